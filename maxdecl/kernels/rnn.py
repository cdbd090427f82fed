"""Runtime of ``lstm`` and ``gru`` (``maxdecl.ops.rnn``): the input projections of every
step in one matmul, then the steps in order, float32 throughout."""

from __future__ import annotations

import numpy as np

_GATES = {"lstm": 4, "gru": 3}


def _sigmoid(v):
    with np.errstate(over="ignore"):
        return np.float32(1) / (np.float32(1) + np.exp(-v))


def _bias(b, size: int) -> np.ndarray:
    b = np.asarray(b, np.float32)
    return np.broadcast_to(b.reshape(-1) if b.ndim else b, (size,))


def _run(kind):
    gates = _GATES[kind]

    def run(args, attrs):
        x, w_ih, w_hh, b_ih, b_hh, *rest = (np.asarray(a, np.float32) for a in args)
        hidden = w_hh.shape[1]
        lead, (seq, n_in) = x.shape[:-2], x.shape[-2:]
        if w_ih.shape != (gates * hidden, n_in) or w_hh.shape != (gates * hidden, hidden):
            raise ValueError(f"{kind}: w_ih {list(w_ih.shape)} / w_hh {list(w_hh.shape)} do "
                             f"not fit x {list(x.shape)} with hidden {hidden}")
        xs = x.reshape(-1, seq, n_in)
        rows = xs.shape[0]
        gx = xs @ w_ih.T + _bias(b_ih, gates * hidden)          # [rows, seq, gates * H]
        bh = _bias(b_hh, gates * hidden)
        wt = np.ascontiguousarray(w_hh.T)
        shape = (rows, 2, hidden) if kind == "lstm" else (rows, hidden)
        state = (np.zeros(shape, np.float32) if not rest
                 else np.array(rest[0], np.float32).reshape(shape))
        h = state[:, 0] if kind == "lstm" else state
        c = state[:, 1] if kind == "lstm" else None
        out = np.empty((rows, seq, hidden), np.float32)
        for t in range(seq):
            gh = h @ wt + bh
            g = gx[:, t]
            if kind == "lstm":
                pre = g + gh
                i, f = _sigmoid(pre[:, :hidden]), _sigmoid(pre[:, hidden:2 * hidden])
                cand = np.tanh(pre[:, 2 * hidden:3 * hidden])
                o = _sigmoid(pre[:, 3 * hidden:])
                c = f * c + i * cand
                h = o * np.tanh(c)
            else:
                r = _sigmoid(g[:, :hidden] + gh[:, :hidden])
                z = _sigmoid(g[:, hidden:2 * hidden] + gh[:, hidden:2 * hidden])
                n = np.tanh(g[:, 2 * hidden:] + r * gh[:, 2 * hidden:])
                h = (np.float32(1) - z) * n + z * h
            out[:, t] = h
        outs = [out.reshape(*lead, seq, hidden)]
        if rest:
            new = np.stack([h, c], axis=1) if kind == "lstm" else h
            outs.append(np.ascontiguousarray(new.reshape(rest[0].shape), np.float32))
        return outs
    return run


RUN = {"lstm": _run("lstm"), "gru": _run("gru")}
