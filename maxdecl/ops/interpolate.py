"""``interpolate``: resampling of 1-D, 2-D or 3-D spatial data to a new size, as torch's
``nn.functional.interpolate`` (modes nearest, nearest-exact, linear, cubic).

x is ``[N, *spatial, C]`` (``channels_last``, the default, as the NHWC convolutions give
it) or torch's ``[N, C, *spatial]``; rank 3, 4 or 5 gives 1, 2 or 3 spatial dims. The
new size comes from ``size`` (one int per spatial dim, or one int for all) or from
``scale_factor`` (a number or one per dim: ``floor(in * factor)``, and the factor itself
sets the sampling step, as torch does when ``recompute_scale_factor`` is not set).
``linear`` is torch's linear / bilinear / trilinear by rank, ``cubic`` its bicubic
(2-D in torch; here any rank, one axis after another); ``align_corners`` as in torch. With the optional input ``like``, the spatial sizes are
like's (segmentation heads resize every feature map to the first one's size, which may
be symbolic); like's values are not read.
"""

from __future__ import annotations

import math

from .. import dims as symbolic
from ..dtypes import TensorType, format_shape
from . import _checks
from ._registry import define, public

__all__ = ["interpolate", "grid_sample"]

MODES = ("nearest", "nearest-exact", "linear", "cubic")
MAX_SIZE = 1 << 24          # an output dim above this is refused (a typo, not a model)


def _per_dim(value, nd: int, what: str, kind):
    """``value`` (a number or one per spatial dim) as a tuple of ``nd`` entries."""
    vals = (value,) * nd if isinstance(value, (int, float)) else tuple(value)
    if len(vals) != nd:
        raise ValueError(f"{what} needs one entry per spatial dim ({nd}), got {list(vals)}")
    for v in vals:
        if isinstance(v, bool) or not isinstance(v, kind) or not (v > 0) or v != v:
            raise ValueError(f"{what} entries must be positive "
                             f"{'ints' if kind is int else 'numbers'}, got {value!r}")
    return vals


def _normalize(a):
    mode = str(a["mode"])
    if mode not in MODES:
        raise ValueError(f"mode must be one of {', '.join(MODES)}, got {mode!r}")
    if a["align_corners"] and mode not in ("linear", "cubic"):
        raise ValueError(f"align_corners applies to modes linear and cubic, not {mode!r}")
    if a["antialias"] and (mode not in ("linear", "cubic") or a["align_corners"]):
        raise ValueError(f"antialias applies to modes linear and cubic without align_corners, "
                         f"not mode {mode!r} with align_corners={a['align_corners']!r}")
    out = {**a, "mode": mode, "align_corners": bool(a["align_corners"]),
           "antialias": bool(a["antialias"]),
           "channels_last": bool(a["channels_last"])}
    for key, kind in (("size", int), ("scale_factor", (int, float))):
        v = a[key]
        if v is None:
            continue
        if isinstance(v, bool) or not isinstance(v, (int, float, list, tuple)):
            raise ValueError(f"{key} must be a number or a list of numbers, got {v!r}")
        if isinstance(v, (list, tuple)):
            v = tuple(v)
        out[key] = v
        _per_dim(v, len(v) if isinstance(v, tuple) else 1, key, kind)   # entry types
    return out


def spatial_axes(rank: int, channels_last: bool) -> tuple:
    """The spatial axes of an ``interpolate`` input of ``rank``."""
    return tuple(range(1, rank - 1)) if channels_last else tuple(range(2, rank))


def out_size(size, factor: float) -> int:
    """``floor(size * factor)``, torch's output length for a scale factor."""
    return int(math.floor(size * factor))


def _out_dim(d, size, factor):
    if size is not None:
        return size
    if isinstance(d, int):
        n = out_size(d, factor)
        if n < 1:
            raise ValueError(f"scale_factor {factor} leaves no output of input size {d}")
        return n
    if float(factor).is_integer():
        return symbolic.mul(d, int(factor))
    return f"interp({d},{factor!r})"


