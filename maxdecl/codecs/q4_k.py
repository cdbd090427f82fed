"""Q4_K: 256-float super-blocks, 8 sub-blocks with 6-bit scales and mins (GGML ``block_q4_K``).

``x = d * sc[s] * q - dmin * m[s]`` with ``q`` in 0..15 and ``s`` the 32-float
sub-block. Quantization follows GGML's ``quantize_row_q4_K_ref`` (a weighted
least-squares search per sub-block, ``make_qkx2_quants``), so the bytes equal
llama.cpp's for the same float input. The 12-byte scale/min packing is drawn in
``maxdecl/kernels/block_rows.py`` (``_q4k_scale_min``).
"""

from __future__ import annotations

import numpy as np

from . import register
from ._blocks import decode_exact, fp16_to_fp32_table, raise_if_flagged, rows_to_blocks

QK_K = 256          # floats per super-block
K_SCALE_SIZE = 12   # bytes of packed 6-bit scales and mins


class Q4_KEncoding:
    """GGML Q4_K (``quantize_row_q4_K_ref`` / ``dequantize_row_q4_K``)."""

    name = "q4_k"
    block_elements = QK_K
    block_bytes = (
        2                # d: fp16 super-block scale of the 6-bit scales
        + 2              # dmin: fp16 super-block scale of the 6-bit mins
        + K_SCALE_SIZE   # scales: 8 scales + 8 mins, 6 bits each, packed in 12 bytes
        + QK_K // 2      # qs: 4 groups of 32 bytes; byte l of group g holds
    )                    #     x[64g + l] (low nibble) and x[64g + 32 + l] (high nibble)

    def quantize(self, x: np.ndarray) -> np.ndarray:
        """float32 ``[..., K]`` (K % 256 == 0) -> uint8 ``[..., K // 256 * 144]``.

        Byte-identical to GGML's ``quantize_row_q4_K_ref`` (no importance matrix).
        """
        from ..kernels.codec_q4_k import _q4_k_quantize

        blocks, out_shape = rows_to_blocks(self, x)
        out = np.zeros((blocks.shape[0], self.block_bytes), dtype=np.uint8)
        bad = np.zeros(blocks.shape[0], dtype=np.uint8)
        _q4_k_quantize(blocks, fp16_to_fp32_table(), out, bad)
        raise_if_flagged(self, bad, x.shape)
        return out.reshape(out_shape)

    def dequantize(self, data: np.ndarray, shape, out: np.ndarray | None = None) -> np.ndarray:
        """uint8 Q4_K blocks -> float32 of logical ``shape`` (bit-identical to GGML)."""
        return decode_exact(self, data, shape, out)


Q4_K = register(Q4_KEncoding())
