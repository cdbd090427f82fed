"""Shape ops that move no arithmetic: reshape, transpose, concat, split, slice, gather,
tile and select (``np.where``).

Symbolic dims flow through: a dim that keeps its size keeps its symbol; a dim whose
size is derived from a symbol gets a derived symbol such as ``"past+seq"``.
"""

from __future__ import annotations

import builtins
import math

import numpy as np

from ..dtypes import DType, TensorType, format_shape
from . import _checks
from ._registry import apply, register

__all__ = ["reshape", "transpose", "concat", "split", "slice", "gather", "tile", "select"]


def _reshape_infer(inputs, attrs):
    (x,) = inputs
    _checks.not_quantized(x)
    new = list(attrs["shape"])
    if sum(1 for d in new if d == -1) > 1:
        raise ValueError(f"reshape to {format_shape(new)}: at most one dim may be -1")
    for d in new:
        if isinstance(d, int) and d < -1:
            raise ValueError(f"reshape to {format_shape(new)}: negative dim {d}")
    if -1 in new:
        known_in = [d for d in x.shape if isinstance(d, int)]
        sym_in = sorted(d for d in x.shape if isinstance(d, str))
        known_out = [d for d in new if isinstance(d, int) and d != -1]
        sym_out = sorted(d for d in new if isinstance(d, str))
        rest = [s for s in sym_in if s not in sym_out] if set(sym_out) <= set(sym_in) else None
        n_in, n_out = math.prod(known_in), math.prod(known_out)
        if rest == [] and n_out and n_in % n_out == 0:
            new[new.index(-1)] = n_in // n_out
        elif rest and len(rest) == 1 and n_out and n_in == n_out:
            new[new.index(-1)] = rest[0]
        else:
            raise ValueError(f"cannot infer -1 reshaping {format_shape(x.shape)} to "
                             f"{format_shape(attrs['shape'])}")
    elif all(isinstance(d, int) for d in (*x.shape, *new)):
        if math.prod(x.shape) != math.prod(new):
            raise ValueError(f"cannot reshape {format_shape(x.shape)} "
                             f"({math.prod(x.shape)} elements) to {format_shape(new)} "
                             f"({math.prod(new)} elements)")
    return [TensorType(x.dtype, tuple(new))]


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


def _transpose_infer(inputs, attrs):
    (x,) = inputs
    _checks.not_quantized(x)
    perm = [int(p) for p in attrs["perm"]]
    if sorted(p % max(x.rank, 1) for p in perm) != list(range(x.rank)) or len(perm) != x.rank:
        raise ValueError(f"perm {perm} is not a permutation of the {x.rank} axes of "
                         f"{format_shape(x.shape)}")
    return [TensorType(x.dtype, tuple(x.shape[p] for p in perm))]


register("reshape", infer=_reshape_infer, run=_reshape_run, kind="shape",
         normalize=lambda a: {**a, "shape": tuple(a["shape"])})
register("transpose", infer=_transpose_infer, kind="shape",
         normalize=lambda a: {**a, "perm": tuple(int(p) for p in a["perm"])},
         run=lambda args, attrs: [np.ascontiguousarray(np.transpose(args[0], attrs["perm"]))])


def reshape(x, shape):
    """``x`` with a new shape (one dim may be -1; symbolic dims allowed)."""
    return apply("reshape", [x], shape=tuple(shape))[0]


def transpose(x, perm):
    """Permute the axes of ``x`` (``np.transpose(x, perm)``)."""
    return apply("transpose", [x], perm=tuple(perm))[0]


