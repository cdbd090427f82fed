"""Q4_0 kernels: 32 floats -> fp16 scale d + 32 4-bit quants, x = d * (q - 8)."""

from __future__ import annotations

import numpy as np
from numba import njit, prange

from .codec_common import c_trunc_u8, f32_to_f16_bits
from .config import CACHE, EXACT


@njit(cache=CACHE, fastmath=EXACT, error_model="numpy", parallel=True)
def _q4_0_quantize(x, out, bad):
    # x: (nb, 32) f32 -> out: (nb, 18) u8, bad: (nb,) u8 (1 where a NaN/Inf was seen)
    for i in prange(x.shape[0]):
        # gguf-py: vmax = x[argmax |x|] (first of equals). GGML's C starts from +0.0 instead,
        # which differs only in the sign of d = -0.0 / +0.0 for an all-zero block.
        vmax = x[i, 0]
        amax = abs(vmax)
        finite = True
        for j in range(32):
            v = x[i, j]
            if not (abs(v) < np.float32(np.inf)):
                finite = False
            if amax < abs(v):          # strict: the first element of largest |x| wins
                amax = abs(v)
                vmax = v
        if not finite:
            bad[i] = 1
            continue
        d = vmax / np.float32(-8.0)
        idv = np.float32(1.0) / d if d != np.float32(0.0) else np.float32(0.0)
        h = f32_to_f16_bits(d)
        out[i, 0] = np.uint8(h & 0xFF)
        out[i, 1] = np.uint8(h >> 8)
        for j in range(16):
            # gguf-py: trunc(x * id + 8.5) cast to uint8, then clip to [0, 15]
            q0 = min(c_trunc_u8(x[i, j] * idv + np.float32(8.5)), 15)
            q1 = min(c_trunc_u8(x[i, j + 16] * idv + np.float32(8.5)), 15)
            out[i, 2 + j] = np.uint8(q0 | (q1 << 4))
