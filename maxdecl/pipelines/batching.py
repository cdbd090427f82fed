"""Continuous batching: several sequences decode together through one compiled graph.

Each step runs the rows of every active sequence at once (``CompiledGraph`` with
``rows=``): the weights are read once per step for all of them, each sequence keeps
its own KV cache and position, a sequence that finishes frees its slot and a waiting
one joins. A new sequence is prefilled in a step of its own (prefill is compute-bound,
and its logits then equal a solo prefill's); decode steps take up to
``GEMV_MAX_ROWS`` sequences, whose rows the GEMV kernels compute exactly as one row
alone, so greedy ids equal each prompt's solo ids.

The graph convention is the generation loop's (``maxdecl.pipelines.generate``): inputs
``tokens`` and ``positions`` (and optionally ``logit_rows``), output ``logits``, every
other input a state fed back by the output of the same name.

A graph whose state is read by plain ops (a recurrence written with ``mul`` and
``add``, a ``reshape`` of a cache) cannot take one array per sequence in one call; its
steps run each sequence through the graph in turn (``per_sequence``), with the same
numbers as alone and none of the shared weight reads. So does a graph whose batched
call fails (a ``masked_attention`` whose mask follows the step's rows), from its first
failing step on.
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from ..errors import GraphError, MaxdeclError
from ..kernels.config import GEMV_MAX_ROWS     # decode rows per step that keep solo numerics
from ..kernels.kv_cache import truncate_kv
from ..runtime import PerSequence, direct_state_reader

ROW_INPUTS = ("tokens", "positions", "logit_rows")


@dataclass
class Request:
    """One sequence to generate: prompt ids, a sampler ``logits_row -> id`` (it may keep
    its own RNG and history), a length limit, stop ids and an optional ``on_token(id)``
    that returns True to stop (a stop string was completed, the client went away)."""

    prompt: list
    sample: Callable
    max_new_tokens: int
    stop_ids: frozenset = frozenset()
    on_token: Callable | None = None
    lookup: int = 0                  # prompt lookup: draft up to this many tokens (greedy only)
    ids: list = field(default_factory=list)
    finish_reason: str = ""
    drafted: int = 0                 # draft tokens proposed by prompt lookup ...
    accepted: int = 0                # ... and how many of them the model confirmed
    prefill_s: float = 0.0
    decode_s: float = 0.0
    _state: dict | None = None
    _pos: int = 0
    _draft_len: int = 2              # prompt lookup: draft length now (adapts, see _adapt)
    _pause: int = 0                  # ... steps left without drafting after misses
    _misses: int = 0                 # ... drafts in a row with nothing accepted

    @property
    def done(self) -> bool:
        return bool(self.finish_reason)


class BatchRunner:
    """Runs ``Request``s through ``compiled`` (a ``CompiledGraph`` of a language model),
    up to ``max_batch`` decoding together."""

    def __init__(self, compiled, max_batch: int = 8):
        names = list(compiled.input_names)
        outs = list(compiled.output_names)
        for need in ("tokens", "positions"):
            if need not in names:
                raise MaxdeclError(f"{compiled.name}: batching needs a graph input {need!r}")
        if "logits" not in outs:
            raise MaxdeclError(f"{compiled.name}: batching needs a graph output 'logits'")
        if not 1 <= int(max_batch) <= 1024:
            raise MaxdeclError(f"max_batch must be in 1..1024, got {max_batch}")
        self.compiled, self.max_batch = compiled, int(max_batch)
        self._names, self._logits = names, outs.index("logits")
        self._states = [n for n in names if n not in ROW_INPUTS]
        missing = [n for n in self._states if n not in outs]
        if missing:
            raise MaxdeclError(f"{compiled.name}: state inputs {missing} have no output of "
                               "the same name to feed them")
        if not self._states:
            raise MaxdeclError(f"{compiled.name}: batched decoding needs the graph's KV "
                               "caches (state inputs fed back by outputs of the same name); "
                               "a graph without them generates one sequence at a time")
        self._state_out = {n: outs.index(n) for n in self._states}
        self._types = dict(zip(names, compiled.input_types))
        # a spec that says so, or a state read by plain ops: each sequence of a step alone
        self.per_sequence = (getattr(compiled, "batching", "rows") == "per_sequence" or any(
            direct_state_reader(compiled, names.index(n)) is not None for n in self._states))
        # prompt lookup rolls a state back after a rejected draft: only states that grow
        # along the sequence (KV caches, a symbolic dim at axis -3) can be rolled back
        self.can_lookup = all(t.rank >= 3 and isinstance(t.shape[-3], str)
                              for t in (self._types[n] for n in self._states))
        self._waiting: deque = deque()
        self._active: list = []

    def zero_state(self) -> dict:
        """Empty states: each state input with its symbolic dims set to 0."""
        return {n: np.zeros(tuple(0 if isinstance(d, str) else d
                                  for d in self._types[n].shape), self._types[n].dtype.numpy)
                for n in self._states}

    def run(self, requests) -> list:
        """Generate every request (continuous batching); returns them, finished."""
        requests = list(requests)
        for r in requests:
            self.add(r)
        while self.step():
            pass
        return requests

    def add(self, request: Request) -> None:
        """Queue a request; it joins the batch when a slot is free (``step``)."""
        self._waiting.append(request)

    @property
    def decoding(self) -> int:
        """Requests in the batch now (admitted, not finished)."""
        return sum(not r.done for r in self._active)

    @property
    def waiting(self) -> int:
        """Requests queued for a free slot."""
        return len(self._waiting)

    @property
    def busy(self) -> bool:
        """Whether a request is waiting or decoding."""
        return bool(self._waiting or self._active)

    def step(self) -> bool:
        """One round: admit (prefill) one waiting request if a slot is free, then one
        decode step for every active request. Returns ``busy``."""
        self._active = [r for r in self._active if not r.done]   # cancelled in between
        if self._waiting and len(self._active) < self.max_batch:
            r = self._waiting.popleft()
            if not r.done:
                self._prefill(r)
            if not r.done:
                self._active.append(r)
        for k in range(0, len(self._active), GEMV_MAX_ROWS):
            self._decode([r for r in self._active[k:k + GEMV_MAX_ROWS] if not r.done])
        self._active = [r for r in self._active if not r.done]
        return self.busy

    def _call(self, tokens, positions, logit_rows, states, rows):
        feed = {"tokens": np.asarray(tokens, np.int64),
                "positions": np.asarray(positions, np.int64),
                "logit_rows": np.asarray(logit_rows, np.int64), **states}
        if self.per_sequence:
            outs = self._call_each(feed, rows)
        else:
            try:
                outs = self.compiled(*(feed[n] for n in self._names), rows=rows)
            except GraphError:
                # an op that cannot take the batch as one call (a masked_attention
                # whose mask follows the step's rows): each sequence alone from now on,
                # and an error that is not about the batch comes back from there
                outs = self._call_each(feed, rows)
                self.per_sequence = True
        logits = outs[self._logits]
        if "logit_rows" not in self._names:            # every row came back: keep the lasts
            logits = logits[np.cumsum(rows) - 1]
        return logits, outs

    def _call_each(self, feed: dict, rows) -> list:
        """The outputs of one batched call, made by running each sequence alone: row
        inputs cut by ``rows`` (``logit_rows`` entries taken by the sequence whose rows
        they index, counted from its first), states taken per sequence; logits put back
        in ``logit_rows`` order, every other output a ``PerSequence``."""
        picks = feed["logit_rows"]
        has_picks = "logit_rows" in self._names
        parts, per, start = [], [], 0
        for k, n in enumerate(rows):
            mine = np.nonzero((picks >= start) & (picks < start + n))[0]
            one = {"tokens": feed["tokens"][start:start + n],
                   "positions": feed["positions"][start:start + n],
                   "logit_rows": picks[mine] - start,
                   **{s: feed[s][k] for s in self._states}}
            outs = self.compiled(*(one[m] for m in self._names))
            parts.append((mine, outs[self._logits]))
            per.append(outs)
            start += n
        if has_picks:
            first = parts[0][1]
            logits = np.empty((len(picks),) + first.shape[1:], first.dtype)
            for mine, part in parts:
                logits[mine] = part
        else:                                  # every row came back: one after another
            logits = np.concatenate([part for _, part in parts])
        return [logits if j == self._logits else PerSequence(o[j] for o in per)
                for j in range(len(per[0]))]

    def _prefill(self, r: Request) -> None:
        if not r.prompt:
            raise MaxdeclError("the prompt is empty (no tokens to start from)")
        t0 = time.perf_counter()
        n = len(r.prompt)
        zero = self.zero_state()
        logits, outs = self._call(r.prompt, np.arange(n), [n - 1],
                                  {k: PerSequence([v]) for k, v in zero.items()}, [n])
        r._state = {k: outs[i][0] for k, i in self._state_out.items()}
        r._pos = n
        r.prefill_s += time.perf_counter() - t0
        self._take(r, logits[0])

    def _decode(self, batch: list) -> None:
        if not batch:
            return
        if any(r.lookup for r in batch):
            return self._decode_lookup(batch)
        t0 = time.perf_counter()
        states = {k: PerSequence(r._state[k] for r in batch) for k in self._states}
        logits, outs = self._call([r.ids[-1] for r in batch], [r._pos for r in batch],
                                  np.arange(len(batch)), states, [1] * len(batch))
        dt = (time.perf_counter() - t0) / len(batch)
        for j, r in enumerate(batch):
            r._state = {k: outs[i][j] for k, i in self._state_out.items()}
            r._pos += 1
            r.decode_s += dt
            self._take(r, logits[j])

    def _decode_lookup(self, batch: list) -> None:
        """One step where each sequence feeds its last id plus a draft of the ids that
        followed the same n-gram earlier in its context; the model's greedy choice
        for every row confirms the draft up to the first miss, so each step yields
        1 + accepted ids, exactly the ids plain greedy decoding gives."""
        if not self.can_lookup:
            raise MaxdeclError(f"{self.compiled.name}: prompt lookup needs every state to "
                               "grow along the sequence (KV caches) so a rejected draft "
                               "can be rolled back")
        room = GEMV_MAX_ROWS - len(batch)            # rows beyond one per sequence
        drafts = []
        for r in batch:
            d = []
            if r._pause:
                r._pause -= 1
            else:
                d = propose_draft(r.prompt + r.ids, min(r.lookup, r._draft_len, max(room, 0)),
                                  min_ngram=LOOKUP_MIN_NGRAM)
            room -= len(d)
            drafts.append(d)
        t0 = time.perf_counter()
        rows = [1 + len(d) for d in drafts]
        tokens = [t for r, d in zip(batch, drafts) for t in [r.ids[-1], *d]]
        positions = [r._pos + j for r, n in zip(batch, rows) for j in range(n)]
        states = {k: PerSequence(r._state[k] for r in batch) for k in self._states}
        logits, outs = self._call(tokens, positions, np.arange(sum(rows)), states, rows)
        dt = (time.perf_counter() - t0) / len(batch)
        start = 0
        for j, (r, d) in enumerate(zip(batch, drafts)):
            used = 0
            for row in range(len(d) + 1):
                used = row + 1
                before = len(r.ids)
                self._take(r, logits[start + row])
                if r.done or row == len(d) or len(r.ids) == before or r.ids[-1] != d[row]:
                    break
                r.accepted += 1
            r.drafted += len(d)
            if d:
                _adapt(r, used - 1, len(d))
            r._state = {k: truncate_kv(outs[i][j], r._state[k].shape[-3] + used)
                        for k, i in self._state_out.items()}
            r._pos += used
            r.decode_s += dt
            start += rows[j]

    @staticmethod
    def _take(r: Request, row) -> None:
        """Sample the next id of ``r`` and decide whether it is finished."""
        if r.max_new_tokens <= 0:
            r.finish_reason = "length"
            return
        nxt = int(r.sample(row))
        if nxt in r.stop_ids:
            r.finish_reason = "stop"
            return
        r.ids.append(nxt)
        if r.on_token is not None and r.on_token(nxt):
            r.finish_reason = "stop"
        elif len(r.ids) >= r.max_new_tokens:
            r.finish_reason = "length"


# Prompt lookup policy. A verify row costs a fraction of a decode step (the weights are
# read and decoded once for all rows, but every row's products are computed), so a
# draft pays off only when it is mostly accepted: match at least a bigram (single-token
# matches were accepted ~6% of the time on the bench prompts), start with 2 tokens,
# double after a fully accepted draft, fall back to what was accepted plus one after a
# miss, and after drafts with nothing accepted pause drafting for 1, 2, 4 ... 16 steps.
LOOKUP_MIN_NGRAM = 2


def _adapt(r: Request, accepted: int, drafted: int) -> None:
    if accepted == drafted:
        r._draft_len = min(r.lookup, 2 * drafted)
    else:
        r._draft_len = max(1, accepted + 1)
    r._misses = 0 if accepted else r._misses + 1
    r._pause = min(16, 2 ** (r._misses - 1)) if r._misses else 0


def propose_draft(context: list, n: int, max_ngram: int = 3, min_ngram: int = 1) -> list:
    """Prompt lookup: the up to ``n`` ids that followed the latest earlier occurrence of
    the context's last ``k``-gram (``k`` from ``max_ngram`` down to ``min_ngram``); [] if
    none."""
    if n <= 0 or len(context) < 2:
        return []
    for k in range(min(max_ngram, len(context) - 1), min_ngram - 1, -1):
        tail = context[-k:]
        for start in range(len(context) - k - 1, -1, -1):
            if context[start:start + k] == tail:
                follow = context[start + k:start + k + n]
                if follow:
                    return list(follow)
    return []
