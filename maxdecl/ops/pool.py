"""Pooling on NHWC input (MAX v24.4): ``avg_pool`` and ``max_pool``.

Attribute forms (canonicalised when the node is made, as for ``conv2d``):

* ``kernel_size``, ``stride``, ``dilation``: an int (both dims) or ``(h, w)``.
  The default stride is 1, as in MAX (torch's default is the kernel size).
* ``padding``: an int (all sides), ``(ph, pw)`` (same before and after) or
  ``(h_before, h_after, w_before, w_after)``. Padding never wins a max and counts
  as zeros in an average only when ``count_boundary``.
* ``ceil_mode``: round the output size up, but drop a last window that would start
  inside the trailing padding (as torch).
* ``count_boundary`` (avg only): True divides by the taps inside the padded input
  (torch ``count_include_pad=True``); False by the taps inside the real input.

A window with no tap inside the input gives 0 (avg) or the dtype's lowest value
(max: -inf for floats).
"""

from __future__ import annotations

from ..dtypes import DType, TensorType, format_shape
from . import _checks
from ._registry import REQUIRED, apply, define
from .conv import expand, expand_padding, window_out

__all__ = ["avg_pool", "max_pool"]


def _normalize(attrs):
    out = {**attrs, "kernel_size": expand(attrs["kernel_size"], 2, "kernel_size"),
           "stride": expand(attrs["stride"], 2, "stride"),
           "dilation": expand(attrs["dilation"], 2, "dilation"),
           "padding": expand_padding(attrs["padding"], 2),
           "ceil_mode": bool(attrs["ceil_mode"])}
    if "count_boundary" in attrs:
        out["count_boundary"] = bool(attrs["count_boundary"])
    return out


def _outs(shape, attrs):
    p = attrs["padding"]
    return tuple(window_out(shape[1 + i], attrs["kernel_size"][i], attrs["stride"][i],
                            attrs["dilation"][i], p[2 * i], p[2 * i + 1], attrs["ceil_mode"])
                 for i in range(2))


def _infer(name):
    def infer(inputs, attrs):
        (x,) = inputs
        _checks.not_quantized(x)
        _checks.no_bfloat16(x)
        if name == "avg_pool":
            _checks.float_input(x)
        elif x.dtype == DType.bool:
            raise TypeError(f"max_pool of a bool tensor: cast it first (got {x.type})")
        if x.rank != 4:
            raise ValueError(f"{name} needs NHWC input of rank 4, got {format_shape(x.shape)}")
        oh, ow = _outs(x.shape, attrs)
        return [TensorType(x.dtype, (x.shape[0], oh, ow, x.shape[3]))]
    return infer


_POOL = {"kernel_size": REQUIRED, "stride": 1, "dilation": 1, "padding": 0, "ceil_mode": False}
define("avg_pool", rule=_infer("avg_pool"), run="vision", attrs={**_POOL, "count_boundary": True},
       normalize=_normalize, kind="pool", doc="average over windows of NHWC x",
       rule_doc="x float, rank 4 (NHWC); each window must fit")
define("max_pool", rule=_infer("max_pool"), run="vision", attrs=_POOL, normalize=_normalize,
       kind="pool", doc="maximum over windows of NHWC x; padding never wins",
       rule_doc="x not bool, rank 4 (NHWC); each window must fit")


def avg_pool(x, kernel_size, stride=1, dilation=1, padding=0, ceil_mode=False,
             count_boundary=True):
    """Average over ``kernel_size`` windows of NHWC ``x`` (see the module doc for forms).

    ``out[n, oh, ow, c] = sum(window taps inside x) / count`` where count is the number
    of taps inside the padded input (``count_boundary``) or inside ``x``.

    Example::

        y = md.ops.avg_pool(x, 3, stride=2, padding=1)   # x: [N, H, W, C]
    """
    return apply("avg_pool", [x], kernel_size=kernel_size, stride=stride, dilation=dilation,
                 padding=padding, ceil_mode=ceil_mode, count_boundary=count_boundary)[0]


def max_pool(x, kernel_size, stride=1, dilation=1, padding=0, ceil_mode=False):
    """Maximum over ``kernel_size`` windows of NHWC ``x``; padding never wins."""
    return apply("max_pool", [x], kernel_size=kernel_size, stride=stride, dilation=dilation,
                 padding=padding, ceil_mode=ceil_mode)[0]
