"""Q5_K quantizer: 256 floats -> fp16 d, dmin + 8 x (6-bit scale, 6-bit min) + 256 5-bit quants.

``x = d * sc[s] * q - dmin * m[s]`` for sub-block ``s`` (32 floats), ``q`` in 0..31.
The quantizer is GGML's ``quantize_row_q5_K_ref``: the same weighted search as Q4_K
(``make_qkx2_quants``, here with 31 levels and a narrower step sweep) and the same
12-byte scale/min packing, written in plain float32 without contraction so that the
bytes match GGML's.

Block layout (176 bytes): d @0 | dmin @2 | scales[12] @4 | qh[32] @16 | qs[128] @48.
Chunk ``c`` (64 values): byte ``qs[32c + l]`` holds the low 4 bits of value ``64c + l``
(low nibble) and of ``64c + 32 + l`` (high nibble); the 5th bit of value ``32t + l``
is bit ``t`` of ``qh[l]``.

``error_model="numpy"``: a float division by zero gives inf/NaN as in C instead of
raising (finite inputs whose range overflows float32 reach it); helpers called from
these kernels are compiled with the same flags.
"""
# ruff: noqa: PLR1730 -- explicit if-updates mirror the C reference (NaN behaviour too)

from __future__ import annotations

import numpy as np
from numba import njit, prange

from .codec_common import all_finite
from .codec_q4_k import _scales_mins_quants
from .config import CACHE, EXACT

QK_K = 256
CHUNK = 64  # blocks per prange iteration (scratch buffers are allocated per chunk)

_QH, _QS = 16, 48   # after q4_k's header: d @0, dmin @2, scales @4


@njit(cache=CACHE, fastmath=EXACT, error_model="numpy")
def _q5_k_block(x, table, out, L, laux, w, scales, mins):
    # x: (256,) f32 -> out: (176,) u8 (zeroed); L, laux, w, scales, mins: scratch
    _scales_mins_quants(x, table, out, L, laux, w, scales, mins, 31, np.float32(-0.5), 15)
    for c in range(4):
        for l in range(32):
            l1 = L[64 * c + l]
            l2 = L[64 * c + 32 + l]
            h = out[_QH + l]
            if l1 > 15:
                l1 -= 16
                h |= np.uint8(1 << (2 * c))
            if l2 > 15:
                l2 -= 16
                h |= np.uint8(2 << (2 * c))
            out[_QH + l] = h
            out[_QS + 32 * c + l] = l1 | (l2 << 4)


@njit(cache=CACHE, fastmath=EXACT, error_model="numpy", parallel=True)
def _q5_k_quantize(x, table, out, bad):
    # x: (nb, 256) f32 -> out: (nb, 176) u8 zeroed, bad: (nb,) u8 (1 where a NaN/Inf was seen)
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
            _q5_k_block(x[i], table, out[i], L, laux, w, scales, mins)
