"""Helpers for the architecture tests (MoE, Mamba, encoders): the low-level route.

``md.load_weights(path, spec=SPEC)`` maps an HF directory onto the spec and reads its
hyperparameters (``td.params``), ``md.build`` uses them, ``md.compile`` runs the graph;
the decoders are stepped here through their state (KV caches, conv/SSM states).
"""

from __future__ import annotations

import numpy as np

import maxdecl as md
from modelhelp import N_PROMPT, rel_err, spec_path

TOL = 1e-5          # max|ours - ref| <= TOL * max|ref|


def load(name: str, path, variant: str = "tiny"):
    """(graph, weights) of ``specs/<name>.yaml`` on ``path``: an HF directory or any file
    ``md.load_weights`` reads (a lone ``.safetensors``, a GGUF, a checkpoint)."""
    td = md.load_weights(path, spec=spec_path(name), variant=variant)
    return md.build(spec_path(name), weights=td), td


class Stepper:
    """Runs a decoder graph step by step, feeding each state output back as input."""

    def __init__(self, graph, weights):
        self.run = md.compile(graph, weights)
        self.graph = graph
        self.names = [v.name for v in graph.inputs]
        self.outs = list(graph.output_names)
        self.state_names = [n for n in self.names if n in self.outs]

    def initial_state(self) -> dict:
        return {v.name: np.zeros(tuple(0 if isinstance(d, str) else d for d in v.shape),
                                 v.dtype.numpy)
                for v in self.graph.inputs if v.name in self.state_names}

    def step(self, ids, start: int, state: dict):
        """Logits of every position of ``ids`` (at ``start``...) and the new state."""
        ids = np.asarray(ids, np.int64)
        feed = {"tokens": ids, "positions": np.arange(start, start + ids.size, dtype=np.int64),
                "logit_rows": np.arange(ids.size, dtype=np.int64), **state}
        res = self.run(*(feed[n] for n in self.names))
        got = dict(zip(self.outs, res))
        return got["logits"], {n: got[n] for n in self.state_names}


def decoder_errors(graph, weights, ref, ids, n_prompt: int = N_PROMPT) -> tuple[float, float]:
    """(prefill error, decode error): a prefill of ``n_prompt`` tokens, then one token at
    a time through the state, against reference logits of the whole sequence."""
    s = Stepper(graph, weights)
    pre, state = s.step(ids[:n_prompt], 0, s.initial_state())
    dec = []
    for pos in range(n_prompt, len(ids)):
        lg, state = s.step([ids[pos]], pos, state)
        dec.append(lg[-1])
    return rel_err(pre, ref[:n_prompt]), rel_err(np.stack(dec), ref[n_prompt:])


def error_with_state_reset(graph, weights, ref, ids, reset: str = "",
                           n_prompt: int = 12) -> float:
    """The error of one decode step after a prefill of ``n_prompt`` tokens, with every
    state whose name ends in ``reset`` (default: every state) set back to its empty
    start (a negative control: a state that matters makes it large)."""
    s = Stepper(graph, weights)
    _, state = s.step(ids[:n_prompt], 0, s.initial_state())
    zeros = s.initial_state()
    state = {n: zeros[n] if n.endswith(reset) else v for n, v in state.items()}
    lg, _ = s.step([ids[n_prompt]], n_prompt, state)
    return rel_err(lg[-1], ref[n_prompt])


def mamba2_dynamics(mixer, heads: int, gen) -> None:
    """A Mamba-2 mixer's ``A_log`` and ``dt_bias`` drawn where trained checkpoints hold
    them (A in [0.5, 4], softplus(dt_bias) in [0.01, 0.2]), in place, from ``gen``: random
    N(0, 1) values make the scan forget everything or nothing."""
    import torch

    mixer.A_log.copy_(torch.log(0.5 + 3.5 * torch.rand(heads, generator=gen)))
    dt = 0.01 + 0.19 * torch.rand(heads, generator=gen)
    mixer.dt_bias.copy_(dt + torch.log(-torch.expm1(-dt)))     # softplus^-1


def hf_cases(make, cases: dict, tmp_path_factory, prefix: str, vocab: int, n_tokens: int) -> dict:
    """name -> (HF model, its save_pretrained folder, token ids, HF logits) for each
    ``cases`` entry: ``make(seed=k, **kw)`` built, saved and run once (ids seeded 7 + k)."""
    from modelhelp import hf_logits, save_hf, token_ids

    out = {}
    for k, (name, kw) in enumerate(cases.items()):
        model = make(seed=k, **kw)
        path = save_hf(model, tmp_path_factory.mktemp(f"{prefix}_{name}"))
        ids = token_ids(vocab, n=n_tokens, seed=7 + k)
        out[name] = (model, path, ids, hf_logits(model, ids))
    return out
