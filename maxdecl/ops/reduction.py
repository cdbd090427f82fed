"""Reductions: ``sum mean max min argmax`` over axes, ``cumsum`` along one, and ``softmax``
(numba kernel).

``axis`` is an int, a tuple of ints, or None (every axis); ``argmax`` takes one int
axis or None (index into the flattened tensor, as ``np.argmax``). ``keepdims`` keeps
the reduced axes as size 1. Float sums and means accumulate in float32 (float16
inputs too) and return the input dtype; integer sums keep the integer dtype.
"""

from __future__ import annotations

from ..dtypes import DType, TensorType
from . import _checks
from ._registry import define, public

__all__ = ["sum", "mean", "max", "min", "prod", "argmax", "argmin", "cumsum", "cummax",
           "softmax", "sort"]


def _normalize_axis(attrs):
    axis = attrs["axis"]
    if isinstance(axis, (list, tuple)):
        axis = tuple(int(a) for a in axis)
    elif axis is not None:
        axis = int(axis)
    return {**attrs, "axis": axis, "keepdims": bool(attrs["keepdims"])}


def _axes(axis, rank) -> tuple:
    if axis is None:
        return tuple(range(rank))
    axes = axis if isinstance(axis, tuple) else (axis,)
    norm = tuple(_checks.valid_axis(a, rank) for a in axes)
    if len(set(norm)) != len(norm):
        raise ValueError(f"axis {axis} repeats an axis")
    return norm


def _reduced_shape(x, attrs) -> tuple:
    axes = _axes(attrs["axis"], x.rank)
    if attrs["keepdims"]:
        return tuple(1 if i in axes else d for i, d in enumerate(x.shape))
    return tuple(d for i, d in enumerate(x.shape) if i not in axes)


def _summable(x, name) -> None:
    """TypeError unless ``x`` is a plain, non-bool tensor an accumulating op can take."""
    _checks.not_quantized(x)
    _checks.no_bfloat16(x)
    if x.dtype == DType.bool:
        raise TypeError(f"{name} of a bool tensor: cast it first (got {x.type})")


def _reduce_rule(name):
    def infer(inputs, attrs):
        (x,) = inputs
        _summable(x, name)
        if name == "mean" and not x.dtype.is_float:
            raise TypeError(f"mean needs a float tensor, got {x.type}")
        if name in ("max", "min") and attrs["axis"] is not None and any(
                isinstance(x.shape[a], int) and x.shape[a] == 0
                for a in _axes(attrs["axis"], x.rank)):
            raise ValueError(f"{name} over an empty axis of {x.type}")
        return [TensorType(x.dtype, _reduced_shape(x, attrs))]
    return infer


def _arg_rule(name):
    def rule(inputs, attrs):
        (x,) = inputs
        _checks.not_quantized(x)
        _checks.no_bfloat16(x)
        if isinstance(attrs["axis"], tuple):
            raise ValueError(f"{name} takes one axis (or None), got {attrs['axis']}")
        if attrs["axis"] is None:
            shape = (1,) * x.rank if attrs["keepdims"] else ()
        else:
            shape = _reduced_shape(x, attrs)
        return [TensorType(DType.int64, shape)]
    return rule


_AXIS = {"axis": -1, "keepdims": False}
for _name in ("sum", "mean", "max", "min", "prod"):
    define(_name, rule=_reduce_rule(_name), run="reduction", attrs=_AXIS,
           normalize=_normalize_axis, kind="reduction",
           doc=f"{_name} over axis (an int, a list, or null for every axis)",
           rule_doc=("x float" if _name == "mean" else "x not bool")
           + "; reduced axes dropped, or 1 with keepdims")
for _name, _what in (("argmax", "maximum"), ("argmin", "minimum")):
    define(_name, rule=_arg_rule(_name), run="reduction", attrs=_AXIS,
           normalize=_normalize_axis, kind="reduction",
           doc=f"int64 index of the first {_what} along axis (a NaN counts as the {_what}, "
               "as in torch and NumPy)",
           rule_doc="x float or integer (token ids, a mask as int32); one axis or null; "
                    "out int64")


def _reduce_axis(axis):
    return tuple(axis) if isinstance(axis, (list, tuple)) else axis


@public
def sum():  # noqa: A001 - the signature comes from the definition
    """Sum over ``axis`` (int, tuple, or None for all)."""


@public
def mean():  # noqa: A001 - the signature comes from the definition
    """Arithmetic mean over ``axis`` (int, tuple, or None for all); float inputs only."""


