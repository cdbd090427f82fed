"""Runtime of ``conv_transpose`` (``maxdecl.ops.conv_transpose``) on channels-last 3-D data
(2-D uses depth 1).

groups == 1: one BLAS GEMM multiplies every input pixel by the filter, ``cols[n, i, k,
f] = sum_c x[n, i, c] * w[k, f, c]``; then ``_col2im`` gathers, for each output pixel,
the taps that land on it (``o = i * stride - pad_before + k * dilation``). groups > 1
(depthwise included): ``_grouped`` gathers and multiplies directly. Both run output
rows in parallel, so no two threads write one value.
"""

from __future__ import annotations

import numba
import numpy as np

from ..ops.conv_transpose import filter_first, out_size, window
from .config import CACHE, FASTMATH

_COLS_LIMIT = 1 << 25  # GEMM result floats per chunk (128 MiB); larger batches go in chunks


@numba.njit(cache=CACHE, parallel=True, fastmath=FASTMATH)
def _col2im(cols, out, st, dl, pb):
    # cols: (N, D, H, W, KD, KH, KW, F) f32 -> out: (N, OD, OH, OW, F) f32
    # out[n, o, f] = sum of cols[n, i, k, f] over i, k with o = i*st - pb + k*dl
    N, D, H, W, KD, KH, KW, F = cols.shape
    _, OD, OH, OW, _ = out.shape
    for row in numba.prange(N * OD * OH):
        n = row // (OD * OH)
        od = (row // OH) % OD
        oh = row % OH
        for ow in range(OW):
            for f in range(F):
                out[n, od, oh, ow, f] = 0.0
            for q in range(KD):
                tz = od + pb[0] - q * dl[0]
                if tz < 0 or tz % st[0] != 0 or tz // st[0] >= D:
                    continue
                iz = tz // st[0]
                for r in range(KH):
                    ty = oh + pb[1] - r * dl[1]
                    if ty < 0 or ty % st[1] != 0 or ty // st[1] >= H:
                        continue
                    iy = ty // st[1]
                    for s in range(KW):
                        tx = ow + pb[2] - s * dl[2]
                        if tx < 0 or tx % st[2] != 0 or tx // st[2] >= W:
                            continue
                        ix = tx // st[2]
                        for f in range(F):
                            out[n, od, oh, ow, f] += cols[n, iz, iy, ix, q, r, s, f]


@numba.njit(cache=CACHE, parallel=True, fastmath=FASTMATH)
def _grouped(x, w, out, groups, st, dl, pb):
    # x: (N, D, H, W, C) f32; w: (KD, KH, KW, F/groups, C) f32 -> out: (N, OD, OH, OW, F) f32
    # out[n, o, g*Fg + f] = sum over i, k with o = i*st - pb + k*dl and c < C/groups of
    #                       x[n, i, g*Cg + c] * w[k, f, g*Cg + c]
    N, D, H, W, C = x.shape
    KD, KH, KW, Fg, _ = w.shape
    _, OD, OH, OW, F = out.shape
    Cg = C // groups
    for row in numba.prange(N * OD * OH):
        n = row // (OD * OH)
        od = (row // OH) % OD
        oh = row % OH
        for ow in range(OW):
            for f in range(F):
                out[n, od, oh, ow, f] = 0.0
            for q in range(KD):
                tz = od + pb[0] - q * dl[0]
                if tz < 0 or tz % st[0] != 0 or tz // st[0] >= D:
                    continue
                iz = tz // st[0]
                for r in range(KH):
                    ty = oh + pb[1] - r * dl[1]
                    if ty < 0 or ty % st[1] != 0 or ty // st[1] >= H:
                        continue
                    iy = ty // st[1]
                    for s in range(KW):
                        tx = ow + pb[2] - s * dl[2]
                        if tx < 0 or tx % st[2] != 0 or tx // st[2] >= W:
                            continue
                        ix = tx // st[2]
                        if Cg == 1 and Fg == 1:     # depthwise: one vector loop
                            for f in range(F):
                                out[n, od, oh, ow, f] += x[n, iz, iy, ix, f] * w[q, r, s, 0, f]
                        else:
                            for g in range(groups):
                                for c in range(g * Cg, (g + 1) * Cg):
                                    xv = x[n, iz, iy, ix, c]
                                    for f in range(Fg):
                                        out[n, od, oh, ow, g * Fg + f] += xv * w[q, r, s, f, c]


def conv_transpose_ndhwc(x, w, stride, dilation, padding, groups, outs, bias=None):
    """x: (N, D, H, W, C) f32, w: (KD, KH, KW, F/groups, C) f32 -> (N, OD, OH, OW, F) f32.

    ``padding`` = (d_before, d_after, h_before, h_after, w_before, w_after) (only the
    befores shift the output; ``outs`` crops the end); ``outs`` = (OD, OH, OW).
    """
    x = np.ascontiguousarray(x, dtype=np.float32)
    w = np.ascontiguousarray(w, dtype=np.float32)
    if x.ndim != 5 or w.ndim != 5 or x.shape[4] != w.shape[4] or groups < 1 \
            or x.shape[4] % groups:
        raise ValueError(f"conv_transpose: x {x.shape} must be (N, D, H, W, C) and w {w.shape} "
                         f"(KD, KH, KW, F/groups, C) with C divisible by groups={groups}")
    if len(stride) != 3 or len(dilation) != 3 or len(padding) != 6 or len(outs) != 3 \
            or min(stride) < 1 or min(dilation) < 1 or min(outs) < 0:
        raise ValueError(f"conv_transpose: bad stride {stride}, dilation {dilation}, padding "
                         f"{padding} or outs {outs}")
    N, D, H, W, C = x.shape
    KD, KH, KW, Fg, _ = w.shape
    F = Fg * groups
    if bias is not None and np.size(bias) != F:
        raise ValueError(f"conv_transpose: bias has {np.size(bias)} values for {F} channels")
    st, dl = np.array(stride, np.int64), np.array(dilation, np.int64)
    pb = np.array(padding[0::2], np.int64)
    out = np.empty((N, *(int(o) for o in outs), F), np.float32)
    if out.size and groups > 1:
        _grouped(x, w, out, groups, st, dl, pb)
    elif out.size:
        wm = w.reshape(-1, C).T                      # (C, KD*KH*KW*F)
        per = max(1, _COLS_LIMIT // max(1, D * H * W * wm.shape[1]))
        for n0 in range(0, N, per):
            xs = x[n0:n0 + per]
            cols = (xs.reshape(-1, C) @ wm).reshape(xs.shape[0], D, H, W, KD, KH, KW, F)
            _col2im(cols, out[n0:n0 + per], st, dl, pb)
    if bias is not None:
        out += np.asarray(bias, dtype=np.float32)
    return out


def _run(args, attrs):
    x, w, *rest = args
    nd = x.ndim - 2
    first = attrs["input_layout"][1] == "C"
    if first:   # NC... -> N...C
        x = np.moveaxis(x, 1, -1)
    if filter_first(attrs):   # torch filter [C, Fg, k...] -> [k..., Fg, C]
        w = np.moveaxis(np.moveaxis(w, 0, -1), 0, -2)
    if nd == 2:
        x, w = x[:, None], w[None]
    lead = (1,) * (3 - nd)
    st, dl, pad, extra = window(attrs, nd)
    st, dl, pad, extra = lead + st, lead + dl, (0, 0) * (3 - nd) + pad, (0,) * (3 - nd) + extra
    outs = tuple(out_size(x.shape[1 + i], w.shape[i], st[i], dl[i], pad[2 * i],
                          pad[2 * i + 1], extra[i]) for i in range(3))
    if min(outs) < 1:
        raise ValueError(f"conv_transpose: output size {outs[3 - nd:]} is not positive")
    out = conv_transpose_ndhwc(x, w, st, dl, pad, attrs["groups"], outs,
                               rest[0] if rest else None)
    if nd == 2:
        out = out[:, 0]
    if first:
        out = np.ascontiguousarray(np.moveaxis(out, -1, 1))
    return [out.astype(args[0].dtype, copy=False)]


RUN = {"conv_transpose": _run}
