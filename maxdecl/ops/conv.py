"""Convolutions with MAX (v24.4) layouts: ``conv2d`` and ``conv3d``.

Layouts: input ``NHWC`` (default) or ``NCHW``; filter ``RSCF`` = [R, S, C/groups, F]
(default) or ``FCRS`` = [F, C/groups, R, S] (torch's weight layout). 3-D: ``NDHWC`` /
``NCDHW`` and ``QRSCF`` / ``FCQRS``. The output uses the input's layout.

Attribute forms (canonicalised when the node is made, so YAML and Python agree):

* ``stride``, ``dilation``: an int (every spatial dim) or one int per spatial dim.
* ``padding``: an int (everywhere), one int per spatial dim (same before and after),
  explicit ``(h_before, h_after, w_before, w_after)`` (3-D: 6 values, d first), or
  ``"same"``: TF's SAME, the output ``ceil(in / stride)`` with the odd pixel of padding
  after (torch's ``padding="same"`` at stride 1), sized from the input when it runs.
* ``groups``: C and F must both divide by it; ``groups == C`` is depthwise.

Output size per spatial dim: ``(in + before + after - dilation*(k-1) - 1) // stride + 1``;
it must be at least 1.
"""

from __future__ import annotations

from ..dtypes import TensorType, format_shape
from . import _checks
from ._registry import define, public
from ._window import SAME, is_same, same_out

_CONV = {"stride": 1, "dilation": 1, "padding": 0, "groups": 1}

__all__ = ["conv2d", "conv3d"]

_LAYOUTS = {2: (("NHWC", "NCHW"), ("RSCF", "FCRS")), 3: (("NDHWC", "NCDHW"), ("QRSCF", "FCQRS"))}


def expand(value, nd: int, what: str) -> tuple:
    """An int or an ``nd``-sequence -> a tuple of ``nd`` positive ints."""
    vals = (value,) * nd if isinstance(value, int) else tuple(value)
    if len(vals) != nd or any(not isinstance(v, int) or isinstance(v, bool) or v < 1
                              for v in vals):
        raise ValueError(f"{what} must be a positive int or {nd} of them, got {value!r}")
    return vals


def expand_padding(value, nd: int):
    """int -> all sides; nd ints -> symmetric per dim; 2*nd ints -> (before, after) per dim;
    ``"same"`` stays ``"same"``."""
    if is_same(value):
        return SAME
    vals = (value,) * (2 * nd) if isinstance(value, int) else tuple(value)
    if len(vals) == nd:
        vals = tuple(v for p in vals for v in (p, p))
    if len(vals) != 2 * nd or any(not isinstance(v, int) or isinstance(v, bool) or v < 0
                                  for v in vals):
        raise ValueError(f"padding must be a non-negative int, {nd} ints, {2 * nd} ints "
                         f"(before, after per dim) or \"same\", got {value!r}")
    return vals


def window_out_size(size, k, stride, dilation, before, after, ceil_mode=False) -> int:
    """Output length of a window sweep over one int dim, torch's formula.

    ``ceil_mode`` rounds up but drops a last window that would start inside the
    trailing padding (as torch does): so a kernel larger than the padded input still
    gives one window when the stride exceeds the shortfall (torch's floor division of
    a negative span). The result is 0 when nothing fits.
    """
    span = size + before + after - dilation * (k - 1) - 1
    n = (span + (stride - 1 if ceil_mode else 0)) // stride + 1
    if ceil_mode and n > 0 and (n - 1) * stride >= size + before:
        n -= 1
    return max(n, 0)


def window_out(size, k, stride, dilation, before, after, ceil_mode=False, what="kernel"):
    """Output length of a window sweep over one dim (symbolic sizes give a symbol)."""
    eff = dilation * (k - 1) + 1
    if not isinstance(size, int):
        if stride == 1:     # no rounding: the size moves by the padding less the extent
            return _checks.add_dims(size, before + after - eff + 1)
        return f"win({size},{k},{stride},{dilation},{before},{after})"
    n = window_out_size(size, k, stride, dilation, before, after, ceil_mode)
    if n < 1:
        raise ValueError(f"{what} of extent {eff} (size {k}, dilation {dilation}) does not fit "
                         f"input size {size} with padding ({before}, {after})")
    return n


