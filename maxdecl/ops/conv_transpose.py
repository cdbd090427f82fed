"""Transposed convolution, 2-D or 3-D by the input's rank: ``conv_transpose``.

The semantics of torch's ``conv_transpose2d/3d`` and ONNX ConvTranspose: every input
pixel scatters ``x[n, i, c] * filter[k, f, c]`` to output position
``o = i * stride - pad_before + k * dilation`` (the gradient of a conv2d).

Layouts: input ``NHWC`` (default; rank 5 reads it as ``NDHWC``) with filter
``[kH, kW, C_out/groups, C_in]`` (3-D ``[kD, kH, kW, C_out/groups, C_in]``), or
``NCHW`` / ``NCDHW`` with torch's filter ``[C_in, C_out/groups, kH, kW]``. The output
uses the input's layout. ``filter_layout`` picks the filter's layout apart from the
input's: ``RSFC`` / ``QRSFC`` (``[k..., C_out/groups, C_in]``) or ``CFRS`` / ``CFQRS``
(torch's ``[C_in, C_out/groups, k...]``); by default it follows the input. Groups split C_in and C_out alike: output channel
``g * C_out/groups + j`` sums input channels ``g * C_in/groups ...``.

Attributes (canonical forms as for pools, see ``_window``): ``stride``, ``dilation``
(positive), ``output_padding`` (non-negative; smaller than the stride or the
dilation, as torch) an int or one per spatial dim; ``padding`` as for ``conv2d``: an
int, one per spatial dim or before/after per dim (asymmetric allowed).

Output size per spatial dim: ``(in - 1) * stride - pad_before - pad_after
+ dilation * (k - 1) + 1 + output_padding``; it must be at least 1.
"""

from __future__ import annotations

from .. import dims as symbolic
from ..dtypes import TensorType, format_shape
from . import _checks
from ._registry import define, public
from ._window import canon, canon_padding, per_dim, per_side

__all__ = ["conv_transpose"]

_LAYOUTS = {"NHWC": (4, 5), "NCHW": (4, 5), "NDHWC": (5,), "NCDHW": (5,)}
_FILTERS = {"RSFC": 4, "CFRS": 4, "QRSFC": 5, "CFQRS": 5}     # name -> rank


def filter_first(attrs) -> bool:
    """Whether the filter is channels first (torch's ``[C_in, C_out/groups, k...]``)."""
    fl = attrs.get("filter_layout")
    return (fl or attrs["input_layout"])[1 if fl is None else 0] == "C"


def _normalize(attrs):
    layout = str(attrs["input_layout"]).upper()
    if layout not in _LAYOUTS:
        raise ValueError(f"input_layout must be one of {', '.join(_LAYOUTS)}, got {layout!r}")
    groups = attrs["groups"]
    if not isinstance(groups, int) or isinstance(groups, bool) or groups < 1:
        raise ValueError(f"groups must be a positive int, got {groups!r}")
    fl = attrs.get("filter_layout")
    if fl is not None:
        fl = str(fl).upper()
        if fl not in _FILTERS:
            raise ValueError(f"filter_layout must be one of {', '.join(_FILTERS)}, got {fl!r}")
    return {**attrs, "filter_layout": fl, "stride": canon(attrs["stride"], "stride"),
            "dilation": canon(attrs["dilation"], "dilation"),
            "padding": canon_padding(attrs["padding"]),
            "output_padding": canon(attrs["output_padding"], "output_padding", least=0),
            "input_layout": layout}


def window(attrs, nd: int) -> tuple:
    """(stride, dilation, padding, output_padding) as tuples for ``nd`` spatial dims."""
    return (per_dim(attrs["stride"], nd, "stride"), per_dim(attrs["dilation"], nd, "dilation"),
            per_side(attrs["padding"], nd),
            per_dim(attrs["output_padding"], nd, "output_padding"))


def out_size(size, k, stride, dilation, before, after, extra):
    """One output dim: ``(size - 1) * stride - before - after + dilation * (k - 1) + 1
    + extra`` (a symbolic ``size`` gives a symbolic dim)."""
    return symbolic.add(symbolic.mul(stride, size),
                        -stride - before - after + dilation * (k - 1) + 1 + extra)


def split_filter(shape, channels_first: bool) -> tuple:
    """(kernel dims, C_out/groups, C_in) of a filter shape."""
    if channels_first:
        return tuple(shape[2:]), shape[1], shape[0]
    return tuple(shape[:-2]), shape[-2], shape[-1]


