"""Q4_0: blocks of 32 floats as one fp16 scale and 32 signed 4-bit quants (GGML ``block_q4_0``).

``x[j] = d * (q[j] - 8)`` with ``d = max / -8`` where ``max`` is the element of
largest magnitude (sign kept), so that element maps exactly to ``q = 0``.
"""

from __future__ import annotations

import numpy as np

from . import register
from ._blocks import decode_exact, raise_if_flagged, rows_to_blocks

QK4_0 = 32  # floats per block


class Q4_0Encoding:
    """GGML Q4_0 (``quantize_row_q4_0_ref`` / ``dequantize_row_q4_0``)."""

    name = "q4_0"
    block_elements = QK4_0
    block_bytes = (
        2            # d: fp16 block scale
        + QK4_0 // 2  # qs: byte j = q[j] (low nibble) | q[j + 16] << 4 (high nibble)
    )

    def quantize(self, x: np.ndarray) -> np.ndarray:
        """float32 ``[..., K]`` (K % 32 == 0) -> uint8 ``[..., K // 32 * 18]``.

        Bit-identical to ``gguf.quants.quantize(x, GGMLQuantizationType.Q4_0)``.
        """
        from ..kernels.codec_q4_0 import _q4_0_quantize

        blocks, out_shape = rows_to_blocks(self, x)
        out = np.empty((blocks.shape[0], self.block_bytes), dtype=np.uint8)
        bad = np.zeros(blocks.shape[0], dtype=np.uint8)
        _q4_0_quantize(blocks, out, bad)
        raise_if_flagged(self, bad, x.shape)
        return out.reshape(out_shape)

    def dequantize(self, data: np.ndarray, shape, out: np.ndarray | None = None) -> np.ndarray:
        """uint8 Q4_0 blocks -> float32 of logical ``shape`` (bit-identical to GGML)."""
        return decode_exact(self, data, shape, out)


Q4_0 = register(Q4_0Encoding())
