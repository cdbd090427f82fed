"""bf16 <-> float32 kernels (GGML ``ggml_compute_fp32_to_bf16`` / ``_bf16_to_fp32``)."""

from __future__ import annotations

import numpy as np
from numba import njit, prange

from .config import CACHE, EXACT


@njit(cache=CACHE, fastmath=EXACT, parallel=True)
def _bf16_quantize(x, out):
    # x: (n,) u32 (float32 bits) -> out: (n,) u16
    for i in prange(x.shape[0]):
        n = x[i]
        if (n & np.uint32(0x7FFFFFFF)) > np.uint32(0x7F800000):
            # NaN: keep sign and top payload bits, force the quiet bit (64 << 16)
            q = (n & np.uint32(0xFFFF0000)) | np.uint32(0x00400000)
            out[i] = np.uint16(q >> np.uint32(16))
        else:
            # round to nearest even on the 16 dropped bits; never overflows 32 bits here
            out[i] = np.uint16((n + (np.uint32(0x7FFF) + ((n >> np.uint32(16)) & np.uint32(1))))
                               >> np.uint32(16))
