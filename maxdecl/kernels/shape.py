"""Runtime of the shape ops (``maxdecl.ops.shape``): NumPy views and copies."""

from __future__ import annotations

import builtins

import numpy as np


def _reshape_run(args, attrs):
    x = args[0]
    shape = [d if isinstance(d, int) else -1 for d in attrs["shape"]]
    if shape.count(-1) > 1:  # symbolic dims resolved from the input at run time
        return [x.reshape(_resolve(x.shape, attrs["shape"]))]
    return [x.reshape(shape)]


def _resolve(in_shape, spec):
    """Resolve several symbolic dims: each keeps the size of the same-position input dim."""
    out = []
    for i, d in enumerate(spec):
        out.append(d if isinstance(d, int) else in_shape[i])
    return out


def _split_run(args, attrs):
    x = args[0]
    cuts = np.cumsum(attrs["sizes"])[:-1]
    return list(np.split(x, cuts, axis=attrs["axis"] % x.ndim))


def _slice_run(args, attrs):
    x = args[0]
    index = [builtins.slice(None)] * x.ndim
    for a, s, e, st in zip(attrs["axes"], attrs["starts"], attrs["ends"], attrs["steps"]):
        index[a % x.ndim] = builtins.slice(s, e, st)
    return [x[tuple(index)]]


def _gather_run(args, attrs):
    x, idx = args
    axis = attrs["axis"] % x.ndim
    n = x.shape[axis]
    if idx.size:
        # a decode step gathers one row: Python's min/max of a short list beat NumPy's
        few = idx.ravel().tolist() if idx.size <= 16 else None
        lo, hi = (min(few), max(few)) if few is not None else (idx.min(), idx.max())
        if lo < -n or hi >= n:
            raise IndexError(f"index {lo if lo < -n else hi} is out of range for axis {axis} "
                             f"of size {n}")
    return [np.take(x, idx, axis=axis)]


RUN = {
    "reshape": _reshape_run,
    "transpose": lambda args, attrs: [np.ascontiguousarray(np.transpose(args[0], attrs["perm"]))],
    "concat": lambda args, attrs: [np.concatenate(args, axis=attrs["axis"])],
    "split": _split_run,
    "slice": _slice_run,
    "gather": _gather_run,
    "expand_as": lambda args, attrs: [np.ascontiguousarray(np.broadcast_to(args[0],
                                                                           args[1].shape))],
    "tile": lambda args, attrs: [np.tile(args[0], attrs["repeats"])],
    "select": lambda args, attrs: [np.where(args[0], args[1], args[2])],
}
