"""Quantizers of GGML's Q4_1, Q5_1, TQ1_0 and TQ2_0, byte for byte gguf-py's.

Q4_1 / Q5_1: per 32 floats ``d = (max - min) / (2^bits - 1)`` and ``m = min``, each
``q = trunc((x - min) / d + 0.5)`` capped at ``2^bits - 1``. TQ1_0 / TQ2_0 (ternary,
per 256 floats): ``d = max |x|``, ``q = round(x / d)`` in {-1, 0, 1} stored as
``q + 1``; TQ2_0 packs four 2-bit digits a byte, TQ1_0 five base-3 digits a byte
(four in its last 4 bytes), scaled to fill the byte (``(v * 256 + 242) // 243``).
Every signature is ``(x (nb, be) f32, fp16 table, out (nb, bb) u8, bad (nb,) u8)``.
"""

from __future__ import annotations

import numpy as np
from numba import njit, prange

from .codec_common import all_finite, c_trunc_u8, f32_to_f16_bits
from .config import CACHE, EXACT


@njit(cache=CACHE, fastmath=EXACT, inline="always")
def _put_f16(out, i, at, f):
    h = f32_to_f16_bits(f)
    out[i, at] = np.uint8(h & 0xFF)
    out[i, at + 1] = np.uint8(h >> 8)


@njit(cache=CACHE, fastmath=EXACT, error_model="numpy")
def _min_scale(x, i, levels):
    # gguf-py: d = (max - min) / levels, id = 1 / d (0 when d is 0)
    mn = x[i, 0]
    mx = x[i, 0]
    for j in range(1, 32):
        v = x[i, j]
        if v < mn:
            mn = v
        if v > mx:
            mx = v
    d = (mx - mn) / np.float32(levels)
    idv = np.float32(1.0) / d if d != np.float32(0.0) else np.float32(0.0)
    return mn, d, idv


@njit(cache=CACHE, fastmath=EXACT, error_model="numpy", parallel=True)
def _q4_1_quantize(x, table, out, bad):
    # x: (nb, 32) -> out: (nb, 20): d f16 | m f16 | qs[16] (q[j] low nibble, q[j+16] high)
    for i in prange(x.shape[0]):
        if not all_finite(x[i]):
            bad[i] = 1
            continue
        mn, d, idv = _min_scale(x, i, 15)
        _put_f16(out, i, 0, d)
        _put_f16(out, i, 2, mn)
        for j in range(16):
            q0 = min(c_trunc_u8((x[i, j] - mn) * idv + np.float32(0.5)), 15)
            q1 = min(c_trunc_u8((x[i, j + 16] - mn) * idv + np.float32(0.5)), 15)
            out[i, 4 + j] = np.uint8(q0 | (q1 << 4))


@njit(cache=CACHE, fastmath=EXACT, error_model="numpy", parallel=True)
def _q5_1_quantize(x, table, out, bad):
    # x: (nb, 32) -> out: (nb, 24): d | m | qh u32 (bit j: 5th bit of q[j]) | qs[16]
    for i in prange(x.shape[0]):
        if not all_finite(x[i]):
            bad[i] = 1
            continue
        mn, d, idv = _min_scale(x, i, 31)
        _put_f16(out, i, 0, d)
        _put_f16(out, i, 2, mn)
        for j in range(16):
            q0 = min(c_trunc_u8((x[i, j] - mn) * idv + np.float32(0.5)), 31)
            q1 = min(c_trunc_u8((x[i, j + 16] - mn) * idv + np.float32(0.5)), 31)
            out[i, 8 + j] = np.uint8((q0 & 15) | ((q1 << 4) & 0xFF))
            out[i, 4 + j // 8] |= np.uint8((q0 >> 4) << (j % 8))
            out[i, 6 + j // 8] |= np.uint8((q1 >> 4) << (j % 8))


@njit(cache=CACHE, fastmath=EXACT, error_model="numpy")
def _ternary(x, i, j, idv):
    # GGML's lroundf(x * id) + 1: round half away from zero, as an int in {0, 1, 2}. A
    # block of subnormals has 1 / d = inf: lroundf of inf or NaN gives LONG_MIN, whose
    # low 32 bits (GGML keeps an int) are 0.
    v = x[i, j] * idv
    if not (abs(v) < np.float32(np.inf)):
        return np.int32(1)
    a = abs(v)
    fl = np.floor(a)
    r = fl + np.floor(np.float32(2.0) * (a - fl))
    if v < np.float32(0.0):
        r = -r
    return np.int32(r) + 1


@njit(cache=CACHE, fastmath=EXACT, error_model="numpy")
def _absmax(x, i):
    d = np.float32(0.0)
    for j in range(x.shape[1]):
        a = abs(x[i, j])
        if a > d:
            d = a
    idv = np.float32(1.0) / d if d != np.float32(0.0) else np.float32(0.0)
    return d, idv


@njit(cache=CACHE, fastmath=EXACT, error_model="numpy", parallel=True)
def _tq2_0_quantize(x, table, out, bad):
    # x: (nb, 256) -> out: (nb, 66): qs[64] (value 128g + 32s + l in bits 2s of byte
    # 32g + l) | d f16
    for i in prange(x.shape[0]):
        if not all_finite(x[i]):
            bad[i] = 1
            continue
        d, idv = _absmax(x, i)
        for g in range(2):
            for s in range(4):
                for l in range(32):
                    out[i, 32 * g + l] |= np.uint8(_ternary(x, i, 128 * g + 32 * s + l, idv)
                                                   << (2 * s))
        _put_f16(out, i, 64, d)


@njit(cache=CACHE, fastmath=EXACT, error_model="numpy")
def _trits(x, i, idv, start, width, digits):
    # byte l of a group: sum over n of digit (value start + width * n + l) * 3^(digits-1-n),
    # then scaled to 0..255 as (v * 256 + 242) // 243
    res = np.zeros(width, np.uint8)
    for l in range(width):
        v = np.int32(0)
        for n in range(digits):
            v = v * np.int32(3) + _ternary(x, i, start + width * n + l, idv)
        if digits == 4:
            v = v * np.int32(3)
        res[l] = np.uint8((v * np.int32(256) + np.int32(242)) // np.int32(243))
    return res


@njit(cache=CACHE, fastmath=EXACT, error_model="numpy", parallel=True)
def _tq1_0_quantize(x, table, out, bad):
    # x: (nb, 256) -> out: (nb, 54): qs[48] (values 0-159 in 32 bytes, 160-239 in 16) |
    # qh[4] (values 240-255) | d f16
    for i in prange(x.shape[0]):
        if not all_finite(x[i]):
            bad[i] = 1
            continue
        d, idv = _absmax(x, i)
        out[i, 0:32] = _trits(x, i, idv, 0, 32, 5)
        out[i, 32:48] = _trits(x, i, idv, 160, 16, 5)
        out[i, 48:52] = _trits(x, i, idv, 240, 4, 4)
        _put_f16(out, i, 52, d)
