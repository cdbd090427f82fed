"""Q6_K: super-blocks of 256 floats, 16 sub-blocks of 16 with int8 scales (GGML ``block_q6_K``).

``x = d * sc[s] * (q - 32)`` with ``q`` in 0..63 (low 4 bits in ``ql``, high 2
bits in ``qh``) and ``s`` the 16-float sub-block. Quantization follows GGML's
``quantize_row_q6_K_ref`` (``make_qx_quants``); the ql/qh bit map is drawn in
``maxdecl/kernels/block_rows.py`` (``_dec_q6_k``).
"""

from __future__ import annotations

import numpy as np

from . import register
from ._blocks import decode_exact, fp16_to_fp32_table, raise_if_flagged, rows_to_blocks

QK_K = 256  # floats per super-block


class Q6_KEncoding:
    """GGML Q6_K (``quantize_row_q6_K_ref`` / ``dequantize_row_q6_K``)."""

    name = "q6_k"
    block_elements = QK_K
    block_bytes = (
        QK_K // 2     # ql: low 4 bits of each quant, two per byte
        + QK_K // 4   # qh: high 2 bits of each quant, four per byte
        + QK_K // 16  # scales: one int8 scale per 16-float sub-block
        + 2           # d: fp16 super-block scale
    )

    def quantize(self, x: np.ndarray) -> np.ndarray:
        """float32 ``[..., K]`` (K % 256 == 0) -> uint8 ``[..., K // 256 * 210]``.

        Byte-identical to GGML's ``quantize_row_q6_K_ref`` (no importance matrix).
        """
        from ..kernels.codec_q6_k import _q6_k_quantize

        blocks, out_shape = rows_to_blocks(self, x)
        out = np.zeros((blocks.shape[0], self.block_bytes), dtype=np.uint8)
        bad = np.zeros(blocks.shape[0], dtype=np.uint8)
        _q6_k_quantize(blocks, fp16_to_fp32_table(), out, bad)
        raise_if_flagged(self, bad, x.shape)
        return out.reshape(out_shape)

    def dequantize(self, data: np.ndarray, shape, out: np.ndarray | None = None) -> np.ndarray:
        """uint8 Q6_K blocks -> float32 of logical ``shape`` (bit-identical to GGML)."""
        return decode_exact(self, data, shape, out)


Q6_K = register(Q6_KEncoding())
