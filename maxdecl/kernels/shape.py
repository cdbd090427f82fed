"""Runtime of the shape ops (``maxdecl.ops.shape``): NumPy views and copies."""

from __future__ import annotations

import builtins

import numpy as np

from .step_outputs import empty, writes_into


def _reshape_run(args, attrs):
    x = args[0]
    shape = [d if isinstance(d, int) else -1 for d in attrs["shape"]]
    if shape.count(-1) > 1:  # symbolic dims resolved from the input at run time
        return [x.reshape(resolve_dims(attrs["shape"], attrs.get("_in", ()), x.shape))]
    return [x.reshape(shape)]


def resolve_dims(target, in_dims, in_shape) -> list:
    """Sizes for a reshape's ``target`` dims: ints as they are, a symbolic dim by name
    from the input's declared dims ``in_dims`` and its run-time ``in_shape`` (``[a, b]``
    to ``[b, a]`` swaps the sizes), at most one dim left to -1 (NumPy infers it)."""
    from .. import dims

    sizes = {}
    for d, n in zip(in_dims, in_shape):
        if not isinstance(d, int) and dims.poly(d) == {(d,): 1}:
            sizes.setdefault(d, n)
    out = [d if isinstance(d, int) else dims.evaluate(d, sizes) for d in target]
    if sum(v is None or v == -1 for v in out) > 1:
        raise ValueError(f"reshape to {list(target)}: the sizes of "
                         f"{[d for d, v in zip(target, out) if v is None]} do not follow from "
                         f"the input's dims {list(in_dims)}")
    return [-1 if v is None else v for v in out]


