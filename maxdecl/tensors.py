"""Tensors held outside a graph: QuantizedTensor and the TensorDict of weights.

A ``TensorDict`` maps weight names (``blk.0.attn_q.weight``) to NumPy arrays or
``QuantizedTensor`` s. It owns its values: ``copy()`` gives an independent deep
copy; arrays loaded from a file may be read-only memory maps.
"""

from __future__ import annotations

from collections.abc import Iterator, MutableMapping
from dataclasses import dataclass

import numpy as np

from .errors import QuantizationError, WeightsError


@dataclass(frozen=True, eq=False)
class QuantizedTensor:
    """Packed GGML blocks plus the float ``shape`` they decode to.

    ``data`` is uint8 ``[*shape[:-1], shape[-1] // block_elements * block_bytes]``.
    """

    data: np.ndarray
    shape: tuple
    encoding: str

    def __post_init__(self):
        from . import codecs

        enc = codecs.get(self.encoding)
        object.__setattr__(self, "encoding", enc.name.lower())
        shape = tuple(int(d) for d in self.shape)
        object.__setattr__(self, "shape", shape)
        data = np.asarray(self.data)
        if data.dtype != np.uint8:
            raise QuantizationError(f"{enc.name}: packed data must be uint8, got {data.dtype}")
        if not shape or shape[-1] % enc.block_elements:
            raise QuantizationError(
                f"{enc.name}: logical shape {list(shape)} must end in a multiple of "
                f"{enc.block_elements}")
        want = (*shape[:-1], shape[-1] // enc.block_elements * enc.block_bytes)
        if data.shape != want:
            if data.size != int(np.prod(want)):
                raise QuantizationError(
                    f"{enc.name}: {data.size} bytes do not hold logical shape {list(shape)} "
                    f"(expected {int(np.prod(want))} bytes as {list(want)})")
            data = data.reshape(want)
        object.__setattr__(self, "data", data)

    @property
    def nbytes(self) -> int:
        return int(self.data.nbytes)

    @property
    def dtype(self):
        return self.data.dtype

    def dequantize(self) -> np.ndarray:
        """float32 array of ``self.shape``."""
        from . import codecs

        return codecs.get(self.encoding).dequantize(self.data, self.shape)

    def copy(self) -> "QuantizedTensor":
        return QuantizedTensor(np.array(self.data, copy=True), self.shape, self.encoding)

    def __repr__(self) -> str:
        return f"QuantizedTensor({self.encoding}, shape={list(self.shape)}, {self.nbytes} bytes)"


class TensorView:
    """A read-only look at one tensor's bytes; ``unsafe_ptr()`` gives their address."""

    def __init__(self, name: str, value):
        self.name = name
        self._value = value

    @property
    def array(self) -> np.ndarray:
        v = self._value
        return v.data if isinstance(v, QuantizedTensor) else v

    @property
    def shape(self) -> tuple:
        return tuple(self._value.shape)

    @property
    def encoding(self) -> str | None:
        return self._value.encoding if isinstance(self._value, QuantizedTensor) else None

    def unsafe_ptr(self) -> int:
        """Integer address of the first byte; valid while the TensorDict holds the tensor."""
        return int(self.array.__array_interface__["data"][0])


class TensorDict(MutableMapping):
    """Named tensors (arrays or QuantizedTensors), in insertion order.

    ``metadata`` is a plain dict describing where the tensors came from: GGUF
    key/values (``general.architecture``), a Hugging Face ``config.json``, a
    llama2.c header; ``metadata["maxdecl.format"]`` names the file format.
    ``params`` holds the spec hyperparameters read from that metadata
    (``md.load_weights(path, spec=...)``; ``md.build`` uses them), ``variant`` the
    spec variant they complete, ``mapped_for`` the name of the spec whose ``formats``
    mapping gave the tensors their names (None: the file's own names).
    """

    def __init__(self, items=None, metadata=None, params=None):
        self._items: dict[str, object] = {}
        self.version = 0          # bumped by every change; lets a graph cache its binding
        self.metadata: dict = dict(metadata) if metadata else {}
        self.params: dict = dict(params) if params else {}
        self.variant: str | None = None
        self.mapped_for: str | None = None
        if items:
            for k, v in dict(items).items():
                self[k] = v

    def __setitem__(self, name: str, value) -> None:
        if not isinstance(name, str) or not name:
            raise WeightsError(f"tensor names must be non-empty strings, got {name!r}")
        if not isinstance(value, QuantizedTensor):
            value = np.asarray(value)
            if value.dtype == object:
                raise WeightsError(f"{name}: object arrays cannot be stored")
        self._items[name] = value
        self.version += 1

    def __getitem__(self, name: str):
        try:
            return self._items[name]
        except KeyError:
            import difflib
            close = difflib.get_close_matches(name, list(self._items), n=1)
            hint = f"; did you mean {close[0]!r}?" if close else ""
            raise KeyError(f"no tensor named {name!r}{hint}") from None

    def __delitem__(self, name: str) -> None:
        del self._items[name]
        self.version += 1

    def __iter__(self) -> Iterator[str]:
        return iter(self._items)

    def __len__(self) -> int:
        return len(self._items)

    def __contains__(self, name) -> bool:
        return name in self._items

    def copy(self) -> "TensorDict":
        """A deep copy: no array is shared with ``self``."""
        import copy

        out = TensorDict(metadata=copy.deepcopy(self.metadata), params=copy.deepcopy(self.params))
        out.variant, out.mapped_for = self.variant, self.mapped_for
        for k, v in self._items.items():
            out._items[k] = v.copy() if isinstance(v, QuantizedTensor) else np.array(v, copy=True)
        return out

    def view(self, name: str) -> TensorView:
        """A view of tensor ``name`` exposing ``unsafe_ptr()``."""
        return TensorView(name, self[name])

    @property
    def nbytes(self) -> int:
        return sum(int(v.nbytes) for v in self._items.values())

    def __repr__(self) -> str:
        return f"TensorDict({len(self)} tensors, {self.nbytes} bytes)"


TensorMap = TensorDict
