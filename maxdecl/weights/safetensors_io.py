"""The safetensors container, read by memory map and written atomically.

Layout (https://huggingface.co/docs/safetensors)::

    u64 LE  N                       header length
    N bytes JSON header             {"name": {"dtype": "F32", "shape": [2, 3],
                                              "data_offsets": [begin, end]}, ...,
                                     "__metadata__": {"key": "value", ...}}
    data                            offsets are relative to the first byte after the header

Reading checks every number against the file before any array is made, so a
truncated or hostile file gives one ``WeightsError`` line. Writing pads the
header with spaces so the data starts 64-byte aligned and lays the tensors out
by decreasing item size (every tensor aligned to its dtype, as the reference
implementation does) while the header keeps the caller's key order.

This module is the container only; what maxdecl stores inside it (encodings of
quantized tensors, metadata) is ``maxdecl.checkpoint``'s business.
"""

from __future__ import annotations

import json
import mmap
import os
import re
import secrets
import struct
import time

import numpy as np

from ..errors import WeightsError
from ._checks import check_shape, load_json

# safetensors dtype name -> numpy dtype (little-endian). BF16 has no numpy dtype:
# its bytes are read as uint16 and wrapped as a "bf16" QuantizedTensor by callers.
DTYPES: dict[str, np.dtype] = {
    "F64": np.dtype("<f8"), "F32": np.dtype("<f4"), "F16": np.dtype("<f2"),
    "BF16": np.dtype("<u2"),
    "I64": np.dtype("<i8"), "I32": np.dtype("<i4"), "I16": np.dtype("<i2"), "I8": np.dtype("i1"),
    "U64": np.dtype("<u8"), "U32": np.dtype("<u4"), "U16": np.dtype("<u2"), "U8": np.dtype("u1"),
    "BOOL": np.dtype("?"),
}
# numpy kind+itemsize -> safetensors dtype name, for writing (never BF16: see write()).
_NAMES = {(d.kind, d.itemsize): n for n, d in DTYPES.items() if n != "BF16"}

DATA_ALIGN = 64          # the data section starts at a multiple of this in the file
MAX_HEADER = 1 << 30     # refuse headers over 1 GiB (the file must also hold them)


class Entry:
    """One tensor of a safetensors file: name, dtype name, shape and byte range."""

    __slots__ = ("name", "dtype", "shape", "begin", "end")

    def __init__(self, name, dtype, shape, begin, end):
        self.name, self.dtype, self.shape, self.begin, self.end = name, dtype, shape, begin, end


def is_safetensors(head: bytes) -> bool:
    """True when the first bytes look like a safetensors header (length, then ``{``).

    A length past the end of the file still counts, so that a truncated file is
    reported as a truncated safetensors file rather than an unknown one.
    """
    if len(head) < 9:
        return False
    (n,) = struct.unpack_from("<Q", head, 0)
    return 2 <= n <= MAX_HEADER and head[8:9] == b"{"


