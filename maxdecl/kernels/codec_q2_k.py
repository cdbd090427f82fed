"""Q2_K quantizer: 256 floats -> 16 x (4-bit scale, 4-bit min) + 256 2-bit quants + fp16 d, dmin.

``x = d * sc[s] * q - dmin * m[s]`` for sub-block ``s`` (16 floats), ``q`` in 0..3.
The quantizer is GGML's ``quantize_row_q2_K_ref``: per sub-block a weighted search
like Q4_K's ``make_qkx2_quants`` but scoring candidates by weighted *absolute*
error (weights ``|x|``), then 4-bit scales and mins relative to the block maxima.
Plain float32 without contraction, so the bytes match GGML's.

Block layout (84 bytes): scales[16] @0 (low nibble scale, high nibble min of
sub-block ``s``) | qs[64] @16 | d @80 | dmin @82. Value ``128g + 32k + l``
(``g < 2``, ``k < 4``, ``l < 32``) is bits ``2k..2k+1`` of ``qs[32g + l]``.

``error_model="numpy"``: a float division by zero gives inf/NaN as in C instead of
raising (finite inputs whose range overflows float32 reach it); helpers called from
these kernels are compiled with the same flags.
"""
# ruff: noqa: PLR1730 -- explicit if-updates mirror the C reference (NaN behaviour too)

from __future__ import annotations

import numpy as np
from numba import njit, prange

from .codec_common import all_finite, f32_to_f16_bits, nearest_int
from .codec_q4_k import _make_qkx2_quants
from .config import CACHE, EXACT

QK_K = 256
CHUNK = 64  # blocks per prange iteration (scratch buffers are allocated per chunk)

_SC, _QS, _D, _DMIN = 0, 16, 80, 82


@njit(cache=CACHE, fastmath=EXACT, error_model="numpy")
def _q2_k_block(x, table, out, L, laux, w, scales, mins):
    # x: (256,) f32 -> out: (84,) u8 (zeroed); L, laux, w, scales, mins: scratch
    q4scale = np.float32(15.0)
    max_scale = np.float32(0.0)
    max_min = np.float32(0.0)
    for j in range(16):
        for l in range(16):
            w[l] = abs(x[16 * j + l])
        s, m = _make_qkx2_quants(x, 16 * j, 16, 3, w, L, 16 * j, laux,
                                 np.float32(-0.5), np.float32(0.1), 15, True)
        scales[j] = s
        mins[j] = m
        if s > max_scale:
            max_scale = s
        if m > max_min:
            max_min = m
    if max_scale > np.float32(0.0):
        iscale = q4scale / max_scale
        for j in range(16):
            out[_SC + j] = nearest_int(iscale * scales[j]) & 0xFF   # low byte, as C stores it
        hd = f32_to_f16_bits(max_scale / q4scale)
    else:
        hd = f32_to_f16_bits(np.float32(0.0))
    if max_min > np.float32(0.0):
        iscale = q4scale / max_min
        for j in range(16):
            out[_SC + j] |= np.uint8((nearest_int(iscale * mins[j]) << 4) & 0xFF)
        hm = f32_to_f16_bits(max_min / q4scale)
    else:
        hm = f32_to_f16_bits(np.float32(0.0))
    out[_D] = hd & 0xFF
    out[_D + 1] = hd >> 8
    out[_DMIN] = hm & 0xFF
    out[_DMIN + 1] = hm >> 8
    fd = table[hd]
    fm = table[hm]
    for j in range(16):
        sc = np.int32(out[_SC + j])
        d = fd * np.float32(sc & 0x0F)
        if d == np.float32(0.0):
            continue                     # keep the sub-block quants the search chose
        dm = fm * np.float32(sc >> 4)
        for ii in range(16):
            L[16 * j + ii] = max(0, min(3, nearest_int((x[16 * j + ii] + dm) / d)))
    for g in range(2):
        for l in range(32):
            b = 128 * g + l
            out[_QS + 32 * g + l] = (L[b] | (L[b + 32] << 2) | (L[b + 64] << 4)
                                     | (L[b + 96] << 6))


@njit(cache=CACHE, fastmath=EXACT, error_model="numpy", parallel=True)
def _q2_k_quantize(x, table, out, bad):
    # x: (nb, 256) f32 -> out: (nb, 84) u8 zeroed, bad: (nb,) u8 (1 where a NaN/Inf was seen)
    nb = x.shape[0]
    for c in prange((nb + CHUNK - 1) // CHUNK):
        L = np.zeros(QK_K, dtype=np.uint8)
        laux = np.zeros(16, dtype=np.uint8)
        w = np.zeros(16, dtype=np.float32)
        scales = np.zeros(16, dtype=np.float32)
        mins = np.zeros(16, dtype=np.float32)
        for i in range(c * CHUNK, min(nb, (c + 1) * CHUNK)):
            if not all_finite(x[i]):
                bad[i] = 1
                continue
            _q2_k_block(x[i], table, out[i], L, laux, w, scales, mins)
