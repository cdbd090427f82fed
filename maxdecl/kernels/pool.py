"""Pooling kernels on NHWC input, output rows (n, oh) in parallel."""

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
def _avg_pool(x, out, k, s, d, p, count_boundary):
    # x: (N, H, W, C) f32 -> out: (N, OH, OW, C) f32
    # k, s, d: (2,) kernel, stride, dilation; p: (4,) h_before, h_after, w_before, w_after
    # divisor: taps inside the padded input (count_boundary) or inside the input
    N, H, W, C = x.shape
    _, OH, OW, _ = out.shape
    for row in numba.prange(N * OH):
        n = row // OH
        oh = row % OH
        vh, ph = _taps(oh, k[0], s[0], d[0], p[0], p[1], H)
        for ow in range(OW):
            vw, pw = _taps(ow, k[1], s[1], d[1], p[2], p[3], W)
            count = ph * pw if count_boundary else vh * vw
            for c in range(C):
                out[n, oh, ow, c] = 0.0
            for r in range(k[0]):
                ih = oh * s[0] - p[0] + r * d[0]
                if ih < 0 or ih >= H:
                    continue
                for t in range(k[1]):
                    iw = ow * s[1] - p[2] + t * d[1]
                    if iw < 0 or iw >= W:
                        continue
                    for c in range(C):
                        out[n, oh, ow, c] += x[n, ih, iw, c]
            inv = np.float32(1) / np.float32(count) if count > 0 else np.float32(0)
            for c in range(C):
                out[n, oh, ow, c] *= inv


@numba.njit(cache=CACHE, parallel=True)
def _max_pool(x, out, k, s, d, p, lowest):
    # x: (N, H, W, C) any real dtype -> out: (N, OH, OW, C) same dtype
    # padding never wins (it is -inf); a NaN in the window wins and stays
    N, H, W, C = x.shape
    _, OH, OW, _ = out.shape
    for row in numba.prange(N * OH):
        n = row // OH
        oh = row % OH
        for ow in range(OW):
            for c in range(C):
                out[n, oh, ow, c] = lowest
            for r in range(k[0]):
                ih = oh * s[0] - p[0] + r * d[0]
                if ih < 0 or ih >= H:
                    continue
                for t in range(k[1]):
                    iw = ow * s[1] - p[2] + t * d[1]
                    if iw < 0 or iw >= W:
                        continue
                    for c in range(C):
                        v = x[n, ih, iw, c]
                        m = out[n, oh, ow, c]
                        if v > m or (v != v and m == m):
                            out[n, oh, ow, c] = v


def _arr(v):
    return np.array(v, np.int64)


def _check_window(op, x, kernel, stride, dilation, padding, outs) -> None:
    """ValueError unless x is (N, H, W, C) and every window parameter is well formed."""
    if x.ndim != 4:
        raise ValueError(f"{op}: x must be (N, H, W, C), got shape {x.shape}")
    if (len(kernel) != 2 or len(stride) != 2 or len(dilation) != 2 or len(padding) != 4
            or len(outs) != 2):
        raise ValueError(f"{op}: kernel, stride, dilation, outs need 2 values and padding 4; "
                         f"got {kernel}, {stride}, {dilation}, {outs}, {padding}")
    if min(kernel) < 1 or min(stride) < 1 or min(dilation) < 1 or min(padding) < 0 \
            or min(outs) < 0:
        raise ValueError(f"{op}: kernel {kernel}, stride {stride} and dilation {dilation} must "
                         f"be >= 1, padding {padding} and outs {outs} >= 0")


def avg_pool_nhwc(x, kernel, stride, dilation, padding, count_boundary, outs) -> np.ndarray:
    """Average pooling of an (N, H, W, C) array into (N, *outs, C) float32."""
    x = np.ascontiguousarray(x, dtype=np.float32)
    _check_window("avg_pool", x, kernel, stride, dilation, padding, outs)
    out = np.empty((x.shape[0], *outs, x.shape[3]), np.float32)
    if out.size:
        _avg_pool(x, out, _arr(kernel), _arr(stride), _arr(dilation), _arr(padding),
                  bool(count_boundary))
    return out


def max_pool_nhwc(x, kernel, stride, dilation, padding, outs) -> np.ndarray:
    """Max pooling of an (N, H, W, C) array into (N, *outs, C), same dtype."""
    x = np.ascontiguousarray(x)
    _check_window("max_pool", x, kernel, stride, dilation, padding, outs)
    for i in range(2):        # a window of only padding would give -inf
        taps = (np.arange(outs[i])[:, None] * stride[i] - padding[2 * i]
                + np.arange(kernel[i])[None, :] * dilation[i])
        hit = ((taps >= 0) & (taps < x.shape[1 + i])).any(axis=1)
        if not hit.all():
            raise ValueError(f"max_pool: output {'row' if i == 0 else 'column'} "
                             f"{int(np.argmin(hit))} would pool padding only: pad={list(padding)}"
                             f" is too large for kernel_size={list(kernel)} and dilation="
                             f"{list(dilation)} (torch: pad should be at most half of effective "
                             "kernel size)")
    out = np.empty((x.shape[0], *outs, x.shape[3]), x.dtype)
    lowest = -np.inf if x.dtype.kind == "f" else np.iinfo(x.dtype).min
    if out.size:
        _max_pool(x, out, _arr(kernel), _arr(stride), _arr(dilation), _arr(padding),
                  x.dtype.type(lowest))
    return out