def read(path) -> tuple[dict[str, np.ndarray], dict[str, Entry], dict[str, str]]:
    """Map a safetensors file: ``(arrays, entries, metadata)``.

    Arrays are read-only views of the memory-mapped file (BF16 tensors as uint16
    arrays; ``entries[name].dtype`` says which). Keys keep the header's order.

    Raises:
        WeightsError: missing, truncated, corrupted or foreign file (one line,
            naming the file and what is wrong).
    """
    path = os.fspath(path)
    mm, size = _map(path)
    if size < 8:
        raise WeightsError(f"{path}: not a safetensors file: only {size} bytes "
                           "(truncated? a header length needs 8)")
    (n,) = struct.unpack_from("<Q", mm, 0)
    if n > size - 8:
        raise WeightsError(
            f"{path}: not a safetensors file or truncated: header length {n} but only "
            f"{size - 8} bytes follow")
    if n > MAX_HEADER:
        raise WeightsError(f"{path}: safetensors header of {n} bytes is too large")
    header = load_json(f"{path}: corrupted safetensors header", mm[8:8 + n])
    if not isinstance(header, dict):
        raise WeightsError(f"{path}: corrupted safetensors header: a JSON object expected, "
                           f"got {type(header).__name__}")
    metadata = header.pop("__metadata__", None) or {}
    if not isinstance(metadata, dict) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in metadata.items()):
        raise WeightsError(f"{path}: corrupted safetensors header: __metadata__ must map "
                           "strings to strings")
    start = 8 + n
    data_len = size - start
    entries: dict[str, Entry] = {}
    for name, info in header.items():
        entries[name] = _entry(path, name, info, data_len)
    _check_overlaps(path, entries)
    arrays = {}
    for name, e in entries.items():
        dt = DTYPES[e.dtype]
        offset = start + e.begin
        count = (e.end - e.begin) // dt.itemsize
        if offset % dt.itemsize:
            # Misaligned data (allowed by the format): one aligned copy, kept read-only.
            arr = np.frombuffer(mm, np.uint8, e.end - e.begin, offset).copy().view(dt)
            arr.flags.writeable = False
        else:
            arr = np.frombuffer(mm, dt, count, offset)
        arrays[name] = arr.reshape(e.shape)
    return arrays, entries, metadata


def _map(path: str):
    try:
        with open(path, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            if size == 0:
                return b"", 0
            return mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ), size
    except FileNotFoundError:
        raise WeightsError(f"{path}: no such file") from None
    except IsADirectoryError:
        raise WeightsError(f"{path}: is a directory, not a safetensors file") from None
    except OSError as e:
        raise WeightsError(f"{path}: cannot read: {e.strerror or e}") from None


def _entry(path: str, name: str, info, data_len: int) -> Entry:
    where = f"{path}: tensor {name!r}"
    if not isinstance(info, dict):
        raise WeightsError(f"{where}: corrupted header entry (an object expected)")
    dtype, shape, offs = info.get("dtype"), info.get("shape"), info.get("data_offsets")
    if not isinstance(dtype, str) or dtype not in DTYPES:
        raise WeightsError(f"{where}: unsupported dtype {dtype!r} "
                           f"(supported: {', '.join(DTYPES)})")
    if not isinstance(shape, list):
        raise WeightsError(f"{where}: corrupted shape {shape!r}")
    check_shape(where, shape, DTYPES[dtype].itemsize)
    if (not isinstance(offs, list) or len(offs) != 2
            or not all(type(o) is int for o in offs) or not 0 <= offs[0] <= offs[1]):
        raise WeightsError(f"{where}: corrupted data_offsets {offs!r}")
    begin, end = offs
    want = DTYPES[dtype].itemsize
    for d in shape:
        want *= d
    if end - begin != want:
        raise WeightsError(
            f"{where}: data_offsets {offs} hold {end - begin} bytes but {dtype}{shape} "
            f"needs {want}")
    if end > data_len:
        raise WeightsError(
            f"{where}: bytes [{begin}, {end}) lie past the end of the data ({data_len} "
            "bytes): the file is truncated or corrupted")
    return Entry(name, dtype, tuple(shape), begin, end)


def _check_overlaps(path: str, entries: dict[str, Entry]) -> None:
    spans = sorted((e.begin, e.end, e.name) for e in entries.values() if e.end > e.begin)
    for (_, end_a, a), (begin_b, _, b) in zip(spans, spans[1:]):
        if begin_b < end_a:
            raise WeightsError(f"{path}: corrupted header: tensors {a!r} and {b!r} overlap")


def dtype_name(arr: np.ndarray) -> str | None:
    """The safetensors dtype name for a NumPy array, or None when it has none."""
    return _NAMES.get((arr.dtype.kind, arr.dtype.itemsize))


