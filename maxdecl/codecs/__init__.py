"""Quantization encodings: the public protocol and the registry.

An encoding turns float32 rows ``[..., K]`` into packed GGML blocks
``uint8 [..., K // block_elements * block_bytes]`` and back. The byte layout of
every built-in encoding is GGML's, so bytes read from a GGUF file dequantize
unchanged. Built-in encodings register themselves exactly as a user's would::

    class MyEncoding:                      # follows QuantizationEncoding
        name, block_elements, block_bytes = "my_q8", 32, 34
        def quantize(self, x): ...
        def dequantize(self, data, shape): ...

    md.codecs.register(MyEncoding())
    md.codecs.get("MY_Q8")                 # names are case-insensitive
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

import numpy as np

from ..blocks import FLOAT_STORAGE, GGML_BLOCKS
from ..errors import QuantizationError

__all__ = ["QuantizationEncoding", "register", "get", "names", "unregister",
           # plumbing for writing an encoding (the built-ins use it as a user would)
           "rows_to_blocks", "bytes_to_blocks", "output_array", "raise_if_flagged"]


@runtime_checkable
class QuantizationEncoding(Protocol):
    """What an encoding provides; ``block_*`` values equal GGML's for built-ins."""

    name: str            # registry name, lower case ("q4_k")
    block_elements: int  # floats per block (q4_k: 256; bf16: 1)
    block_bytes: int     # bytes per block (q4_k: 144; bf16: 2)

    def quantize(self, x: np.ndarray) -> np.ndarray:
        """float32 ``[..., K]`` -> uint8 ``[..., K // block_elements * block_bytes]``."""
        ...

    def dequantize(self, data: np.ndarray, shape) -> np.ndarray:
        """Packed uint8 bytes -> float32 array of logical ``shape``.

        The built-in encodings also take ``out=``: a C-contiguous float32 array of
        ``shape`` to write into (no allocation; see :func:`output_array`).
        """
        ...


_REGISTRY: dict[str, QuantizationEncoding] = {}


def register(encoding: QuantizationEncoding) -> QuantizationEncoding:
    """Add ``encoding`` under ``encoding.name`` (case-insensitive); twice is an error."""
    missing = [a for a in ("name", "block_elements", "block_bytes", "quantize", "dequantize")
               if not hasattr(encoding, a)]
    if missing:
        raise QuantizationError(
            f"cannot register {encoding!r}: missing {', '.join(missing)} "
            "(see md.codecs.QuantizationEncoding)")
    key = str(encoding.name).lower()
    if key in _REGISTRY:
        raise QuantizationError(f"encoding {key!r} is already registered")
    if int(encoding.block_elements) <= 0 or int(encoding.block_bytes) <= 0:
        raise QuantizationError(f"encoding {key!r}: block_elements and block_bytes must be positive")
    sizes = (int(encoding.block_elements), int(encoding.block_bytes))
    if key in {**FLOAT_STORAGE, **GGML_BLOCKS} and sizes != GGML_BLOCKS.get(key):
        raise QuantizationError(f"encoding {key!r}: blocks of {sizes} differ from GGML's "
                                f"{GGML_BLOCKS.get(key, 'unquantized storage')} "
                                "(maxdecl.blocks, the one table of block sizes)")
    _REGISTRY[key] = encoding
    return encoding


def unregister(name: str) -> None:
    """Remove a registered encoding (for tests and plugin reloads)."""
    _REGISTRY.pop(name.lower(), None)


def get(name) -> QuantizationEncoding:
    """The encoding registered as ``name`` (case-insensitive), or an object passed through."""
    if not isinstance(name, str):
        if isinstance(name, QuantizationEncoding):
            return name
        raise QuantizationError(f"not an encoding: {name!r}")
    try:
        return _REGISTRY[name.lower()]
    except KeyError:
        import difflib
        close = difflib.get_close_matches(name.lower(), list(_REGISTRY), n=3)
        hint = f"; did you mean {' or '.join(map(repr, close))}?" if close else ""
        raise QuantizationError(
            f"unknown encoding {name!r} (known: {', '.join(sorted(_REGISTRY))}){hint}") from None


def names() -> list[str]:
    """Registered encoding names, sorted."""
    return sorted(_REGISTRY)


from ._blocks import bytes_to_blocks, output_array, raise_if_flagged, rows_to_blocks  # noqa: E402

# Built-ins register themselves on import, through the same register() as users.
from . import bf16, q4_0, q4_k, q6_k  # noqa: E402,F401
from . import q5_0, q8_0  # noqa: E402,F401  (written against the public protocol only)
from . import ggml_more  # noqa: E402,F401  (q4_1, q5_1, q2_k, q3_k, q5_k, iq4_*, tq*_0)
