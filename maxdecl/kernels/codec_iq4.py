"""IQ4_NL / IQ4_XS quantizers: 4-bit indices into GGML's non-linear grid ``kvalues_iq4nl``.

* IQ4_NL (18 bytes per 32 floats): fp16 d @0 | qs[16] @2; ``x = d * grid[q]``.
* IQ4_XS (136 bytes per 256 floats): fp16 d @0 | scales_h u16 @2 (2 high bits per
  sub-block) | scales_l[4] @4 (a low nibble per sub-block) | qs[128] @8;
  ``x = d * (sc[s] - 32) * grid[q]`` for sub-block ``s`` (32 floats).

In both, byte ``j`` of a 32-value sub-block's 16 bytes holds value ``j`` (low nibble)
and value ``16 + j`` (high nibble). The quantizers are GGML's
``quantize_row_iq4_nl_ref`` (no scale sweep) and ``quantize_row_iq4_xs_ref`` (a sweep of
15 candidate scales per sub-block, then 6-bit sub-block scales and a re-pick of the
indices), written in plain float32 without contraction so the bytes match GGML's.

One deliberate difference: for an IQ4_NL block whose max ``|x|`` is below 1e-15, the
older GGML builds leave the quants uninitialised (stack garbage, or the previous
block's); like current GGML we write index 0 there (``d`` is 0, so the block still
decodes to zeros).

``error_model="numpy"``: a float division by zero gives inf/NaN as in C instead of
raising (finite inputs whose range overflows float32 reach it); helpers called from
these kernels are compiled with the same flags.
"""
# ruff: noqa: PLR1730 -- explicit if-updates mirror the C reference (NaN behaviour too)

from __future__ import annotations

import numpy as np
from numba import njit, prange

from .codec_common import all_finite, f32_to_f16_bits, nearest_int
from .config import CACHE, EXACT

QK_K = 256
QK4_NL = 32
CHUNK = 64             # blocks per prange iteration (scratch is allocated per chunk)
GROUP_MAX_EPS = 1e-15  # GGML: a group whose max |x| is below this is all zero

# GGML's kvalues_iq4nl, as float32 (every entry is exact)
KVALUES = np.array([-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113],
                   dtype=np.float32)


@njit(cache=CACHE, fastmath=EXACT, error_model="numpy")
def _best_index(vals, v):
    """Index of the grid value nearest ``v`` (GGML ``best_index_int8``, ties go up).

    Binary search on the sorted grid; a NaN ``v`` ends on the last index like the C.
    """
    n = vals.shape[0]
    if v <= vals[0]:
        return 0
    if v >= vals[n - 1]:
        return n - 1
    ml = 0
    mu = n - 1
    while mu - ml > 1:
        mav = (ml + mu) // 2
        if v < vals[mav]:
            mu = mav
        else:
            ml = mav
    return mu - 1 if v - vals[mu - 1] < vals[mu] - v else mu


@njit(cache=CACHE, fastmath=EXACT, error_model="numpy")
def _iq4_sub_scale(x, off, vals, w, L, ntry):
    """Scale of one 32-value sub-block ``x[off:off+32]`` (weights ``x**2``).

    Picks indices for ``d = max / grid[0]`` (sign flipped when ``ntry > 0``), takes the
    least-squares ``d`` for them, then tries ``id = (t + grid[0]) / max`` for
    ``t = -ntry..ntry`` and keeps the best ``d``. Writes the first pick's indices
    into ``L[off:off+32]``. Returns 0 (and L = 0) for a group below GROUP_MAX_EPS.
    """
    for j in range(32):
        w[j] = x[off + j] * x[off + j]
    amax = np.float32(0.0)
    mx = np.float32(0.0)
    for j in range(32):
        ax = abs(x[off + j])
        if ax > amax:
            amax = ax
            mx = x[off + j]
    if amax < np.float32(GROUP_MAX_EPS):
        for j in range(32):
            L[off + j] = 0
        return np.float32(0.0)
    d = -mx / vals[0] if ntry > 0 else mx / vals[0]
    inv = np.float32(1.0) / d
    sumqx = np.float32(0.0)
    sumq2 = np.float32(0.0)
    for j in range(32):
        v = x[off + j]
        l = _best_index(vals, inv * v)
        L[off + j] = l
        q = vals[l]
        sumqx += w[j] * q * v
        sumq2 += w[j] * q * q
    d = sumqx / sumq2 if sumq2 > np.float32(0.0) else np.float32(0.0)
    best = d * sumqx
    for t in range(-ntry, ntry + 1):
        inv = (np.float32(t) + vals[0]) / mx
        sumqx = np.float32(0.0)
        sumq2 = np.float32(0.0)
        for j in range(32):
            v = x[off + j]
            q = vals[_best_index(vals, inv * v)]
            sumqx += w[j] * q * v
            sumq2 += w[j] * q * q
        if sumq2 > np.float32(0.0) and sumqx * sumqx > best * sumq2:
            d = sumqx / sumq2
            best = d * sumqx
    return d


