"""Pooling on NHWC input, NDHWC for 3-D pooling or NLC for 1-D (the rank decides):
``avg_pool`` and ``max_pool`` (MAX v24.4 layouts; torch's ``*_pool1d/2d/3d``), and
``adaptive_avg_pool`` and ``adaptive_max_pool``, which give a fixed output size (torch's
``AdaptiveAvgPool*d``).

Attribute forms (canonicalised when the node is made; see ``_window``):

* ``kernel_size``, ``stride``, ``dilation``: an int (every spatial dim) or one int per
  spatial dim (``(h, w)``, or ``(d, h, w)`` in 3-D). The default stride is 1, as in
  MAX (torch's default is the kernel size).
* ``padding``: an int (all sides), one int per spatial dim (same before and after) or
  before/after per dim: ``(h_before, h_after, w_before, w_after)`` (6 values in 3-D,
  d first), or ``"same"`` (TF's SAME: the output ``ceil(in / stride)``, the odd pixel
  of padding after; TF's average pool then wants ``count_boundary: false``). Padding
  never wins a max and counts as zeros in an average only when ``count_boundary``. A max pool's padding is at most half its effective kernel
  ``dilation * (k - 1) + 1`` on each side (torch's rule).
* ``ceil_mode``: round the output size up, but drop a last window that would start
  inside the trailing padding (as torch); so a kernel larger than the input still
  gives one window when the stride allows it, as in torch.
* ``count_boundary`` (avg only): True divides by the taps inside the padded input
  (torch ``count_include_pad=True``, its default); False by the taps inside the real
  input (torch ``count_include_pad=False``, PoolFormer's pooling).
* ``return_indices`` (max only): a second output, int64, holding for each maximum its
  flat position in its input image: ``h * W + w`` (3-D: ``(d * H + h) * W + w``), per
  batch and channel, as torch's ``max_pool2d(..., return_indices=True)``.

A window with no tap inside the input gives 0 (avg) or the dtype's lowest value
(max: -inf for floats, index -1).
"""

from __future__ import annotations

from ..dtypes import DType, TensorType, format_shape
from . import _checks
from ._registry import REQUIRED, define, public
from ._window import SAME, canon, canon_padding, per_dim, per_side, same_out
from .conv import window_out

__all__ = ["avg_pool", "max_pool", "adaptive_avg_pool", "adaptive_max_pool"]


def _normalize(attrs):
    out = {**attrs, "kernel_size": canon(attrs["kernel_size"], "kernel_size"),
           "stride": canon(attrs["stride"], "stride"),
           "dilation": canon(attrs["dilation"], "dilation"),
           "padding": canon_padding(attrs["padding"]),
           "ceil_mode": bool(attrs["ceil_mode"])}
    for flag in ("count_boundary", "return_indices"):
        if flag in attrs:
            out[flag] = bool(attrs[flag])
    return out


def window(attrs, nd: int) -> tuple:
    """(kernel, stride, dilation, padding) of a pool node as tuples for ``nd`` dims."""
    return (per_dim(attrs["kernel_size"], nd, "kernel_size"),
            per_dim(attrs["stride"], nd, "stride"),
            per_dim(attrs["dilation"], nd, "dilation"), per_side(attrs["padding"], nd))


def _max_padding_check(k, d, p) -> None:
    for i, (kk, dd) in enumerate(zip(k, d)):
        eff = dd * (kk - 1) + 1
        if max(p[2 * i], p[2 * i + 1]) > eff // 2:
            raise ValueError(f"padding ({p[2 * i]}, {p[2 * i + 1]}) of spatial dim {i} is over "
                             f"half the effective kernel {eff} (size {kk}, dilation {dd}): at "
                             f"most {eff // 2} per side, as in torch")


def _check_pool_input(name: str, x) -> None:
    """A pool's x: not packed or bfloat16, float for an average, not bool for a maximum,
    rank 3, 4 or 5 (channels last)."""
    _checks.not_quantized(x)
    _checks.no_bfloat16(x)
    if "avg" in name:
        _checks.float_input(x)
    elif x.dtype == DType.bool:
        raise TypeError(f"{name} of a bool tensor: cast it first (got {x.type})")
    if x.rank not in (3, 4, 5):
        raise ValueError(f"{name} needs NLC (rank 3), NHWC (rank 4) or NDHWC (rank 5) "
                         f"input, got {format_shape(x.shape)}")


