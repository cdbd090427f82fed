"""Runtime of the reductions (``maxdecl.ops.reduction``): NumPy, and the numba softmax."""

from __future__ import annotations

import numpy as np

from . import softmax as _softmax_kernel


def _np_axis(axis):
    return axis  # None, int or tuple: NumPy takes all three


def _accumulating(fold):
    """The runtime of ``sum`` / ``prod``: ``fold`` (np.sum, np.prod) with floats (float16
    too) accumulated in float32 and integers in their own dtype, cast back to x's."""
    def run(args, attrs):
        x = args[0]
        acc = np.float32 if x.dtype.kind == "f" else x.dtype
        out = fold(x, axis=_np_axis(attrs["axis"]), dtype=acc, keepdims=attrs["keepdims"])
        return [np.asarray(out).astype(x.dtype, copy=False)]
    return run


def _mean_run(args, attrs):
    x = args[0]
    out = np.mean(x, axis=_np_axis(attrs["axis"]), dtype=np.float32, keepdims=attrs["keepdims"])
    return [np.asarray(out).astype(x.dtype, copy=False)]


def _sort_run(args, attrs):
    x = args[0]
    axis = attrs["axis"] % x.ndim
    if attrs["descending"]:
        # stable descending: an ascending stable sort of x reversed, read backwards,
        # keeps equal values in their first order and puts NaN first
        n = x.shape[axis]
        rev = np.flip(x, axis)
        idx = np.flip(np.argsort(rev, axis=axis, kind="stable"), axis)
        idx = (n - 1) - idx
    else:
        idx = np.argsort(x, axis=axis, kind="stable")
    idx = np.ascontiguousarray(idx, dtype=np.int64)
    return [np.take_along_axis(x, idx, axis), idx]


def _max_run(args, attrs):
    x = args[0]
    return [np.asarray(np.max(x, axis=_np_axis(attrs["axis"]), keepdims=attrs["keepdims"]))]


def _min_run(args, attrs):
    x = args[0]
    return [np.asarray(np.min(x, axis=_np_axis(attrs["axis"]), keepdims=attrs["keepdims"]))]


def _arg_run(fn):
    def run(args, attrs):
        # the first index, as torch and NumPy (a NaN counts as the extreme)
        out = fn(args[0], axis=attrs["axis"], keepdims=attrs["keepdims"])
        return [np.asarray(out, dtype=np.int64)]
    return run


def _cumsum_run(args, attrs):
    x = args[0]
    # torch's CPU accumulator: float64 for float32, float32 for float16 (a running sum
    # of 1/3 over 700 steps differs in float32 by a whole unit after floor)
    acc = {np.dtype(np.float32): np.float64, np.dtype(np.float16): np.float32}.get(x.dtype,
                                                                                 x.dtype)
    return [np.cumsum(x, axis=attrs["axis"], dtype=acc).astype(x.dtype, copy=False)]


def _cummax_run(args, attrs):
    x = args[0]
    out = np.maximum.accumulate(x, axis=attrs["axis"])    # a NaN propagates, as in torch
    return [np.asarray(out, dtype=x.dtype)]


def _softmax_run(args, attrs):
    x = args[0]
    axis = attrs["axis"] % x.ndim
    moved = np.moveaxis(x, axis, -1)
    out = _softmax_kernel.softmax_lastdim(np.ascontiguousarray(moved, dtype=np.float32)).astype(x.dtype)
    return [np.moveaxis(out, -1, axis)]


RUN = {"sum": _accumulating(np.sum), "mean": _mean_run, "max": _max_run, "min": _min_run,
       "prod": _accumulating(np.prod), "sort": _sort_run,
       "argmax": _arg_run(np.argmax), "argmin": _arg_run(np.argmin),
       "cumsum": _cumsum_run, "cummax": _cummax_run, "softmax": _softmax_run}
