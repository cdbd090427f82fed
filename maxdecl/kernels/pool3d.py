"""Pooling kernels on NDHWC input, output rows (n, od, oh) in parallel: 3-D pools, and
max pooling with indices (2-D pools run here with depth 1 when indices are asked for).
"""

from __future__ import annotations

import numba
import numpy as np

from .config import CACHE, FASTMATH


@numba.njit(cache=CACHE)
def _taps(o, k, s, d, before, after, size):
    # (taps inside the input, taps inside the padded input) of window o along one dim
    valid = 0
    padded = 0
    for r in range(k):
        i = o * s - before + r * d
        if 0 <= i < size:
            valid += 1
        if -before <= i < size + after:
            padded += 1
    return valid, padded


@numba.njit(cache=CACHE, parallel=True, fastmath=FASTMATH)
def _avg_pool3(x, out, k, s, d, p, count_boundary):
    # x: (N, D, H, W, C) f32 -> out: (N, OD, OH, OW, C) f32
    # k, s, d: (3,) kernel, stride, dilation; p: (6,) before, after per dim (d, h, w)
    # divisor: taps inside the padded input (count_boundary) or inside the input
    N, D, H, W, C = x.shape
    _, OD, OH, OW, _ = out.shape
    for row in numba.prange(N * OD * OH):
        n = row // (OD * OH)
        od = (row // OH) % OD
        oh = row % OH
        vd, pd = _taps(od, k[0], s[0], d[0], p[0], p[1], D)
        vh, ph = _taps(oh, k[1], s[1], d[1], p[2], p[3], H)
        for ow in range(OW):
            vw, pw = _taps(ow, k[2], s[2], d[2], p[4], p[5], W)
            count = pd * ph * pw if count_boundary else vd * vh * vw
            for c in range(C):
                out[n, od, oh, ow, c] = 0.0
            for q in range(k[0]):
                iz = od * s[0] - p[0] + q * d[0]
                if iz < 0 or iz >= D:
                    continue
                for r in range(k[1]):
                    iy = oh * s[1] - p[2] + r * d[1]
                    if iy < 0 or iy >= H:
                        continue
                    for t in range(k[2]):
                        ix = ow * s[2] - p[4] + t * d[2]
                        if ix < 0 or ix >= W:
                            continue
                        for c in range(C):
                            out[n, od, oh, ow, c] += x[n, iz, iy, ix, c]
            inv = np.float32(1) / np.float32(count) if count > 0 else np.float32(0)
            for c in range(C):
                out[n, od, oh, ow, c] *= inv


@numba.njit(cache=CACHE, parallel=True)
def _max_pool3(x, out, idx, k, s, d, p, lowest):
    # x: (N, D, H, W, C) any real dtype -> out: (N, OD, OH, OW, C) same dtype,
    # idx: (N, OD, OH, OW, C) i64 = (iz * H + iy) * W + ix of the maximum (-1: no tap)
    # as torch: the first tap inside the input starts the scan, a larger value or a
    # NaN takes over (ties keep the first; the last NaN wins); padding never wins
    N, D, H, W, C = x.shape
    _, OD, OH, OW, _ = out.shape
    for row in numba.prange(N * OD * OH):
        n = row // (OD * OH)
        od = (row // OH) % OD
        oh = row % OH
        for ow in range(OW):
            for c in range(C):
                out[n, od, oh, ow, c] = lowest
                idx[n, od, oh, ow, c] = -1
            for q in range(k[0]):
                iz = od * s[0] - p[0] + q * d[0]
                if iz < 0 or iz >= D:
                    continue
                for r in range(k[1]):
                    iy = oh * s[1] - p[2] + r * d[1]
                    if iy < 0 or iy >= H:
                        continue
                    for t in range(k[2]):
                        ix = ow * s[2] - p[4] + t * d[2]
                        if ix < 0 or ix >= W:
                            continue
                        pos = (iz * H + iy) * W + ix
                        for c in range(C):
                            v = x[n, iz, iy, ix, c]
                            if idx[n, od, oh, ow, c] < 0 or v > out[n, od, oh, ow, c] or v != v:
                                out[n, od, oh, ow, c] = v
                                idx[n, od, oh, ow, c] = pos


def _params(x, kernel, stride, dilation, padding, outs):
    """Window parameters as int64 arrays, checked so the kernels stay inside x and out."""
    if x.ndim != 5:
        raise ValueError(f"pool: x must be (N, D, H, W, C), got shape {x.shape}")
    vals = [np.array(v, np.int64).reshape(-1) for v in (kernel, stride, dilation, padding, outs)]
    if [len(v) for v in vals] != [3, 3, 3, 6, 3] or min(vals[0].min(), vals[1].min(),
                                                        vals[2].min()) < 1 \
            or vals[3].min() < 0 or vals[4].min() < 0:
        raise ValueError(f"pool: kernel {kernel}, stride {stride}, dilation {dilation} need 3 "
                         f"values >= 1, padding {padding} 6 and outs {outs} 3 values >= 0")
    return vals


def avg_pool_ndhwc(x, kernel, stride, dilation, padding, count_boundary, outs) -> np.ndarray:
    """Average pooling of an (N, D, H, W, C) array into (N, *outs, C) float32."""
    x = np.ascontiguousarray(x, dtype=np.float32)
    k, s, d, p, o = _params(x, kernel, stride, dilation, padding, outs)
    out = np.empty((x.shape[0], *o.tolist(), x.shape[4]), np.float32)
    if out.size:
        _avg_pool3(x, out, k, s, d, p, bool(count_boundary))
    return out


def max_pool_ndhwc(x, kernel, stride, dilation, padding, outs) -> tuple:
    """Max pooling of an (N, D, H, W, C) array: (values, int64 indices), (N, *outs, C)."""
    x = np.ascontiguousarray(x)
    k, s, d, p, o = _params(x, kernel, stride, dilation, padding, outs)
    shape = (x.shape[0], *o.tolist(), x.shape[4])
    out = np.empty(shape, x.dtype)
    idx = np.empty(shape, np.int64)
    lowest = -np.inf if x.dtype.kind == "f" else np.iinfo(x.dtype).min
    if out.size:
        _max_pool3(x, out, idx, k, s, d, p, x.dtype.type(lowest))
    return out, idx
