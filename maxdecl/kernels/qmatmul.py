"""``x @ dequantize(W).T`` on packed GGML blocks: GEMV kernels and tiled GEMM.

Two paths, chosen by the number of activation rows M:

* **GEMV** (M == 1, decode; bandwidth-bound; ``gemv.py``): one kernel per encoding reads each
  weight row's blocks once, in place, with the block scales folded into the products
  and one horizontal sum per row; rows run under ``prange``. Every kernel but bf16
  writes the row dot as LLVM vector IR (``_row_dot_intrinsic`` for 32-value blocks,
  ``_superblock_dot_intrinsic`` for the K-quants): 8-lane vectors, F16C scales.
* **GEMM** (M > 1, prefill; compute-bound): in one parallel region, each thread
  decodes 16 weight rows at a time into a small float32 buffer (exact: the same
  float32 operations as gguf-py, so the rows equal ``dequantize`` bit for bit)
  and multiplies them with register-blocked (2 x 4) dots over cache-sized K
  slices. One fork/join per call, where tile-by-tile numba + BLAS alternated two
  thread pools (measured ~8x slower at M=64 on a shared 2-core machine).
* Encodings without kernels go through ``tiled_matmul``: their own
  ``dequantize`` on a tile of rows (about ``TILE_BYTES``), then BLAS.

The whole matrix is never decoded at once.

Activations are never quantized: every product is float32 weight x float32 x.
Block layouts: ``maxdecl/kernels/block_rows.py``.
"""

from __future__ import annotations

import numba
import numpy as np

from .block_rows import KINDS, _decode_row, dequantize_rows  # noqa: F401  (re-exported)
from .config import CACHE, FASTMATH
from .gemv import (_gemv_bf16, _gemv_q4_0, _gemv_q4_k, _gemv_q5_0, _gemv_q6_k,
                   _gemv_q8_0)

TILE_BYTES = 2 << 20  # float32 bytes of one decoded tile in the fallback path


# -- GEMM (M > 1): decode 16 rows into a per-thread buffer, then 2 x 4 register-blocked
# dots over K slices that stay in cache; one parallel region for the whole product.
_GEMM_ROWS = 16   # weight rows decoded per prange step
_GEMM_KC = 512    # K slice: x[:, slice] and 4 decoded rows stay in L2 / L1


@numba.njit(cache=CACHE, fastmath=FASTMATH)
def _dots_2x4(a, b, w0, w1, w2, w3, out, m, r):
    # out[m:m+2, r:r+4] += [a; b] @ [w0; w1; w2; w3].T, all (KC,) f32 slices
    s00 = np.float32(0)
    s01 = np.float32(0)
    s02 = np.float32(0)
    s03 = np.float32(0)
    s10 = np.float32(0)
    s11 = np.float32(0)
    s12 = np.float32(0)
    s13 = np.float32(0)
    for k in range(a.shape[0]):
        xa = a[k]
        xb = b[k]
        s00 += xa * w0[k]
        s01 += xa * w1[k]
        s02 += xa * w2[k]
        s03 += xa * w3[k]
        s10 += xb * w0[k]
        s11 += xb * w1[k]
        s12 += xb * w2[k]
        s13 += xb * w3[k]
    out[m, r] += s00
    out[m, r + 1] += s01
    out[m, r + 2] += s02
    out[m, r + 3] += s03
    out[m + 1, r] += s10
    out[m + 1, r + 1] += s11
    out[m + 1, r + 2] += s12
    out[m + 1, r + 3] += s13


@numba.njit(cache=CACHE, fastmath=FASTMATH)
def _dots_1x4(a, w0, w1, w2, w3, out, m, r):
    s0 = np.float32(0)
    s1 = np.float32(0)
    s2 = np.float32(0)
    s3 = np.float32(0)
    for k in range(a.shape[0]):
        xa = a[k]
        s0 += xa * w0[k]
        s1 += xa * w1[k]
        s2 += xa * w2[k]
        s3 += xa * w3[k]
    out[m, r] += s0
    out[m, r + 1] += s1
    out[m, r + 2] += s2
    out[m, r + 3] += s3


