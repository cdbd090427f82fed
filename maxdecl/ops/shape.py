"""Shape ops that move no arithmetic: reshape, transpose, concat, split, slice, gather,
tile and select (``np.where``).

Symbolic dims flow through: a dim that keeps its size keeps its symbol; a dim whose
size is derived from a symbol gets a derived symbol such as ``"past+seq"``.
"""

from __future__ import annotations

import builtins
import numbers

from .. import dims
from ..dtypes import DType, TensorType, format_shape
from . import _checks
from ._registry import REQUIRED, define, public

__all__ = ["reshape", "transpose", "concat", "stack", "split", "slice", "gather", "tile", "select",
           "expand_as", "unflatten", "roll", "take_along_axis", "arange_like", "pad",
           "squeeze", "unsqueeze", "identity", "repeat_interleave", "unfold", "full_like",
           "pad_to_multiple", "axis_size", "check", "flatten", "scatter"]


def _reshape_rule(types, attrs):
    (x,) = types
    _checks.not_quantized(x)
    new = list(attrs["shape"])
    if sum(1 for d in new if d == -1) > 1:
        raise ValueError(f"reshape to {format_shape(new)}: at most one dim may be -1")
    for d in new:
        if isinstance(d, int) and d < -1:
            raise ValueError(f"reshape to {format_shape(new)}: negative dim {d}")
    _check_named_dims(x, new)
    count = dims.mul(*x.shape)
    if -1 in new:
        known = dims.mul(*(d for d in new if d != -1))
        rest = dims.divide(count, known)
        if rest is None:
            raise ValueError(f"cannot infer -1 reshaping {x} ({count} elements) to "
                             f"{format_shape(new)}")
        new[new.index(-1)] = rest
    elif dims.differ(count, dims.mul(*new)):
        raise ValueError(f"cannot reshape {x} ({count} elements) to {format_shape(new)} "
                         f"({dims.mul(*new)} elements)")
    return [TensorType(x.dtype, tuple(new))]


def _check_named_dims(x, new) -> None:
    """At run time a symbolic target dim is sized by its names from x's dims that are a
    plain name; at most one dim (a -1 or one that does not follow) is left to infer."""
    names = {d for d in x.shape if isinstance(d, str) and dims.poly(d) == {(d,): 1}}
    loose = [d for d in new if d == -1 or (isinstance(d, str) and not dims.names(d) <= names)]
    if len(loose) > 1:
        held = ", ".join(sorted(names)) or "none"
        raise ValueError(f"reshape to {format_shape(new)}: at most one dim may be left to infer "
                         f"(-1, or a symbolic dim whose names x{format_shape(x.shape)} does not "
                         f"hold as dims; it holds: {held}), got {format_shape(loose)}; unflatten "
                         f"(like) splits an axis by another value's sizes")


def _transpose_rule(inputs, attrs):
    (x,) = inputs
    _checks.not_quantized(x)
    perm = [int(p) for p in attrs["perm"]]
    if sorted(p % max(x.rank, 1) for p in perm) != list(range(x.rank)) or len(perm) != x.rank:
        raise ValueError(f"perm {perm} is not a permutation of the {x.rank} axes of "
                         f"{format_shape(x.shape)}")
    return [TensorType(x.dtype, tuple(x.shape[p] for p in perm))]


define("reshape", rule=_reshape_rule, run="shape", attrs={"shape": REQUIRED}, kind="shape",
       dim_attrs=("shape",), normalize=lambda a: {**a, "shape": tuple(a["shape"])},
       doc="new shape; one dim may be -1; symbolic dims allowed",
       rule_doc="element counts must match (as polynomials of the symbolic dims)"
                "; x not quantized (a packed weight: an f32 encoding override, or a "
                "load-time transform)")
define("transpose", rule=_transpose_rule, run="shape", attrs={"perm": REQUIRED}, kind="shape",
       normalize=lambda a: {**a, "perm": tuple(int(p) for p in a["perm"])},
       doc="permute axes", rule_doc="perm is a permutation of x's axes; x not quantized")


@public
def reshape():  # noqa: A001 - the signature comes from the definition
    """``x`` with a new shape (one dim may be -1; symbolic dims allowed)."""


@public
def transpose():  # noqa: A001 - the signature comes from the definition
    """Permute the axes of ``x`` (``np.transpose(x, perm)``)."""


# -- concat / split ---------------------------------------------------------------------
def _concat_rule(inputs, attrs):
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
        ds = [v.shape[i] for v in inputs]
        if i == axis:
            out.append(_checks.add_dims(*ds))
            continue
        ints = {d for d in ds if isinstance(d, int)}
        # dims over different names may be equal (2*win(h) and win(h2)): checked at run
        if len(ints) > 1 or any(dims.differ(d, e) for d in ds for e in ds):
            raise ValueError(f"concat on axis {axis}: dim {i} differs: "
                             + ", ".join(str(v.type) for v in inputs))
        out.append(ints.pop() if ints else ds[0])
    return [TensorType(dtype, tuple(out))]


def _stack_rule(inputs, attrs):
    if not inputs:
        raise ValueError("stack needs at least one value")
    _checks.not_quantized(*inputs)
    dtype = _checks.same_dtype(*inputs)
    rank = inputs[0].rank
    first = inputs[0].shape
    for v in inputs[1:]:
        if v.rank != rank or any(not _checks.dims_equal(a, b) for a, b in zip(v.shape, first)):
            raise ValueError("the values differ in shape: "
                             + ", ".join(str(v.type) for v in inputs))
    axis = _checks.valid_axis(attrs["axis"], rank + 1)
    shape = tuple(next((d for d in col if isinstance(d, int)), col[0])
                  for col in zip(*(v.shape for v in inputs)))
    return [TensorType(dtype, shape[:axis] + (len(inputs),) + shape[axis:])]


def _split_rule(inputs, attrs):
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


define("concat", rule=_concat_rule, run="shape", inputs=("values",), variadic=True,
       attrs={"axis": 0}, kind="shape", doc="join along axis",
       rule_doc="one dtype and rank; dims other than axis equal; axis dims add")
define("stack", rule=_stack_rule, run="shape", inputs=("values",), variadic=True,
       attrs={"axis": 0}, kind="shape", doc="join along a new axis (torch.stack)",
       rule_doc="one dtype and shape; axis in [-(rank+1), rank]")
