"""Runtime of ``causal_conv1d``, ``selective_scan``, ``linear_scan`` and
``gated_delta_rule`` (``maxdecl.ops.ssm``).

Leading batch dims are flattened to one ``B``; the wrappers check every shape, so
the kernels never index past their inputs.
"""

from __future__ import annotations

import numba
import numpy as np

from ..dtypes import format_shape
from ._dispatch import njit_twins, pick


@njit_twins()
def _conv_rows(x, w, bias, state, y, new_state):
    # x: (B, L, C), w: (C, K), bias: (C,), state: (B, K-1, C) f32
    # -> y: (B, L, C); new_state: (B, K-1, C), the last K-1 rows of [state; x]
    nb, seq, ch = x.shape
    k = w.shape[1]
    for r in numba.prange(nb * seq):
        b = r // seq
        t = r % seq
        for c in range(ch):
            acc = bias[c]
            for j in range(k):
                s = t + j - (k - 1)                  # row of x; < 0 reads the state
                v = x[b, s, c] if s >= 0 else state[b, s + k - 1, c]
                acc += w[c, j] * v
            y[b, t, c] = acc
    for b in range(nb):
        for i in range(k - 1):
            s = seq - (k - 1) + i
            for c in range(ch):
                new_state[b, i, c] = x[b, s, c] if s >= 0 else state[b, s + k - 1, c]


def _f32(a):
    """float32, C-contiguous; a scalar stays 0-d (ascontiguousarray would make it [1])."""
    return np.ascontiguousarray(a, dtype=np.float32) if np.ndim(a) else np.asarray(a, np.float32)


def _conv_run(args, attrs):
    x, w, *rest = (_f32(a) for a in args)
    ch, k = w.shape
    lead = x.shape[:-2]
    bias = np.broadcast_to(rest[0], (ch,)).copy() if rest else np.zeros(ch, np.float32)
    want = (*lead, k - 1, ch)
    if x.shape[-1] != ch or (len(rest) > 1 and rest[1].shape != want) or \
            (rest and rest[0].ndim and rest[0].shape != (ch,)):
        raise ValueError(f"causal_conv1d: x{format_shape(x.shape)}, weight{format_shape(w.shape)}"
                         f"{''.join(f', {format_shape(r.shape)}' for r in rest)}: expected "
                         f"x[..., seq, {ch}], bias [{ch}], state {format_shape(want)}")
    seq = x.shape[-2]
    x3 = x.reshape(-1, seq, ch)
    state = rest[1].reshape(-1, k - 1, ch) if len(rest) > 1 else \
        np.zeros((x3.shape[0], k - 1, ch), np.float32)
    y = np.empty_like(x3)
    new_state = np.empty_like(state)
    pick(_conv_rows, x3.size * k)(x3, w, bias, state, y, new_state)
    y = y.reshape(x.shape)
    return [y, new_state.reshape(want)] if len(rest) > 1 else [y]


@njit_twins()
def _scan_rows(x, dt, a, bm, cm, dv, h, y, softplus):
    # x, dt: (B, L, D); a: (1 or B, D, N); bm, cm: (B, L, N); dv: (1 or B, D); h: (B, D, N) in/out
    # -> y: (B, L, D). One (batch, channel) pair per iteration; h[b, d] stays in a row.
    nb, seq, ch = x.shape
    n = a.shape[2]
    for r in numba.prange(nb * ch):
        b = r // ch
        d = r % ch
        ad = a[b % a.shape[0], d]
        hs = h[b, d]
        for t in range(seq):
            delta = dt[b, t, d]
            if softplus and delta <= np.float32(20.0):      # torch's softplus threshold
                delta = np.float32(np.log1p(np.exp(np.float64(delta))))
            xv = x[b, t, d]
            acc = np.float32(0.0)
            for i in range(n):
                hs[i] = np.exp(delta * ad[i]) * hs[i] + (delta * bm[b, t, i]) * xv
                acc += hs[i] * cm[b, t, i]
            y[b, t, d] = acc + dv[b % dv.shape[0], d] * xv


def _scan_run(args, attrs):
    x, dt, a, bm, cm, dv, *rest = (_f32(v) for v in args)
    ch, n = a.shape[-2:]
    lead, seq = x.shape[:-2], x.shape[-2]
    want_bc, want_h = (*lead, seq, n), (*lead, ch, n)
    if (x.shape[-1] != ch or dt.shape != x.shape or bm.shape != want_bc
            or a.shape not in ((ch, n), want_h)
            or cm.shape != want_bc or (dv.ndim and dv.shape not in ((ch,), (*lead, ch)))
            or (rest and rest[0].shape != want_h)):
        shapes = ", ".join(format_shape(v.shape) for v in args)
        raise ValueError(f"selective_scan: inputs {shapes}: expected x, dt [..., seq, {ch}], "
                         f"A [{ch}, {n}] or {format_shape(want_h)}, B, C "
                         f"{format_shape(want_bc)}, D [{ch}] or {format_shape((*lead, ch))}, "
                         f"state {format_shape(want_h)}")
    h = (rest[0].copy() if rest else np.zeros(want_h, np.float32)).reshape(-1, ch, n)
    x3 = x.reshape(-1, seq, ch)
    y = np.empty_like(x3)
    pick(_scan_rows, x3.size * n)(x3, dt.reshape(x3.shape), a.reshape(-1, ch, n),
                                  bm.reshape(-1, seq, n),
                                  cm.reshape(-1, seq, n),
                                  (dv.reshape(-1, ch) if dv.ndim > 1 else
                                   np.broadcast_to(dv, (1, ch)).copy()),
                                  h, y, bool(attrs["dt_softplus"]))
    y = y.reshape(x.shape)
    return [y, h.reshape(want_h)] if rest else [y]


