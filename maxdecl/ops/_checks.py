"""Shared build-time checks; each raises ValueError/TypeError naming what it rejects.

``Graph._add_node`` turns these into one ``GraphError`` with layer path, op and types.
"""

from __future__ import annotations

from .. import dims as symbolic
from ..dtypes import DType, format_shape


def broadcast_shapes(*shapes) -> tuple:
    """NumPy broadcasting over int and symbolic dims (a symbol matches itself or 1)."""
    rank = max(len(s) for s in shapes)
    out = []
    for i in range(rank):
        dims = [s[len(s) - rank + i] for s in shapes if len(s) - rank + i >= 0]
        picked = 1
        for d in dims:
            if d == 1 or d == picked:
                continue
            if picked == 1:
                picked = d
            elif not symbolic.differ(d, picked):
                # a symbol against an int or another symbol: they must match at run time
                picked = d if isinstance(picked, str) else picked
            else:
                raise ValueError("shapes " + " and ".join(format_shape(s) for s in shapes)
                                 + f" do not broadcast (dim {i - rank}: {picked} vs {d})")
        out.append(picked)
    return tuple(out)


def same_dtype(*values) -> DType:
    """The common dtype of ``values``; mixing dtypes is an error (cast explicitly)."""
    dtypes = {v.dtype for v in values}
    if len(dtypes) != 1:
        raise TypeError("dtypes differ: " + ", ".join(str(v.type) for v in values)
                        + " (cast explicitly)")
    return dtypes.pop()


def float_input(v, what: str = "x") -> None:
    if not v.dtype.is_float or v.is_quantized:
        raise TypeError(f"{what} must be a float tensor, got {v.type}")


def has_axes(x, op: str) -> None:
    """``op`` reads an axis of ``x``: a scalar is an error naming the op."""
    if x.rank == 0:
        raise ValueError(f"{op} needs x of rank >= 1")


def not_quantized(*values) -> None:
    for v in values:
        if v.is_quantized:
            raise TypeError(f"{v.type} is quantized; this op needs a plain tensor")


def valid_axis(axis: int, rank: int) -> int:
    """Normalise a possibly negative axis; error if out of range."""
    if not isinstance(axis, int) or not -rank <= axis < max(rank, 1):
        raise ValueError(f"axis {axis} is out of range for rank {rank}")
    return axis % max(rank, 1)


dims_equal = symbolic.may_equal     # False only when two dims can never be equal
add_dims = symbolic.add             # "past" + "seq" -> "past+seq"


def no_bfloat16(*values) -> None:
    """Compute ops work in float32/float16; bfloat16 is a storage type here."""
    for v in values:
        if v.dtype == DType.bfloat16:
            raise TypeError(f"{v.type}: bfloat16 is storage only here; cast to float32 first")


def int_input(v, what: str) -> None:
    if v.is_quantized or v.dtype not in (DType.int32, DType.int64, DType.int8, DType.uint8):
        raise TypeError(f"{what} must be an integer tensor, got {v.type}")
