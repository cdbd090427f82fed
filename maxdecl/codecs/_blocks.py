"""Plumbing for writing an encoding: rows <-> blocks, byte-shape math, output buffers, fp16.

Every function here runs at the codec's Python boundary, checks its input once and
hands the kernels contiguous ``(n_blocks, ...)`` views; importing this module loads
no numba (``decode_exact`` imports its kernels when it runs).
Every error is a ``QuantizationError`` naming the encoding and the shapes.
``rows_to_blocks``, ``bytes_to_blocks``, ``output_array`` and ``raise_if_flagged``
are public (``md.codecs``): a user's encoding calls them as the built-ins do.
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np

from ..errors import QuantizationError


def row_bytes(enc, k: int) -> int:
    """Bytes holding one row of ``k`` floats: ``k // block_elements * block_bytes``."""
    return k // enc.block_elements * enc.block_bytes


def rows_to_blocks(enc, x) -> tuple[np.ndarray, tuple[int, ...]]:
    """Check a quantize input; return ``(blocks, out_shape)``.

    ``blocks`` is a C-contiguous float32 ``(n_blocks, block_elements)`` view of
    ``x``; ``out_shape`` is ``[..., K // block_elements * block_bytes]``.
    """
    name = enc.name
    if not isinstance(x, np.ndarray):
        raise QuantizationError(f"{name}: quantize expects a float32 numpy array, "
                                f"got {type(x).__name__}")
    if x.dtype != np.float32:
        raise QuantizationError(f"{name}: quantize expects float32 [..., K], got {x.dtype} "
                                f"{list(x.shape)}; cast with x.astype(np.float32)")
    if x.ndim == 0:
        raise QuantizationError(f"{name}: quantize expects float32 [..., K], got a scalar")
    k = x.shape[-1]
    if k % enc.block_elements:
        raise QuantizationError(
            f"{name}: K = {k} (input {list(x.shape)}) is not a multiple of the block size "
            f"{enc.block_elements}; pad the last axis to "
            f"{-(-k // enc.block_elements) * enc.block_elements}")
    out_shape = (*x.shape[:-1], row_bytes(enc, k))
    blocks = np.ascontiguousarray(x).reshape(-1, enc.block_elements)
    return blocks, out_shape


def raise_if_flagged(enc, bad: np.ndarray, shape) -> None:
    """Raise for the first block whose ``bad`` flag is set (NaN or Inf inside)."""
    hit = np.flatnonzero(bad)
    if hit.size == 0:
        return
    b = int(hit[0])
    k = int(shape[-1])
    per_row = k // enc.block_elements
    row, col = divmod(b, per_row) if per_row else (0, 0)
    where = np.unravel_index(row, shape[:-1]) if len(shape) > 1 else ()
    idx = ", ".join(str(int(i)) for i in (*where, col * enc.block_elements))
    raise QuantizationError(
        f"{enc.name}: input {list(shape)} float32 holds NaN or Inf in the block starting at "
        f"[{idx}] ({hit.size} bad block{'s' if hit.size > 1 else ''} in all); "
        "a block encoding needs finite values")


def bytes_to_blocks(enc, data, shape) -> tuple[np.ndarray, tuple[int, ...]]:
    """Check a dequantize input; return ``(blocks, shape)``.

    ``data`` is uint8, either ``[..., nbytes_per_row]`` or flat, holding exactly the
    bytes of the logical float ``shape``. ``blocks`` is a C-contiguous uint8
    ``(n_blocks, block_bytes)`` view.
    """
    name = enc.name
    try:
        shape = tuple(int(d) for d in (shape if np.iterable(shape) else (shape,)))
    except (TypeError, ValueError):
        raise QuantizationError(
            f"{name}: logical shape must be a tuple of ints, got {shape!r}") from None
    if not shape or any(d < 0 for d in shape):
        raise QuantizationError(
            f"{name}: logical shape {list(shape)} must be non-empty and non-negative")
    if isinstance(data, (bytes, bytearray, memoryview)):
        data = np.frombuffer(data, dtype=np.uint8)
    if not isinstance(data, np.ndarray) or data.dtype != np.uint8:
        got = (f"{data.dtype} {list(data.shape)}" if isinstance(data, np.ndarray)
               else type(data).__name__)
        raise QuantizationError(f"{name}: packed data must be uint8 bytes, got {got}")
    k = shape[-1]
    if k % enc.block_elements:
        raise QuantizationError(
            f"{name}: logical shape {list(shape)} must end in a multiple of {enc.block_elements}")
    want = (*shape[:-1], row_bytes(enc, k))
    n_bytes = int(np.prod(want, dtype=np.int64))
    if data.size != n_bytes:
        what = "truncated" if data.size < n_bytes else "too long"
        raise QuantizationError(
            f"{name}: {data.size} bytes {list(data.shape)} are {what} for logical shape "
            f"{list(shape)} (expected {n_bytes} bytes as {list(want)})")
    blocks = np.ascontiguousarray(data).reshape(-1, enc.block_bytes)
    return blocks, shape


def output_array(name: str, shape, out=None) -> np.ndarray:
    """The float32 array a ``dequantize`` of logical ``shape`` writes: ``out`` or a new one.

    ``out`` must be a writeable, C-contiguous float32 array of exactly ``shape``;
    anything else raises ``QuantizationError`` naming encoding ``name``. Writing
    into a reused buffer skips the page faults of a fresh allocation (for large
    tensors those cost as much as the dequantize itself).
    """
    shape = tuple(shape)
    if out is None:
        return np.empty(shape, dtype=np.float32)
    if not isinstance(out, np.ndarray) or out.dtype != np.float32 or tuple(out.shape) != shape:
        got = (f"{out.dtype} {list(out.shape)}" if isinstance(out, np.ndarray)
               else type(out).__name__)
        raise QuantizationError(f"{name}: out= must be float32 {list(shape)}, got {got}")
    if not out.flags.c_contiguous or not out.flags.writeable:
        raise QuantizationError(f"{name}: out= must be a writeable C-contiguous array")
    return out


def decode_exact(enc, data, shape, out=None) -> np.ndarray:
    """``dequantize`` of a built-in GGML encoding: checks, then the exact row decoders
    the GEMM also uses (``maxdecl/kernels/block_rows.py``), in parallel."""
    from ..kernels.block_rows import dequantize_blocks

    blocks, shape = bytes_to_blocks(enc, data, shape)
    out = output_array(enc.name, shape, out)
    dequantize_blocks(enc.name, blocks, out.reshape(-1))
    return out


@lru_cache(maxsize=1)
def fp16_to_fp32_table() -> np.ndarray:
    """float32 value of each of the 65536 fp16 bit patterns (exact; NumPy's conversion)."""
    t = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16).view(np.float16).astype(np.float32)
    t.flags.writeable = False
    return t
