"""bf16: float32 with the low 16 mantissa bits rounded off (GGML ``GGML_TYPE_BF16``).

Stored as little-endian uint16, one element per "block". Rounding is to nearest
even; NaN stays NaN (made quiet); Inf and NaN are accepted, as in GGML.
"""

from __future__ import annotations

import numpy as np

from . import register
from ._blocks import decode_exact, rows_to_blocks


class BF16Encoding:
    """GGML bf16: the top half of each float32, rounded to nearest even."""

    name = "bf16"
    block_elements = 1
    block_bytes = (
        2  # v: the high 16 bits of the float32 (sign, 8-bit exponent, 7-bit mantissa)
    )

    def quantize(self, x: np.ndarray) -> np.ndarray:
        """float32 ``[..., K]`` -> uint8 ``[..., 2 * K]`` (little-endian bf16).

        Example: ``bf16.quantize(np.float32([[1.0]])).view(np.uint16)`` is ``[[0x3f80]]``.
        """
        from ..kernels.codec_bf16 import _bf16_quantize

        blocks, out_shape = rows_to_blocks(self, x)
        out = np.empty(blocks.shape[0], dtype=np.uint16)
        _bf16_quantize(blocks.reshape(-1).view(np.uint32), out)
        return out.view(np.uint8).reshape(out_shape)

    def dequantize(self, data: np.ndarray, shape, out: np.ndarray | None = None) -> np.ndarray:
        """uint8 bf16 bytes -> float32 of logical ``shape`` (exact widening)."""
        return decode_exact(self, data, shape, out)


BF16 = register(BF16Encoding())