define("split", rule=_split_rule, run="shape", attrs={"sizes": REQUIRED, "axis": 0},
       outputs=lambda n, attrs: len(attrs["sizes"]), outputs_doc="one per entry of `sizes`",
       kind="shape",
       normalize=lambda a: {**a, "sizes": tuple(int(s) for s in a["sizes"])},
       doc="split into pieces of the given sizes (one output per size)",
       rule_doc="sizes sum to the axis dim")


@public
def concat():  # noqa: A001 - the signature comes from the definition
    """Join ``values`` (same dtype, same dims except ``axis``) along ``axis``."""


@public
def stack():
    """Join ``values`` (one dtype and shape) along a new axis ``axis`` (``torch.stack``):
    the result has ``len(values)`` at ``axis``; ``axis: -1`` puts it last."""


@public
def split():  # noqa: A001 - the signature comes from the definition
    """Split ``x`` along ``axis`` into pieces of ``sizes`` (summing to that dim); a list."""


# -- slice ------------------------------------------------------------------------------
def _normalize_slice(attrs):
    starts = tuple(None if s is None else int(s) for s in attrs["starts"])
    ends = tuple(None if e is None else int(e) for e in attrs["ends"])
    n = len(starts)
    axes = tuple(range(n)) if attrs["axes"] is None else tuple(int(a) for a in attrs["axes"])
    steps = (1,) * n if attrs["steps"] is None else tuple(int(s) for s in attrs["steps"])
    return {**attrs, "starts": starts, "ends": ends, "axes": axes, "steps": steps}


def _slice_rule(inputs, attrs):
    (x,) = inputs
    _checks.not_quantized(x)
    starts, ends, axes, steps = attrs["starts"], attrs["ends"], attrs["axes"], attrs["steps"]
    if not len(starts) == len(ends) == len(axes) == len(steps):
        raise ValueError(f"starts {list(starts)}, ends {list(ends)}, axes {list(axes)} "
                         f"and steps {list(steps)} must have one length")
    norm = [_checks.valid_axis(a, x.rank) for a in axes]
    if len(set(norm)) != len(norm):
        raise ValueError(f"axes {list(axes)} repeat an axis")
    if 0 in steps:
        raise ValueError("steps must be nonzero")
    out = list(x.shape)
    for a, s, e, st in zip(norm, starts, ends, steps):
        d = x.shape[a]
        if isinstance(d, int):
            out[a] = len(range(*builtins.slice(s, e, st).indices(d)))
        elif (s in (None, 0) and st == 1 and (e is None or e >= 2**31 - 1)):
            out[a] = d  # the whole symbolic dim
        elif (st > 0 and s is not None and e is not None and (s >= 0) == (e >= 0)
              and e <= s):
            out[a] = 0  # x[2:2], x[-1:-3]: empty at any length (an empty start to concat on)
        elif (st > 1 and 0 <= (s or 0) < st and (e is None or e >= 2**31 - 1)
              and dims.divide(d, st) is not None):
            # every st-th row of a multiple of st, from any of the first st: d / st rows
            # (the even and the odd rows of a padded map, Swin's patch merging)
            out[a] = dims.divide(d, st)
        else:
            # a compound dim is sliced whole: "(h+1)[1::1]", never h + "1[1::1]"
            base = d if d.isidentifier() else f"({d})"
            out[a] = f"{base}[{'' if s is None else s}:{'' if e is None else e}:{st}]"
    return [TensorType(x.dtype, tuple(out))]


define("slice", rule=_slice_rule, run="shape", normalize=_normalize_slice, kind="shape",
       attrs={"starts": REQUIRED, "ends": REQUIRED, "axes": None, "steps": None},
       doc="x[starts:ends:steps] on axes (default: the first len(starts) axes)",
       rule_doc="starts, ends, axes, steps of one length; axes distinct and in range; x not "
                "quantized")


@public
def slice():  # noqa: A001 - the signature comes from the definition
    """``x[starts:ends:steps]`` on ``axes`` (default: the first ``len(starts)`` axes).

    Python slice semantics: negative indices count from the end, out-of-range
    bounds clamp, ``None`` means "to the edge". A negative step walks backwards:
    ``starts: [-1], ends: [null], steps: [-1]`` reverses an axis (its length stays
    the input's when the bounds are whole; other bounds on a symbolic axis give a
    length the checker does not know).
    """


# -- gather / tile / select -------------------------------------------------------------
def _gather_rule(inputs, attrs):
    x, idx = inputs
    _checks.not_quantized(x)
    _checks.int_input(idx, "indices")
    _checks.has_axes(x, "gather")
    axis = _checks.valid_axis(attrs["axis"], x.rank)
    return [TensorType(x.dtype, x.shape[:axis] + idx.shape + x.shape[axis + 1:])]


def _take_along_rule(inputs, attrs):
    x, idx = inputs
    _checks.not_quantized(x)
    _checks.int_input(idx, "indices")
    if x.rank == 0 or idx.rank != x.rank:
        raise ValueError(f"take_along_axis: indices must have x's rank ({x.rank}, at least 1), "
                         f"got x{format_shape(x.shape)} and indices{format_shape(idx.shape)}")
    axis = _checks.valid_axis(attrs["axis"], x.rank)
    others = [(a, b) for i, (a, b) in enumerate(zip(x.shape, idx.shape)) if i != axis]
    shape = _checks.broadcast_shapes(tuple(a for a, _ in others), tuple(b for _, b in others))
    shape = list(shape)
    shape.insert(axis, idx.shape[axis])
    return [TensorType(x.dtype, tuple(shape))]


SCATTER_REDUCE = ("sum", "prod", "mean", "amax", "amin")


def _normalize_scatter(a):
    reduce = a["reduce"]
    if reduce is not None and reduce not in SCATTER_REDUCE:
        raise ValueError(f"reduce must be null (replace) or one of "
                         f"{', '.join(SCATTER_REDUCE)}, got {reduce!r}")
    if not isinstance(a["include_self"], bool):
        raise ValueError(f"include_self must be true or false, got "
                         f"{a['include_self']!r}")
    return dict(a)