def _rule(inputs, attrs):
    x, *like = inputs
    given = (attrs["size"] is not None) + (attrs["scale_factor"] is not None) + len(like)
    if given != 1:
        raise ValueError("interpolate needs exactly one of size, scale_factor and the "
                         "input like")
    _checks.not_quantized(x)
    _checks.no_bfloat16(x)
    _checks.float_input(x)
    if x.rank not in (3, 4, 5):
        raise ValueError(f"interpolate needs x of rank 3, 4 or 5 (1 to 3 spatial dims "
                         f"between batch and channels), got {format_shape(x.shape)}")
    axes = spatial_axes(x.rank, attrs["channels_last"])
    nd = len(axes)
    sizes = (_per_dim(attrs["size"], nd, "size", int) if attrs["size"] is not None
             else (None,) * nd)
    factors = (_per_dim(attrs["scale_factor"], nd, "scale_factor", (int, float))
               if attrs["scale_factor"] is not None else (None,) * nd)
    shape = list(x.shape)
    if like:
        if like[0].rank != x.rank:
            raise ValueError(f"like{format_shape(like[0].shape)} must have x's rank "
                             f"({x.rank}): its spatial dims give the output's")
        sizes = tuple(like[0].shape[ax] for ax in axes)
    for ax, size, factor in zip(axes, sizes, factors):
        shape[ax] = _out_dim(x.shape[ax], size, factor)
        if isinstance(shape[ax], int) and shape[ax] > MAX_SIZE:
            raise ValueError(f"interpolate output dim {shape[ax]} is over {MAX_SIZE}")
    return [TensorType(x.dtype, tuple(shape))]


define("interpolate", rule=_rule, run="interpolate", optional=("like",),
       attrs={"size": None, "scale_factor": None, "mode": "nearest", "align_corners": False,
              "antialias": False, "channels_last": True},
       normalize=_normalize, kind="resample",
       doc="resampling to a new spatial size (torch.nn.functional.interpolate): nearest, "
           "nearest-exact, linear (bi-, trilinear), cubic",
       rule_doc="x float, rank 3 to 5 ([N, *spatial, C], or [N, C, *spatial] without "
                "channels_last); one of size, scale_factor (per spatial dim) and like (x's "
                "rank; its spatial dims); out: x's type with the new spatial sizes")


@public
def interpolate():  # noqa: A001 - the signature comes from the definition
    """Resample the spatial dims of ``x``, as ``torch.nn.functional.interpolate``.

    x: ``[N, *spatial, C]`` (``channels_last``, default) or ``[N, C, *spatial]``, with
    1, 2 or 3 spatial dims. Give exactly one of ``size`` (an int, or one per spatial
    dim), ``scale_factor`` (a number or one per dim: the output is ``floor(in *
    factor)`` and the sampling step ``1 / factor``, torch's default) and the input
    ``like``, a value of x's rank and layout whose spatial dims the output takes
    (torch's ``size=other.shape[2:]``; they may be symbolic; only its shape is read, so
    its batch and channel dims and its dtype may differ from x's). Modes:

    * ``nearest``: source index ``floor(out * in / out_size)`` (torch's legacy nearest);
    * ``nearest-exact``: ``floor((out + 0.5) * in / out_size)`` (PIL, scikit-image);
    * ``linear``: linear, bilinear or trilinear by the number of spatial dims;
    * ``cubic``: cubic convolution with a = -0.75 (torch's bicubic; edge indices
      clamped), along one axis after another.

    ``align_corners`` (linear, cubic) maps the corner samples onto each other, as in
    torch. ``antialias`` (linear, cubic; not with ``align_corners``) is torch's
    ``antialias=True``: where an axis shrinks, each output averages every input under the
    filter stretched by the scale (a triangle, or the cubic kernel with a = -0.5), the
    weights normalised to sum 1 (SigLIP 2's position-table resize); where it grows, the
    same filter unstretched. float32 math.

    Example::

        y = md.ops.interpolate(x, size=(64, 64), mode="linear")   # x: [N, H, W, C]
        y = md.ops.interpolate(x, scale_factor=2)                 # nearest, 2x
    """


