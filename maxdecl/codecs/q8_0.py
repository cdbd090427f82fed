"""Q8_0: blocks of 32 floats as one fp16 scale and 32 int8 quants (GGML ``block_q8_0``).

Written against the public protocol only, exactly as a user's plugin encoding
would be: it imports nothing private from maxdecl, builds its own numba kernels
on first use, and registers itself with ``maxdecl.codecs.register``.
``x[j] = d * q[j]`` with ``d = max|x| / 127`` and ``q = roundf(x / d)``.
"""

from __future__ import annotations

import numpy as np

from maxdecl.codecs import (bytes_to_blocks, output_array, raise_if_flagged, register,
                            rows_to_blocks)

QK8_0 = 32  # floats per block
_KERNELS: dict = {}


def _kernels():
    """(quantize, dequantize) numba kernels, compiled (or loaded from cache) on first use."""
    if _KERNELS:
        return _KERNELS["q"], _KERNELS["dq"]
    import numba

    @numba.njit(cache=True, parallel=True)
    def quantize(x, d, qs, bad):
        # x: (nb, 32) f32 -> d: (nb,) f32 (rounded to fp16 by the caller), qs: (nb, 32) i8
        for i in numba.prange(x.shape[0]):
            amax = np.float32(0.0)
            for j in range(QK8_0):
                a = abs(x[i, j])
                if not (a < np.float32(np.inf)):
                    bad[i] = 1
                amax = max(amax, a)
            di = amax / np.float32(127.0)
            idv = np.float32(1.0) / di if di != np.float32(0.0) else np.float32(0.0)
            d[i] = di
            for j in range(QK8_0):
                v = x[i, j] * idv
                # gguf-py's np_roundf (half away from zero): floor(a) + floor(2 (a - floor(a)))
                a = abs(v)
                f = np.floor(a)
                r = f + np.floor(np.float32(2.0) * (a - f))
                r = -r if v < np.float32(0.0) else r
                # (int8) cast as NumPy does it on x86: int32 truncation, low byte kept
                qs[i, j] = np.int64(r) if abs(r) < np.float32(2147483648.0) else 0

    @numba.njit(cache=True, parallel=True)
    def dequantize(b, f16, out):
        # b: (nb, 34) u8 = fp16 d (bytes 0-1) | int8 q[0..31], f16: (65536,) f32 -> out: (nb, 32)
        n = out.shape[1]                  # a run-time trip count: LLVM vectorises, not unrolls
        for i in numba.prange(b.shape[0]):
            d = f16[np.int64(b[i, 0]) | (np.int64(b[i, 1]) << 8)]
            for j in range(n):
                out[i, j] = np.float32(np.int8(b[i, 2 + j])) * d

    # fp16 -> float32 of every bit pattern (NumPy's exact conversion), read by dequantize
    f16 = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16).view(np.float16)
    _KERNELS.update(q=quantize, dq=dequantize, f16=f16.astype(np.float32))
    return quantize, dequantize


class Q8_0Encoding:
    """GGML Q8_0 (``quantize_row_q8_0_ref`` / ``dequantize_row_q8_0``)."""

    name = "q8_0"
    block_elements = QK8_0
    block_bytes = (
        2        # d: fp16 block scale
        + QK8_0  # qs: 32 int8 quants, in element order
    )

    def quantize(self, x: np.ndarray) -> np.ndarray:
        """float32 ``[..., K]`` (K % 32 == 0) -> uint8 ``[..., K // 32 * 34]``.

        Bit-identical to ``gguf.quants.quantize(x, GGMLQuantizationType.Q8_0)``.
        """
        blocks, out_shape = rows_to_blocks(self, x)
        nb = blocks.shape[0]
        d = np.empty(nb, dtype=np.float32)
        out = np.empty((nb, self.block_bytes), dtype=np.uint8)
        bad = np.zeros(nb, dtype=np.uint8)
        quantize, _ = _kernels()
        quantize(blocks, d, out[:, 2:].view(np.int8), bad)
        raise_if_flagged(self, bad, x.shape)
        with np.errstate(over="ignore"):   # NumPy's fp16 rounds to nearest even; > 65504 is inf
            out[:, :2] = d.astype(np.float16).view(np.uint8).reshape(nb, 2)
        return out.reshape(out_shape)

    def dequantize(self, data: np.ndarray, shape, out: np.ndarray | None = None) -> np.ndarray:
        """uint8 Q8_0 blocks -> float32 of logical ``shape`` (bit-identical to GGML)."""
        blocks, shape = bytes_to_blocks(self, data, shape)
        out = output_array(self.name, shape, out)
        _, dequantize = _kernels()
        dequantize(blocks, _KERNELS["f16"], out.reshape(-1, QK8_0))
        return out


Q8_0 = register(Q8_0Encoding())
