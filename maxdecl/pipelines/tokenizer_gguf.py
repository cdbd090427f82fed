"""Fast reader for the key/value metadata at the head of a GGUF file.

``gguf.GGUFReader`` builds a NumPy view per array element, which takes
seconds (up to a minute on a busy machine) for a 262144-string vocabulary.
The tokenizer needs only the metadata, so this module walks the header itself
over an ``mmap`` and stops before the tensor infos. The layout (GGUF v2/v3,
little-endian):

    magic "GGUF" | version u32 | n_tensors u64 | n_kv u64 | n_kv * KV
    KV     = key:STR | type:u32 | value
    STR    = len:u64 | utf-8 bytes
    ARRAY  = elem_type:u32 | count:u64 | count * value   (fixed-size elements
             are read as one NumPy array; strings one by one)
"""

from __future__ import annotations

import mmap
import struct
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import WeightsError

# GGUF value type id -> (struct format, NumPy dtype) for fixed-size scalars.
_SCALARS = {
    0: ("<B", np.uint8),
    1: ("<b", np.int8),
    2: ("<H", np.uint16),
    3: ("<h", np.int16),
    4: ("<I", np.uint32),
    5: ("<i", np.int32),
    6: ("<f", np.float32),
    7: ("<?", np.bool_),
    10: ("<Q", np.uint64),
    11: ("<q", np.int64),
    12: ("<d", np.float64),
}
_STRING, _ARRAY = 8, 9


def read_gguf_metadata(path: str | Path, prefix: str = "") -> dict[str, Any]:
    """Read every metadata key (or those starting with ``prefix``) of a GGUF file.

    Scalars come back as Python values, strings as ``str``, numeric arrays as
    NumPy arrays and string arrays as ``list[str]``.

    Raises:
        WeightsError: not a GGUF file, unsupported version, or truncated header.

    Example:
        >>> meta = read_gguf_metadata("model.gguf", prefix="tokenizer.")
        >>> meta["tokenizer.ggml.model"]
        'llama'
    """
    path = Path(path)
    try:
        with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as mm:
            return _parse(mm, prefix, path)
    except (struct.error, IndexError, ValueError) as exc:
        raise WeightsError(f"{path}: truncated or corrupted GGUF metadata ({exc})") from None
    except OSError as exc:
        raise WeightsError(f"{path}: cannot read GGUF file: {exc}") from None


def _parse(mm: mmap.mmap, prefix: str, path: Path) -> dict[str, Any]:
    if mm[:4] != b"GGUF":
        raise WeightsError(f"{path}: not a GGUF file (magic {bytes(mm[:4])!r}, expected b'GGUF')")
    (version,) = struct.unpack_from("<I", mm, 4)
    if version not in (2, 3):
        raise WeightsError(f"{path}: GGUF version {version} unsupported (expected 2 or 3, "
                           "little-endian); re-convert with a recent gguf-py")
    _n_tensors, n_kv = struct.unpack_from("<QQ", mm, 8)
    off = 24
    out: dict[str, Any] = {}
    for _ in range(n_kv):
        key, off = _read_str(mm, off)
        (vtype,) = struct.unpack_from("<I", mm, off)
        off += 4
        want = key.startswith(prefix)
        value, off = _read_value(mm, off, vtype, want)
        if want:
            out[key] = value
    return out


def _read_str(mm: mmap.mmap, off: int) -> tuple[str, int]:
    (n,) = struct.unpack_from("<Q", mm, off)
    off += 8
    if off + n > len(mm):
        raise ValueError(f"string of {n} bytes at offset {off} runs past end of file")
    return mm[off:off + n].decode("utf-8", errors="surrogateescape"), off + n


def _read_value(mm: mmap.mmap, off: int, vtype: int, want: bool) -> tuple[Any, int]:
    if vtype in _SCALARS:
        fmt, _ = _SCALARS[vtype]
        (v,) = struct.unpack_from(fmt, mm, off)
        return v, off + struct.calcsize(fmt)
    if vtype == _STRING:
        return _read_str(mm, off)
    if vtype != _ARRAY:
        raise ValueError(f"unknown GGUF value type {vtype} at offset {off}")
    etype, count = struct.unpack_from("<IQ", mm, off)
    off += 12
    if etype in _SCALARS:
        dtype = np.dtype(_SCALARS[etype][1]).newbyteorder("<")
        nbytes = dtype.itemsize * count
        if off + nbytes > len(mm):
            raise ValueError(f"array of {count} items at offset {off} runs past end of file")
        arr = np.frombuffer(mm, dtype=dtype, count=count, offset=off).copy() if want else None
        return arr, off + nbytes
    if etype == _STRING:
        return _read_str_array(mm, off, count, want)
    # Nested arrays: rare in practice; walk them one by one.
    items = []
    for _ in range(count):
        v, off = _read_value(mm, off, etype, want)
        items.append(v)
    return items, off


def _read_str_array(mm: mmap.mmap, off: int, count: int, want: bool) -> tuple[Any, int]:
    unpack = struct.Struct("<Q").unpack_from
    items: list[str] = []
    append = items.append
    for _ in range(count):
        (n,) = unpack(mm, off)
        off += 8
        if want:
            append(mm[off:off + n].decode("utf-8", errors="surrogateescape"))
        off += n
    if off > len(mm):
        raise ValueError(f"string array of {count} items runs past end of file")
    return (items if want else None), off