def _infer(name):
    def infer(inputs, attrs):
        (x,) = inputs
        _check_pool_input(name, x)
        nd = x.rank - 2
        k, s, d, p = window(attrs, nd)
        if p == SAME:
            outs = tuple(same_out(x.shape[1 + i], s[i]) for i in range(nd))
        else:
            if name == "max_pool":
                _max_padding_check(k, d, p)
            outs = tuple(window_out(x.shape[1 + i], k[i], s[i], d[i], p[2 * i], p[2 * i + 1],
                                    attrs["ceil_mode"]) for i in range(nd))
        out = TensorType(x.dtype, (x.shape[0], *outs, x.shape[-1]))
        if attrs.get("return_indices"):
            return [out, TensorType(DType.int64, out.shape)]
        return [out]
    return infer


_POOL = {"kernel_size": REQUIRED, "stride": 1, "dilation": 1, "padding": 0, "ceil_mode": False}
define("avg_pool", rule=_infer("avg_pool"), run="vision", attrs={**_POOL, "count_boundary": True},
       normalize=_normalize, kind="pool",
       doc="average over windows of NHWC x (NDHWC: 3-D pooling, NLC: 1-D)",
       rule_doc="x float, rank 3 (NLC), 4 (NHWC) or 5 (NDHWC); window attributes one per "
                "spatial dim; "
                "at least one window per spatial dim (with ceil_mode a kernel larger than "
                "the input gives one, as torch)")
define("max_pool", rule=_infer("max_pool"), run="vision",
       attrs={**_POOL, "return_indices": False}, normalize=_normalize, kind="pool",
       outputs=lambda n_inputs, attrs: 2 if attrs.get("return_indices") else 1,
       outputs_doc="out; with `return_indices` also int64 indices (`h * W + w` in each image)",
       doc="maximum over windows of NHWC x (NDHWC: 3-D pooling, NLC: 1-D); padding never "
           "wins",
       rule_doc="x not bool, rank 3 (NLC), 4 (NHWC) or 5 (NDHWC); window attributes one per "
                "spatial dim; padding at most half the effective kernel per side; at least one window "
                "per spatial dim (with ceil_mode a kernel larger than the input gives one)")


def _adaptive_normalize(attrs):
    size = attrs["output_size"]
    items = [size] if isinstance(size, int) or size is None else list(size)
    if not items or any(v is not None and (isinstance(v, bool) or not isinstance(v, int)
                                           or v < 1) for v in items):
        raise ValueError(f"output_size must be a positive int or one positive int (or null: "
                         f"the input's size) per spatial dim, got {size!r}")
    return {**attrs, "output_size": items[0] if isinstance(size, int) else tuple(items)}


def adaptive_sizes(attrs, spatial: tuple) -> tuple:
    """The output size per spatial dim: ``output_size`` (null: the input's dim)."""
    size = attrs["output_size"]
    sizes = (size,) * len(spatial) if isinstance(size, int) else size
    if len(sizes) != len(spatial):
        raise ValueError(f"output_size {tuple(sizes)} has {len(sizes)} values for "
                         f"{len(spatial)} spatial dims")
    return tuple(d if o is None else o for o, d in zip(sizes, spatial))


def _adaptive_infer(name):
    def infer(inputs, attrs):
        (x,) = inputs
        _check_pool_input(name, x)
        for d in x.shape[1:-1]:
            if isinstance(d, int) and d == 0:
                raise ValueError(f"{name} of an empty spatial dim: {format_shape(x.shape)}")
        outs = adaptive_sizes(attrs, tuple(x.shape[1:-1]))
        return [TensorType(x.dtype, (x.shape[0], *outs, x.shape[-1]))]
    return infer


_ADAPTIVE_DOC = ("output cell i of a spatial dim of size L covers inputs floor(i L / out) "
                 "to ceil((i + 1) L / out) - 1, as torch")
