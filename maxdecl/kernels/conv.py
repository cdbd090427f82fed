"""Convolution kernels on channels-last 3-D data (2-D convs use depth 1).

groups == 1: ``_im2col`` gathers every output pixel's receptive field into one row
(zeros where it falls in padding) and one BLAS GEMM with the (Q*R*S*C, F) filter
does the arithmetic. groups > 1 (depthwise included): ``_conv_grouped`` loops
directly, output rows in parallel.
"""

from __future__ import annotations

import numba
import numpy as np

from .config import CACHE, FASTMATH

_COLS_LIMIT = 1 << 25  # im2col floats per chunk (128 MiB); larger batches go in chunks


@numba.njit(cache=CACHE, parallel=True)
def _im2col(x, cols, ks, st, dl, pb, outs):
    # x: (N, D, H, W, C) f32 -> cols: (N*OD*OH*OW, KD*KH*KW*C) f32
    # ks/st/dl/pb: (3,) kernel, stride, dilation, padding-before per spatial dim
    N, D, H, W, C = x.shape
    OD, OH, OW = outs[0], outs[1], outs[2]
    for row in numba.prange(N * OD * OH):
        n = row // (OD * OH)
        od = (row // OH) % OD
        oh = row % OH
        for ow in range(OW):
            o = row * OW + ow
            col = 0
            for q in range(ks[0]):
                iz = od * st[0] - pb[0] + q * dl[0]
                for r in range(ks[1]):
                    iy = oh * st[1] - pb[1] + r * dl[1]
                    for s in range(ks[2]):
                        ix = ow * st[2] - pb[2] + s * dl[2]
                        if 0 <= iz < D and 0 <= iy < H and 0 <= ix < W:
                            for c in range(C):
                                cols[o, col + c] = x[n, iz, iy, ix, c]
                        else:
                            for c in range(C):
                                cols[o, col + c] = 0.0
                        col += C


@numba.njit(cache=CACHE, parallel=True, fastmath=FASTMATH)
def _conv_grouped(x, w, out, groups, st, dl, pb):
    # x: (N, D, H, W, C) f32; w: (KD, KH, KW, C/groups, F) f32
    # out: (N, OD, OH, OW, F) f32, zero on entry; output channel f reads group f // (F/groups)
    N, D, H, W, C = x.shape
    KD, KH, KW, Cg, F = w.shape
    _, OD, OH, OW, _ = out.shape
    Fg = F // groups
    for row in numba.prange(N * OD * OH):
        n = row // (OD * OH)
        od = (row // OH) % OD
        oh = row % OH
        for ow in range(OW):
            for q in range(KD):
                iz = od * st[0] - pb[0] + q * dl[0]
                if iz < 0 or iz >= D:
                    continue
                for r in range(KH):
                    iy = oh * st[1] - pb[1] + r * dl[1]
                    if iy < 0 or iy >= H:
                        continue
                    for s in range(KW):
                        ix = ow * st[2] - pb[2] + s * dl[2]
                        if ix < 0 or ix >= W:
                            continue
                        if Cg == 1 and Fg == 1:  # depthwise, multiplier 1: one vector loop
                            for f in range(F):
                                out[n, od, oh, ow, f] += x[n, iz, iy, ix, f] * w[q, r, s, 0, f]
                        else:
                            for g in range(groups):
                                for c in range(Cg):
                                    xv = x[n, iz, iy, ix, g * Cg + c]
                                    for f in range(g * Fg, (g + 1) * Fg):
                                        out[n, od, oh, ow, f] += xv * w[q, r, s, c, f]


def conv3d_ndhwc(x, w, stride, dilation, padding, groups, outs, bias=None) -> np.ndarray:
    """x: (N, D, H, W, C) f32, w: (KD, KH, KW, C/groups, F) f32 -> (N, OD, OH, OW, F) f32.

    ``padding`` = (d_before, d_after, h_before, h_after, w_before, w_after); ``outs`` =
    (OD, OH, OW), computed by the op from the same formula as its shape rule.
    """
    x = np.ascontiguousarray(x, dtype=np.float32)
    w = np.ascontiguousarray(w, dtype=np.float32)
    if x.ndim != 5 or w.ndim != 5:
        raise ValueError(f"conv: x must be (N, D, H, W, C) and w (KD, KH, KW, C/groups, F); "
                         f"got {x.shape} and {w.shape}")
    N, D, H, W, C = x.shape
    KD, KH, KW, Cg, F = w.shape
    if groups < 1 or C != Cg * groups or F % groups:
        raise ValueError(f"conv: x has {C} channels and w{list(w.shape)} takes {Cg} per group "
                         f"and gives {F}; with groups={groups} need C == {Cg} * groups and F "
                         "divisible by groups")
    if (len(stride) != 3 or len(dilation) != 3 or len(padding) != 6 or len(outs) != 3
            or min(stride) < 1 or min(dilation) < 1 or min(padding) < 0 or min(outs) < 0):
        raise ValueError(f"conv: bad stride {stride}, dilation {dilation}, padding {padding} "
                         f"or outs {outs}")
    if bias is not None and np.size(bias) != F:
        raise ValueError(f"conv: bias has {np.size(bias)} values for {F} filters")
    ks = np.array((KD, KH, KW), np.int64)
    st = np.array(stride, np.int64)
    dl = np.array(dilation, np.int64)
    pb = np.array(padding[0::2], np.int64)
    OD, OH, OW = (int(o) for o in outs)
    outs = np.array(outs, np.int64)
    if groups == 1:
        pointwise = (KD == KH == KW == 1 and not any(padding) and tuple(stride) == (1, 1, 1))
        wm = w.reshape(KD * KH * KW * C, F)
        if pointwise:
            out = (x.reshape(-1, C) @ wm).reshape(N, OD, OH, OW, F)
        else:
            out = np.empty((N, OD, OH, OW, F), np.float32)
            per = max(1, _COLS_LIMIT // max(1, OD * OH * OW * KD * KH * KW * C))
            for n0 in range(0, N, per):
                xs = x[n0:n0 + per]
                cols = np.empty((xs.shape[0] * OD * OH * OW, KD * KH * KW * C), np.float32)
                if cols.size:
                    _im2col(xs, cols, ks, st, dl, pb, outs)
                np.matmul(cols, wm, out=out[n0:n0 + per].reshape(-1, F))
    else:
        out = np.zeros((N, OD, OH, OW, F), np.float32)
        if out.size:
            _conv_grouped(x, w, out, groups, st, dl, pb)
    if bias is not None:
        out += np.asarray(bias, dtype=np.float32)
    return out
