"""Element types and tensor types; a dim is an ``int`` or a symbolic ``str``.

Plain Python (NumPy loads only when ``DType.numpy`` is first asked for), so the spec
layer's type checker uses the same ``TensorType`` / ``QuantizedType`` as the graph.
Both types answer what an op's type rule reads: ``dtype``, ``shape``, ``rank``,
``is_quantized``, ``logical_shape``, ``encoding``.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Union

from .blocks import block_size
from .errors import GraphError

Dim = Union[int, str]
_FLOATS = frozenset({"float32", "float16", "bfloat16"})
_INTS = frozenset({"int8", "uint8", "int32", "int64"})
_NUMPY: dict = {}


def _np():
    np = _NUMPY.get("np")
    if np is None:
        import numpy as np

        _NUMPY["np"] = np
    return np


class DType(enum.Enum):
    """Element type of a tensor; ``.numpy`` gives the matching NumPy dtype."""

    float32 = "float32"
    float16 = "float16"
    bfloat16 = "bfloat16"
    int8 = "int8"
    uint8 = "uint8"
    int32 = "int32"
    int64 = "int64"
    bool = "bool"

    @property
    def numpy(self):
        """The NumPy dtype (bfloat16 is stored as little-endian uint16)."""
        cached = _NUMPY.get(self)
        if cached is None:
            np = _np()
            cached = _NUMPY[self] = np.dtype("uint16" if self is DType.bfloat16 else self.value)
        return cached

    @property
    def is_float(self) -> bool:
        return self._value_ in _FLOATS

    @property
    def is_int(self) -> bool:
        return self._value_ in _INTS

    @classmethod
    def from_numpy(cls, dtype) -> "DType":
        """Map a NumPy dtype to a DType (GraphError for unsupported ones)."""
        try:
            name = _np().dtype(dtype).name
        except TypeError:
            name = repr(dtype)
        try:
            return cls(name)
        except ValueError:
            raise GraphError(f"unsupported dtype {name!r}; expected one of "
                             f"{', '.join(d.value for d in cls)}") from None

    @classmethod
    def parse(cls, value) -> "DType":
        """Accept a DType, its name (``"float32"``, ``"f32"``) or a NumPy dtype."""
        if isinstance(value, DType):
            return value
        if isinstance(value, str):
            alias = {"f32": "float32", "f16": "float16", "bf16": "bfloat16",
                     "i8": "int8", "u8": "uint8", "i32": "int32", "i64": "int64"}
            try:
                return cls(alias.get(value, value))
            except ValueError:
                raise GraphError(f"unknown dtype {value!r}; expected one of "
                                 f"{', '.join(d.value for d in cls)}") from None
        return cls.from_numpy(value)

    def __repr__(self) -> str:
        return f"DType.{self.value}"


def format_shape(shape) -> str:
    """``(\"seq\", 16)`` -> ``[seq, 16]``."""
    return "[" + ", ".join(str(d) for d in shape) + "]"


MAX_STATIC_ELEMENTS = 1 << 40   # elements of a value whose dims are all known (~1e12)


def check_dims(shape) -> tuple:
    """``shape`` as a tuple of non-negative ints and non-empty strs (GraphError if not);
    its static dims may hold at most ``MAX_STATIC_ELEMENTS`` elements together."""
    if isinstance(shape, (str, bytes)) or not hasattr(shape, "__iter__"):
        raise GraphError(f"a shape must be a sequence of dims, got {shape!r}")
    out = []
    for d in shape:
        if isinstance(d, str):
            if not d.strip():
                raise GraphError(f"symbolic dim {d!r} is empty")
            out.append(d.strip())
        elif isinstance(d, bool) or not hasattr(d, "__index__"):
            raise GraphError(f"dim {d!r} must be an int or a symbolic str")
        elif int(d) < 0:
            raise GraphError(f"dim {int(d)} must be non-negative")
        else:
            out.append(int(d))
    count = 1
    for d in out:
        if isinstance(d, int):
            count *= d
    if count > MAX_STATIC_ELEMENTS and 0 not in out:
        raise GraphError(f"shape {format_shape(out)} holds {count:.3g} elements, over the "
                         f"limit of {MAX_STATIC_ELEMENTS:.3g} (MAX_STATIC_ELEMENTS)")
    return tuple(out)


@dataclass(frozen=True)
class TensorType:
    """A tensor's dtype and shape; a ``str`` dim is symbolic (``"seq"``)."""

    dtype: DType
    shape: tuple

    def __init__(self, dtype, shape):
        object.__setattr__(self, "dtype", DType.parse(dtype))
        object.__setattr__(self, "shape", check_dims(shape))

    rank = property(lambda self: len(self.shape))
    is_quantized = False
    encoding = None
    logical_shape = property(lambda self: self.shape)
    type = property(lambda self: self)

    def __str__(self) -> str:
        return f"{self.dtype.value}{format_shape(self.shape)}"


@dataclass(frozen=True)
class QuantizedType:
    """Type of a packed-block tensor: uint8 bytes that decode to ``logical_shape``."""

    encoding: str
    logical_shape: tuple

    dtype = DType.uint8
    is_quantized = True
    type = property(lambda self: self)

    @property
    def shape(self) -> tuple:
        be, bb = block_size(self.encoding)
        *lead, k = self.logical_shape
        last = k // be * bb if isinstance(k, int) else k
        return (*lead, last)

    @property
    def rank(self) -> int:
        return len(self.logical_shape)

    def __str__(self) -> str:
        return f"{self.encoding}{format_shape(self.logical_shape)}"


def as_type(t):
    """A TensorType/QuantizedType, or ``(dtype, shape)``; GraphError for anything else."""
    if isinstance(t, (TensorType, QuantizedType)):
        return t
    if isinstance(t, (tuple, list)) and len(t) == 2 and not isinstance(t[1], (str, int)):
        return TensorType(*t)
    raise GraphError(f"expected a md.TensorType (or (dtype, shape)), got {t!r}")