@njit_twins()
def _linear_rows(a, x, h, y):
    # a, x: (B, L, C); h: (B, C) in/out -> y: (B, L, C): h = a * h + x, row by row
    nb, seq, ch = x.shape
    for b in numba.prange(nb):
        hb = h[b]
        for t in range(seq):
            for c in range(ch):
                hb[c] = a[b, t, c] * hb[c] + x[b, t, c]
                y[b, t, c] = hb[c]


def _linear_scan_run(args, attrs):
    a, x, *rest = (_f32(v) for v in args)
    want_h = (*x.shape[:-2], x.shape[-1])
    if x.ndim < 2 or a.shape != x.shape or (rest and rest[0].shape != want_h):
        shapes = ", ".join(format_shape(v.shape) for v in args)
        raise ValueError(f"linear_scan: inputs {shapes}: expected a, x of one shape [..., seq, "
                         f"C] and state {format_shape(want_h)}")
    ch, nb = x.shape[-1], int(np.prod(x.shape[:-2], dtype=np.int64))
    h = (rest[0].copy() if rest else np.zeros(want_h, np.float32)).reshape(nb, ch)
    x3 = x.reshape(nb, x.shape[-2], ch)
    y = np.empty_like(x3)
    pick(_linear_rows, x3.size)(a.reshape(x3.shape), x3, h, y)
    y = y.reshape(x.shape)
    return [y, h.reshape(want_h)] if rest else [y]


@njit_twins()
def _delta_rows(q, k, v, g, beta, s, o, r, scale, l2):
    # q, k: (B, L, Hk, dk); v, o: (B, L, Hv, dv); g, beta: (B, L, Hv); s: (B, Hv, dk, dv)
    # in/out. Value head h reads key head h // r. One recurrence per (b, h), in order.
    nb, seq, hv = g.shape
    dk, dv = q.shape[3], v.shape[3]
    for bh in numba.prange(nb * hv):
        b, h = bh // hv, bh % hv
        j = h // r
        st = s[b, h]
        qn = np.empty(dk, np.float32)
        kn = np.empty(dk, np.float32)
        mem = np.empty(dv, np.float32)
        for t in range(seq):
            qs, ks = np.float32(1.0), np.float32(1.0)
            if l2:
                sq, sk = np.float32(0.0), np.float32(0.0)
                for i in range(dk):
                    sq += q[b, t, j, i] * q[b, t, j, i]
                    sk += k[b, t, j, i] * k[b, t, j, i]
                qs = np.float32(1.0) / np.sqrt(sq + np.float32(1e-6))
                ks = np.float32(1.0) / np.sqrt(sk + np.float32(1e-6))
            for i in range(dk):
                qn[i] = q[b, t, j, i] * qs * scale
                kn[i] = k[b, t, j, i] * ks
            decay = np.exp(g[b, t, h])
            for c in range(dv):
                mem[c] = np.float32(0.0)
            for i in range(dk):
                for c in range(dv):
                    st[i, c] *= decay
                    mem[c] += st[i, c] * kn[i]
            bt = beta[b, t, h]
            for c in range(dv):
                mem[c] = (v[b, t, h, c] - mem[c]) * bt          # the delta, scaled
            for c in range(dv):
                o[b, t, h, c] = np.float32(0.0)
            for i in range(dk):
                for c in range(dv):
                    st[i, c] += kn[i] * mem[c]
                    o[b, t, h, c] += st[i, c] * qn[i]


def _delta_rule_run(args, attrs):
    q, k, v, g, beta, *rest = (_f32(a) for a in args)
    hk = attrs["k_heads"]
    lead, seq = q.shape[:-2], q.shape[-2]
    hv = max(g.shape[-1], 1)
    dk, dv = max(q.shape[-1] // hk, 1), v.shape[-1] // hv
    want_s = (*lead, hv, dk, dv)
    ok = (q.ndim >= 2 and k.shape == q.shape and v.shape[:-1] == q.shape[:-1]
          and g.shape == beta.shape == (*q.shape[:-1], hv) and q.shape[-1] == hk * dk
          and v.shape[-1] >= hv
          and v.shape[-1] == hv * dv and hv % hk == 0 and (not rest or rest[0].shape == want_s))
    if not ok:
        shapes = ", ".join(format_shape(a.shape) for a in args)
        raise ValueError(f"gated_delta_rule: inputs {shapes} do not fit [..., seq, k_heads * "
                         f"dk] (k_heads {hk}) and state {format_shape(want_s)}")
    nb = int(np.prod(lead, dtype=np.int64))
    s = (rest[0].copy() if rest else np.zeros(want_s, np.float32)).reshape(nb, hv, dk, dv)
    o = np.empty((nb, seq, hv, dv), np.float32)
    scale = np.float32(dk ** -0.5 if attrs["scale"] is None else attrs["scale"])
    pick(_delta_rows, nb * hv * seq * dk * dv)(
        q.reshape(nb, seq, hk, dk), k.reshape(nb, seq, hk, dk), v.reshape(nb, seq, hv, dv),
        g.reshape(nb, seq, hv), beta.reshape(nb, seq, hv), s, o, hv // hk, scale,
        attrs["qk_l2norm"])
    o = o.reshape(v.shape)
    return [o, s.reshape(want_s)] if rest else [o]


RUN = {"causal_conv1d": _conv_run, "selective_scan": _scan_run, "linear_scan": _linear_scan_run,
       "gated_delta_rule": _delta_rule_run}