@public
def max():  # noqa: A001 - the signature comes from the definition
    """Maximum over ``axis`` (int, tuple, or None for all); NaN propagates."""


@public
def min():  # noqa: A001 - the signature comes from the definition
    """Minimum over ``axis`` (int, tuple, or None for all); NaN propagates."""


@public
def prod():  # noqa: A001 - the signature comes from the definition
    """Product over ``axis`` (int, tuple, or None for all); float32 multiplies in
    float32 (float16 in float32, rounded once), integers in their own dtype."""


@public
def argmax():  # noqa: A001 - the signature comes from the definition
    """int64 index of the first maximum along ``axis`` (None: of the flattened tensor)."""


@public
def argmin():  # noqa: A001 - the signature comes from the definition
    """int64 index of the first minimum along ``axis`` (None: of the flattened tensor):
    the nearest codebook entry from a distance (a vector quantizer)."""


# -- cumsum -----------------------------------------------------------------------------
def _running_rule(name):
    def rule(inputs, attrs):
        (x,) = inputs
        _summable(x, name)
        _checks.valid_axis(attrs["axis"], x.rank)
        return [x.type]
    return rule


_RUNNING_DOC = {
    "cumsum": "running sum along axis, first element first (torch.cumsum, np.cumsum); as "
              "torch on CPU, float32 sums accumulate in float64 and float16 in float32, each "
              "running value rounded once; integer sums keep the dtype",
    "cummax": "running maximum along axis, first element first (the values of torch.cummax, "
              "np.maximum.accumulate); a NaN stays the maximum from where it appears, as in "
              "torch",
}
for _name, _doc in _RUNNING_DOC.items():
    define(_name, rule=_running_rule(_name), run="reduction", attrs={"axis": -1},
           kind="reduction", normalize=lambda a: {**a, "axis": int(a["axis"])}, doc=_doc,
           rule_doc="x not bool; out: the type of x")


@public
def cumsum():  # noqa: A001 - the signature comes from the definition
    """Running sum of ``x`` along ``axis`` (``np.cumsum(x, axis)``): RoBERTa's and
    MPNet's positions from a padding mask, ``cumsum(mask) * mask + pad``."""


@public
def cummax():  # noqa: A001 - the signature comes from the definition
    """Running maximum of ``x`` along ``axis`` (the values of ``torch.cummax``): a
    log-space stabiliser ``m_t = max(m_{t-1}, a_t)`` over a whole sequence at once."""


# -- sort -------------------------------------------------------------------------------
def _sort_rule(inputs, attrs):
    (x,) = inputs
    _checks.not_quantized(x)
    _checks.no_bfloat16(x)
    _checks.has_axes(x, "sort")
    _checks.valid_axis(attrs["axis"], x.rank)
    if not isinstance(attrs["descending"], bool):
        raise ValueError(f"descending must be true or false, got {attrs['descending']!r}")
    return [x.type, TensorType(DType.int64, x.shape)]


define("sort", rule=_sort_rule, run="reduction", attrs={"axis": -1, "descending": False},
       outputs=2, kind="reduction", normalize=lambda a: {**a, "axis": int(a["axis"])},
       doc="x sorted along axis and the int64 positions the values came from (torch.sort "
           "with stable=True, np.sort / np.argsort kind='stable'): equal values keep their "
           "order, NaN sorts as the largest; the axis may be symbolic",
       rule_doc="x not quantized; out: values of x's type, indices int64 of x's shape")


@public
def sort():  # noqa: A001 - the signature comes from the definition
    """``(values, indices)``: x sorted along ``axis`` (ascending, or ``descending``), and
    the int64 positions along ``axis`` the values came from; stable (equal values keep
    their order) in both directions, NaN the largest, as ``torch.sort(stable=True)``.
    ``indices`` alone is ``torch.argsort``; ``take_along_axis`` with it reorders
    another tensor the same way."""


# -- softmax ----------------------------------------------------------------------------
def _softmax_rule(inputs, attrs):
    (x,) = inputs
    _checks.float_input(x)
    _checks.no_bfloat16(x)
    _checks.valid_axis(attrs["axis"], x.rank)
    return [x]


define("softmax", rule=_softmax_rule, run="reduction", attrs={"axis": -1}, kind="reduction",
       normalize=lambda a: {**a, "axis": int(a["axis"])},
       doc="exp(x - max) / sum(exp(x - max)) along axis", rule_doc="x float; out: the type of x")


@public
def softmax():  # noqa: A001 - the signature comes from the definition
    """exp(x - max) / sum(exp(x - max)) along ``axis``."""