@njit(cache=CACHE, fastmath=EXACT, error_model="numpy")
def _pack_nibbles(L, loff, out, qoff):
    # 32 indices L[loff:loff+32] -> 16 bytes out[qoff:qoff+16]
    for j in range(16):
        out[qoff + j] = L[loff + j] | (L[loff + 16 + j] << 4)


@njit(cache=CACHE, fastmath=EXACT, error_model="numpy", parallel=True)
def _iq4_nl_quantize(x, table, out, bad):
    # x: (nb, 32) f32 -> out: (nb, 18) u8 zeroed, bad: (nb,) u8 (1 where a NaN/Inf was seen)
    nb = x.shape[0]
    vals = KVALUES
    for c in prange((nb + CHUNK - 1) // CHUNK):
        L = np.zeros(QK4_NL, dtype=np.uint8)
        w = np.zeros(32, dtype=np.float32)
        for i in range(c * CHUNK, min(nb, (c + 1) * CHUNK)):
            if not all_finite(x[i]):
                bad[i] = 1
                continue
            s = _iq4_sub_scale(x[i], 0, vals, w, L, -1)
            hd = f32_to_f16_bits(s)
            out[i, 0] = hd & 0xFF
            out[i, 1] = hd >> 8
            _pack_nibbles(L, 0, out[i], 2)


@njit(cache=CACHE, fastmath=EXACT, error_model="numpy")
def _iq4_xs_block(x, table, out, vals, L, w, scales):
    # x: (256,) f32 -> out: (136,) u8 (zeroed); L (256,) u8, w (32,), scales (8,) f32: scratch
    max_scale = np.float32(0.0)
    amax_scale = np.float32(0.0)
    for ib in range(8):
        s = _iq4_sub_scale(x, 32 * ib, vals, w, L, 7)
        scales[ib] = s
        if abs(s) > amax_scale:
            amax_scale = abs(s)
            max_scale = s
    d = -max_scale / np.float32(32.0)
    hd = f32_to_f16_bits(d)
    out[0] = hd & 0xFF
    out[1] = hd >> 8
    inv = np.float32(1.0) / d if d != np.float32(0.0) else np.float32(0.0)
    sh = 0
    for ib in range(8):
        l = max(-32, min(31, nearest_int(inv * scales[ib])))
        dl = d * np.float32(l)
        idl = np.float32(1.0) / dl if dl != np.float32(0.0) else np.float32(0.0)
        for j in range(32):
            L[32 * ib + j] = _best_index(vals, idl * x[32 * ib + j])
        l += 32
        if ib % 2 == 0:
            out[4 + ib // 2] = l & 0x0F
        else:
            out[4 + ib // 2] |= np.uint8((l & 0x0F) << 4)
        sh |= (l >> 4) << (2 * ib)
    out[2] = sh & 0xFF
    out[3] = (sh >> 8) & 0xFF
    for ib in range(8):
        _pack_nibbles(L, 32 * ib, out, 8 + 16 * ib)


@njit(cache=CACHE, fastmath=EXACT, error_model="numpy", parallel=True)
def _iq4_xs_quantize(x, table, out, bad):
    # x: (nb, 256) f32 -> out: (nb, 136) u8 zeroed, bad: (nb,) u8 (1 where a NaN/Inf was seen)
    nb = x.shape[0]
    vals = KVALUES
    for c in prange((nb + CHUNK - 1) // CHUNK):
        L = np.zeros(QK_K, dtype=np.uint8)
        w = np.zeros(32, dtype=np.float32)
        scales = np.zeros(8, dtype=np.float32)
        for i in range(c * CHUNK, min(nb, (c + 1) * CHUNK)):
            if not all_finite(x[i]):
                bad[i] = 1
                continue
            _iq4_xs_block(x[i], table, out[i], vals, L, w, scales)
