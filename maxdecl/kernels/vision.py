"""Runtime of the convolution and pooling ops (``maxdecl.ops.conv``, ``maxdecl.ops.pool``):
layouts moved to channels-last 3-D, then the numba kernels of ``conv`` and ``pool``
(``pool3d`` for 3-D pools and max pooling with indices)."""

from __future__ import annotations

import numpy as np

from ..ops._window import SAME, same_pads
from ..ops.conv import window_out
from ..ops.pool import adaptive_sizes, window
from . import conv, pool, pool3d


def _to_cl3(x, w, attrs, nd):
    """Input and filter as channels-last 3-D arrays (N, D, H, W, C) and (Q, R, S, Cg, F)."""
    if attrs["input_layout"][1] == "C":
        x = np.moveaxis(x, 1, -1)
    if attrs["filter_layout"][0] == "F":
        w = np.moveaxis(np.moveaxis(w, 0, -1), 0, -2)   # F C k... -> k... C F
    if nd == 2:
        x, w = x[:, None], w[None]
    return x, w


def _run(nd):
    def run(args, attrs):
        x, w, *rest = args
        x3, w3 = _to_cl3(x, w, attrs, nd)
        lead = (1,) * (3 - nd)
        stride, dil = lead + attrs["stride"], lead + attrs["dilation"]
        ks = w3.shape[:3]
        pad = attrs["padding"]
        if pad == SAME:
            pad = same_pads(x3.shape[1:4], ks, stride, dil)[2 * (3 - nd):]
        pad = (0, 0) * (3 - nd) + pad
        # a window that does not fit a symbolic dim is an error here, as in torch
        outs = tuple(window_out(x3.shape[1 + i], ks[i], stride[i], dil[i], pad[2 * i],
                                pad[2 * i + 1]) for i in range(3))
        out = conv.conv3d_ndhwc(x3, w3, stride, dil, pad, attrs["groups"], outs,
                                rest[0] if rest else None)
        if nd == 2:
            out = out[:, 0]
        if attrs["input_layout"][1] == "C":
            out = np.ascontiguousarray(np.moveaxis(out, -1, 1))
        return [out.astype(x.dtype, copy=False)]
    return run


def _pool_window(x, attrs):
    """(kernel, stride, dilation, padding, outs) of a pool node for x's spatial rank."""
    nd = x.ndim - 2
    k, s, d, p = window(attrs, nd)
    if p == SAME:
        p = same_pads(x.shape[1:1 + nd], k, s, d)
    outs = tuple(window_out(x.shape[1 + i], k[i], s[i], d[i], p[2 * i], p[2 * i + 1],
                            attrs["ceil_mode"], what="window") for i in range(nd))
    return k, s, d, p, outs


def _as3d(x, k, s, d, p, outs):
    """A 2-D pool's array and window as depth-1 3-D ones."""
    return x[:, None], (1, *k), (1, *s), (1, *d), (0, 0, *p), (1, *outs)


def _as2d(x, attrs):
    """A 1-D pool (NLC) as a height-1 2-D one: x [N, 1, L, C] and its attributes."""
    k, s, d, p = window(attrs, 1)
    pad = p if p == SAME else (0, 0, *p)
    return x[:, None], {**attrs, "kernel_size": (1, *k), "stride": (1, *s),
                        "dilation": (1, *d), "padding": pad}


def _one_d(run):
    """``run`` of a pool that also takes NLC input, through its 2-D kernel."""
    def wrapped(args, attrs):
        x = args[0]
        if x.ndim != 3:
            return run(args, attrs)
        x2, attrs2 = _as2d(x, attrs)
        return [o[:, 0] for o in run([x2], attrs2)]
    return wrapped


def _avg_run(args, attrs):
    x = args[0]
    win = _pool_window(x, attrs)
    if x.ndim == 4:
        out = pool.avg_pool_nhwc(x, *win[:4], attrs["count_boundary"], win[4])
    else:
        out = pool3d.avg_pool_ndhwc(x, *win[:4], attrs["count_boundary"], win[4])
    return [out.astype(x.dtype, copy=False)]


def _max_run(args, attrs):
    x = args[0]
    win = _pool_window(x, attrs)
    xw = x.astype(np.float32) if x.dtype == np.float16 else x   # numba has no float16; exact
    if x.ndim == 4 and not attrs["return_indices"]:
        return [pool.max_pool_nhwc(xw, *win).astype(x.dtype, copy=False)]
    out, idx = pool3d.max_pool_ndhwc(*(_as3d(xw, *win) if x.ndim == 4 else (xw, *win)))
    if x.ndim == 4:
        out, idx = out[:, 0], idx[:, 0]
    out = out.astype(x.dtype, copy=False)
    return [out, idx] if attrs["return_indices"] else [out]


def _adaptive_axis(x, axis: int, out: int, kind: str):
    """x reduced along ``axis`` to ``out`` cells, cell i over inputs floor(i n / out) to
    ceil((i + 1) n / out) - 1 (torch's adaptive windows). Vectorised over the cells: one
    gather of the k-th entry of every window per k, k < the longest window (at most
    ceil(n / out) + 1), so time and memory stay within the input's and output's sizes;
    an average adds the entries in order, in float32."""
    n = x.shape[axis]
    cells = np.arange(out, dtype=np.int64)
    start = cells * n // out
    length = -((-(cells + 1) * n) // out) - start
    acc = None
    for k in range(int(length.max())):
        idx = start + np.minimum(k, length - 1)
        part = np.take(x, idx, axis=axis)
        if kind == "max":
            acc = part if acc is None else np.maximum(acc, part)
        else:
            keep = (k < length).astype(np.float32).reshape(
                (-1,) + (1,) * (x.ndim - 1 - axis % x.ndim))
            part = part * keep
            acc = part if acc is None else acc + part
    if kind == "avg":
        acc = acc / length.astype(np.float32).reshape((-1,) + (1,) * (x.ndim - 1 - axis % x.ndim))
    return acc


def _adaptive_run(kind):
    def run(args, attrs):
        x = args[0]
        spatial = x.shape[1:-1]
        if 0 in spatial:
            raise ValueError(f"adaptive_{kind}_pool of an empty spatial dim: "
                             f"{list(x.shape)}")
        outs = adaptive_sizes(attrs, spatial)
        y = np.asarray(x, np.float32) if kind == "avg" else x
        for i, o in enumerate(outs):
            y = _adaptive_axis(y, 1 + i, o, kind)
        return [np.ascontiguousarray(y, dtype=x.dtype)]
    return run


RUN = {"conv2d": _run(2), "conv3d": _run(3), "avg_pool": _one_d(_avg_run),
       "max_pool": _one_d(_max_run),
       "adaptive_avg_pool": _adaptive_run("avg"), "adaptive_max_pool": _adaptive_run("max")}
