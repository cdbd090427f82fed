"""Reductions over one axis: softmax (numba kernel on the last axis)."""

from __future__ import annotations

import numpy as np

from . import _checks
from ._registry import apply, register

__all__ = ["softmax"]


def _softmax_infer(inputs, attrs):
    (x,) = inputs
    _checks.float_input(x)
    _checks.valid_axis(attrs["axis"], x.rank)
    return [x.type]


def _softmax_run(args, attrs):
    x = args[0]
    axis = attrs["axis"] % x.ndim
    moved = np.moveaxis(x, axis, -1)
    from ..kernels import softmax as k
    out = k.softmax_lastdim(np.ascontiguousarray(moved, dtype=np.float32)).astype(x.dtype)
    return [np.moveaxis(out, -1, axis)]


register("softmax", infer=_softmax_infer, run=_softmax_run, kind="reduction")


def softmax(x, axis: int = -1):
    """exp(x - max) / sum(exp(x - max)) along ``axis``."""
    return apply("softmax", [x], axis=axis)[0]
