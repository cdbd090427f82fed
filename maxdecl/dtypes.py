"""Element types and tensor types; a dim is an ``int`` or a symbolic ``str``."""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Union

import numpy as np

Dim = Union[int, str]


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
    def numpy(self) -> np.dtype:
        # NumPy has no bfloat16: its storage is little-endian uint16.
        return np.dtype("uint16") if self is DType.bfloat16 else np.dtype(self.value)

    @property
    def is_float(self) -> bool:
        return self in (DType.float32, DType.float16, DType.bfloat16)

    @classmethod
    def from_numpy(cls, dtype) -> "DType":
        """Map a NumPy dtype to a DType (raises ValueError for unsupported ones)."""
        name = np.dtype(dtype).name
        try:
            return cls(name)
        except ValueError:
            raise ValueError(f"unsupported dtype {name!r}; expected one of "
                             f"{', '.join(d.value for d in cls)}") from None

    @classmethod
    def parse(cls, value) -> "DType":
        """Accept a DType, its name (``"float32"``, ``"f32"``) or a NumPy dtype."""
        if isinstance(value, DType):
            return value
        if isinstance(value, str):
            alias = {"f32": "float32", "f16": "float16", "bf16": "bfloat16",
                     "i8": "int8", "u8": "uint8", "i32": "int32", "i64": "int64"}
            return cls(alias.get(value, value))
        return cls.from_numpy(value)

    def __repr__(self) -> str:
        return f"DType.{self.value}"


def format_shape(shape) -> str:
    """``(\"seq\", 16)`` -> ``[seq, 16]``."""
    return "[" + ", ".join(str(d) for d in shape) + "]"


@dataclass(frozen=True)
class TensorType:
    """A tensor's dtype and shape; a ``str`` dim is symbolic (``"seq"``)."""

    dtype: DType
    shape: tuple

    def __init__(self, dtype, shape):
        object.__setattr__(self, "dtype", DType.parse(dtype))
        dims = tuple(shape)
        for d in dims:
            if isinstance(d, bool) or not isinstance(d, (int, np.integer, str)):
                raise TypeError(f"dim {d!r} must be an int or a symbolic str")
            if not isinstance(d, str) and d < 0:
                raise ValueError(f"dim {d} must be non-negative")
        object.__setattr__(self, "shape", tuple(d if isinstance(d, str) else int(d) for d in dims))

    @property
    def rank(self) -> int:
        return len(self.shape)

    def __str__(self) -> str:
        return f"{self.dtype.value}{format_shape(self.shape)}"
