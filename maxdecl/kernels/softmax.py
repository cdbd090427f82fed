"""Softmax over the last axis, rows in parallel."""

from __future__ import annotations

import numba
import numpy as np

from ._dispatch import njit_twins, pick
from .vmath import expf


@njit_twins()
def _softmax_rows(x, out):
    # x, out: (R, C) f32; each row: exp(x - max) / sum
    for r in numba.prange(x.shape[0]):
        m = -np.inf
        for c in range(x.shape[1]):
            m = max(m, x[r, c])
        s = np.float32(0)
        for c in range(x.shape[1]):
            e = expf(x[r, c] - m)
            out[r, c] = e
            s += e
        inv = np.float32(1) / s
        for c in range(x.shape[1]):
            out[r, c] *= inv


def softmax_lastdim(x: np.ndarray) -> np.ndarray:
    """float32 softmax along the last axis of a contiguous array."""
    out = np.empty_like(x)
    if x.size:
        pick(_softmax_rows, x.size)(x.reshape(-1, x.shape[-1]), out.reshape(-1, x.shape[-1]))
    return out
