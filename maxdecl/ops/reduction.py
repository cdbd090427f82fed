"""Reductions: ``sum mean max argmax`` over axes, and ``softmax`` (numba kernel).

``axis`` is an int, a tuple of ints, or None (every axis); ``argmax`` takes one int
axis or None (index into the flattened tensor, as ``np.argmax``). ``keepdims`` keeps
the reduced axes as size 1. Float sums and means accumulate in float32 (float16
inputs too) and return the input dtype; integer sums keep the integer dtype.
"""

from __future__ import annotations

import numpy as np

from ..dtypes import DType, TensorType
from . import _checks
from ._registry import apply, kernels, register

__all__ = ["sum", "mean", "max", "argmax", "softmax"]


def _normalize_axis(attrs):
    axis = attrs["axis"]
    if isinstance(axis, (list, tuple)):
        axis = tuple(int(a) for a in axis)
    elif axis is not None:
        axis = int(axis)
    return {**attrs, "axis": axis, "keepdims": bool(attrs["keepdims"])}


def _axes(axis, rank) -> tuple:
    if axis is None:
        return tuple(range(rank))
    axes = axis if isinstance(axis, tuple) else (axis,)
    norm = tuple(_checks.valid_axis(a, rank) for a in axes)
    if len(set(norm)) != len(norm):
        raise ValueError(f"axis {axis} repeats an axis")
    return norm


def _reduced_shape(x, attrs) -> tuple:
    axes = _axes(attrs["axis"], x.rank)
    if attrs["keepdims"]:
        return tuple(1 if i in axes else d for i, d in enumerate(x.shape))
    return tuple(d for i, d in enumerate(x.shape) if i not in axes)


def _reduce_infer(name):
    def infer(inputs, attrs):
        (x,) = inputs
        _checks.not_quantized(x)
        _checks.no_bfloat16(x)
        if x.dtype == DType.bool:
            raise TypeError(f"{name} of a bool tensor: cast it first (got {x.type})")
        if name == "mean" and not x.dtype.is_float:
            raise TypeError(f"mean needs a float tensor, got {x.type}")
        if name == "max" and attrs["axis"] is not None and any(
                isinstance(x.shape[a], int) and x.shape[a] == 0
                for a in _axes(attrs["axis"], x.rank)):
            raise ValueError(f"max over an empty axis of {x.type}")
        return [TensorType(x.dtype, _reduced_shape(x, attrs))]
    return infer


def _np_axis(axis):
    return axis  # None, int or tuple: NumPy takes all three


def _sum_run(args, attrs):
    x = args[0]
    acc = np.float32 if x.dtype.kind == "f" else x.dtype
    out = np.sum(x, axis=_np_axis(attrs["axis"]), dtype=acc, keepdims=attrs["keepdims"])
    return [np.asarray(out).astype(x.dtype, copy=False)]


def _mean_run(args, attrs):
    x = args[0]
    out = np.mean(x, axis=_np_axis(attrs["axis"]), dtype=np.float32, keepdims=attrs["keepdims"])
    return [np.asarray(out).astype(x.dtype, copy=False)]


def _max_run(args, attrs):
    x = args[0]
    return [np.asarray(np.max(x, axis=_np_axis(attrs["axis"]), keepdims=attrs["keepdims"]))]


def _argmax_infer(inputs, attrs):
    (x,) = inputs
    _checks.not_quantized(x)
    _checks.no_bfloat16(x)
    if isinstance(attrs["axis"], tuple):
        raise ValueError(f"argmax takes one axis (or None), got {attrs['axis']}")
    if attrs["axis"] is None:
        shape = (1,) * x.rank if attrs["keepdims"] else ()
    else:
        shape = _reduced_shape(x, attrs)
    return [TensorType(DType.int64, shape)]


def _argmax_run(args, attrs):
    x = args[0]
    # first index of the maximum, as torch and NumPy (a NaN counts as the maximum)
    out = np.argmax(x, axis=attrs["axis"], keepdims=attrs["keepdims"])
    return [np.asarray(out, dtype=np.int64)]


for _name, _run in (("sum", _sum_run), ("mean", _mean_run), ("max", _max_run)):
    register(_name, infer=_reduce_infer(_name), run=_run, normalize=_normalize_axis,
             kind="reduction")
register("argmax", infer=_argmax_infer, run=_argmax_run, normalize=_normalize_axis,
         kind="reduction")


def _reduce_axis(axis):
    return tuple(axis) if isinstance(axis, (list, tuple)) else axis


def sum(x, axis=-1, keepdims: bool = False):  # noqa: A001
    """Sum over ``axis`` (int, tuple, or None for all)."""
    return apply("sum", [x], axis=_reduce_axis(axis), keepdims=keepdims)[0]


def mean(x, axis=-1, keepdims: bool = False):
    """Arithmetic mean over ``axis`` (int, tuple, or None for all); float inputs only."""
    return apply("mean", [x], axis=_reduce_axis(axis), keepdims=keepdims)[0]


def max(x, axis=-1, keepdims: bool = False):  # noqa: A001
    """Maximum over ``axis`` (int, tuple, or None for all); NaN propagates."""
    return apply("max", [x], axis=_reduce_axis(axis), keepdims=keepdims)[0]


def argmax(x, axis=-1, keepdims: bool = False):
    """int64 index of the first maximum along ``axis`` (None: of the flattened tensor)."""
    return apply("argmax", [x], axis=axis, keepdims=keepdims)[0]


# -- softmax ----------------------------------------------------------------------------
def _softmax_infer(inputs, attrs):
    (x,) = inputs
    _checks.float_input(x)
    _checks.no_bfloat16(x)
    _checks.valid_axis(attrs["axis"], x.rank)
    return [x.type]


def _softmax_run(args, attrs):
    x = args[0]
    axis = attrs["axis"] % x.ndim
    moved = np.moveaxis(x, axis, -1)
    k = kernels("softmax")
    out = k.softmax_lastdim(np.ascontiguousarray(moved, dtype=np.float32)).astype(x.dtype)
    return [np.moveaxis(out, -1, axis)]


register("softmax", infer=_softmax_infer, run=_softmax_run, kind="reduction",
         normalize=lambda a: {**a, "axis": int(a["axis"])})


def softmax(x, axis: int = -1):
    """exp(x - max) / sum(exp(x - max)) along ``axis``."""
    return apply("softmax", [x], axis=axis)[0]
