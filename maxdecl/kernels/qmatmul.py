"""``x @ dequantize(W).T`` on packed GGML blocks: GEMV kernels and tiled GEMM.

Two paths, chosen by the number of activation rows M:

* **GEMV** (M <= ``GEMV_MAX_ROWS``: decode, batched decode, lookup verify; ``gemv.py``):
  each weight row's blocks are read once, in place, and decoded once for up to 8 rows
  of x at a time, in LLVM vector IR (16 lanes with AVX-512, else 8) whose arithmetic
  is pinned: every output is bit-identical whether its x row runs alone or with others.
* **GEMM** (M > ``GEMV_MAX_ROWS``, prefill; compute-bound; ``gemm.py``): in one parallel region, each
  thread decodes a chunk of weight rows at a time into a small float32 buffer (exact:
  the rows equal ``dequantize`` bit for bit) and multiplies them against x, packed
  once into transposed panels, with an outer-product micro-kernel in LLVM vector IR
  (8 x 32 with 16 lanes on AVX-512, 4 x 16 with 8 lanes otherwise).
* Every GGML type with a row decoder (``block_rows.ROW_LAYOUTS``: all of
  ``block_rows.KINDS``) has both paths.
* Encodings without kernels go through ``tiled_matmul``: their own
  ``dequantize`` on a tile of rows (about ``TILE_BYTES``), then BLAS.

The whole matrix is never decoded at once.

By default activations are never quantized: every product is float32 weight x float32
x. ``md.compile(..., activations="q8")`` makes the GEMV round x to int8 (``gemv_q8.py``).
Block layouts: ``maxdecl/kernels/block_rows.py``.
"""

from __future__ import annotations

import numpy as np

from .block_rows import (KINDS, LAYOUTS, ROW_LAYOUTS, _decode_row,  # noqa: F401 (re-exported)
                         dequantize_rows)
from .config import GEMV_MAX_ROWS
from .gemm import gemm
from .gemv_q8 import gemv

TILE_BYTES = 2 << 20  # float32 bytes of one decoded tile in the fallback path


# -- Python wrappers -----------------------------------------------------------------
# (block_elements, block_bytes) each kernel assumes, as GGML defines them


def has_kernel(encoding: str, block_elements: int, block_bytes: int) -> bool:
    """True if ``encoding`` has fast kernels and its block sizes are GGML's."""
    return LAYOUTS.get(encoding) == (block_elements, block_bytes)


def has_row_decoder(encoding: str, block_elements: int, block_bytes: int) -> bool:
    """True if ``encoding`` has an exact numba row decoder (GEMM, tiled GEMV)."""
    return ROW_LAYOUTS.get(encoding) == (block_elements, block_bytes)


def tile_rows(k: int) -> int:
    """Weight rows per decoded tile in the fallback path (about TILE_BYTES)."""
    return max(8, TILE_BYTES // (4 * max(k, 1)))


def tiled_matmul(x2: np.ndarray, n: int, decode_tile) -> np.ndarray:
    """``x2 @ W.T`` with W decoded one tile of rows at a time by ``decode_tile(r0, r1, buf)``.

    x2: (M, K) f32 contiguous -> (M, N) f32. ``buf`` is a (rows, K) f32 scratch view.
    """
    m, k = x2.shape
    rows = min(n, tile_rows(k))
    buf = np.empty((rows, k), np.float32)
    if m <= GEMV_MAX_ROWS:
        # each row of x its own matrix-vector product: a row's result does not depend on
        # how many rows run with it (BLAS picks other kernels for other widths)
        out = np.empty((m, n), np.float32)
        for r0 in range(0, n, rows):
            r1 = min(n, r0 + rows)
            tile = buf[: r1 - r0]
            decode_tile(r0, r1, tile)
            for i in range(m):
                np.matmul(tile, x2[i], out=out[i, r0:r1])
        return out
    out_t = np.empty((n, m), np.float32)             # W_tile @ x2.T lands in contiguous rows
    xt = x2.T
    for r0 in range(0, n, rows):
        r1 = min(n, r0 + rows)
        tile = buf[: r1 - r0]
        decode_tile(r0, r1, tile)
        np.matmul(tile, xt, out=out_t[r0:r1])
    return np.ascontiguousarray(out_t.T)


def qmatmul_blocks(x2: np.ndarray, w: np.ndarray, encoding: str) -> np.ndarray:
    """``x2 @ dequantize(w).T`` for an encoding in ``ROW_LAYOUTS``.

    x2: (M, K) f32 contiguous, w: (N, K // be * bb) u8 contiguous -> (M, N) f32.
    """
    if encoding not in ROW_LAYOUTS:
        raise ValueError(f"qmatmul: no kernel for encoding {encoding!r}")
    be, bb = ROW_LAYOUTS[encoding]
    if x2.ndim != 2 or w.ndim != 2 or w.dtype != np.uint8:
        raise ValueError(f"qmatmul: x must be [M, K] and w [N, bytes] uint8, got "
                         f"{list(x2.shape)} and {list(w.shape)} {w.dtype}")
    k = x2.shape[1]
    if k % be or w.shape[1] != k // be * bb:
        raise ValueError(f"qmatmul: {encoding} rows of K={k} take {k // be * bb} bytes "
                         f"({k / be:g} blocks of {bb}), but w has {w.shape[1]} bytes per row")
    n = w.shape[0]
    out = np.empty((x2.shape[0], n), np.float32)
    if x2.shape[0] <= GEMV_MAX_ROWS:                # decode, batched decode, lookup verify
        gemv(x2, w.view(np.uint16) if encoding == "bf16" else w, encoding, out)
        return out
    gemm(KINDS[encoding], x2, w, out)
    return out
