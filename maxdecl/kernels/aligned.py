"""Arrays whose data starts on a 64-byte (cache line, zmm) boundary.

numpy's allocator gives 16-byte alignment, so a float32 row of 16k values read in
64-byte vectors straddles two cache lines on every load. The GEMV and attention kernels
read such rows many times per call; see their modules for what alignment measured.
"""

from __future__ import annotations

import math

import numpy as np

ALIGN = 64


def empty_aligned(shape, dtype=np.float32) -> np.ndarray:
    """An uninitialised C-order array of ``shape`` whose data starts on a 64-byte boundary."""
    dtype = np.dtype(dtype)
    nbytes = math.prod(shape) * dtype.itemsize
    buf = np.empty(nbytes + ALIGN, np.uint8)
    start = -address(buf) % ALIGN
    return buf[start:start + nbytes].view(dtype).reshape(shape)


def address(a: np.ndarray) -> int:
    """The address of ``a``'s first element (cheaper than ``a.ctypes.data``)."""
    return a.__array_interface__["data"][0]


def rows_aligned(x2: np.ndarray) -> bool:
    """Whether every row of the 2-D ``x2`` starts on a 64-byte boundary."""
    return address(x2) % ALIGN == 0 and (x2.shape[0] == 1 or x2.strides[0] % ALIGN == 0)