# -- grid_sample ----------------------------------------------------------------------
GRID_MODES = ("bilinear", "nearest")
GRID_PADDING = ("zeros", "border", "reflection")


def _normalize_grid(a):
    mode, padding = str(a["mode"]), str(a["padding_mode"])
    if mode not in GRID_MODES:
        raise ValueError(f"mode must be one of {', '.join(GRID_MODES)}, got {mode!r}")
    if padding not in GRID_PADDING:
        raise ValueError(f"padding_mode must be one of {', '.join(GRID_PADDING)}, got "
                         f"{padding!r}")
    return {**a, "mode": mode, "padding_mode": padding,
            "align_corners": bool(a["align_corners"]), "channels_last": bool(a["channels_last"])}


def _grid_rule(inputs, attrs):
    x, grid = inputs
    _checks.not_quantized(x, grid)
    _checks.no_bfloat16(x, grid)
    _checks.float_input(x)
    _checks.float_input(grid, "grid")
    if x.rank != 4 or grid.rank != 4 or not _checks.dims_equal(grid.shape[-1], 2):
        raise ValueError(f"grid_sample needs x [N, H, W, C] (or [N, C, H, W]) and grid "
                         f"[N, H_out, W_out, 2], got x{format_shape(x.shape)} and "
                         f"grid{format_shape(grid.shape)}")
    if not _checks.dims_equal(x.shape[0], grid.shape[0]):
        raise ValueError(f"x{format_shape(x.shape)} and grid{format_shape(grid.shape)} must "
                         f"have one batch size")
    _checks.same_dtype(x, grid)
    n, ho, wo = grid.shape[:3]
    c = x.shape[-1] if attrs["channels_last"] else x.shape[1]
    shape = (n, ho, wo, c) if attrs["channels_last"] else (n, c, ho, wo)
    return [TensorType(x.dtype, shape)]


define("grid_sample", rule=_grid_rule, run="interpolate", inputs=("x", "grid"),
       attrs={"mode": "bilinear", "padding_mode": "zeros", "align_corners": False,
              "channels_last": True},
       normalize=_normalize_grid, kind="resample",
       doc="x sampled at the points of grid (torch.nn.functional.grid_sample, 2-D): "
           "bilinear or nearest, zeros, border or reflection padding",
       rule_doc="x float [N, H, W, C] ([N, C, H, W] without channels_last), grid x's dtype "
                "[N, H_out, W_out, 2]; out: [N, H_out, W_out, C] (or [N, C, H_out, W_out])")


@public
def grid_sample():  # noqa: A001 - the signature comes from the definition
    """Sample ``x`` at the points of ``grid``, as ``torch.nn.functional.grid_sample`` on
    4-D input (deformable attention's multi-scale sampling, spatial transformers).

    x: ``[N, H, W, C]`` (``channels_last``, the default) or torch's ``[N, C, H, W]``;
    grid: ``[N, H_out, W_out, 2]``, each point ``(x, y)`` in ``[-1, 1]`` across the
    width and the height (``-1`` the left / top edge: the first pixel's centre with
    ``align_corners``, its outer edge without). The output is ``[N, H_out, W_out, C]``
    (or ``[N, C, H_out, W_out]``). ``mode``: ``bilinear`` (the four neighbours weighted
    by distance) or ``nearest`` (rounding half to even). ``padding_mode``: ``zeros``
    (taps outside x count as 0), ``border`` (points clamped to the edge) or
    ``reflection`` (points mirrored back inside). float32 math in torch's order.
    """
