"""Generation: prefill, then decode one token at a time through an explicit KV cache.

The loop is generic over specs. It relies on the graph's named inputs and outputs:

* inputs ``tokens`` (int64 ``[seq]``) and ``positions`` (int64 ``[seq]``), and
  optionally ``logit_rows`` (int64 ``[rows]``: which positions get logits);
* output ``logits`` (``[rows, vocab]``);
* every other input is state (a KV cache): the output of the same name feeds it on
  the next step; it starts as zeros with every symbolic dim set to 0. A graph with no
  state input reruns all the tokens so far at every step (``with_history``).

``Session`` runs steps through a ``run(*inputs) -> list[np.ndarray]`` callable (the
compiled graph); ``generate_ids`` is the loop for one sequence. A batched engine
replaces ``generate_ids`` for many sequences without changing its inputs or output.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np

from ..errors import MaxdeclError
from .compile_timer import CompileTimer
from .stops import StopStrings


@dataclass
class GenerateOutput:
    """One generation: ``ids`` (prompt excluded; a stop string's last token included),
    ``text`` (ending before any stop string), ``finish_reason`` ("stop": end-of-sequence
    or a stop string; "length": ``max_new_tokens`` reached), ``prompt_tokens`` and the
    seconds spent in prefill and decode, numba's kernel compiling / cache loading
    (``compile_s``) excluded."""

    ids: list
    text: str
    finish_reason: str = "length"
    prompt_tokens: int = 0
    prefill_s: float = 0.0
    decode_s: float = 0.0
    compile_s: float = 0.0
    prompt_ids: list = field(default_factory=list, repr=False)
    drafted: int = 0             # prompt lookup: draft tokens proposed ...
    accepted: int = 0            # ... and confirmed by the model

    @property
    def prefill_tps(self) -> float:
        """Prompt tokens per second of prefill."""
        return self.prompt_tokens / self.prefill_s if self.prefill_s else 0.0

    @property
    def decode_tps(self) -> float:
        """Generated tokens per second of decode (the first comes from the prefill)."""
        n = max(len(self.ids) - 1, 0)
        return n / self.decode_s if self.decode_s else 0.0

    # Earlier names, kept for callers that use them.
    stop_reason = property(lambda self: self.finish_reason)
    prefill_seconds = property(lambda self: self.prefill_s)
    decode_seconds = property(lambda self: self.decode_s)


@dataclass(frozen=True)
class GenerateRequest:
    """One sequence to generate: checked prompt ids, ``max_new_tokens``, the sampling
    arguments (``params.check_sampling``'s dict) and stop strings."""

    ids: list
    max_new_tokens: int
    sampling: dict
    stop: tuple = ()


STEP_INPUTS = ("tokens", "positions", "logit_rows")


def is_language_model(input_names, output_names) -> bool:
    """Whether a graph is generated from: inputs ``tokens`` and ``positions``, an output
    ``logits``, and every other input (but ``logit_rows``) a state fed back by the
    output of the same name. Anything else (an encoder with an MLM head and an attention
    mask) is called with its inputs."""
    names, outs = list(input_names), set(output_names)
    return ({"tokens", "positions"} <= set(names) and "logits" in outs
            and all(n in outs for n in names if n not in STEP_INPUTS))


HISTORY = "tokens so far"     # a stateless session's state: the tokens it has run


def with_history(session, tokens, start: int, state: dict):
    """``(tokens to run, how many of them are new, their first position, new state)``.
    A graph with state inputs runs ``tokens`` at ``start`` (the new state comes from its
    outputs: None here); a stateless one (no KV cache: transformers' ``use_cache=False``)
    reruns every token so far from position 0, kept in the state under ``HISTORY``."""
    tokens = np.asarray(tokens, np.int64).reshape(-1)
    if not session.stateless:
        return tokens, tokens.size, start, None
    so_far = state.get(HISTORY, np.zeros(0, np.int64))[:start]
    if so_far.size != start:
        raise MaxdeclError(f"step at position {start} after {so_far.size} tokens")
    tokens = np.concatenate([so_far, tokens])
    return tokens, tokens.size - start, 0, {HISTORY: tokens}


def logit_rows(n: int, new: int, all_logits: bool) -> np.ndarray:
    """The ``logit_rows`` input: the last ``new`` rows of ``n``, or the last one."""
    return np.arange(n - new if all_logits else n - 1, n, dtype=np.int64)


class Session:
    """A language-model graph run step by step; ``run(*inputs)`` executes the graph."""

    def __init__(self, graph, run):
        self.graph, self.run = graph, run
        names = [v.name for v in graph.inputs]
        out_names = list(graph.output_names)
        for need in ("tokens", "positions"):
            if need not in names:
                raise MaxdeclError(f"{graph.name}: generation needs a graph input named "
                                   f"{need!r}; inputs are {names}")
        if "logits" not in out_names:
            raise MaxdeclError(f"{graph.name}: generation needs a graph output named 'logits'; "
                               f"outputs are {out_names}")
        self._in_names = names
        self._logits_index = out_names.index("logits")
        self._state_names = [n for n in names if n not in STEP_INPUTS]
        missing = [n for n in self._state_names if n not in out_names]
        if missing:
            raise MaxdeclError(f"{graph.name}: state inputs {missing} have no output of the "
                               "same name to feed them")
        self._state_out = {n: out_names.index(n) for n in self._state_names}

    # symbolic dims an initial state holds once (an encoder-decoder's batch of one)
    _unit_dims: frozenset = frozenset()

    def initial_state(self) -> dict:
        """Zero-length caches: each state input with its symbolic dims set to 0 (those
        in ``_unit_dims`` to 1)."""
        state = {}
        for v in self.graph.inputs:
            if v.name in self._state_names:
                shape = tuple(d if isinstance(d, int) else 1 if d in self._unit_dims else 0
                              for d in v.shape)
                state[v.name] = np.zeros(shape, v.dtype.numpy)
        return state

    @property
    def stateless(self) -> bool:
        """No state input (no KV cache): every step reruns all the tokens so far."""
        return not self._state_names

    def step(self, tokens, start: int, state: dict, all_logits: bool = False):
        """Run ``tokens`` at positions ``start..``; returns (logits, new state)."""
        tokens, new, start, history = with_history(self, tokens, start, state)
        feed = {"tokens": tokens, "positions": np.arange(start, start + tokens.size, dtype=np.int64),
                "logit_rows": logit_rows(tokens.size, new, all_logits), **state}
        outs = self.run(*(feed[n] for n in self._in_names))
        logits = outs[self._logits_index]
        if "logit_rows" not in self._in_names:
            logits = logits[-new:] if all_logits else logits[-1:]
        return logits, history or {n: outs[i] for n, i in self._state_out.items()}

    def prefill(self, ids, chunk: int | None = None, on_progress=None):
        """``step`` over the whole prompt from an empty cache, in chunks of ``chunk``
        tokens when given (``on_progress(done, total)`` after each); returns the last
        row's logits and the state."""
        state = self.initial_state()
        if not chunk or len(ids) <= chunk:
            return self.step(ids, 0, state)
        logits = None
        for start in range(0, len(ids), chunk):
            logits, state = self.step(ids[start:start + chunk], start, state)
            if on_progress is not None:
                on_progress(min(start + chunk, len(ids)), len(ids))
        return logits, state


def generate_ids(session: Session, tok, prompt_ids, max_new_tokens, sampler,
                 on_text=None, stop_ids=None, stop=(), prefill_chunk=None,
                 on_prefill=None) -> GenerateOutput:
    """The prefill + decode loop for one sequence.

    Args:
        session: the model's ``Session``.
        tok: its tokenizer (``decode``; ``stream_decoder`` when present), or None: then
            ``text`` is "" and only ``stop_ids`` end generation early.
        prompt_ids: the prompt's token ids (checked by the caller).
        max_new_tokens: at most this many new tokens.
        sampler: ``sampler(logits_row, context=ids) -> id``.
        on_text: called with text as it becomes complete (never part of a stop string).
        stop_ids: ids that end generation (default: the tokenizer's ``eos_ids``; ``()``
            never stops early).
        stop: stop strings; the text ends before the first one.
        prefill_chunk, on_prefill: prefill in chunks, calling ``on_prefill(done, total)``.

    Returns:
        a ``GenerateOutput``.
    """
    if not prompt_ids:
        raise MaxdeclError("the prompt is empty (no tokens to start from)")
    stops = set(getattr(tok, "eos_ids", ()) or ()) if stop_ids is None else set(stop_ids)
    # The new text continues the prompt: keep a SentencePiece leading space.
    stream = tok.stream_decoder(continuation=True) if hasattr(tok, "stream_decoder") else None
    if tok is None:                      # ids in, ids out: no text to stream or match
        on_text = stop = None
    matcher = StopStrings(stop) if stop else None
    context = list(prompt_ids)
    out_ids: list[int] = []
    reason = "length"

    def emit(piece: str) -> bool:
        """Pass text on; True when it completed a stop string."""
        if matcher is not None:
            piece = matcher.push(piece)
        if piece and on_text is not None:
            on_text(piece)
        return matcher is not None and matcher.stopped

    with CompileTimer() as ct:
        t0 = time.perf_counter()
        if max_new_tokens > 0:
            logits, state = session.prefill(context, prefill_chunk, on_prefill)
        t1, c1 = time.perf_counter(), ct.seconds
        pos = len(context)
        for n in range(max_new_tokens):
            nxt = sampler(logits[-1], context)
            if nxt in stops:
                reason = "stop"
                break
            out_ids.append(nxt)
            context.append(nxt)
            if (on_text is not None or matcher is not None) and emit(
                    stream.push(nxt) if stream is not None else tok.decode([nxt])):
                reason = "stop"
                break
            if n + 1 == max_new_tokens:
                break
            logits, state = session.step([nxt], pos, state)
            pos += 1
        t2 = time.perf_counter()
    hit = matcher is not None and matcher.stopped
    if not hit and stream is not None and (on_text is not None or matcher is not None):
        hit = emit(stream.flush())
    if matcher is not None and on_text is not None and not hit:
        rest = matcher.flush()
        if rest:
            on_text(rest)
    text = _decode(tok, out_ids)
    if matcher is not None:
        cut = [i for i in (text.find(s) for s in stop) if i >= 0]
        if cut:
            text, reason = text[:min(cut)], "stop"
    return GenerateOutput(out_ids, text, reason, len(prompt_ids),
                          max(t1 - t0 - c1, 0.0), max(t2 - t1 - (ct.seconds - c1), 0.0),
                          ct.seconds, list(prompt_ids))


def _decode(tok, ids) -> str:
    if tok is None:
        return ""
    try:
        return tok.decode(ids, continuation=True)
    except TypeError:  # tokenizers without SentencePiece prefix rules
        return tok.decode(ids)
