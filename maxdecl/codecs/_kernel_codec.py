"""One codec class for GGML block encodings whose quantizer is a numba kernel.

A built-in encoding here is a name, GGML's block sizes, a short description of the
block, and the kernel (module, function) that quantizes a ``(n_blocks,
block_elements)`` float32 array into ``(n_blocks, block_bytes)`` bytes exactly as
GGML's reference quantizer does. Dequantizing runs the exact row decoders
(``maxdecl/kernels/block_rows.py``), equal to gguf-py's ``dequantize`` bit for bit.
"""

from __future__ import annotations

import importlib

import numpy as np

from ..blocks import GGML_BLOCKS
from ._blocks import decode_exact, fp16_to_fp32_table, raise_if_flagged, rows_to_blocks


class KernelCodec:
    """A GGML block encoding: ``quantize`` through a kernel, ``dequantize`` exact."""

    def __init__(self, name: str, kernel: str, layout: str):
        self.name = name
        self.block_elements, self.block_bytes = GGML_BLOCKS[name]
        self.layout = layout              # the block's fields, for ``repr`` and docs
        self._kernel = kernel             # "module:function" under maxdecl.kernels

    def __repr__(self) -> str:
        return (f"<encoding {self.name}: {self.block_elements} floats in "
                f"{self.block_bytes} bytes: {self.layout}>")

    def quantize(self, x: np.ndarray) -> np.ndarray:
        """float32 ``[..., K]`` (K a multiple of ``block_elements``) -> uint8
        ``[..., K // block_elements * block_bytes]``, GGML's reference bytes
        (no importance matrix)."""
        module, fn = self._kernel.split(":")
        kernel = getattr(importlib.import_module(f"maxdecl.kernels.{module}"), fn)
        blocks, out_shape = rows_to_blocks(self, x)
        out = np.zeros((blocks.shape[0], self.block_bytes), dtype=np.uint8)
        bad = np.zeros(blocks.shape[0], dtype=np.uint8)
        kernel(blocks, fp16_to_fp32_table(), out, bad)
        raise_if_flagged(self, bad, x.shape)
        return out.reshape(out_shape)

    def dequantize(self, data: np.ndarray, shape, out: np.ndarray | None = None) -> np.ndarray:
        """uint8 blocks -> float32 of logical ``shape`` (bit-identical to gguf-py)."""
        return decode_exact(self, data, shape, out)
