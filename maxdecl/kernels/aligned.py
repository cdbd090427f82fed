"""Arrays whose data starts on a 64-byte (cache line, zmm) boundary.

numpy's allocator gives 16-byte alignment, so a float32 row of 16k values read in
64-byte vectors straddles two cache lines on every load. The GEMV and attention kernels
read such rows many times per call; see their modules for what alignment measured.
"""

from __future__ import annotations

import numpy as np

ALIGN = 64


def empty_aligned(shape, dtype=np.float32) -> np.ndarray:
    """An uninitialised C-order array of ``shape`` whose data starts on a 64-byte boundary."""
    dtype = np.dtype(dtype)
    n = int(np.prod(shape, dtype=np.int64))
    buf = np.empty(n * dtype.itemsize + ALIGN, np.uint8)
    start = -buf.ctypes.data % ALIGN
    return buf[start:start + n * dtype.itemsize].view(dtype).reshape(shape)


def rows_aligned(x2: np.ndarray) -> bool:
    """Whether every row of the 2-D ``x2`` starts on a 64-byte boundary."""
    return x2.ctypes.data % ALIGN == 0 and (x2.shape[0] == 1 or x2.strides[0] % ALIGN == 0)
