"""Q4_K kernels: 256 floats -> fp16 d, dmin + 8 x (6-bit scale, 6-bit min) + 256 4-bit quants.

``x = d * sc[s] * q - dmin * m[s]`` for sub-block ``s`` (32 floats). The quantizer
is GGML's ``quantize_row_q4_K_ref`` (``make_qkx2_quants`` per sub-block), written
in plain float32 without contraction so that the bytes match GGML's.
"""
# ruff: noqa: PLR1730 -- explicit if-updates mirror the C reference (NaN behaviour too)

from __future__ import annotations

import numpy as np
from numba import njit, prange

from .block_rows import _q4k_scale_min
from .codec_common import all_finite, f32_to_f16_bits, nearest_int
from .config import CACHE, EXACT

QK_K = 256
CHUNK = 64  # blocks per prange iteration (scratch buffers are allocated per chunk)

# Byte offsets inside one 144-byte block (see maxdecl/codecs/q4_k.py for the table).
_D, _DMIN, _SC, _QS = 0, 2, 4, 16


@njit(cache=CACHE, fastmath=EXACT, error_model="numpy")
def _make_qkx2_quants(x, off, n, nmax, w, L, loff, laux, rmin, rdelta, nstep, use_mad=False):
    """GGML ``make_qkx2_quants``: fit ``x ~ scale * L - the_min``, each candidate scored
    by ``sum w * error^2`` (or ``sum w * |error|`` with ``use_mad``, as q2_k does).

    Returns ``(scale, the_min)``; writes the chosen quants into ``L[loff:loff+n]``.
    """
    # explicit ``if`` updates (not min/max) mirror the C reference statement for statement
    mn = x[off]
    mx = x[off]
    sum_w = w[0]
    sum_x = sum_w * x[off]
    for i in range(1, n):
        v = x[off + i]
        if v < mn:
            mn = v
        if v > mx:
            mx = v
        sum_w += w[i]
        sum_x += w[i] * v
    if mn > np.float32(0.0):
        mn = np.float32(0.0)
    if mx == mn:
        for i in range(n):
            L[loff + i] = 0
        return np.float32(0.0), -mn
    fnmax = np.float32(nmax)
    iscale = fnmax / (mx - mn)
    scale = np.float32(1.0) / iscale
    best_error = np.float32(0.0)
    for i in range(n):
        v = x[off + i]
        l = max(0, min(nmax, nearest_int(iscale * (v - mn))))
        L[loff + i] = l
        diff = scale * np.float32(l) + mn - v
        best_error += w[i] * (abs(diff) if use_mad else diff * diff)
    for step in range(nstep + 1):
        iscale = (rmin + rdelta * np.float32(step) + fnmax) / (mx - mn)
        sum_l = np.float32(0.0)
        sum_l2 = np.float32(0.0)
        sum_xl = np.float32(0.0)
        for i in range(n):
            v = x[off + i]
            l = max(0, min(nmax, nearest_int(iscale * (v - mn))))
            laux[i] = l
            fl = np.float32(l)
            sum_l += w[i] * fl
            sum_l2 += w[i] * fl * fl
            sum_xl += w[i] * fl * v
        D = sum_w * sum_l2 - sum_l * sum_l
        if D > np.float32(0.0):
            this_scale = (sum_w * sum_xl - sum_x * sum_l) / D
            this_min = (sum_l2 * sum_x - sum_l * sum_xl) / D
            if this_min > np.float32(0.0):
                this_min = np.float32(0.0)
                this_scale = sum_xl / sum_l2
            cur_error = np.float32(0.0)
            for i in range(n):
                diff = this_scale * np.float32(laux[i]) + this_min - x[off + i]
                cur_error += w[i] * (abs(diff) if use_mad else diff * diff)
            if cur_error < best_error:
                for i in range(n):
                    L[loff + i] = laux[i]
                best_error = cur_error
                scale = this_scale
                mn = this_min
    return scale, -mn