def _normalize(nd):
    def normalize(attrs):
        ins, fils = _LAYOUTS[nd]
        il = str(attrs["input_layout"]).upper()
        fl = str(attrs["filter_layout"]).upper()
        if il not in ins:
            raise ValueError(f"input_layout must be one of {', '.join(ins)}, got {il!r}")
        if fl not in fils:
            raise ValueError(f"filter_layout must be one of {', '.join(fils)}, got {fl!r}")
        groups = attrs["groups"]
        if not isinstance(groups, int) or isinstance(groups, bool) or groups < 1:
            raise ValueError(f"groups must be a positive int, got {groups!r}")
        return {**attrs, "stride": expand(attrs["stride"], nd, "stride"),
                "dilation": expand(attrs["dilation"], nd, "dilation"),
                "padding": expand_padding(attrs["padding"], nd),
                "input_layout": il, "filter_layout": fl}
    return normalize


def _split_x(shape, layout):
    """(N, spatial..., C) from a shape in ``layout``."""
    if layout[1] == "C":
        return shape[0], tuple(shape[2:]), shape[1]
    return shape[0], tuple(shape[1:-1]), shape[-1]


def _split_w(shape, layout):
    """(spatial..., C/groups, F) from a filter shape in ``layout``."""
    if layout[0] == "F":
        return tuple(shape[2:]), shape[1], shape[0]
    return tuple(shape[:-2]), shape[-2], shape[-1]


def _infer(nd):
    def infer(inputs, attrs):
        x, w, *rest = inputs
        bias = rest[0] if rest else None
        for v, what in ((x, "x"), (w, "filter")) + (((bias, "bias"),) if bias else ()):
            _checks.float_input(v, what)
        _checks.no_bfloat16(x)
        _checks.same_dtype(x, w, *rest)
        il, fl = attrs["input_layout"], attrs["filter_layout"]
        if x.rank != nd + 2:
            raise ValueError(f"x must be rank {nd + 2} ({il}), got {format_shape(x.shape)}")
        if w.rank != nd + 2:
            raise ValueError(f"filter must be rank {nd + 2} ({fl}), got {format_shape(w.shape)}")
        n, spatial, c = _split_x(x.shape, il)
        ks, cg, f = _split_w(w.shape, fl)
        groups = attrs["groups"]
        if any(not isinstance(k, int) for k in (*ks, cg, f)):
            raise ValueError(f"filter {format_shape(w.shape)} needs static dims")
        if f % groups:
            raise ValueError(f"filter {fl}{format_shape(w.shape)}: F={f} is not divisible by "
                             f"groups={groups}")
        if not _checks.dims_equal(c, cg * groups):
            raise ValueError(f"x {il}{format_shape(x.shape)} has C={c} channels but filter "
                             f"{fl}{format_shape(w.shape)} expects C/groups={cg} x groups="
                             f"{groups} = {cg * groups}")
        if bias is not None and (bias.rank != 1 or not _checks.dims_equal(bias.shape[0], f)):
            raise ValueError(f"bias{format_shape(bias.shape)} must be [{f}] (F)")
        p = attrs["padding"]
        if p == SAME:
            outs = tuple(same_out(size, s) for size, s in zip(spatial, attrs["stride"]))
        else:
            outs = tuple(window_out(size, k, s, d, p[2 * i], p[2 * i + 1])
                         for i, (size, k, s, d) in enumerate(
                             zip(spatial, ks, attrs["stride"], attrs["dilation"])))
        shape = (n, f, *outs) if il[1] == "C" else (n, *outs, f)
        return [TensorType(x.dtype, shape)]
    return infer