define("adaptive_avg_pool", rule=_adaptive_infer("adaptive_avg_pool"), run="vision",
       attrs={"output_size": REQUIRED}, normalize=_adaptive_normalize, kind="pool",
       doc="average of channels-last x (NLC, NHWC or NDHWC) over the windows that give "
           "`output_size` cells per spatial dim (torch's AdaptiveAvgPool1d/2d/3d; "
           "1: global average pooling); " + _ADAPTIVE_DOC,
       rule_doc="x float, rank 3, 4 or 5 (channels last); output_size an int or one int "
                "(null: the input's size) per spatial dim; spatial dims not empty")
define("adaptive_max_pool", rule=_adaptive_infer("adaptive_max_pool"), run="vision",
       attrs={"output_size": REQUIRED}, normalize=_adaptive_normalize, kind="pool",
       doc="maximum of channels-last x (NLC, NHWC or NDHWC) over the windows that give "
           "`output_size` cells per spatial dim (torch's AdaptiveMaxPool1d/2d/3d); "
           + _ADAPTIVE_DOC,
       rule_doc="x not bool, rank 3, 4 or 5 (channels last); output_size an int or one int "
                "(null: the input's size) per spatial dim; spatial dims not empty")


@public
def adaptive_avg_pool():  # noqa: A001 - the signature comes from the definition
    """Average of channels-last ``x`` (``[N, L, C]``, ``[N, H, W, C]`` or ``[N, D, H, W,
    C]``) into ``output_size`` cells per spatial dim, as torch's ``AdaptiveAvgPool*d``:
    cell i of a dim of size L averages inputs ``floor(i L / out)`` to ``ceil((i + 1) L /
    out) - 1``. ``output_size``: an int, or one per spatial dim (None keeps that dim).

    Example::

        y = md.ops.adaptive_avg_pool(x, output_size=7)        # x: [N, H, W, C] -> [N, 7, 7, C]
    """


@public
def adaptive_max_pool():  # noqa: A001 - the signature comes from the definition
    """Maximum of channels-last ``x`` into ``output_size`` cells per spatial dim, as
    torch's ``AdaptiveMaxPool*d`` (windows as ``adaptive_avg_pool``).

    Example::

        y = md.ops.adaptive_max_pool(x, output_size=(1, None))   # x: [N, H, W, C]
    """


@public
def avg_pool():  # noqa: A001 - the signature comes from the definition
    """Average over ``kernel_size`` windows of NHWC (or NDHWC) ``x`` (see the module doc).

    ``out[n, oh, ow, c] = sum(window taps inside x) / count`` where count is the number
    of taps inside the padded input (``count_boundary: true``, torch's
    ``count_include_pad=True``) or inside ``x`` (``false``: torch's
    ``count_include_pad=False``, PoolFormer's pooling). There is no
    NCHW form: transpose NCHW input once (``perm: [0, 2, 3, 1]``) and keep the network
    channels-last (``conv2d`` with ``input_layout: NHWC``). ``kernel_size``, ``stride``,
    ``dilation`` and ``padding`` take an int (every spatial dim) or one entry per dim;
    ``padding: same`` is TF's SAME (with ``count_boundary: false``, TF's average).

    Example::

        y = md.ops.avg_pool(x, 3, stride=2, padding=1)   # x: [N, H, W, C]
        y = md.ops.avg_pool(v, (1, 2, 2), stride=2)      # v: [N, D, H, W, C]
    """


@public
def max_pool():  # noqa: A001 - the signature comes from the definition
    """Maximum over ``kernel_size`` windows of NHWC (or NDHWC) ``x``; padding never wins.

    With ``return_indices`` returns ``(out, indices)``: int64, each the flat position of
    the maximum in its input image (``h * W + w``; 3-D ``(d * H + h) * W + w``), as torch.

    Example::

        y = md.ops.max_pool(x, 2, stride=2)                       # x: [N, H, W, C]
        y, idx = md.ops.max_pool(x, 3, padding=1, return_indices=True)
    """
