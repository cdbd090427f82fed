"""Q5_0: blocks of 32 floats as one fp16 scale and 32 signed 5-bit quants (GGML ``block_q5_0``).

Written against the public protocol only, exactly as a user's plugin encoding
would be: it imports nothing private from maxdecl, builds its own numba kernels
on first use, and registers itself with ``maxdecl.codecs.register``.
``x[j] = d * (q[j] - 16)`` with ``d = max / -16`` (``max``: the element of largest
magnitude, sign kept).
"""

from __future__ import annotations

import numpy as np

from maxdecl.codecs import (bytes_to_blocks, output_array, raise_if_flagged, register,
                            rows_to_blocks)

QK5_0 = 32  # floats per block
_KERNELS: dict = {}


def _kernels():
    """(quantize, dequantize) numba kernels, compiled (or loaded from cache) on first use."""
    if _KERNELS:
        return _KERNELS["q"], _KERNELS["dq"]
    import numba

    @numba.njit(cache=True, parallel=True)
    def quantize(x, d, out, bad):
        # x: (nb, 32) f32 -> d: (nb,) f32 (rounded to fp16 by the caller), out: (nb, 22) u8
        for i in numba.prange(x.shape[0]):
            vmax = x[i, 0]                     # gguf-py: x[argmax |x|] (C starts at +0.0,
            amax = abs(vmax)                   # which flips the sign of d = 0 in zero blocks)
            for j in range(QK5_0):
                v = x[i, j]
                if not (abs(v) < np.float32(np.inf)):
                    bad[i] = 1
                if amax < abs(v):              # strict: the first element of largest |x| wins
                    amax = abs(v)
                    vmax = v
            di = vmax / np.float32(-16.0)
            idv = np.float32(1.0) / di if di != np.float32(0.0) else np.float32(0.0)
            d[i] = di
            qh = 0
            for j in range(QK5_0):
                # gguf-py: trunc(x * id + 16.5).astype(uint8).clip(0, 31); the uint8 cast is
                # x86's: int32 truncation keeping the low byte (NaN, Inf, |t| >= 2**31 give 0)
                t = x[i, j] * idv + np.float32(16.5)
                q = min((np.int64(t) & 0xFF) if abs(t) < np.float32(2147483648.0) else 0, 31)
                qh |= (q >> 4) << j
                if j < 16:
                    out[i, 6 + j] = q & 0x0F                   # q[j]: low nibble
                else:
                    out[i, 6 + j - 16] |= (q & 0x0F) << 4      # q[j + 16]: high nibble
            for k in range(4):
                out[i, 2 + k] = (qh >> (8 * k)) & 0xFF

    @numba.njit(cache=True, parallel=True)
    def dequantize(b, f16, out):
        # b: (nb, 22) u8, f16: (65536,) f32 fp16 -> f32 -> out: (nb, 32) f32
        #
        # byte  0-1 | 2    3     4     5     | 6 .. 21
        #       d   | qh: bit j of the LE u32 | qs[j] = q[j] & 15 | (q[j + 16] & 15) << 4
        #           |  = bit 4 of q[j]        |
        # x[j] = d * (q[j] - 16),  q[j] = low 4 bits from qs | bit 4 from qh
        half = out.shape[1] // 2
        for i in numba.prange(b.shape[0]):
            d = f16[np.int64(b[i, 0]) | (np.int64(b[i, 1]) << 8)]
            qh = (np.int64(b[i, 2]) | (np.int64(b[i, 3]) << 8)
                  | (np.int64(b[i, 4]) << 16) | (np.int64(b[i, 5]) << 24))
            for j in range(half):          # run-time trip count: vectorised, not unrolled
                q0 = (np.int64(b[i, 6 + j]) & 0x0F) | (((qh >> j) & 1) << 4)
                out[i, j] = d * np.float32(np.int32(q0) - 16)
            for j in range(half):
                q1 = (np.int64(b[i, 6 + j]) >> 4) | (((qh >> (j + half)) & 1) << 4)
                out[i, j + half] = d * np.float32(np.int32(q1) - 16)

    # fp16 -> float32 of every bit pattern (NumPy's exact conversion), read by dequantize
    f16 = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16).view(np.float16)
    _KERNELS.update(q=quantize, dq=dequantize, f16=f16.astype(np.float32))
    return quantize, dequantize


class Q5_0Encoding:
    """GGML Q5_0 (``quantize_row_q5_0_ref`` / ``dequantize_row_q5_0``)."""

    name = "q5_0"
    block_elements = QK5_0
    block_bytes = (
        2             # d: fp16 block scale
        + 4           # qh: bit j of this little-endian uint32 is bit 4 of q[j]
        + QK5_0 // 2  # qs: byte j = q[j] bits 3-0 (low nibble) | q[j + 16] bits 3-0 << 4
    )

    def quantize(self, x: np.ndarray) -> np.ndarray:
        """float32 ``[..., K]`` (K % 32 == 0) -> uint8 ``[..., K // 32 * 22]``.

        Bit-identical to ``gguf.quants.quantize(x, GGMLQuantizationType.Q5_0)``.
        """
        blocks, out_shape = rows_to_blocks(self, x)
        nb = blocks.shape[0]
        d = np.empty(nb, dtype=np.float32)
        out = np.empty((nb, self.block_bytes), dtype=np.uint8)
        bad = np.zeros(nb, dtype=np.uint8)
        quantize, _ = _kernels()
        quantize(blocks, d, out, bad)
        raise_if_flagged(self, bad, x.shape)
        with np.errstate(over="ignore"):   # NumPy's fp16 rounds to nearest even; > 65504 is inf
            out[:, :2] = d.astype(np.float16).view(np.uint8).reshape(nb, 2)
        return out.reshape(out_shape)

    def dequantize(self, data: np.ndarray, shape, out: np.ndarray | None = None) -> np.ndarray:
        """uint8 Q5_0 blocks -> float32 of logical ``shape`` (bit-identical to GGML)."""
        blocks, shape = bytes_to_blocks(self, data, shape)
        out = output_array(self.name, shape, out)
        _, dequantize = _kernels()
        dequantize(blocks, _KERNELS["f16"], out.reshape(-1, QK5_0))
        return out


Q5_0 = register(Q5_0Encoding())
