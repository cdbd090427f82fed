"""Runtime of ``scatter`` (``maxdecl.ops.shape``): values written or combined at indices
along an axis, one pass in C order over the indices, so a repeated index is resolved
the same way on every run (the later value wins a replace; sums add in index order)."""

from __future__ import annotations

import numba
import numpy as np

from .config import CACHE

_MODES = {None: 0, "sum": 1, "prod": 2, "mean": 3, "amax": 4, "amin": 5}


@numba.njit(cache=CACHE)
def _scatter_flat(out, pos, vals, mode, include_self, counts):
    # out: x flattened (a copy); pos[t]: the flat position of values[t] (checked in
    # range); counts: int64 like out, 0 before; afterwards the number of values that
    # landed on each position (plus 1 for x's own where include_self), 0 where none did
    for t in range(pos.shape[0]):
        p = pos[t]
        v = vals[t]
        if mode == 0:
            out[p] = v
            counts[p] = 1
            continue
        if counts[p] == 0:
            if not include_self:
                out[p] = v
                counts[p] = 1
                continue
            counts[p] = 1
        cur = out[p]
        if mode == 1 or mode == 3:
            out[p] = cur + v
        elif mode == 2:
            out[p] = cur * v
        elif mode == 4:
            if v > cur or v != v:          # NaN wins, as torch.maximum
                out[p] = v
        elif v < cur or v != v:
            out[p] = v
        counts[p] += 1


def _scatter_run(args, attrs):
    x, idx, values = args
    axis = attrs["axis"] % x.ndim
    n = x.shape[axis]
    for d, (a, b) in enumerate(zip(x.shape, idx.shape)):
        if d != axis and b > a:
            raise ValueError(f"indices {list(idx.shape)} are longer than x "
                             f"{list(x.shape)} on axis {d}")
    try:
        vals = np.broadcast_to(values, idx.shape)
    except ValueError:
        raise ValueError(f"values {list(np.shape(values))} do not broadcast to "
                         f"indices {list(idx.shape)}") from None
    out = np.array(x, copy=True, order="C")
    if idx.size == 0:
        return [out]
    lo, hi = idx.min(), idx.max()
    if lo < -n or hi >= n:
        raise IndexError(f"index {lo if lo < -n else hi} is out of range for axis "
                         f"{axis} of size {n}")
    strides = [s // out.itemsize for s in out.strides]
    pos = np.zeros(idx.shape, np.int64)
    for d, c in enumerate(np.indices(idx.shape, sparse=True)):
        if d == axis:
            c = np.where(idx < 0, idx.astype(np.int64) + n, idx.astype(np.int64))
        pos += c * strides[d]
    mode = _MODES[attrs["reduce"]]
    work = out
    if mode and out.dtype == np.float16:        # float16 combines in float32
        work = out.astype(np.float32)
    flat = work.reshape(-1)
    counts = np.zeros(flat.shape, np.int64)
    _scatter_flat(flat, pos.reshape(-1), np.ascontiguousarray(vals, work.dtype).reshape(-1),
                  mode, bool(attrs["include_self"]), counts)
    if mode == 3:
        hit = counts > 0
        if np.issubdtype(flat.dtype, np.integer):
            flat[hit] = np.floor_divide(flat[hit], counts[hit])
        else:
            flat[hit] = flat[hit] / counts[hit]
    return [work.astype(out.dtype, copy=False)]


RUN = {"scatter": _scatter_run}