@njit(cache=CACHE, fastmath=EXACT, error_model="numpy")
def _scales_mins_quants(x, table, out, L, laux, w, scales, mins, nmax, rmin, nstep):
    # The part q4_k and q5_k share (their first 16 bytes are laid out alike): per 32-float
    # sub-block a make_qkx2_quants fit, the 6-bit scales and mins packed into out[4:16],
    # d and dmin into out[0:4], then every quant (0..nmax) into L against the rounded
    # scales. x: (256,) f32; L, laux, w, scales, mins: scratch
    max_scale = np.float32(0.0)          # sub-block scales are >= 0 once the min is taken out
    max_min = np.float32(0.0)
    for j in range(8):
        sum_x2 = np.float32(0.0)
        for l in range(32):
            sum_x2 += x[32 * j + l] * x[32 * j + l]
        av_x = np.sqrt(sum_x2 / np.float32(32.0))
        for l in range(32):
            w[l] = av_x + abs(x[32 * j + l])
        s, m = _make_qkx2_quants(x, 32 * j, 32, nmax, w, L, 32 * j, laux,
                                 rmin, np.float32(0.1), nstep)
        scales[j] = s
        mins[j] = m
        if s > max_scale:
            max_scale = s
        if m > max_min:
            max_min = m
    inv_scale = np.float32(63.0) / max_scale if max_scale > np.float32(0.0) else np.float32(0.0)
    inv_min = np.float32(63.0) / max_min if max_min > np.float32(0.0) else np.float32(0.0)
    for j in range(8):
        # C stores nearest_int() into a uint8 (keeps the low byte) before MIN(63, .)
        ls = min(63, nearest_int(inv_scale * scales[j]) & 0xFF)
        lm = min(63, nearest_int(inv_min * mins[j]) & 0xFF)
        if j < 4:
            out[_SC + j] = ls
            out[_SC + j + 4] = lm
        else:
            out[_SC + j + 4] = (ls & 0x0F) | ((lm & 0x0F) << 4)
            out[_SC + j - 4] |= np.uint8((ls >> 4) << 6)
            out[_SC + j] |= np.uint8((lm >> 4) << 6)
    hd = f32_to_f16_bits(max_scale / np.float32(63.0))
    hm = f32_to_f16_bits(max_min / np.float32(63.0))
    out[_D] = hd & 0xFF
    out[_D + 1] = hd >> 8
    out[_DMIN] = hm & 0xFF
    out[_DMIN + 1] = hm >> 8
    fd = table[hd]
    fm = table[hm]
    for j in range(8):
        sc, m = _q4k_scale_min(out, _SC, j)
        d = fd * np.float32(sc)
        if d == np.float32(0.0):
            continue                     # keep the sub-block quants make_qkx2 chose
        dm = fm * np.float32(m)
        for ii in range(32):
            L[32 * j + ii] = max(0, min(nmax, nearest_int((x[32 * j + ii] + dm) / d)))


@njit(cache=CACHE, fastmath=EXACT, error_model="numpy")
def _q4_k_block(x, table, out, L, laux, w, scales, mins):
    # x: (256,) f32 -> out: (144,) u8; L, laux, w, scales, mins: scratch
    _scales_mins_quants(x, table, out, L, laux, w, scales, mins, 15, np.float32(-1.0), 20)
    for g in range(4):
        for l in range(32):
            out[_QS + 32 * g + l] = L[64 * g + l] | (L[64 * g + 32 + l] << 4)


@njit(cache=CACHE, fastmath=EXACT, error_model="numpy", parallel=True)
def _q4_k_quantize(x, table, out, bad):
    # x: (nb, 256) f32 -> out: (nb, 144) u8, bad: (nb,) u8 (1 where a NaN/Inf was seen)
    nb = x.shape[0]
    for c in prange((nb + CHUNK - 1) // CHUNK):
        L = np.zeros(QK_K, dtype=np.uint8)
        laux = np.zeros(32, dtype=np.uint8)
        w = np.zeros(32, dtype=np.float32)
        scales = np.zeros(8, dtype=np.float32)
        mins = np.zeros(8, dtype=np.float32)
        for i in range(c * CHUNK, min(nb, (c + 1) * CHUNK)):
            if not all_finite(x[i]):
                bad[i] = 1
                continue
            _q4_k_block(x[i], table, out[i], L, laux, w, scales, mins)