def _unflatten(x, like, attrs):
    axis = attrs["axis"] % x.ndim
    if like is None:
        sizes = tuple(attrs["sizes"])
        known = int(np.prod([v for v in sizes if v != -1], dtype=np.int64))
        if (x.shape[axis] % known if -1 in sizes else x.shape[axis] != known):
            raise ValueError(f"unflatten: sizes {list(sizes)} do not fit the axis length "
                             f"{x.shape[axis]}")
        if -1 in sizes and known:      # numpy cannot infer -1 when another axis is empty
            sizes = tuple(x.shape[axis] // known if v == -1 else v for v in sizes)
    else:
        sizes = tuple(like.shape[a] for a in attrs["like_axes"])
    return x.reshape(x.shape[:axis] + sizes + x.shape[axis + 1:])


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


@writes_into
def _gather_run(args, attrs, out=None):
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
    if out is None or not isinstance(x, np.ndarray) or not isinstance(idx, np.ndarray):
        return [np.take(x, idx, axis=axis)]
    y = empty(out, 0, x.shape[:axis] + idx.shape + x.shape[axis + 1:], x.dtype)
    return [np.take(x, idx, axis=axis, out=y, mode="wrap")]   # in range: checked above


def _take_along_run(args, attrs):
    x, idx = args
    axis = attrs["axis"] % x.ndim
    n = x.shape[axis]
    if idx.size and (idx.min() < -n or idx.max() >= n):
        bad = idx.min() if idx.min() < -n else idx.max()
        raise IndexError(f"index {bad} is out of range for axis {axis} of size {n}")
    shape = [max(a, b) for a, b in zip(x.shape, idx.shape)]
    xs, ids = list(shape), list(shape)
    xs[axis], ids[axis] = x.shape[axis], idx.shape[axis]
    return [np.take_along_axis(np.broadcast_to(x, xs), np.broadcast_to(idx, ids), axis)]


_NP_PAD = {"constant": "constant", "reflect": "reflect", "replicate": "edge",
           "circular": "wrap"}


def _pad_run(args, attrs):
    (x,) = args
    width = [(0, 0)] * x.ndim
    for k, axis in enumerate(attrs["axes"]):
        before, after = attrs["pads"][2 * k], attrs["pads"][2 * k + 1]
        n = x.shape[axis]
        if attrs["mode"] == "reflect" and max(before, after) >= n:
            raise ValueError(f"reflect padding ({before}, {after}) must be less than the size "
                             f"{n} of axis {axis}")
        if attrs["mode"] == "circular" and max(before, after) > n:
            raise ValueError(f"circular padding ({before}, {after}) wraps more than the size "
                             f"{n} of axis {axis}")
        if attrs["mode"] != "constant" and n == 0 and before + after:
            raise ValueError(f"{attrs['mode']} padding of an empty axis {axis}")
        width[axis % x.ndim] = (before, after)
    mode = _NP_PAD[attrs["mode"]]
    if mode == "constant":
        return [np.pad(x, width, mode, constant_values=x.dtype.type(attrs["value"]))]
    return [np.pad(x, width, mode)]


def _squeeze_run(args, attrs):
    x = args[0]
    for a in attrs["axis"]:
        if x.shape[a] != 1:
            raise ValueError(f"squeeze axis {a % x.ndim} of x{list(x.shape)} has size "
                             f"{x.shape[a]}, not 1")
    return [np.squeeze(x, axis=tuple(attrs["axis"]))]


def _unfold_run(args, attrs):
    (x,) = args
    axis, size, step = attrs["axis"], attrs["size"], attrs["step"]
    if x.shape[axis] < size:
        raise ValueError(f"unfold: windows of {size} do not fit axis {axis} of size "
                         f"{x.shape[axis]}")
    win = np.lib.stride_tricks.sliding_window_view(x, size, axis=axis)
    if step > 1:
        win = win[(slice(None),) * (axis % x.ndim) + (slice(None, None, step),)]
    return [np.ascontiguousarray(win)]


def _full_like_run(args, attrs):
    x = args[0]
    dtype = np.dtype(attrs["dtype"].numpy) if attrs["dtype"] is not None else x.dtype
    shape = getattr(x, "shape", np.shape(x))
    return [np.full(shape, attrs["value"], dtype=dtype)]


def _pad_to_multiple_run(args, attrs):
    (x,) = args
    pads = [p for axis, m in zip(attrs["axes"], attrs["multiples"])
            for p in (0, (-x.shape[axis]) % m)]
    if not any(pads):
        return [x]
    return _pad_run(args, {**attrs, "pads": pads})


def _flatten(x, attrs):
    start, end = attrs["start_axis"] % x.ndim, attrs["end_axis"] % x.ndim
    return np.ascontiguousarray(x).reshape(x.shape[:start] + (-1,) + x.shape[end + 1:]) \
        if x.size else x.reshape(x.shape[:start] + (int(np.prod(x.shape[start:end + 1])),)
                                 + x.shape[end + 1:])


def _check_run(args, attrs):
    if not np.all(args[1]):
        from ..errors import GraphError
        raise GraphError(attrs["message"])
    return [args[0]]


RUN = {
    "flatten": lambda args, attrs: [_flatten(args[0], attrs)],
    "axis_size": lambda args, attrs: [np.array(args[0].shape[attrs["axis"]], np.int64)],
    "check": _check_run,
    "pad": _pad_run,
    "pad_to_multiple": _pad_to_multiple_run,
    "full_like": _full_like_run,
    "unfold": _unfold_run,
    "take_along_axis": _take_along_run,
    "arange_like": lambda args, attrs: [
        np.arange(attrs["start"], attrs["start"] + args[0].shape[attrs["axis"]], dtype=np.int64)],
    "reshape": _reshape_run,
    "transpose": lambda args, attrs: [np.ascontiguousarray(np.transpose(args[0], attrs["perm"]))],
    "concat": lambda args, attrs: [np.concatenate(args, axis=attrs["axis"])],
    "stack": lambda args, attrs: [np.stack(args, axis=attrs["axis"])],
    "split": _split_run,
    "slice": _slice_run,
    "gather": _gather_run,
    "expand_as": lambda args, attrs: [np.ascontiguousarray(np.broadcast_to(
        args[0], args[1].shape if attrs["axes"] is None else tuple(
            args[1].shape[a] if a % args[0].ndim in {b % args[0].ndim for b in attrs["axes"]}
            else d for a, d in enumerate(args[0].shape))))],
    "tile": lambda args, attrs: [np.tile(args[0], attrs["repeats"])],
    "unflatten": lambda args, attrs: [_unflatten(args[0], args[1] if len(args) > 1 else None,
                                                 attrs)],
    "roll": lambda args, attrs: [np.roll(args[0], attrs["shifts"], attrs["axes"])],
    "select": lambda args, attrs: [np.where(args[0], args[1], args[2])],
    "squeeze": _squeeze_run,
    "identity": lambda args, attrs: [args[0]],
    "repeat_interleave": lambda args, attrs: [_repeat_interleave_run(args, attrs)],
    "unsqueeze": lambda args, attrs: [np.expand_dims(args[0], tuple(attrs["axis"]))],
}


MAX_REPEAT_ELEMENTS = 1 << 31   # a counts input summing past this is refused, not allocated


def _repeat_interleave_run(args, attrs):
    x, *counts = args
    axis = attrs["axis"]
    if not counts:
        return np.repeat(x, attrs["repeats"], axis=axis)
    c = np.asarray(counts[0])
    n = x.shape[axis]
    if c.shape != (n,):
        raise ValueError(f"counts{list(c.shape)} must hold one count for each of the {n} "
                         f"elements along axis {axis}")
    if c.size and c.min() < 0:
        raise ValueError(f"counts must be >= 0, got {int(c.min())} at index "
                         f"{int(np.argmin(c))}")
    total = int(c.astype(np.int64).sum())
    per = x.size // n if n else 0
    if total * per > MAX_REPEAT_ELEMENTS:
        raise ValueError(f"counts sum to {total} along axis {axis}: {total * per} elements, "
                         f"more than {MAX_REPEAT_ELEMENTS}")
    return np.repeat(x, c.astype(np.int64), axis=axis)