define("conv2d", rule=_infer(2), run="vision", inputs=("x", "filter"), optional=("bias",),
       call_order=("stride", "dilation", "padding", "groups", "bias", "input_layout",
                   "filter_layout"),
       attrs={**_CONV, "input_layout": "NHWC", "filter_layout": "RSCF"},
       normalize=_normalize(2), kind="conv",
       doc="2-D convolution (cross-correlation), MAX layouts NHWC / RSCF (or NCHW / FCRS)",
       rule_doc="x rank 4, filter rank 4 with static dims; C = C/groups x groups; F divisible "
                "by groups; bias [F]; each window must fit")
define("conv3d", rule=_infer(3), run="vision", inputs=("x", "filter"), optional=("bias",),
       call_order=("stride", "dilation", "padding", "groups", "bias", "input_layout",
                   "filter_layout"),
       attrs={**_CONV, "input_layout": "NDHWC", "filter_layout": "QRSCF"},
       normalize=_normalize(3), kind="conv",
       doc="3-D convolution, layouts NDHWC / QRSCF (or NCDHW / FCQRS)",
       rule_doc="as conv2d with one more spatial dim (rank 5)")


@public
def conv2d():  # noqa: A001 - the signature comes from the definition
    """2-D convolution (cross-correlation, as torch and MAX).

    ``out[n, oh, ow, f] = bias[f] + sum_{r, s, c} x[n, oh*sh - ph + r*dh, ow*sw - pw + s*dw,
    g*C/groups + c] * filter[r, s, c, f]`` with ``g = f // (F/groups)``; zero padding.

    Args: x ``[N, H, W, C]`` (or NCHW), filter ``[R, S, C/groups, F]`` (or FCRS), bias
    ``[F]``; padding ``(h_before, h_after, w_before, w_after)`` (or the short forms
    below). Returns ``[N, OH, OW, F]`` in the input's layout. ``input_layout`` and
    ``filter_layout`` are independent: NHWC values with torch's ``[F, C, R, S]`` filters
    is ``input_layout="NHWC", filter_layout="FCRS"``. H and W may be symbolic dims; a
    window that does not fit is then reported when the graph runs.

    ``stride`` and ``dilation``: an int, or one per spatial dim (``[h, w]``); ``padding``:
    an int, one per spatial dim, ``[h_before, h_after, w_before, w_after]``, or
    ``"same"``: TF's SAME (TF-ported EfficientNet, MobileNet and BiT convs), the output
    ``ceil(in / stride)`` with the odd pixel of padding after, sized from the input
    when the node runs, so symbolic H and W work (the output dims are then opaque
    ``same(h,stride)``; at stride 1 it is torch's ``padding="same"``). A 1-D
    convolution (torch's ``Conv1d(C, F, K, stride=s, padding=p)``) is a height-1 conv2d:
    x ``[N, 1, L, C]`` (NHWC), filter ``[F, C, 1, K]`` (FCRS; the ``unsqueeze: 2``
    transform makes it from torch's ``[F, C, K]``), ``stride: [1, s]``, ``padding:
    [0, p]`` (a single ``padding: p`` would pad the height too).

    ``groups``: C and F both divide by it, and the filter's channel dim is C/groups; a
    depthwise conv is ``groups == C``: 7x7 over 96 channels is ``[7, 7, 1, 96]`` in RSCF
    and ``[96, 1, 7, 7]`` in FCRS (torch's ``Conv2d(96, 96, 7, groups=96).weight``).

    Example::

        y = md.ops.conv2d(x, w, stride=2, padding=1)           # NHWC / RSCF
        y = md.ops.conv2d(x, w, padding=1, input_layout="NCHW", filter_layout="FCRS")
    """


@public
def conv3d():  # noqa: A001 - the signature comes from the definition
    """3-D convolution: as ``conv2d`` with depth; x ``[N, D, H, W, C]`` (or NCDHW), filter
    ``[Q, R, S, C/groups, F]`` (or FCQRS), padding of 6 (d, h, w; before and after each)."""
