"""2-D pooling on NHWC input: the window checks, then the 3-D kernels of ``pool3d`` with a
depth of one (one set of loops for both ranks)."""

from __future__ import annotations

import numpy as np

from . import pool3d


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
    return pool3d.avg_pool_ndhwc(x[:, None], (1, *kernel), (1, *stride), (1, *dilation),
                                 (0, 0, *padding), count_boundary, (1, *outs))[:, 0]


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
    out, _ = pool3d.max_pool_ndhwc(x[:, None], (1, *kernel), (1, *stride), (1, *dilation),
                                   (0, 0, *padding), (1, *outs))
    return out[:, 0]