def _scatter_rule(inputs, attrs):
    x, idx, values = inputs
    _checks.not_quantized(x, values)
    _checks.int_input(idx, "indices")
    _checks.same_dtype(x, values)
    if x.rank == 0 or idx.rank != x.rank:
        raise ValueError(f"indices must have x's rank ({x.rank}, at least 1), "
                         f"got x{format_shape(x.shape)} and indices{format_shape(idx.shape)}")
    axis = _checks.valid_axis(attrs["axis"], x.rank)
    for i, (a, b) in enumerate(zip(x.shape, idx.shape)):
        fits = (_checks.dims_equal(a, b) if not (isinstance(a, int) and isinstance(b, int))
                else b <= a)
        if i != axis and not fits:
            raise ValueError(f"indices{format_shape(idx.shape)} must not be longer "
                             f"than x{format_shape(x.shape)} on axes other than {axis} "
                             f"(dim {i}: {b} vs {a})")
    try:
        fits = (values.rank <= idx.rank
                and _checks.broadcast_shapes(values.shape, idx.shape) == idx.shape)
    except ValueError:
        fits = False
    if not fits:
        raise ValueError(f"values{format_shape(values.shape)} must broadcast to "
                         f"indices{format_shape(idx.shape)} (one value per index)")
    if attrs["reduce"] is not None:
        _checks.no_bfloat16(x)
        if x.dtype == DType.bool:
            raise TypeError(f"reduce {attrs['reduce']} needs numbers, got {x.type}")
    return [TensorType(x.dtype, x.shape)]


def _arange_like_rule(inputs, attrs):
    (x,) = inputs
    if x.rank == 0:
        raise ValueError("arange_like needs x of rank >= 1 (it counts along an axis of x)")
    axis = _checks.valid_axis(attrs["axis"], x.rank)
    start = attrs["start"]
    if isinstance(start, bool) or not isinstance(start, int):
        raise ValueError(f"arange_like start must be an int, got {start!r}")
    return [TensorType(DType.int64, (x.shape[axis],))]


def _flatten_rule(inputs, attrs):
    (x,) = inputs
    _checks.not_quantized(x)
    _checks.has_axes(x, "flatten")
    start = _checks.valid_axis(attrs["start_axis"], x.rank)
    end = _checks.valid_axis(attrs["end_axis"], x.rank)
    if end < start:
        raise ValueError(f"end_axis {attrs['end_axis']} comes before start_axis "
                         f"{attrs['start_axis']} in rank {x.rank}")
    merged = dims.mul(*x.shape[start:end + 1])
    return [TensorType(x.dtype, x.shape[:start] + (merged,) + x.shape[end + 1:])]


def _axis_size_rule(inputs, attrs):
    (x,) = inputs
    _checks.has_axes(x, "axis_size")
    _checks.valid_axis(attrs["axis"], x.rank)
    return [TensorType(DType.int64, ())]


def _check_rule(inputs, attrs):
    x, ok = inputs
    if ok.is_quantized or ok.dtype != DType.bool:
        raise TypeError(f"check needs a bool condition, got {ok.type}")
    message = attrs["message"]
    if not isinstance(message, str) or not message.strip():
        raise ValueError(f"check message must be a non-empty string, got {message!r}")
    if "\n" in message or len(message) > 500:
        raise ValueError("check message must be one line of at most 500 characters")
    return [x.type]


def _positive_int(attrs, key: str) -> int:
    v = attrs[key]
    if isinstance(v, bool) or not isinstance(v, int) or v < 1:
        raise ValueError(f"{key} must be a positive int, got {v!r}")
    return v


def _unfold_rule(inputs, attrs):
    (x,) = inputs
    _checks.not_quantized(x)
    _checks.has_axes(x, "unfold")
    axis = _checks.valid_axis(attrs["axis"], x.rank)
    size, step = _positive_int(attrs, "size"), _positive_int(attrs, "step")
    n = x.shape[axis]
    if isinstance(n, int):
        if n < size:
            raise ValueError(f"unfold: windows of {size} do not fit axis {axis} of size {n}")
        out = (n - size) // step + 1
    elif step == 1:
        out = dims.add(n, 1 - size)          # seq+4 padded, windows of 5: seq
    else:
        from .conv import window_out

        out = window_out(n, size, step, 1, 0, 0)
    shape = list(x.shape)
    shape[axis] = out
    return [TensorType(x.dtype, (*shape, size))]


def _full_like_rule(inputs, attrs):
    (x,) = inputs
    dtype = x.dtype if attrs["dtype"] is None else attrs["dtype"]
    if x.is_quantized and attrs["dtype"] is None:
        raise TypeError(f"full_like of packed blocks needs a dtype (got {x.type})")
    v = attrs["value"]
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise ValueError(f"value must be a number, got {v!r}")
    if dtype != DType.bool and dtype.value.startswith(("int", "uint")) and v != int(v):
        raise ValueError(f"value {v!r} is not a whole number for {dtype.value}")
    return [TensorType(dtype, x.logical_shape if x.is_quantized else x.shape)]


def _normalize_full(attrs):
    if attrs["dtype"] is None:
        return attrs
    try:
        return {**attrs, "dtype": DType.parse(attrs["dtype"])}
    except Exception as e:  # noqa: BLE001 - a GraphError from DType.parse
        raise ValueError(str(e)) from None


PAD_MODES = ("constant", "reflect", "replicate", "circular")


def _normalize_pad(a):
    pads = a["pads"]
    pads = (pads,) if isinstance(pads, int) and not isinstance(pads, bool) else tuple(pads)
    if (not pads or len(pads) % 2 or any(isinstance(p, bool) or not isinstance(p, int)
                                         or p < 0 for p in pads)):
        raise ValueError(f"pad: pads must be non-negative ints, a (before, after) pair per "
                         f"axis, got {a['pads']!r}")
    axes = a["axes"]
    n = len(pads) // 2
    axes = tuple(range(-n, 0)) if axes is None else (
        (axes,) if isinstance(axes, int) and not isinstance(axes, bool) else tuple(axes))
    if len(axes) != n or any(isinstance(x, bool) or not isinstance(x, int) for x in axes):
        raise ValueError(f"pad: {n} (before, after) pairs need {n} axes, got {a['axes']!r}")
    mode = str(a["mode"])
    if mode not in PAD_MODES:
        raise ValueError(f"pad: mode must be one of {', '.join(PAD_MODES)}, got {mode!r}")
    value = a["value"]
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"pad: value must be a number, got {value!r}")
    return {**a, "pads": pads, "axes": axes, "mode": mode, "value": float(value)}


