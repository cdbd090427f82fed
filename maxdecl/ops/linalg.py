"""Linear algebra: ``matmul`` (NumPy semantics, float32 through BLAS)."""

from __future__ import annotations

import numpy as np

from ..dtypes import TensorType, format_shape
from . import _checks
from ._registry import apply, register


def _matmul_infer(inputs, attrs):
    a, b = inputs
    _checks.not_quantized(a, b)
    dtype = _checks.same_dtype(a, b)
    if a.rank == 0 or b.rank == 0:
        raise ValueError("matmul needs inputs of rank >= 1")
    sa, sb = list(a.shape), list(b.shape)
    va, vb = a.rank == 1, b.rank == 1
    if va:
        sa = [1] + sa
    if vb:
        sb = sb + [1]
    if not _checks.dims_equal(sa[-1], sb[-2]):
        raise ValueError(f"a{format_shape(a.shape)} @ b{format_shape(b.shape)}: "
                         f"K must match ({sa[-1]} vs {sb[-2]})")
    batch = _checks.broadcast_shapes(tuple(sa[:-2]), tuple(sb[:-2]))
    out = list(batch) + ([] if va else [sa[-2]]) + ([] if vb else [sb[-1]])
    return [TensorType(dtype, tuple(out))]


register("matmul", infer=_matmul_infer, kind="linalg",
         run=lambda args, attrs: [np.asarray(np.matmul(args[0], args[1]))])


def matmul(a, b):
    """``a @ b`` with NumPy semantics (batch broadcasting, 1-D promotion)."""
    return apply("matmul", [a, b])[0]