def write(path, tensors: list[tuple[str, str, tuple, np.ndarray]], metadata: dict[str, str]):
    """Atomically write ``(name, dtype_name, shape, array)`` tensors and ``metadata``.

    The array's bytes are written as they are (little-endian C order); the caller
    has made ``dtype_name``/``shape`` agree with them. The file appears whole or
    not at all: a temporary file in the same directory is written, fsynced and
    renamed over ``path``; on any failure it is removed and ``path`` is untouched.
    """
    path = os.fspath(path)
    header: dict = {}
    if metadata:
        header["__metadata__"] = metadata
    # Lay out by decreasing item size so every tensor is aligned to its dtype.
    order = sorted(range(len(tensors)), key=lambda i: -DTYPES[tensors[i][1]].itemsize)
    offsets = {}
    pos = 0
    for i in order:
        arr = tensors[i][3]
        offsets[i] = (pos, pos + arr.nbytes)
        pos += arr.nbytes
    for i, (name, dt, shape, _) in enumerate(tensors):
        header[name] = {"dtype": dt, "shape": [int(d) for d in shape],
                        "data_offsets": list(offsets[i])}
    hbytes = json.dumps(header, separators=(",", ":"), ensure_ascii=True).encode()
    hbytes += b" " * (-(8 + len(hbytes)) % DATA_ALIGN)

    directory = os.path.dirname(os.path.abspath(path))
    remove_stale_temporaries(path)
    tmp = os.path.join(directory, temporary_name(path))
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
    except OSError as e:
        raise WeightsError(f"{path}: cannot write: {e.strerror or e}") from None
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(struct.pack("<Q", len(hbytes)))
            f.write(hbytes)
            for i in order:
                arr = tensors[i][3]
                if arr.nbytes:
                    f.write(memoryview(np.ascontiguousarray(arr).reshape(-1).view(np.uint8)))
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException as e:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        if isinstance(e, OSError):
            raise WeightsError(f"{path}: cannot write: {e.strerror or e}") from None
        raise
    _fsync_dir(directory)


STALE_AFTER = 60.0       # seconds without a write after which a temporary is abandoned


def temporary_name(path) -> str:
    """``.NAME.<pid>.<12 hex>.tmp``: the temporary a save of ``path`` writes first."""
    return f".{os.path.basename(os.fspath(path))}.{os.getpid()}.{secrets.token_hex(6)}.tmp"


def _temporary_pattern(base: str):
    # also the names of earlier versions, without the pid: .NAME.<12 hex>.tmp
    return re.compile(rf"\.{re.escape(base)}\.(?:(\d+)\.)?[0-9a-f]{{12}}\.tmp")


def remove_stale_temporaries(path) -> list[str]:
    """Remove temporaries that killed saves of ``path`` left behind; returns their names.

    Only files named exactly like :func:`temporary_name` for this target are
    considered, and only abandoned ones: written by a process that no longer runs, or
    not modified for STALE_AFTER seconds. Best effort: errors are ignored.
    """
    path = os.fspath(path)
    directory = os.path.dirname(os.path.abspath(path))
    match = _temporary_pattern(os.path.basename(path)).fullmatch
    removed = []
    try:
        names = os.listdir(directory)
    except OSError:
        return removed
    now = time.time()
    for name in names:
        m = match(name)
        if m is None:
            continue
        full = os.path.join(directory, name)
        try:
            st = os.lstat(full)
            pid = int(m.group(1)) if m.group(1) else None
            if pid != os.getpid() and (not _alive(pid) or now - st.st_mtime > STALE_AFTER):
                os.unlink(full)
                removed.append(name)
        except (OSError, ValueError, OverflowError):
            continue
    return removed


def _alive(pid: int | None) -> bool:
    """False only when ``pid`` surely names no running process."""
    if pid is None or pid <= 0:
        return pid is None
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OSError, OverflowError):
        return True
    return True


def _fsync_dir(directory: str) -> None:
    """Make the rename durable (best effort: not every platform can open a directory)."""
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)