def _rule(inputs, attrs):
    x, w, *rest = inputs
    bias = rest[0] if rest else None
    for v, what in ((x, "x"), (w, "filter")) + (((bias, "bias"),) if bias else ()):
        _checks.float_input(v, what)
    _checks.no_bfloat16(x)
    _checks.same_dtype(x, w, *rest)
    layout = attrs["input_layout"]
    if x.rank not in _LAYOUTS[layout]:
        want = " or ".join(f"rank {r}" for r in _LAYOUTS[layout])
        raise ValueError(f"x {layout}{format_shape(x.shape)} must be {want}")
    if w.rank != x.rank:
        raise ValueError(f"filter{format_shape(w.shape)} must be rank {x.rank} like x")
    fl = attrs.get("filter_layout")
    if fl is not None and _FILTERS[fl] != x.rank:
        raise ValueError(f"filter_layout {fl} is for rank {_FILTERS[fl]}, x is rank {x.rank}")
    nd = x.rank - 2
    first = layout[1] == "C"
    n, spatial, c = ((x.shape[0], tuple(x.shape[2:]), x.shape[1]) if first
                     else (x.shape[0], tuple(x.shape[1:-1]), x.shape[-1]))
    ks, fg, c_in = split_filter(w.shape, filter_first(attrs))
    if any(not isinstance(d, int) for d in (*ks, fg, c_in)):
        raise ValueError(f"filter {format_shape(w.shape)} needs static dims")
    groups = attrs["groups"]
    if c_in % groups:
        raise ValueError(f"filter{format_shape(w.shape)}: C_in={c_in} is not divisible by "
                         f"groups={groups}")
    if not _checks.dims_equal(c, c_in):
        raise ValueError(f"x {layout}{format_shape(x.shape)} has C={c} channels but "
                         f"filter{format_shape(w.shape)} takes C_in={c_in}")
    f = fg * groups
    if bias is not None and (bias.rank != 1 or not _checks.dims_equal(bias.shape[0], f)):
        raise ValueError(f"bias{format_shape(bias.shape)} must be [{f}] (C_out = "
                         f"{fg} x groups {groups})")
    st, dl, pad, extra = window(attrs, nd)
    outs = []
    for i in range(nd):
        if extra[i] >= st[i] and extra[i] >= dl[i]:
            raise ValueError(f"output_padding {extra[i]} of spatial dim {i} must be smaller "
                             f"than its stride {st[i]} or dilation {dl[i]}")
        o = out_size(spatial[i], ks[i], st[i], dl[i], pad[2 * i], pad[2 * i + 1], extra[i])
        if isinstance(o, int) and o < 1:
            raise ValueError(f"output size {o} of spatial dim {i} is not positive: (in "
                             f"{spatial[i]} - 1) x stride {st[i]} - padding {pad[2 * i]} - "
                             f"{pad[2 * i + 1]} + dilation {dl[i]} x (k {ks[i]} - 1) + 1 + "
                             f"output_padding {extra[i]}")
        outs.append(o)
    shape = (n, f, *outs) if first else (n, *outs, f)
    return [TensorType(x.dtype, shape)]


define("conv_transpose", rule=_rule, run="conv_transpose", inputs=("x", "filter"),
       optional=("bias",),
       call_order=("stride", "dilation", "padding", "output_padding", "groups", "bias",
                   "input_layout", "filter_layout"),
       attrs={"stride": 1, "dilation": 1, "padding": 0, "output_padding": 0, "groups": 1,
              "input_layout": "NHWC", "filter_layout": None},
       normalize=_normalize, kind="conv",
       doc="transposed convolution, 2-D or 3-D by rank (torch conv_transpose2d/3d, ONNX "
           "ConvTranspose): NHWC / NDHWC with filter [k..., C_out/groups, C_in], or NCHW / "
           "NCDHW with torch's [C_in, C_out/groups, k...]; filter_layout RSFC / QRSFC or "
           "CFRS / CFQRS sets the filter's apart from the input's",
       rule_doc="x rank 4 or 5 as its layout says, filter the same rank with static dims; "
                "C = C_in, divisible by groups; bias [C_out]; output_padding smaller than "
                "stride or dilation; output size (in - 1) x stride - padding + dilation x "
                "(k - 1) + 1 + output_padding at least 1")


@public
def conv_transpose():  # noqa: A001 - the signature comes from the definition
    """Transposed convolution (see the module doc for layouts and forms).

    ``out[n, i*s - pb + k*d, g*Fg + f] += x[n, i, g*Cg + c] * filter[k, f, g*Cg + c]``
    over input positions ``i``, taps ``k`` and channels ``c`` of group ``g``, then
    ``+ bias``; positions in the padding are cropped away.

    Args: x ``[N, H, W, C]`` (or ``[N, D, H, W, C]``, NCHW, NCDHW), filter ``[kH, kW,
    C_out/groups, C]`` (NCHW: ``[C, C_out/groups, kH, kW]``), bias ``[C_out]``.
    Returns ``[N, OH, OW, C_out]`` in the input's layout: per spatial dim ``(in - 1) *
    stride - pad_before - pad_after + dilation * (k - 1) + 1 + output_padding``, which a
    symbolic ``in`` keeps as a polynomial (stride 4, k 8, padding 2 over ``L`` gives
    ``4*L``). ``stride``, ``dilation``, ``output_padding``: an int or one per spatial
    dim; ``padding``: an int, one per spatial dim, or before/after per dim. 1-D
    (torch's ``ConvTranspose1d``, a vocoder's upsampling): a height-1 map ``[N, 1, L,
    C]`` with ``stride: [1, s]``, ``padding: [0, p]``, ``output_padding: [0, op]``, and
    torch's ``[C_in, C_out/groups, k]`` filter made ``[C_in, C_out/groups, 1, k]`` by the
    ``unsqueeze: 2`` transform and read with ``filter_layout: CFRS``.

    Example::

        y = md.ops.conv_transpose(x, w, stride=2, padding=1, output_padding=1)
        y = md.ops.conv_transpose(x, w_torch, stride=2, input_layout="NCHW")
    """
