"""Runtime of ``topk`` and ``expert_linear`` (``maxdecl.ops.experts``).

``expert_linear`` groups the (token, slot) pairs by expert with a counting sort
(``_group_by_expert``) and runs one product per expert that was chosen at all, on
that expert's ``[N, K]`` slice of the weight: for packed weights the GEMV (one row,
decode) or GEMM kernels of ``qmatmul`` read that slice's blocks in place, so an
expert nobody chose is never read.
"""

from __future__ import annotations

import numba
import numpy as np

from .. import codecs
from ..dtypes import format_shape
from ..tensors import QuantizedTensor
from . import qmatmul as kq
from .linalg import rows_matmul
from ._dispatch import njit_twins, pick
from .config import CACHE


# -- topk ---------------------------------------------------------------------------
@numba.njit(cache=CACHE, inline="always")
def _above(a, b):
    """a ranks above b: greater, or NaN against a number (torch ranks NaN highest)."""
    return a > b or (a != a and b == b)


@njit_twins()
def _topk_rows(x, vals, idx):
    # x: (R, C) -> vals: (R, k) x's dtype, idx: (R, k) i64; a sorted buffer per row.
    # Once the buffer is full, an element enters only if it ranks strictly above the
    # buffer's last (ties keep the earlier index); it goes after every value that does
    # not rank below it (sorted, stable). O(C * k) per row: k is small (routers, sampling).
    k = vals.shape[1]
    for r in numba.prange(x.shape[0]):
        filled = 0
        for c in range(x.shape[1]):
            v = x[r, c]
            if filled == k and not _above(v, vals[r, k - 1]):
                continue
            pos = filled if filled < k else k - 1
            while pos > 0 and _above(v, vals[r, pos - 1]):
                vals[r, pos] = vals[r, pos - 1]
                idx[r, pos] = idx[r, pos - 1]
                pos -= 1
            vals[r, pos] = v
            idx[r, pos] = c
            if filled < k:
                filled += 1


def _topk_run(args, attrs):
    x, k = args[0], attrs["k"]
    axis = attrs["axis"] % x.ndim
    if x.shape[axis] < k:
        raise ValueError(f"topk: k={k} exceeds axis {attrs['axis']} of x{format_shape(x.shape)}")
    moved = np.ascontiguousarray(np.moveaxis(x, axis, -1))
    rows = moved.reshape(-1, moved.shape[-1])
    vals = np.empty((rows.shape[0], k), x.dtype)
    idx = np.empty((rows.shape[0], k), np.int64)
    if rows.shape[0]:
        pick(_topk_rows, rows.size)(rows, vals, idx)
    shape = (*moved.shape[:-1], k)
    return [np.moveaxis(vals.reshape(shape), -1, axis), np.moveaxis(idx.reshape(shape), -1, axis)]


# -- expert_linear -------------------------------------------------------------------
@numba.njit(cache=CACHE)
def _group_by_expert(ids, n_expert, order, starts):
    # ids: (P,) int -> order: (P,) i64 pair indices grouped by expert (stable),
    # starts: (E + 1,) i64 offsets into order; returns the first bad id's pair or -1
    starts[:] = 0
    for p in range(ids.shape[0]):
        e = ids[p]
        if e < 0 or e >= n_expert:
            return p
        starts[e + 1] += 1
    for e in range(n_expert):
        starts[e + 1] += starts[e]
    fill = starts[:-1].copy()
    for p in range(ids.shape[0]):
        e = ids[p]
        order[fill[e]] = p
        fill[e] += 1
    return -1


def _expert_product(xin, w, e, enc):
    """``xin @ w[e].T``: xin (M, K) f32, one expert's slice of a packed or float w."""
    if not isinstance(w, QuantizedTensor):
        return rows_matmul(xin, w[e].T)
    _, n, k = w.shape
    data = w.data[e]
    if kq.has_row_decoder(w.encoding, int(enc.block_elements), int(enc.block_bytes)):
        return kq.qmatmul_blocks(xin, np.ascontiguousarray(data), w.encoding)

    def decode(r0, r1, tile):
        tile[...] = np.asarray(enc.dequantize(data[r0:r1], (r1 - r0, k)),
                               np.float32).reshape(r1 - r0, k)
    return kq.tiled_matmul(xin, n, decode)


def _expert_linear_run(args, attrs):
    x, w, ids, *bias = args
    n_expert, n, k_w = (int(d) for d in w.shape)
    slots = ids.shape[-1]
    shared = x.ndim == ids.ndim
    lead = ids.shape[:-1]
    want = (*lead, k_w) if shared else (*lead, slots, k_w)
    if tuple(x.shape) != tuple(want):
        raise ValueError(f"expert_linear: x{format_shape(x.shape)} does not fit "
                         f"ids{format_shape(ids.shape)} and w{format_shape(w.shape)} "
                         f"(expected x{format_shape(want)})")
    dtype = np.float32 if isinstance(w, QuantizedTensor) else x.dtype
    x2 = np.ascontiguousarray(x, dtype=dtype).reshape(-1, k_w)
    flat = np.ascontiguousarray(ids, dtype=np.int64).reshape(-1)
    order = np.empty(flat.size, np.int64)
    starts = np.empty(n_expert + 1, np.int64)
    bad = _group_by_expert(flat, n_expert, order, starts)
    if bad >= 0:
        raise ValueError(f"expert_linear: ids{format_shape(ids.shape)} holds {flat[bad]}, "
                         f"outside 0..{n_expert - 1} (w{format_shape(w.shape)})")
    out = np.empty((flat.size, n), dtype)
    enc = codecs.get(w.encoding) if isinstance(w, QuantizedTensor) else None
    for e in range(n_expert):
        pairs = order[starts[e]:starts[e + 1]]
        if not pairs.size:
            continue                                   # never read: nobody chose it
        xin = np.ascontiguousarray(x2[pairs // slots] if shared else x2[pairs])
        y = _expert_product(xin, w, e, enc)
        if bias:
            y = y + bias[0][e]
        out[pairs] = y
    return [out.reshape(*lead, slots, n)]


RUN = {"topk": _topk_run, "expert_linear": _expert_linear_run}