# -- concat / split ---------------------------------------------------------------------
def _concat_infer(inputs, attrs):
    if not inputs:
        raise ValueError("concat needs at least one value")
    _checks.not_quantized(*inputs)
    dtype = _checks.same_dtype(*inputs)
    rank = inputs[0].rank
    if rank == 0 or any(v.rank != rank for v in inputs):
        raise ValueError("concat needs values of one rank >= 1, got "
                         + ", ".join(str(v.type) for v in inputs))
    axis = _checks.valid_axis(attrs["axis"], rank)
    out = []
    for i in range(rank):
        dims = [v.shape[i] for v in inputs]
        if i == axis:
            out.append(_checks.add_dims(*dims))
            continue
        ints = {d for d in dims if isinstance(d, int)}
        if len(ints) > 1 or (not ints and len(set(dims)) > 1):
            raise ValueError(f"concat on axis {axis}: dim {i} differs: "
                             + ", ".join(str(v.type) for v in inputs))
        out.append(ints.pop() if ints else dims[0])
    return [TensorType(dtype, tuple(out))]


def _split_infer(inputs, attrs):
    (x,) = inputs
    _checks.not_quantized(x)
    axis = _checks.valid_axis(attrs["axis"], x.rank)
    sizes = attrs["sizes"]
    if not sizes or any(not isinstance(s, int) or s < 0 for s in sizes):
        raise ValueError(f"split sizes must be non-negative ints, got {list(sizes)}")
    dim = x.shape[axis]
    if isinstance(dim, int) and sum(sizes) != dim:
        raise ValueError(f"split sizes {list(sizes)} sum to {sum(sizes)}, but axis {axis} of "
                         f"{format_shape(x.shape)} has {dim}")
    return [TensorType(x.dtype, x.shape[:axis] + (s,) + x.shape[axis + 1:]) for s in sizes]


def _split_run(args, attrs):
    x = args[0]
    cuts = np.cumsum(attrs["sizes"])[:-1]
    return list(np.split(x, cuts, axis=attrs["axis"] % x.ndim))


register("concat", infer=_concat_infer, kind="shape",
         run=lambda args, attrs: [np.concatenate(args, axis=attrs["axis"])])
register("split", infer=_split_infer, run=_split_run, kind="shape",
         normalize=lambda a: {**a, "sizes": tuple(int(s) for s in a["sizes"])})


def concat(values, axis: int = 0):
    """Join ``values`` (same dtype, same dims except ``axis``) along ``axis``."""
    return apply("concat", list(values), axis=axis)[0]


def split(x, sizes, axis: int = 0):
    """Split ``x`` along ``axis`` into pieces of ``sizes`` (summing to that dim); a list."""
    return apply("split", [x], sizes=tuple(sizes), axis=axis)


# -- slice ------------------------------------------------------------------------------
def _normalize_slice(attrs):
    starts = tuple(None if s is None else int(s) for s in attrs["starts"])
    ends = tuple(None if e is None else int(e) for e in attrs["ends"])
    n = len(starts)
    axes = tuple(range(n)) if attrs["axes"] is None else tuple(int(a) for a in attrs["axes"])
    steps = (1,) * n if attrs["steps"] is None else tuple(int(s) for s in attrs["steps"])
    return {**attrs, "starts": starts, "ends": ends, "axes": axes, "steps": steps}


def _slice_infer(inputs, attrs):
    (x,) = inputs
    _checks.not_quantized(x)
    starts, ends, axes, steps = attrs["starts"], attrs["ends"], attrs["axes"], attrs["steps"]
    if not len(starts) == len(ends) == len(axes) == len(steps):
        raise ValueError(f"slice: starts {list(starts)}, ends {list(ends)}, axes {list(axes)} "
                         f"and steps {list(steps)} must have one length")
    norm = [_checks.valid_axis(a, x.rank) for a in axes]
    if len(set(norm)) != len(norm):
        raise ValueError(f"slice: axes {list(axes)} repeat an axis")
    if 0 in steps:
        raise ValueError("slice: steps must be nonzero")
    out = list(x.shape)
    for a, s, e, st in zip(norm, starts, ends, steps):
        d = x.shape[a]
        if isinstance(d, int):
            out[a] = len(range(*builtins.slice(s, e, st).indices(d)))
        elif (s in (None, 0) and st == 1 and (e is None or e >= 2**31 - 1)):
            out[a] = d  # the whole symbolic dim
        else:
            out[a] = f"{d}[{'' if s is None else s}:{'' if e is None else e}:{st}]"
    return [TensorType(x.dtype, tuple(out))]


