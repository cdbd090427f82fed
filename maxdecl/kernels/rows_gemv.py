"""GEMV for the encodings that have a row decoder but no vector-IR GEMV kernel
(``block_rows.ROW_LAYOUTS`` minus ``LAYOUTS``: tq1_0, tq2_0): each thread decodes one
weight row at a time into an L1-sized float32 buffer (exactly, ``_decode_row``) and
takes its dot product with every row of x.

A row of x meets every weight row through the same loop whatever the number of
rows with it, so its outputs are bit-identical alone or in a batch. No BLAS call:
OpenBLAS's threads spin after each call and starve the numba threads of the next
parallel region on a small machine (measured here: a 256-row tile decode took 6.5 ms
right after an ``sgemv`` and 0.06 ms alone).
"""

from __future__ import annotations

import numba
import numpy as np

from .block_rows import KINDS, _decode_row
from .config import CACHE, FASTMATH


@numba.njit(cache=CACHE, parallel=True, fastmath=FASTMATH)
def _rows_gemv(kind, x, w, out, tasks):
    # x: (M, K) f32, w: (N, K // be * bb) u8 -> out: (M, N) f32; rows split in ``tasks``
    n = w.shape[0]
    m, k = x.shape
    for t in numba.prange(tasks):
        buf = np.empty(k, np.float32)
        for r in range(t * n // tasks, (t + 1) * n // tasks):
            _decode_row(kind, w, r, buf)
            for i in range(m):
                acc = np.float32(0.0)
                for j in range(k):
                    acc += buf[j] * x[i, j]
                out[i, r] = acc


def rows_gemv(x2: np.ndarray, w: np.ndarray, encoding: str, out: np.ndarray) -> None:
    """``out (M, N) = x2 (M, K) @ dequantize(w).T`` for an encoding of ``KINDS``; x2,
    w and out C-contiguous, shapes checked by the caller."""
    tasks = max(1, min(w.shape[0], 4 * numba.get_num_threads()))
    _rows_gemv(KINDS[encoding], x2, w, out, tasks)