def _pad_rule(inputs, attrs):
    (x,) = inputs
    _checks.not_quantized(x)
    shape = list(x.shape)
    seen = set()
    for k, axis in enumerate(attrs["axes"]):
        ax = _checks.valid_axis(axis, x.rank)
        if ax in seen:
            raise ValueError(f"pad: axis {axis} given twice")
        seen.add(ax)
        before, after = attrs["pads"][2 * k], attrs["pads"][2 * k + 1]
        d = shape[ax]
        if attrs["mode"] == "reflect" and isinstance(d, int) and max(before, after) >= d:
            raise ValueError(f"pad: reflect padding ({before}, {after}) must be less than "
                             f"the size {d} of axis {axis}")
        if attrs["mode"] == "circular" and isinstance(d, int) and max(before, after) > d:
            raise ValueError(f"pad: circular padding ({before}, {after}) wraps more than the "
                             f"size {d} of axis {axis}")
        if attrs["mode"] in ("replicate", "circular") and d == 0:
            raise ValueError(f"pad: {attrs['mode']} padding of an empty axis {axis}")
        shape[ax] = _checks.add_dims(d, before + after) if before + after else d
    return [TensorType(x.dtype, tuple(shape))]


def _normalize_multiple(a):
    m = a["multiples"]
    m = (m,) if isinstance(m, int) and not isinstance(m, bool) else tuple(m)
    if not m or any(isinstance(v, bool) or not isinstance(v, int) or v < 1 for v in m):
        raise ValueError(f"multiples must be positive ints, one per axis, got "
                         f"{a['multiples']!r}")
    axes = a["axes"]
    axes = tuple(range(-len(m), 0)) if axes is None else (
        (axes,) if isinstance(axes, int) and not isinstance(axes, bool) else tuple(axes))
    if len(axes) != len(m) or any(isinstance(x, bool) or not isinstance(x, int) for x in axes):
        raise ValueError(f"{len(m)} multiples need {len(m)} axes, got {a['axes']!r}")
    value = a["value"]
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"value must be a number, got {value!r}")
    mode = str(a["mode"])
    if mode not in PAD_MODES:
        raise ValueError(f"mode must be one of {', '.join(PAD_MODES)}, got {mode!r}")
    return {**a, "multiples": m, "axes": axes, "value": float(value), "mode": mode}