@numba.njit(cache=CACHE, parallel=True, fastmath=FASTMATH)
def _gemm(kind, x, w, out, threads):
    # x: (M, K) f32, w: (N, K//be*bb) u8 -> out: (M, N) f32
    m_rows, k = x.shape
    n = w.shape[0]
    chunks = (n + _GEMM_ROWS - 1) // _GEMM_ROWS
    groups = min(chunks, 4 * threads)
    for g in numba.prange(groups):                   # buffers made once per group
        buf = np.empty((_GEMM_ROWS, k), np.float32)
        tmp = np.empty((m_rows, _GEMM_ROWS), np.float32)
        for c in range(g, chunks, groups):
            r0 = c * _GEMM_ROWS
            rows = min(_GEMM_ROWS, n - r0)
            quads = (rows + 3) // 4
            for i in range(rows):
                _decode_row(kind, w, r0 + i, buf[i])
            for i in range(rows, quads * 4):         # rows past N read as zero
                buf[i, :] = 0
            tmp[:, :] = 0
            for k0 in range(0, k, _GEMM_KC):
                k1 = min(k, k0 + _GEMM_KC)
                for q in range(quads):
                    i = 4 * q
                    w0 = buf[i, k0:k1]
                    w1 = buf[i + 1, k0:k1]
                    w2 = buf[i + 2, k0:k1]
                    w3 = buf[i + 3, k0:k1]
                    for m in range(0, m_rows - 1, 2):
                        _dots_2x4(x[m, k0:k1], x[m + 1, k0:k1], w0, w1, w2, w3, tmp, m, i)
                    if m_rows % 2:
                        _dots_1x4(x[m_rows - 1, k0:k1], w0, w1, w2, w3, tmp, m_rows - 1, i)
            for m in range(m_rows):
                for i in range(rows):
                    out[m, r0 + i] = tmp[m, i]


# -- Python wrappers -----------------------------------------------------------------
_GEMV = {"q4_0": _gemv_q4_0, "q5_0": _gemv_q5_0, "q8_0": _gemv_q8_0,
         "q4_k": _gemv_q4_k, "q6_k": _gemv_q6_k, "bf16": _gemv_bf16}
# (block_elements, block_bytes) each kernel assumes, as GGML defines them
LAYOUTS = {"q4_0": (32, 18), "q5_0": (32, 22), "q8_0": (32, 34),
           "q4_k": (256, 144), "q6_k": (256, 210), "bf16": (1, 2)}


def has_kernel(encoding: str, block_elements: int, block_bytes: int) -> bool:
    """True if ``encoding`` has fast kernels and its block sizes are GGML's."""
    return LAYOUTS.get(encoding) == (block_elements, block_bytes)


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
    out_t = np.empty((n, m), np.float32)             # W_tile @ x2.T lands in contiguous rows
    xt = x2.T
    for r0 in range(0, n, rows):
        r1 = min(n, r0 + rows)
        tile = buf[: r1 - r0]
        decode_tile(r0, r1, tile)
        np.matmul(tile, xt, out=out_t[r0:r1])
    return np.ascontiguousarray(out_t.T)


def qmatmul_blocks(x2: np.ndarray, w: np.ndarray, encoding: str) -> np.ndarray:
    """``x2 @ dequantize(w).T`` for an encoding in ``LAYOUTS``.

    x2: (M, K) f32 contiguous, w: (N, K // be * bb) u8 contiguous -> (M, N) f32.
    """
    n = w.shape[0]
    if x2.shape[0] == 1:                            # decode: keep this path lean
        out = np.empty((1, n), np.float32)
        _GEMV[encoding](x2[0], w.view(np.uint16) if encoding == "bf16" else w, out[0])
        return out
    out = np.empty((x2.shape[0], n), np.float32)
    _gemm(KINDS[encoding], x2, w, out, numba.get_num_threads())
    return out
