"""Runtime of the convolution and pooling ops (``maxdecl.ops.conv``, ``maxdecl.ops.pool``):
layouts moved to channels-last 3-D, then the numba kernels of ``conv`` and ``pool``."""

from __future__ import annotations

import numpy as np

from ..ops.conv import window_out_size
from . import conv, pool


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
        pad = (0, 0) * (3 - nd) + attrs["padding"]
        ks = w3.shape[:3]
        outs = tuple(window_out_size(x3.shape[1 + i], ks[i], stride[i], dil[i], pad[2 * i],
                                     pad[2 * i + 1]) for i in range(3))
        out = conv.conv3d_ndhwc(x3, w3, stride, dil, pad, attrs["groups"], outs,
                                rest[0] if rest else None)
        if nd == 2:
            out = out[:, 0]
        if attrs["input_layout"][1] == "C":
            out = np.ascontiguousarray(np.moveaxis(out, -1, 1))
        return [out.astype(x.dtype, copy=False)]
    return run


def _run_outs(x, attrs):
    p = attrs["padding"]
    return tuple(window_out_size(x.shape[1 + i], attrs["kernel_size"][i], attrs["stride"][i],
                                 attrs["dilation"][i], p[2 * i], p[2 * i + 1],
                                 attrs["ceil_mode"]) for i in range(2))


def _avg_run(args, attrs):
    x = args[0]
    out = pool.avg_pool_nhwc(x, attrs["kernel_size"], attrs["stride"], attrs["dilation"],
                             attrs["padding"], attrs["count_boundary"], _run_outs(x, attrs))
    return [out.astype(x.dtype, copy=False)]


def _max_run(args, attrs):
    x = args[0]
    return [pool.max_pool_nhwc(x, attrs["kernel_size"], attrs["stride"], attrs["dilation"],
                               attrs["padding"], _run_outs(x, attrs))]


RUN = {"conv2d": _run(2), "conv3d": _run(3), "avg_pool": _avg_run, "max_pool": _max_run}
