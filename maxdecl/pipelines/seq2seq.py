"""Generation for encoder-decoder specs (T5, BART): the source ids go to the encoder
inputs at every step, the decoder steps through its own tokens and states.

A spec is an encoder-decoder when its graph inputs include ``dec_tokens`` and one
source input named ``enc_*`` (``enc_tokens``: token ids; any other, such as Whisper's
``enc_features``: an array given as the prompt) and it outputs ``logits``;
``enc_positions`` and ``dec_positions`` are fed when present (0.. along the source's
first axis; the decoder's absolute positions), and every other input is a state fed
back by the output of the same name (the decoder's KV caches; with none, every step
reruns the decoder over all its tokens so far). A source mask input
(``enc_mask`` or ``enc_attention_mask``, for padded batches) is fed all ones: one
source has no padding. A spec with a batch axis (``dec_tokens`` declared ``[batch,
seq]``, the source ``[batch, ...]``) gets a batch of one: the source, dec_tokens (and
a 2-D ``dec_positions``) with a leading axis of 1, states with their batch dim 1, the
logits' batch axis dropped. The decoder starts from the param ``decoder_start`` (T5:
the pad id 0; BART: 2). The steps that read only the source (the encoder, the
cross-attention keys and values) run once per source (``CompiledGraph.fixed``), not at
every decoder step.
"""

from __future__ import annotations

import numpy as np

from ..errors import MaxdeclError
from .generate import Session, logit_rows, with_history

SOURCE_MASKS = ("enc_mask", "enc_attention_mask")
STEP_INPUTS = ("enc_positions", "dec_tokens", "dec_positions", "logit_rows") + SOURCE_MASKS


def source_input(input_names) -> str | None:
    """The encoder's source input: ``enc_tokens``, else the one other ``enc_*`` input
    (not ``enc_positions`` or a source mask), else None."""
    names = list(input_names)
    if "enc_tokens" in names:
        return "enc_tokens"
    others = [n for n in names if n.startswith("enc_") and n not in STEP_INPUTS]
    return others[0] if len(others) == 1 else None


def is_encoder_decoder(input_names, output_names) -> bool:
    """Whether a graph generates as an encoder-decoder (see the module doc)."""
    names, outs = list(input_names), set(output_names)
    src = source_input(names)
    return (src is not None and "dec_tokens" in names and "logits" in outs
            and all(n in outs for n in names if n not in STEP_INPUTS and n != src))


class Seq2SeqSession(Session):
    """A ``Session`` over the decoder of an encoder-decoder graph, for one source
    sequence: ``step(tokens, start, state)`` runs decoder ``tokens`` at decoder positions
    ``start..`` with the source bound at construction, so ``generate_ids`` drives it
    unchanged (its "prompt" is the decoder's start token)."""

    def __init__(self, graph, run, source_ids):
        self.graph = graph
        names = [v.name for v in graph.inputs]
        out_names = list(graph.output_names)
        if not is_encoder_decoder(names, out_names):
            raise MaxdeclError(f"{graph.name}: not an encoder-decoder (it needs a source "
                               f"input 'enc_tokens' or one other 'enc_*', 'dec_tokens', an "
                               f"output 'logits' and every other input a state): inputs are "
                               f"{names}")
        self._in_names = names
        self._logits_index = out_names.index("logits")
        self._source_name = source_input(names)
        fixed = [self._source_name] + [n for n in ("enc_positions",) + SOURCE_MASKS
                                       if n in names]
        self.run = run.fixed(fixed) if hasattr(run, "fixed") else run
        self._state_names = [n for n in names
                             if n not in STEP_INPUTS and n != self._source_name]
        self._state_out = {n: out_names.index(n) for n in self._state_names}
        types = {v.name: v.type for v in graph.inputs}
        self._types = types
        dec = types["dec_tokens"]
        self._batch_dim = dec.shape[0] if dec.rank == 2 else None    # [batch, seq]: one
        if self._batch_dim is not None:
            self._unit_dims = frozenset([self._batch_dim])
        src_type = types[self._source_name]
        if self._source_name == "enc_tokens":
            source = np.asarray(source_ids, np.int64).reshape(-1)
        else:
            source = np.asarray(source_ids, src_type.dtype.numpy)
        if self._batch_dim is not None and source.ndim == src_type.rank - 1:
            source = source[None]                  # a batch of one source
        self.source = source
        if not self.source.size:
            raise MaxdeclError("the source is empty (the encoder needs at least one token)")
        self._mask = {n: np.ones(source.shape, types[n].dtype.numpy)
                      for n in SOURCE_MASKS if n in names}

    def step(self, tokens, start: int, state: dict, all_logits: bool = False):
        """Run decoder ``tokens`` at positions ``start..`` over the bound source; returns
        (logits, new state)."""
        tokens, new, start, history = with_history(self, tokens, start, state)
        batched = self._batch_dim is not None
        positions = np.arange(start, start + tokens.size, dtype=np.int64)
        if batched and self._types.get("dec_positions") is not None \
                and self._types["dec_positions"].rank == 2:
            positions = positions[None]
        feed = {self._source_name: self.source,
                "enc_positions": np.arange(self.source.shape[1 if batched else 0],
                                           dtype=np.int64),
                "dec_tokens": tokens[None] if batched else tokens,
                "dec_positions": positions,
                "logit_rows": logit_rows(tokens.size, new, all_logits),
                **self._mask, **state}
        outs = self.run(*(feed[n] for n in self._in_names))
        logits = outs[self._logits_index]
        if batched:
            logits = logits[0]
        if "logit_rows" not in self._in_names:
            logits = logits[-new:] if all_logits else logits[-1:]
        return logits, history or {n: outs[i] for n, i in self._state_out.items()}


def decoder_start(params: dict, spec_name: str) -> int:
    """The decoder's first token: the spec's param ``decoder_start``."""
    start = params.get("decoder_start")
    if isinstance(start, bool) or not isinstance(start, (int, np.integer)):
        raise MaxdeclError(f"{spec_name}: an encoder-decoder spec generates from its param "
                           f"'decoder_start' (the decoder's first token id; transformers' "
                           f"decoder_start_token_id), got {start!r}")
    return int(start)