def padded_to(d, m: int):
    """An axis of size ``d`` padded up to a multiple of ``m`` (a symbolic one: ``m`` times
    the opaque count of blocks, which a reshape by ``m`` divides back out)."""
    if m == 1:
        return d
    if isinstance(d, int):
        return -(-d // m) * m
    from .conv import window_out

    return dims.mul(m, window_out(d, 1, m, 1, 0, m - 1))


def _pad_to_multiple_rule(inputs, attrs):
    (x,) = inputs
    _checks.not_quantized(x)
    shape = list(x.shape)
    seen = set()
    for axis, m in zip(attrs["axes"], attrs["multiples"]):
        ax = _checks.valid_axis(axis, x.rank)
        if ax in seen:
            raise ValueError(f"axis {axis} given twice")
        seen.add(ax)
        shape[ax] = padded_to(shape[ax], m)
    return [TensorType(x.dtype, tuple(shape))]


def _tile_rule(inputs, attrs):
    (x,) = inputs
    _checks.not_quantized(x)
    reps = attrs["repeats"]
    if any(not isinstance(r, int) or r < 0 for r in reps):
        raise ValueError(f"tile repeats must be non-negative ints, got {list(reps)}")
    rank = max(len(reps), x.rank)
    shape = (1,) * (rank - x.rank) + tuple(x.shape)
    reps = (1,) * (rank - len(reps)) + tuple(reps)
    out = [dims.mul(d, r) for d, r in zip(shape, reps)]
    return [TensorType(x.dtype, tuple(out))]


def _whole(r) -> bool:
    return (isinstance(r, numbers.Integral) and not isinstance(r, bool)) or (
        isinstance(r, float) and r.is_integer())


def _tile_repeats(attrs):
    reps = attrs["repeats"]
    reps = list(reps) if hasattr(reps, "__iter__") and not isinstance(reps, (str, bytes)) \
        else reps
    if not isinstance(reps, list) or not all(_whole(r) for r in reps):
        raise ValueError(f"tile repeats must be non-negative ints, got {reps!r} (a symbolic "
                         "dim is not a repeat count: expand_as(x, like) broadcasts x to the "
                         "shape of a value)")
    return {**attrs, "repeats": tuple(int(r) for r in reps)}


def _expand_as_rule(inputs, attrs):
    x, like = inputs
    _checks.not_quantized(x)
    axes = attrs["axes"]
    if axes is not None:            # only these axes of x (size 1) take like's size
        if x.rank != like.rank:
            raise ValueError(f"with axes, x{format_shape(x.shape)} and like"
                             f"{format_shape(like.shape)} need one rank")
        if not isinstance(axes, (list, tuple)) or not axes:
            raise ValueError(f"axes must be a non-empty list of axes, got {axes!r}")
        norm = [_checks.valid_axis(a, x.rank) for a in axes]
        if len(set(norm)) != len(norm):
            raise ValueError(f"axes {list(axes)} repeat an axis")
        bad = [a for a in norm if x.shape[a] != 1]
        if bad:
            raise ValueError(f"axis {bad[0]} of x{format_shape(x.shape)} is not 1: only "
                             "size-1 axes expand")
        return [TensorType(x.dtype, tuple(like.shape[a] if a in norm else d
                                          for a, d in enumerate(x.shape)))]
    if x.rank > like.rank or any(
            d != 1 and dims.differ(d, e) for d, e in zip(x.shape[::-1], like.shape[::-1])):
        raise ValueError(f"x{format_shape(x.shape)} does not broadcast to "
                         f"{format_shape(like.shape)}: each dim of x must be 1 or the same")
    return [TensorType(x.dtype, tuple(like.shape))]


def _select_rule(inputs, attrs):
    cond, x, y = inputs
    _checks.not_quantized(cond, x, y)
    if cond.dtype != DType.bool:
        raise TypeError(f"cond must be bool, got {cond.type}")
    dtype = _checks.same_dtype(x, y)
    return [TensorType(dtype, _checks.broadcast_shapes(cond.shape, x.shape, y.shape))]


define("gather", rule=_gather_rule, run="shape", inputs=("x", "indices"), attrs={"axis": 0},
       kind="shape", doc="np.take(x, indices, axis)",
       rule_doc="indices integer; out x.shape[:axis] + indices.shape + x.shape[axis+1:]")
define("take_along_axis", rule=_take_along_rule, run="shape", inputs=("x", "indices"),
       attrs={"axis": REQUIRED}, kind="shape",
       doc="np.take_along_axis(x, indices, axis): torch.gather(x, axis, indices), one index "
           "list per position of the other axes",
       rule_doc="indices integer, x's rank; the other axes broadcast; out: the broadcast "
                "of the other axes (indices [B, n, 1] on x [B, N, D] along axis 1 gives "
                "[B, n, D]), indices' size along axis")
define("scatter", rule=_scatter_rule, run="scatter", inputs=("x", "indices", "values"),
       attrs={"axis": REQUIRED, "reduce": None, "include_self": True},
       normalize=_normalize_scatter, kind="shape",
       doc="x with values written at indices along axis: torch's x.scatter(axis, indices, "
           "values) and x.scatter_reduce(axis, indices, values, reduce, include_self) "
           "(np.put_along_axis); reduce null replaces (an index given twice: the later "
           "value in C order wins), sum, prod, mean (integers: floor), amax or amin combine",
       rule_doc="indices integer, x's rank, no longer than x on the other axes; values: "
                "x's dtype, broadcasting to indices' shape; out: x's type")
define("arange_like", rule=_arange_like_rule, run="shape", attrs={"axis": 0, "start": 0},
       kind="shape",
       doc="int64 [start, start + 1, ...] as long as x's axis (np.arange(start, start + n)); "
           "x's values are not read",
       rule_doc="x rank >= 1; out int64 [x.shape[axis]]")
define("flatten", rule=_flatten_rule, run="shape", attrs={"start_axis": 0, "end_axis": -1},
       kind="shape",
       normalize=lambda a: {**a, "start_axis": int(a["start_axis"]),
                            "end_axis": int(a["end_axis"])},
       doc="axes start_axis..end_axis merged into one, C order (torch.flatten(x, start_dim, "
           "end_dim)); the inverse of unflatten, symbolic sizes multiplied",
       rule_doc="x rank >= 1, start_axis <= end_axis; out: that run of dims replaced by "
                "their product")
define("axis_size", rule=_axis_size_rule, run="shape", attrs={"axis": 0}, kind="shape",
       normalize=lambda a: {**a, "axis": int(a["axis"])},
       doc="int64 0-d length of x's axis (torch's x.size(axis)), known when the graph runs; "
           "x's values are not read",
       rule_doc="x rank >= 1; out int64 []")
define("check", rule=_check_rule, run="shape", inputs=("x", "ok"),
       attrs={"message": REQUIRED}, kind="shape",
       doc="x unchanged when every element of the bool ok is true; else the run stops "
           "with the layer's path and message (a size a model cannot take: a map smaller "
           "than its window); use its output, as a check no output depends on is not run",
       rule_doc="ok bool (any shape); message one line; out: the type of x")
define("full_like", rule=_full_like_rule, run="shape", attrs={"value": 0.0, "dtype": None},
       normalize=_normalize_full, kind="shape",
       doc="x's shape filled with value (torch.full_like; zeros_like with value 0): an "
           "initial state or mask that never reads x's values, so inf or NaN in x stay out "
           "(mul(x, 0.0) gives NaN for them)",
       rule_doc="value a number (whole for an integer dtype); dtype: x's unless given; out: "
                "x's shape")
define("unfold", rule=_unfold_rule, run="shape", attrs={"axis": REQUIRED, "size": REQUIRED,
                                                        "step": 1}, kind="shape",
       doc="every window of `size` consecutive entries along axis, `step` apart, as a new "
           "last axis (torch's Tensor.unfold, not nn.Unfold): [b, L, c] with axis 1, size "
           "k gives [b, L - k + 1, c, k]; pad first for windows centred on each position",
       rule_doc="axis one of x's; size, step positive ints, size at most the axis; out: "
                "that axis (L - size) // step + 1 long, then a last axis of size")
define("pad", rule=_pad_rule, run="shape",
       attrs={"pads": REQUIRED, "axes": None, "mode": "constant", "value": 0.0},
       normalize=_normalize_pad, kind="shape",
       doc="x padded along axes: constant (value), reflect, replicate (edge) or circular "
           "(torch.nn.functional.pad; np.pad)",
       rule_doc="pads: (before, after) non-negative per axis (axes default: the last ones); "
                "out: those axes longer by before + after")
define("pad_to_multiple", rule=_pad_to_multiple_rule, run="shape",
       attrs={"multiples": REQUIRED, "axes": None, "value": 0.0, "mode": "constant"},
       normalize=_normalize_multiple, kind="shape",
       doc="x padded at the end of each axis up to the next multiple of its multiple, with "
           "value (mode constant) or as pad's reflect, replicate or circular modes "
           "(transformers' Swin and FocalNet padding of a map to whole windows or patches, "
           "EnCodec's to whole strides, Swin2SR's reflect padding); an axis already a "
           "multiple is unchanged",
       rule_doc="multiples positive ints, one per axis (axes default: the last ones); out: "
                "each axis rounded up to its multiple (a symbolic one: multiple times an "
                "opaque block count)")
define("tile", rule=_tile_rule, run="shape", attrs={"repeats": REQUIRED}, kind="shape",
       normalize=_tile_repeats,
       doc="np.tile", rule_doc="repeats non-negative ints; each dim times its repeat")
define("expand_as", rule=_expand_as_rule, run="shape", inputs=("x", "like"), kind="shape",
       attrs={"axes": None},
       normalize=lambda a: {**a, "axes": None if a["axes"] is None else
                            [int(v) for v in a["axes"]]},
       doc="x broadcast to the shape of like (torch's x.expand_as(like)); with axes, only "
           "those size-1 axes of x take like's sizes (a learned [1, N, D] table to like's "
           "batch: axes [0], like [batch, S, D]), the others keep x's",
       rule_doc="each dim of x 1 or equal to like's (trailing dims aligned); with axes: one "
                "rank, those axes of x 1; out: x's dtype; like's values are not read")
def _unflatten_rule(inputs, attrs):
    x, *like = inputs
    _checks.not_quantized(x)
    axis, axes, fixed = attrs["axis"], attrs["like_axes"], attrs["sizes"]
    if not -x.rank <= axis < x.rank:
        raise ValueError(f"axis {axis} is not an axis of x{format_shape(x.shape)}")
    if (fixed is None) == (not like) or (like and axes is None) or (fixed and axes):
        raise ValueError("unflatten takes either the input like with like_axes, or sizes")
    axis %= x.rank
    d = x.shape[axis]
    if fixed is not None:
        sizes = _fixed_sizes(d, fixed, x)
    else:
        (like,) = like
        if not axes or any(not -like.rank <= a < like.rank for a in axes):
            raise ValueError(f"like_axes {list(axes)} must name axes of like"
                             f"{format_shape(like.shape)}")
        sizes = tuple(like.shape[a % like.rank] for a in axes)
        if dims.differ(dims.mul(*sizes), d):
            raise ValueError(f"axis {axis} of x{format_shape(x.shape)} is {d}, not "
                             f"the product of like{format_shape(like.shape)}'s axes "
                             f"{list(axes)} ({dims.mul(*sizes)})")
    return [TensorType(x.dtype, x.shape[:axis] + sizes + x.shape[axis + 1:])]


def _fixed_sizes(d, fixed, x) -> tuple:
    """``sizes`` with its -1 (if any) worked out from the axis length ``d``: an int, the
    polynomial quotient, or an opaque ``div(d,known)`` for a length no name divides."""
    known = 1
    for v in fixed:
        known *= v if v != -1 else 1
    if -1 not in fixed:
        if dims.differ(known, d):
            raise ValueError(f"sizes {list(fixed)} multiply to {known}, not the axis length "
                             f"{d} of x{format_shape(x.shape)}")
        return tuple(fixed)
    if isinstance(d, int):
        if d % known:
            raise ValueError(f"sizes {list(fixed)} do not divide the axis length {d} of "
                             f"x{format_shape(x.shape)}")
        rest = d // known
    else:
        rest = dims.divide(d, known) or f"div({d},{known})"
    return tuple(rest if v == -1 else v for v in fixed)


def _normalize_unflatten(a):
    if a["axis"] is None:
        raise ValueError("unflatten needs attribute 'axis'")
    axes, fixed = a["like_axes"], a["sizes"]
    axes = None if axes is None else (axes,) if isinstance(axes, int) else tuple(axes)
    if any(isinstance(v, bool) or not isinstance(v, int) for v in (a["axis"], *(axes or ()))):
        raise ValueError(f"axis and like_axes must be ints, got {a['axis']!r}, {a['like_axes']!r}")
    if fixed is not None:
        fixed = (fixed,) if isinstance(fixed, int) else tuple(fixed)
        if (not fixed or sum(v == -1 for v in fixed) > 1
                or any(isinstance(v, bool) or not isinstance(v, int) or (v < 1 and v != -1)
                       for v in fixed)):
            raise ValueError(f"unflatten sizes must be positive ints, one of them -1 at most, "
                             f"got {a['sizes']!r}")
    return {**a, "like_axes": axes, "sizes": fixed}


define("unflatten", rule=_unflatten_rule, run="shape", inputs=("x",), optional=("like",),
       attrs={"axis": None, "like_axes": None, "sizes": None},    # axis: required (checked)
       normalize=_normalize_unflatten,
       kind="shape", doc="axis of x split into the sizes of like's like_axes, or into sizes "
                         "(torch's x.unflatten(axis, sizes))",
       rule_doc="x's axis is the product of like's like_axes (or of sizes, one may be -1); "
                "out: those dims in its place; like's values are not read")
def _roll_rule(inputs, attrs):
    (x,) = inputs
    _checks.not_quantized(x)
    shifts, axes = attrs["shifts"], attrs["axes"]
    if len(shifts) != len(axes) or not axes:
        raise ValueError(f"roll needs one shift per axis, got shifts {list(shifts)} and axes "
                         f"{list(axes)}")
    if any(not -x.rank <= a < x.rank for a in axes):
        raise ValueError(f"axes {list(axes)} must be axes of x{format_shape(x.shape)}")
    return [x]


def _normalize_roll(a):
    out = {}
    for key in ("shifts", "axes"):
        v = a[key]
        v = (v,) if isinstance(v, int) and not isinstance(v, bool) else tuple(v)
        if any(isinstance(e, bool) or not isinstance(e, int) for e in v):
            raise ValueError(f"roll {key} must be ints, got {a[key]!r}")
        out[key] = v
    return {**a, **out}


define("roll", rule=_roll_rule, run="shape", attrs={"shifts": REQUIRED, "axes": REQUIRED},
       normalize=_normalize_roll, kind="shape",
       doc="elements shifted along axes, wrapping around (torch.roll, np.roll)",
       rule_doc="one int shift per axis; out: the type of x")


def _axes_attr(op):
    def normalize(a):
        v = a["axis"]
        v = (v,) if isinstance(v, int) and not isinstance(v, bool) else tuple(v)
        if not v or any(isinstance(e, bool) or not isinstance(e, int) for e in v):
            raise ValueError(f"{op} axis must be an int or a non-empty list of ints, got "
                             f"{a['axis']!r}")
        return {**a, "axis": v}
    return normalize


def _squeeze_rule(inputs, attrs):
    (x,) = inputs
    _checks.not_quantized(x)
    axes = {_checks.valid_axis(a, x.rank) for a in attrs["axis"]}
    if len(axes) != len(attrs["axis"]):
        raise ValueError(f"squeeze axis {list(attrs['axis'])} names an axis twice")
    for a in sorted(axes):
        if isinstance(x.shape[a], int) and x.shape[a] != 1:
            raise ValueError(f"squeeze axis {a} of x{format_shape(x.shape)} has size "
                             f"{x.shape[a]}, not 1")
    return [TensorType(x.dtype, tuple(d for i, d in enumerate(x.shape) if i not in axes))]


def _unsqueeze_rule(inputs, attrs):
    (x,) = inputs
    _checks.not_quantized(x)
    rank = x.rank + len(attrs["axis"])
    axes = {_checks.valid_axis(a, rank) for a in attrs["axis"]}
    if len(axes) != len(attrs["axis"]):
        raise ValueError(f"unsqueeze axis {list(attrs['axis'])} names an axis twice")
    rest = iter(x.shape)
    return [TensorType(x.dtype, tuple(1 if i in axes else next(rest) for i in range(rank)))]


define("squeeze", rule=_squeeze_rule, run="shape", attrs={"axis": REQUIRED},
       normalize=_axes_attr("squeeze"), kind="shape",
       doc="axes of size 1 removed (np.squeeze, torch's x.squeeze(dim)); one axis or a list",
       rule_doc="each axis has size 1 (a symbolic or opaque dim: checked when it runs); "
                "out: x's dims without them")
define("unsqueeze", rule=_unsqueeze_rule, run="shape", attrs={"axis": REQUIRED},
       normalize=_axes_attr("unsqueeze"), kind="shape",
       doc="axes of size 1 inserted (np.expand_dims, torch's x.unsqueeze(dim)): each axis "
           "is a position in the output; one axis or a list",
       rule_doc="axes within the output's rank, each once; out: x's dims with 1s there")


def _identity_rule(inputs, attrs):
    (x,) = inputs
    _checks.not_quantized(x)
    return [x.type]


define("identity", rule=_identity_rule, run="shape", kind="shape",
       doc="x itself under another name (a value that one branch of a 0/1 group computes "
           "and the other passes through)",
       rule_doc="x not quantized; out: the type of x")


def _repeat_interleave_rule(inputs, attrs):
    x, *counts = inputs
    _checks.not_quantized(x)
    axis = _checks.valid_axis(attrs["axis"], x.rank)
    shape = list(x.shape)
    r, length = attrs["repeats"], attrs["length"]
    if counts:
        (c,) = counts
        if r is not None:
            raise ValueError("give `repeats` (one count for all) or a `counts` input, not both")
        if c.dtype not in (DType.int64, DType.int32) or c.rank != 1:
            raise ValueError(f"counts must be 1-D int64 (one count per element along axis "
                             f"{axis}), got {c.type}")
        if not _checks.dims_equal(c.shape[0], shape[axis]):
            raise ValueError(f"counts {c.type} must have one count per element of axis {axis} "
                             f"of {x.type}")
        if not (isinstance(length, str) and length.isidentifier()):
            raise ValueError(f"with a `counts` input the new axis length depends on the "
                             f"data: name it with `length` (a new dim name such as frames), "
                             f"got {length!r}")
        shape[axis] = length
        return [TensorType(x.dtype, tuple(shape))]
    if isinstance(r, bool) or not isinstance(r, int) or r < 0:
        raise ValueError(f"repeat_interleave repeats must be a non-negative int, got {r!r}")
    shape[axis] = dims.mul(shape[axis], r)
    return [TensorType(x.dtype, tuple(shape))]


define("repeat_interleave", rule=_repeat_interleave_rule, run="shape", optional=("counts",),
       attrs={"repeats": None, "axis": 0, "length": None}, kind="shape",
       normalize=lambda a: {**a, "repeats": int(a["repeats"]) if _whole(a["repeats"])
                            else a["repeats"], "axis": int(a["axis"])},
       doc="each element repeated in place along axis (torch's x.repeat_interleave(repeats, "
           "dim), np.repeat): `repeats` times each ([a, b] -> [a, a, b, b]), or `counts[i]` "
           "times element i, a data-dependent length the type checker knows as the dim "
           "named by `length`",
       rule_doc="repeats a non-negative int (the axis dim times repeats), or counts 1-D int "
                "with one count per element and `length` a new dim name (the output's axis)")
define("select", rule=_select_rule, run="shape", inputs=("cond", "x", "y"), kind="shape",
       doc="np.where(cond, x, y)",
       rule_doc="cond bool; x, y one dtype; the three shapes broadcast")


@public
def gather():  # noqa: A001 - the signature comes from the definition
    """``np.take(x, indices, axis)``: output ``x.shape[:axis] + indices.shape + x.shape[axis+1:]``.

    Negative indices count from the end; out-of-range indices fail at run time. In a
    spec, a literal int or ``"{expr}"`` as ``indices`` is a 0-d int64 index, which drops
    the axis (``gather(x, "{k}", axis: 0)`` is ``x[k]``).
    """


@public
def take_along_axis():  # noqa: A001 - the signature comes from the definition
    """``np.take_along_axis(x, indices, axis)``, torch's ``x.gather(axis, indices)``.

    ``out[..., j, ...] = x[..., indices[..., j, ...], ...]`` along ``axis``: each
    position of the other axes picks its own entries (the router weights of the experts
    a token chose: ``take_along_axis(probs [seq, E], ids [seq, k], axis: 1)`` gives
    ``[seq, k]``). indices has x's rank; its other axes and x's broadcast against each
    other (size 1 or equal), as in NumPy. Negative indices count from the end; out-of-range ones fail at run time.
    """


@public
def scatter():  # noqa: A001 - the signature comes from the definition
    """x with ``values`` written at ``indices`` along ``axis``: torch's ``x.scatter(axis,
    indices, values)`` and ``x.scatter_reduce(axis, indices, values, reduce,
    include_self)``, the inverse of ``take_along_axis``.

    ``out[..., indices[..., j, ...], ...] = values[..., j, ...]`` along ``axis``, every
    other axis at the same position (indices may be shorter there, as torch allows:
    the rest of x is kept). ``values`` broadcasts to indices' shape (a scalar fills).
    ``reduce``: null replaces (an index given twice: the later one in C order wins),
    ``sum``, ``prod``, ``mean`` (integers: floor division, as torch), ``amax``,
    ``amin``; ``include_self: false`` leaves x's own entry out where an index lands.
    Negative indices count from the end; out-of-range ones fail at run time.
    """


@public
def arange_like():  # noqa: A001 - the signature comes from the definition
    """int64 ``[start, ..., start + n - 1]`` with ``n = x.shape[axis]``; only x's shape
    is read, so the length may be symbolic.

    Position ids of an encoder without a positions input: ``arange_like(tokens, axis:
    1)``. The positions of a decoder's keys for a relative position bias (T5) are
    better carried as their own int64 state ``key_positions [past]``, with ``concat``
    of it and this step's positions as the new value (specs/t5.yaml):
    ``arange_like(kv_cache, axis: 1)`` gives the same numbers, but a state read by an
    op other than its attention is refused in a batched step (``rows=``).
    """


@public
def pad():  # noqa: A001 - the signature comes from the definition
    """``x`` padded along ``axes``, as ``torch.nn.functional.pad`` / ``np.pad``.

    ``pads``: ``[before, after]`` for each axis of ``axes``, flat and in the order of
    ``axes`` (``[1, 1, 2, 2]`` with ``axes: [1, 2]`` pads H by 1 and W by 2 on both
    sides of NHWC x); ``axes`` defaults to the last ``len(pads) / 2`` axes in order (note
    torch's ``F.pad`` lists the last axis first). Modes: ``constant`` (``value``),
    ``reflect`` (mirrored without the edge; each pad less than its axis), ``replicate``
    (the edge repeated) and ``circular`` (wrapped). Zero padding that a following norm
    or pool must see (BiT's stem: ``ConstantPad2d`` before a GroupNorm), or a
    ``max_pool`` with padding that may win (``value``).

    Example::

        y = md.ops.pad(x, [1, 1, 1, 1], axes=[1, 2])            # x: [N, H, W, C]
        y = md.ops.pad(x, [3, 3], mode="reflect")               # the last axis
    """


@public
def tile():  # noqa: A001 - the signature comes from the definition
    """``np.tile(x, repeats)`` (shorter ``repeats`` apply to the trailing axes)."""


@public
def expand_as():  # noqa: A001 - the signature comes from the definition
    """``x`` broadcast to the shape of ``like`` (torch's ``x.expand_as(like)``).

    The shape comes from a value, so it may hold symbolic dims: a learned [CLS] embedding
    ``[1, 1, dim]`` becomes ``[n, 1, dim]`` for a batch of ``n`` images by
    ``expand_as(cls, like)`` with ``like`` any ``[n, 1, dim]`` value (a ``slice`` of the
    patch embeddings), before a ``concat``. Only the shape of ``like`` is used.
    """


@public
def unflatten():  # noqa: A001 - the signature comes from the definition
    """Axis ``axis`` of ``x`` split into the sizes of ``like``'s axes ``like_axes``, as
    ``x.unflatten(axis, like.shape[...])`` in torch.

    The sizes come from a value, so they may be symbolic dims that a spec cannot name,
    such as a strided conv's output height and width (``win(...)``): tokens ``[n, H*W,
    C]`` back to the feature map ``[n, H, W, C]`` they were flattened from is
    ``unflatten(tokens, fmap, axis: 1, like_axes: [1, 2])`` (hierarchical vision
    transformers: SegFormer, Swin). Only the shape of ``like`` is used. Or, without
    ``like``, fixed ``sizes`` (one may be -1), torch's ``x.unflatten(axis, (-1, p))``:
    rows of a strided-conv map cut into patches of ``p`` (MobileViT); over a length no
    name divides, the -1 becomes an opaque ``div(h,p)`` dim, checked when it runs.
    """


@public
def roll():  # noqa: A001 - the signature comes from the definition
    """``x`` with its elements shifted by ``shifts[i]`` along ``axes[i]``, those that fall
    off one end coming back at the other (``torch.roll(x, shifts, dims)``). Swin's
    shifted windows: ``roll(x, shifts: [-s, -s], axes: [1, 2])`` before the window
    attention, ``[s, s]`` after."""


@public
def select():  # noqa: A001 - the signature comes from the definition
    """``np.where(cond, x, y)``: ``cond`` bool, ``x``/``y`` one dtype, all three broadcast."""


@public
def squeeze():  # noqa: A001 - the signature comes from the definition
    """``x`` without its size-1 axes ``axis`` (``np.squeeze(x, axis)``)."""


@public
def unsqueeze():  # noqa: A001 - the signature comes from the definition
    """``x`` with size-1 axes inserted at the output positions ``axis``
    (``np.expand_dims(x, axis)``)."""


@public
def identity():  # noqa: A001 - the signature comes from the definition
    """``x`` unchanged: a second name for a value."""


@public
def repeat_interleave():  # noqa: A001 - the signature comes from the definition
    """Each element of ``x`` repeated ``repeats`` times in place along ``axis``
    (``np.repeat(x, repeats, axis)``); ``tile`` repeats the whole tensor instead.

    With a ``counts`` input (1-D int64, one count >= 0 per element along ``axis``),
    element i is repeated ``counts[i]`` times (``torch.repeat_interleave(x, counts,
    dim)``): the output's length along ``axis`` is ``sum(counts)``, known only at run
    time, so ``length`` names it as a new dim (``length: frames``) for the type checker.
    A FastSpeech-style length regulator is this op on the encoder states and the rounded
    durations. Counts summing to more than 2**31 elements are refused."""


@public
def unfold():  # noqa: A001 - the signature comes from the definition
    """Every window of ``size`` consecutive entries along ``axis``, ``step`` apart, as a
    new last axis: torch's ``Tensor.unfold(axis, size, step)`` (not ``nn.Unfold``). The
    axis becomes ``(L - size) // step + 1`` long. ConvBERT's span convolution reads each
    token's neighbours as ``unfold(pad(x, pads: [2, 2], axes: [1]), axis: 1, size: 5)``;
    framing audio is ``unfold(wave, axis: -1, size: n_fft, step: hop)``.

    Example::

        w = md.ops.unfold(x, axis=1, size=3)     # x: [b, L, c] -> [b, L - 2, c, 3]
    """


@public
def full_like():  # noqa: A001 - the signature comes from the definition
    """``x``'s shape filled with ``value`` in ``dtype`` (x's when None), as
    ``torch.full_like``; x's values are never read.

    Example::

        h0 = md.ops.full_like(x, value=0.0)
    """


@public
def pad_to_multiple():  # noqa: A001 - the signature comes from the definition
    """``x`` padded with ``value`` at the end of each of ``axes`` up to the next multiple
    of its entry in ``multiples``: transformers' right and bottom padding of a Swin or
    FocalNet map to whole windows or patches. A symbolic axis of size ``h`` becomes
    ``m * win(h,...)``, which a ``reshape`` to ``[..., -1, m, ...]`` splits back.

    Example::

        y = md.ops.pad_to_multiple(x, multiples=(7, 7), axes=(1, 2))   # NHWC
    """


@public
def axis_size():  # noqa: A001 - the signature comes from the definition
    """The length of ``x``'s ``axis`` as an int64 0-d value (``x.size(axis)``), for
    arithmetic on a length only known at run time (``sub(axis_size(x), 1)``)."""


@public
def check():  # noqa: A001 - the signature comes from the definition
    """``x`` unchanged when ``ok`` is all true; otherwise the run fails with
    ``<layer path>: check: <message>``. Feed its output on (``out: x``): a node no
    output depends on is not run."""


@public
def flatten():  # noqa: A001 - the signature comes from the definition
    """Axes ``start_axis`` to ``end_axis`` of ``x`` merged into one (``torch.flatten``):
    heads back into a width, ``[b, s, h, d] -> [b, s, h * d]`` with ``start_axis: 2``,
    symbolic sizes kept as their product (``2*seq``)."""
