"""Scaled dot-product attention: causal / sliding-window masks, ALiBi, soft-capping,
grouped-query heads. One task = (batch, query head, block of query rows), in parallel.

Per query row the kernel computes scores only over the keys the row may see, as
four dot products at a time (``K`` row-major, so each dot runs along head_dim and
LLVM keeps four vector accumulators), a softmax with a vectorisable ``exp``, then
``P @ V`` as four dots at a time against ``V`` transposed.
"""

from __future__ import annotations

import math

import numba
import numpy as np

from ._dispatch import njit_twins, pick
from .config import CACHE, FASTMATH
from .vmath import expf

_QB = 8  # query rows per task


@numba.njit(cache=CACHE, fastmath=FASTMATH, inline="always")
def _softmax_inplace(sc, n):
    # sc[:n] <- softmax(sc[:n]), the max subtracted first (both attention kernels)
    m = sc[0]
    for j in range(1, n):
        m = max(m, sc[j])
    tot = np.float32(0)
    for j in range(n):
        e = expf(sc[j] - m)
        sc[j] = e
        tot += e
    inv = np.float32(1) / tot
    for j in range(n):
        sc[j] *= inv


@numba.njit(cache=CACHE, inline="always")
def _key_range(pos, T, causal, window):
    # keys [lo, hi) a query at absolute position pos may see: j <= pos when causal,
    # pos - j < window when window > 0
    lo = max(0, pos - window + 1) if window > 0 else 0
    hi = min(T, pos + 1) if causal else T
    return lo, hi


@numba.njit(cache=CACHE, fastmath=FASTMATH, inline="always")
def _dots4(a, m, lo, hi, col, out, o0):
    # out[o0 + j - lo] = a . m[j, col...]  for j in [lo, hi), rows of m taken four at a time
    # a: (L,) f32; m: (R, L) f32 with the dot over m's last axis starting at col
    L = a.shape[0]
    j = lo
    while j + 4 <= hi:
        s0 = np.float32(0)
        s1 = np.float32(0)
        s2 = np.float32(0)
        s3 = np.float32(0)
        m0 = m[j]
        m1 = m[j + 1]
        m2 = m[j + 2]
        m3 = m[j + 3]
        for d in range(L):
            ad = a[d]
            s0 += ad * m0[col + d]
            s1 += ad * m1[col + d]
            s2 += ad * m2[col + d]
            s3 += ad * m3[col + d]
        out[o0 + j - lo] = s0
        out[o0 + j - lo + 1] = s1
        out[o0 + j - lo + 2] = s2
        out[o0 + j - lo + 3] = s3
        j += 4
    while j < hi:
        s = np.float32(0)
        mj = m[j]
        for d in range(L):
            s += a[d] * mj[col + d]
        out[o0 + j - lo] = s
        j += 1


