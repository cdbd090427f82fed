"""Generation: prefill, then decode one token at a time through an explicit KV cache.

The loop is generic over specs. It relies on the graph's named inputs and outputs:

* inputs ``tokens`` (int64 ``[seq]``) and ``positions`` (int64 ``[seq]``), and
  optionally ``logit_rows`` (int64 ``[rows]``: which positions get logits);
* output ``logits`` (``[rows, vocab]``);
* every other input is state (a KV cache): the output of the same name feeds it on
  the next step; it starts as zeros with every symbolic dim set to 0.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np

from ..errors import MaxdeclError
from ..runtime import compile as compile_graph
from .sampling import Sampler


@dataclass
class GenerateOutput:
    """What ``generate`` returns: generated ids (prompt excluded) and their text."""

    ids: list
    text: str
    prompt_ids: list = field(default_factory=list)
    prefill_seconds: float = 0.0
    decode_seconds: float = 0.0
    stop_reason: str = ""

    @property
    def prefill_tps(self) -> float:
        return len(self.prompt_ids) / self.prefill_seconds if self.prefill_seconds else 0.0

    @property
    def decode_tps(self) -> float:
        n = max(len(self.ids) - 1, 0)  # the first new token comes from the prefill
        return n / self.decode_seconds if self.decode_seconds else 0.0


class Session:
    """A built graph plus its weights; ``step`` runs tokens through it, carrying state."""

    def __init__(self, graph, weights):
        self.graph, self.weights = graph, weights
        self.compiled = compile_graph(graph, weights)     # planned and bound once
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
        self._state_names = [n for n in names if n not in ("tokens", "positions", "logit_rows")]
        missing = [n for n in self._state_names if n not in out_names]
        if missing:
            raise MaxdeclError(f"{graph.name}: state inputs {missing} have no output of the "
                               "same name to feed them")
        self._state_out = {n: out_names.index(n) for n in self._state_names}

    def initial_state(self) -> dict:
        """Zero-length caches: each state input with its symbolic dims set to 0."""
        state = {}
        for v in self.graph.inputs:
            if v.name in self._state_names:
                shape = tuple(0 if isinstance(d, str) else d for d in v.shape)
                state[v.name] = np.zeros(shape, v.dtype.numpy)
        return state

    def step(self, tokens, start: int, state: dict, all_logits: bool = False):
        """Run ``tokens`` at positions ``start..``; returns (logits, new state)."""
        tokens = np.asarray(tokens, np.int64)
        feed = {"tokens": tokens, "positions": np.arange(start, start + tokens.size, dtype=np.int64),
                "logit_rows": (np.arange(tokens.size, dtype=np.int64) if all_logits
                               else np.array([tokens.size - 1], np.int64)), **state}
        outs = self.compiled(*(feed[n] for n in self._in_names))
        logits = outs[self._logits_index]
        if "logit_rows" not in self._in_names and not all_logits:
            logits = logits[-1:]
        return logits, {n: outs[i] for n, i in self._state_out.items()}


def open_session(spec, weights=None, variant=None):
    """Load spec + weights (a path or TensorDict; None for seeded random ``tiny`` weights)
    and build the graph. Returns (session, tokenizer or None, note)."""
    from .model_loading import load_model

    return load_model(spec, weights, variant)


def generate(spec, weights, prompt, max_new_tokens: int = 16, temperature: float = 0.0,
             top_k=None, top_p=None, seed=0, variant=None, tokenizer=None,
             on_text=None) -> GenerateOutput:
    """Generate text from ``prompt`` with the model of ``spec`` and ``weights``.

    ``weights`` is a path (GGUF, safetensors, HF dir, llama2.c .bin, maxdecl
    checkpoint) or a TensorDict. ``on_text(str)`` receives complete UTF-8 text as
    tokens arrive. Stops at an end-of-sequence id or after ``max_new_tokens``.

    Example::

        out = md.generate("specs/gemma3.yaml", path, "The capital of France is",
                          max_new_tokens=8)
        print(out.text)
    """
    session, tok, _ = open_session(spec, weights, variant)
    tok = tokenizer or tok
    if tok is None:
        raise MaxdeclError("no tokenizer: pass tokenizer= or weights that carry one")
    prompt_ids = tok.encode(prompt, add_bos=True) if isinstance(prompt, str) else list(prompt)
    return generate_ids(session, tok, prompt_ids, max_new_tokens,
                        Sampler(temperature, top_k, top_p, seed), on_text)


def generate_ids(session: Session, tok, prompt_ids, max_new_tokens, sampler,
                 on_text=None, stop_ids=None) -> GenerateOutput:
    """The prefill + decode loop over a built session; ``stop_ids`` defaults to the
    tokenizer's end-of-sequence ids (pass ``()`` to never stop early)."""
    if not prompt_ids:
        raise MaxdeclError("the prompt is empty (no tokens to start from)")
    stops = set(getattr(tok, "eos_ids", ()) or ()) if stop_ids is None else set(stop_ids)
    # The new text continues the prompt: keep a SentencePiece leading space.
    stream = tok.stream_decoder(continuation=True) if hasattr(tok, "stream_decoder") else None
    out_ids: list[int] = []
    reason = "max_new_tokens"
    t0 = time.perf_counter()
    logits, state = session.step(prompt_ids, 0, session.initial_state())
    t1 = time.perf_counter()
    pos = len(prompt_ids)
    for n in range(max_new_tokens):
        nxt = sampler(logits[-1])
        if nxt in stops:
            reason = "eos"
            break
        out_ids.append(nxt)
        if on_text is not None:
            piece = stream.push(nxt) if stream is not None else tok.decode([nxt])
            if piece:
                on_text(piece)
        if n + 1 == max_new_tokens:
            break
        logits, state = session.step([nxt], pos, state)
        pos += 1
    t2 = time.perf_counter()
    if on_text is not None and stream is not None:
        rest = stream.flush()
        if rest:
            on_text(rest)
    return GenerateOutput(out_ids, _decode(tok, out_ids), list(prompt_ids), t1 - t0, t2 - t1,
                          reason)


def _decode(tok, ids) -> str:
    try:
        return tok.decode(ids, continuation=True)
    except TypeError:  # tokenizers without SentencePiece prefix rules
        return tok.decode(ids)