def _slice_run(args, attrs):
    x = args[0]
    index = [builtins.slice(None)] * x.ndim
    for a, s, e, st in zip(attrs["axes"], attrs["starts"], attrs["ends"], attrs["steps"]):
        index[a % x.ndim] = builtins.slice(s, e, st)
    return [x[tuple(index)]]


register("slice", infer=_slice_infer, run=_slice_run, normalize=_normalize_slice, kind="shape")


def slice(x, starts, ends, axes=None, steps=None):  # noqa: A001
    """``x[starts:ends:steps]`` on ``axes`` (default: the first ``len(starts)`` axes).

    Python slice semantics: negative indices count from the end, out-of-range
    bounds clamp, ``None`` means "to the edge".
    """
    return apply("slice", [x], starts=tuple(starts), ends=tuple(ends),
                 axes=None if axes is None else tuple(axes),
                 steps=None if steps is None else tuple(steps))[0]


# -- gather / tile / select -------------------------------------------------------------
def _gather_infer(inputs, attrs):
    x, idx = inputs
    _checks.not_quantized(x)
    _checks.int_input(idx, "indices")
    if x.rank == 0:
        raise ValueError("gather needs x of rank >= 1")
    axis = _checks.valid_axis(attrs["axis"], x.rank)
    return [TensorType(x.dtype, x.shape[:axis] + idx.shape + x.shape[axis + 1:])]


def _gather_run(args, attrs):
    x, idx = args
    axis = attrs["axis"] % x.ndim
    n = x.shape[axis]
    if idx.size and (idx.min() < -n or idx.max() >= n):
        bad = idx.min() if idx.min() < -n else idx.max()
        raise IndexError(f"index {bad} is out of range for axis {axis} of size {n}")
    return [np.take(x, idx, axis=axis)]


def _tile_infer(inputs, attrs):
    (x,) = inputs
    _checks.not_quantized(x)
    reps = attrs["repeats"]
    if any(not isinstance(r, int) or r < 0 for r in reps):
        raise ValueError(f"tile repeats must be non-negative ints, got {list(reps)}")
    rank = max(len(reps), x.rank)
    shape = (1,) * (rank - x.rank) + tuple(x.shape)
    reps = (1,) * (rank - len(reps)) + tuple(reps)
    out = [d * r if isinstance(d, int) else (d if r == 1 else f"{r}*{d}")
           for d, r in zip(shape, reps)]
    return [TensorType(x.dtype, tuple(out))]


def _select_infer(inputs, attrs):
    cond, x, y = inputs
    _checks.not_quantized(cond, x, y)
    if cond.dtype != DType.bool:
        raise TypeError(f"cond must be bool, got {cond.type}")
    dtype = _checks.same_dtype(x, y)
    return [TensorType(dtype, _checks.broadcast_shapes(cond.shape, x.shape, y.shape))]


register("gather", infer=_gather_infer, run=_gather_run, kind="shape")
register("tile", infer=_tile_infer, kind="shape",
         normalize=lambda a: {**a, "repeats": tuple(int(r) for r in a["repeats"])},
         run=lambda args, attrs: [np.tile(args[0], attrs["repeats"])])
register("select", infer=_select_infer, kind="shape",
         run=lambda args, attrs: [np.where(args[0], args[1], args[2])])


def gather(x, indices, axis: int = 0):
    """``np.take(x, indices, axis)``: output ``x.shape[:axis] + indices.shape + x.shape[axis+1:]``.

    Negative indices count from the end; out-of-range indices fail at run time.
    """
    return apply("gather", [x, indices], axis=axis)[0]


def tile(x, repeats):
    """``np.tile(x, repeats)`` (shorter ``repeats`` apply to the trailing axes)."""
    return apply("tile", [x], repeats=tuple(repeats))[0]


def select(cond, x, y):
    """``np.where(cond, x, y)``: ``cond`` bool, ``x``/``y`` one dtype, all three broadcast."""
    return apply("select", [cond, x, y])[0]