@njit_twins(fastmath=FASTMATH)
def _attention(q, k, vt, out, scale, causal, window, slopes, softcap, q_offset):
    # q: (B, Hq, S, D) f32; k: (B, Hkv, T, D) f32; vt: (B, Hkv, Dv, T) f32 (V transposed)
    # out: (B, Hq, S, Dv) f32; slopes: (Hq,) f32 ALiBi slopes (all 0: none)
    # query i sits at absolute position q_offset + i; it sees key j when j <= pos (causal)
    # and pos - j < window (window > 0); score = softcap*tanh(s/softcap) + slope*(j - pos)
    B, Hq, S, D = q.shape
    Hkv = k.shape[1]
    T = k.shape[2]
    Dv = vt.shape[2]
    group = Hq // Hkv
    nblk = (S + _QB - 1) // _QB
    for task in numba.prange(B * Hq * nblk):
        b = task // (Hq * nblk)
        h = (task // nblk) % Hq
        i0 = (task % nblk) * _QB
        hk = h // group
        slope = slopes[h]
        kh = k[b, hk]
        vh = vt[b, hk]
        qs = np.empty(D, np.float32)
        sc = np.empty(T, np.float32)
        for i in range(i0, min(i0 + _QB, S)):
            pos = q_offset + i
            lo, hi = _key_range(pos, T, causal, window)
            orow = out[b, h, i]
            if hi <= lo:
                orow[:] = 0.0
                continue
            for d in range(D):
                qs[d] = q[b, h, i, d] * scale
            _dots4(qs, kh, lo, hi, 0, sc, 0)
            n = hi - lo
            if softcap > 0:
                for j in range(n):
                    sc[j] = softcap * math.tanh(sc[j] / softcap)
            if slope != 0:
                for j in range(n):
                    sc[j] += slope * np.float32(lo + j - pos)
            _softmax_inplace(sc, n)
            # out[e] = sum_j p[j] v[j, e] = p . vt[e, lo:hi]
            _dots4(sc[:n], vh, 0, Dv, lo, orow, 0)


@njit_twins(fastmath=FASTMATH)
def _attention_few(q, k, v, out, scale, causal, window, slopes, softcap, q_offset):
    # Few query rows (decode): k, v read in place, no transposes.
    # q: (B, S, Hq, D) f32; k: (B, T, Hkv, D) f32; v: (B, T, Hkv, Dv) f32
    # out: (B, S, Hq, Dv) f32; same masks and score order as _attention
    B, S, Hq, D = q.shape
    Hkv = k.shape[2]
    T = k.shape[1]
    Dv = v.shape[3]
    group = Hq // Hkv
    for task in numba.prange(B * Hq * S):
        b = task // (Hq * S)
        h = (task // S) % Hq
        i = task % S
        hk = h // group
        pos = q_offset + i
        lo, hi = _key_range(pos, T, causal, window)
        orow = out[b, i, h]
        orow[:] = 0.0
        if hi <= lo:
            continue
        qs = np.empty(D, np.float32)
        for d in range(D):
            qs[d] = q[b, i, h, d] * scale
        n = hi - lo
        sc = np.empty(n, np.float32)
        for j in range(n):
            kr = k[b, lo + j, hk]
            t = np.float32(0)
            for d in range(D):
                t += qs[d] * kr[d]
            if softcap > 0:
                t = softcap * math.tanh(t / softcap)
            t += slopes[h] * np.float32(lo + j - pos)
            sc[j] = t
        _softmax_inplace(sc, n)
        for j in range(n):
            p = sc[j]
            vr = v[b, lo + j, hk]
            for e in range(Dv):
                orow[e] += p * vr[e]


_FEW_ROWS = 16  # up to this many query rows take the in-place path: each row computed as
                # a one-row decode step computes it, so a verify step of prompt lookup
                # (up to 16 rows) gets exactly the numbers of plain decoding


class _ShapeText:
    """The shapes of q, k, v as error text, formatted only when an error needs it."""

    def __init__(self, qs, ks, vs):
        self.shapes = qs, ks, vs

    def __format__(self, spec):
        qs, ks, vs = self.shapes
        return f"q{list(qs)}, k{list(ks)}, v{list(vs)}"


def _check_shapes(q, k, v, slopes) -> None:
    """ValueError unless the kernels can index q, k, v and slopes without reading past them."""
    qs, ks, vs = np.shape(q), np.shape(k), np.shape(v)
    if len(qs) != 4 or len(ks) != 4 or len(vs) != 4:
        raise ValueError(f"attention: q, k, v must be [batch, seq, heads, head_dim]; got "
                         f"q{list(qs)}, k{list(ks)}, v{list(vs)}")
    shapes = _ShapeText(qs, ks, vs)
    (B, _, Hq, D), (Bk, T, Hkv, Dk), (Bv, Tv, Hv, _) = qs, ks, vs
    if not B == Bk == Bv:
        raise ValueError(f"attention: batch sizes differ: {shapes}")
    if T != Tv:
        raise ValueError(f"attention: k and v must have the same length; got {shapes}")
    if Hkv != Hv or D != Dk:
        raise ValueError(f"attention: k must match v in heads and q in head_dim; got {shapes}")
    if Hq and (Hkv == 0 or Hq % Hkv):
        raise ValueError(f"attention: query heads {Hq} must be a multiple of key/value heads "
                         f"{Hkv}; got {shapes}")
    if slopes is not None and np.size(slopes) != Hq:
        raise ValueError(f"attention: {np.size(slopes)} alibi slopes for {Hq} query heads")


def attention(q, k, v, scale, causal, window, slopes, softcap, q_offset) -> np.ndarray:
    """q: (B, S, Hq, D), k: (B, T, Hkv, D), v: (B, T, Hkv, Dv) -> (B, S, Hq, Dv) float32."""
    _check_shapes(q, k, v, slopes)
    if q.shape[1] <= _FEW_ROWS:
        qc = np.ascontiguousarray(q, dtype=np.float32)
        kc = np.ascontiguousarray(k, dtype=np.float32)
        vc = np.ascontiguousarray(v, dtype=np.float32)
        B, S, Hq, _ = qc.shape
        out = np.empty((B, S, Hq, vc.shape[3]), np.float32)
        sl = (np.zeros(Hq, np.float32) if slopes is None
              else np.asarray(slopes, dtype=np.float32).reshape(Hq))
        if out.size:
            pick(_attention_few, Hq * S * kc.shape[1] * qc.shape[3])(
                qc, kc, vc, out, np.float32(scale), bool(causal), int(window or 0), sl,
                np.float32(softcap or 0.0), int(q_offset))
        return out
    qh = np.ascontiguousarray(np.transpose(q, (0, 2, 1, 3)), dtype=np.float32)
    kh = np.ascontiguousarray(np.transpose(k, (0, 2, 1, 3)), dtype=np.float32)
    vt = np.ascontiguousarray(np.transpose(v, (0, 2, 3, 1)), dtype=np.float32)
    B, Hq, S, _ = qh.shape
    out = np.empty((B, Hq, S, vt.shape[2]), np.float32)
    sl = (np.zeros(Hq, np.float32) if slopes is None
          else np.asarray(slopes, dtype=np.float32).reshape(Hq))
    if out.size:
        pick(_attention, Hq * S * kh.shape[2] * qh.shape[3])(qh, kh, vt, out, np.float32(scale), bool(causal),
                   int(window or 0), sl, np.float32(softcap or 0.0), int(q_offset))
    return np.ascontiguousarray(np.transpose(out, (0, 2, 1, 3)))
