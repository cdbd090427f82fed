"""GGUF files -> TensorDict: packed blocks stay packed, memory-mapped, keyed by GGUF name.

Layout (GGUF v2/v3, little-endian; https://github.com/ggml-org/ggml/blob/master/docs/gguf.md)::

    "GGUF"  u32 version  u64 n_tensors  u64 n_kv
    n_kv    x  key: str, type: u32, value          str = u64 length + UTF-8 bytes
    n_tensors x name: str, n_dims: u32, ne: u64[n_dims], ggml_type: u32, offset: u64
    padding to general.alignment (default 32)
    tensor data; each tensor at data_start + offset (a multiple of the alignment)

``ne`` lists dimensions fastest-first, so the logical NumPy shape is
``reversed(ne)``: a [N, K] matrix has ne = (K, N) and its rows are quantized
along K exactly as ``md.codecs`` expects.

Why not ``gguf.GGUFReader``: it builds several NumPy objects per metadata array
element (a minute for Gemma 3's 262k-token vocabulary on a busy machine) and
does no bounds checking. This parser walks the header with ``struct`` and checks
every length against the file; gguf-py still supplies the type tables.
"""

from __future__ import annotations

import mmap
import os
import struct
from array import array

import numpy as np

from ..errors import MaxdeclError, QuantizationError, WeightsError
from ..tensors import QuantizedTensor, TensorDict
from ._checks import check_shape
from .strings import StringArray

__all__ = ["load_gguf", "read_gguf_metadata", "GGUF_MAGIC"]

GGUF_MAGIC = b"GGUF"
_VERSIONS = (2, 3)
_MAX_DIMS = 4            # GGML_MAX_DIMS
_MAX_NESTING = 8         # arrays of arrays deeper than this are refused
_DEFAULT_ALIGNMENT = 32
_MAX_ITEMS = 1 << 22      # strings or arrays in one metadata array (vocabularies: ~262k)
_MAX_STRING = 1 << 24     # bytes of one string (chat templates: ~10 KB)

# GGUF value types (gguf.md) and GGML tensor types, the numbers of gguf-py's GGUFValueType,
# GGMLQuantizationType and GGML_QUANT_SIZES (tests/weights compares them): reading a GGUF
# does not import gguf-py, whose package import loads its writer, vocab and sentencepiece
# (~30 ms and a few MB of every `maxdecl run`). Other GGML types are looked up there.
_STRING, _ARRAY, _N_VALUE_TYPES = 8, 9, 13
# Scalar value types: struct code (little-endian).
_SCALARS = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q",
            12: "d"}
# GGML type -> (name, elements per block, bytes per block).
_GGML_TYPES = {
    0: ("F32", 1, 4), 1: ("F16", 1, 2), 2: ("Q4_0", 32, 18), 3: ("Q4_1", 32, 20),
    6: ("Q5_0", 32, 22), 7: ("Q5_1", 32, 24), 8: ("Q8_0", 32, 34), 9: ("Q8_1", 32, 40),
    10: ("Q2_K", 256, 84), 11: ("Q3_K", 256, 110), 12: ("Q4_K", 256, 144),
    13: ("Q5_K", 256, 176), 14: ("Q6_K", 256, 210), 15: ("Q8_K", 256, 292),
    24: ("I8", 1, 1), 25: ("I16", 1, 2), 26: ("I32", 1, 4), 27: ("I64", 1, 8),
    28: ("F64", 1, 8), 30: ("BF16", 1, 2),
}
# Plain element types stored as arrays of their own dtype.
_ARRAY_TYPES = {
    0: np.dtype("<f4"), 1: np.dtype("<f2"), 28: np.dtype("<f8"),
    24: np.dtype("i1"), 25: np.dtype("<i2"), 26: np.dtype("<i4"), 27: np.dtype("<i8"),
}


def _ggml_type(gtype: int) -> tuple[str, int, int] | None:
    """(name, block elements, block bytes) of a GGML type number, or None if unknown."""
    known = _GGML_TYPES.get(gtype)
    if known is not None:
        return known
    from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType

    try:
        t = GGMLQuantizationType(gtype)
    except ValueError:
        return None
    return (t.name, *GGML_QUANT_SIZES[t])


class _Header:
    """Parsed GGUF header: metadata dict, tensor infos and where the data starts."""

    def __init__(self, metadata, tensors, data_start, alignment):
        self.metadata = metadata
        self.tensors = tensors          # list of (name, ne tuple, ggml type int, offset)
        self.data_start = data_start
        self.alignment = alignment


class _Cursor:
    """Bounds-checked little-endian reads from a buffer; errors name the file."""

    def __init__(self, path: str, buf, size: int):
        self.path, self.buf, self.size, self.pos = path, buf, size, 0

    def fail(self, what: str):
        raise WeightsError(f"{self.path}: {what}")

    def need(self, n: int, what: str) -> None:
        if n < 0 or self.pos + n > self.size:
            self.fail(f"truncated or corrupted GGUF: {what} needs {n} bytes from offset "
                      f"{self.pos}, past the end of the file ({self.size} bytes)")

    def scalar(self, code: str, what: str):
        n = struct.calcsize("<" + code)
        self.need(n, what)
        (v,) = struct.unpack_from("<" + code, self.buf, self.pos)
        self.pos += n
        return v

    def string(self, what: str, strict: bool = True) -> str:
        n = self.scalar("Q", what)
        self.need(n, what)
        if n > _MAX_STRING:
            self.fail(f"corrupted GGUF: {what} is a string of {n:,} bytes, over the limit of "
                      f"{_MAX_STRING:,}")
        raw = self.buf[self.pos:self.pos + n]
        self.pos += n
        try:
            return bytes(raw).decode("utf-8", "strict" if strict else "surrogateescape")
        except UnicodeDecodeError:
            self.fail(f"corrupted GGUF: {what} is not valid UTF-8")

    def value(self, vtype: int, what: str, depth: int = 0):
        if not 0 <= vtype < _N_VALUE_TYPES:
            self.fail(f"corrupted GGUF: {what} has unknown value type {vtype}")
        if vtype in _SCALARS:
            return self.scalar(_SCALARS[vtype], what)
        if vtype == _STRING:
            return self.string(what, strict=False)
        # ARRAY: u32 item type, u64 count, items
        if depth >= _MAX_NESTING:
            self.fail(f"corrupted GGUF: {what} nests arrays more than {_MAX_NESTING} deep")
        itype = self.scalar("I", what)
        count = self.scalar("Q", what)
        if itype in _SCALARS:
            code = _SCALARS[itype]
            n = struct.calcsize("<" + code)
            self.need(count * n, f"{what} ({count} items)")
            dt = np.dtype("?" if code == "?" else "<" + code)
            arr = np.frombuffer(self.buf, dt, count, self.pos).copy()
            self.pos += count * n
            return arr
        # strings (>= 8 bytes each) or nested arrays (>= 12 bytes each)
        self.need(count * 8, f"{what} ({count} items)")
        if count > _MAX_ITEMS:
            self.fail(f"corrupted GGUF: {what} holds {count:,} strings or arrays, over the "
                      f"limit of {_MAX_ITEMS:,}")
        if itype == _STRING:
            return self._strings(count, what)
        return [self.value(itype, what, depth + 1) for _ in range(count)]

    def _strings(self, count: int, what: str) -> StringArray:
        """``count`` length-prefixed strings as one StringArray (no object per item)."""
        buf, unpack, size = self.buf, struct.Struct("<Q").unpack_from, self.size
        first = pos = self.pos
        fast = _short_string_ends(buf, first, count, size)
        ends = array("q")                     # where each string ends (the next prefix)
        append = ends.append
        try:
            for _ in range(0 if fast is not None else count):   # sequential: kept minimal
                pos += unpack(buf, pos)[0] + 8
                append(pos)
        except (struct.error, OverflowError):  # a prefix past the end of the file, or a
            self.pos = ends[-1] if ends else first   # length past any offset
            self.need(8, what)
            self.fail(f"corrupted GGUF: {what} holds a string whose length "
                      f"({unpack(buf, self.pos)[0]:,} bytes, at offset {self.pos}) runs past "
                      f"the end of the file ({size} bytes)")
        if fast is not None:
            end, pos = fast, int(fast[-1]) if count else first
        else:
            end = np.frombuffer(ends, np.int64) if count else np.zeros(0, np.int64)
        start = np.empty(count, np.int64)     # where each string's bytes begin
        if count:
            start[0] = first + 8
            start[1:] = end[:-1] + 8
        lengths = end - start
        if count and (int(end[-1]) > size or int(lengths.max()) > _MAX_STRING):
            k = int(np.argmax((end > size) | (lengths > _MAX_STRING)))
            self.pos = int(start[k])
            n = int(lengths[k])
            self.need(n, what)
            self.fail(f"corrupted GGUF: {what} holds a string of {n:,} bytes, over the "
                      f"limit of {_MAX_STRING:,}")
        self.pos = pos
        region = np.frombuffer(buf, np.uint8, pos - first, first)
        keep = np.ones(region.size, bool)         # every byte but the u64 length prefixes
        prefix = start - 8 - first
        for b in range(8):
            keep[prefix + b] = False
        offsets = np.zeros(count + 1, np.int64)
        np.cumsum(lengths, out=offsets[1:])
        blob = region[keep].tobytes()
        del region
        return StringArray(blob, offsets)


def _short_string_ends(buf, first: int, count: int, size: int):
    """Where each of ``count`` length-prefixed strings from ``first`` ends (int64), found
    at once when every string is shorter than 256 bytes (token tables): a length prefix
    is then a u64 below 256, so the prefixes are among the offsets whose eight bytes read
    so, and the walk ``p -> p + 8 + length`` is checked to step exactly from one to the
    next (an offset no other one steps to is dropped first). None when it does not (a
    longer string, a count or size that lies): the caller walks them one by one. Reads
    only ``buf[first:size]``, a window at a time. Gemma 3's 262,144 tokens, the whole
    string table: 28-43 ms against 108 ms one by one."""
    out, pos, left = [], first, count
    window = 16 * count + 4096
    while left:
        hi = min(size, pos + window)
        if hi - pos < 8:
            return None
        words = np.ndarray((hi - pos - 7,), "<u8", buffer=buf, offset=pos, strides=(1,))
        cand = np.flatnonzero(words < 256)
        if not len(cand) or cand[0] != 0:
            return None
        nxt = cand + 8 + words[cand].astype(np.int64)
        for _ in range(8):        # drop offsets no other one steps to (a text's last byte
            hit = np.zeros(len(cand), bool)           # before an empty string's prefix)
            at = np.searchsorted(cand, nxt)
            inside = at < len(cand)
            hit[at[inside][cand[at[inside]] == nxt[inside]]] = True
            hit[0] = True
            if hit.all():
                break
            cand, nxt = cand[hit], nxt[hit]
        brk = np.flatnonzero(nxt[:-1] != cand[1:])
        k = min(int(brk[0]) + 1 if len(brk) else len(cand), left)
        if k < left and nxt[k - 1] + 8 <= hi - pos:
            return None                   # the next prefix lies inside but was not found
        out.append(nxt[:k] + pos)
        step = int(nxt[k - 1])
        pos, left = pos + step, left - k
        if pos > size:
            return None
        window = step * left // k + step // 8 + 4096       # the rest, at this rate
    return np.concatenate(out) if out else np.zeros(0, np.int64)


def _open(path: str):
    try:
        with open(path, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            if size == 0:
                raise WeightsError(f"{path}: empty file, not a GGUF file")
            return mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ), size
    except FileNotFoundError:
        raise WeightsError(f"{path}: no such file") from None
    except IsADirectoryError:
        raise WeightsError(f"{path}: is a directory, not a GGUF file") from None
    except OSError as e:
        raise WeightsError(f"{path}: cannot read: {e.strerror or e}") from None


def _parse(path: str, buf, size: int, tensors: bool = True) -> _Header:
    c = _Cursor(path, buf, size)
    c.need(4, "the magic")
    if bytes(buf[:4]) != GGUF_MAGIC:
        c.fail(f"not a GGUF file (magic {bytes(buf[:4])!r}, expected b'GGUF')")
    c.pos = 4
    version = c.scalar("I", "the version")
    if version & 0xFFFF == 0 and version:
        c.fail("big-endian GGUF files are not supported")
    if version not in _VERSIONS:
        c.fail(f"GGUF version {version} is not supported (supported: 2, 3)")
    n_tensors = c.scalar("Q", "the tensor count")
    n_kv = c.scalar("Q", "the metadata count")
    # Each key/value takes at least 13 bytes and each tensor info 32: refuse counts the
    # file cannot hold before looping over them.
    c.need(n_kv * 13 + n_tensors * 32, f"{n_kv} metadata entries and {n_tensors} tensor infos")

    metadata: dict = {}
    for i in range(n_kv):
        key = c.string(f"metadata key #{i}")
        vtype = c.scalar("I", f"the type of metadata {key!r}")
        if key in metadata:
            c.fail(f"corrupted GGUF: metadata key {key!r} appears twice")
        metadata[key] = c.value(vtype, f"metadata {key!r}")

    alignment = metadata.get("general.alignment", _DEFAULT_ALIGNMENT)
    if (not isinstance(alignment, int) or isinstance(alignment, bool) or alignment <= 0
            or alignment & (alignment - 1)):
        shown = " ".join(repr(alignment).split())
        c.fail(f"corrupted GGUF: general.alignment {shown[:60]} is not a power of two")
    if not tensors:
        return _Header(metadata, [], None, alignment)

    infos = []
    seen = set()
    for i in range(n_tensors):
        name = c.string(f"tensor name #{i}")
        if name in seen:
            c.fail(f"corrupted GGUF: tensor {name!r} appears twice")
        seen.add(name)
        n_dims = c.scalar("I", f"tensor {name!r} dims")
        if not 1 <= n_dims <= _MAX_DIMS:
            c.fail(f"corrupted GGUF: tensor {name!r} has {n_dims} dimensions "
                   f"(1 to {_MAX_DIMS} allowed)")
        ne = tuple(c.scalar("Q", f"tensor {name!r} dims") for _ in range(n_dims))
        gtype = c.scalar("I", f"tensor {name!r} type")
        offset = c.scalar("Q", f"tensor {name!r} offset")
        infos.append((name, ne, gtype, offset))
    data_start = c.pos + (-c.pos % alignment)
    return _Header(metadata, infos, data_start, alignment)


def read_gguf_metadata(path) -> dict:
    """The key/value metadata of a GGUF file, without touching its tensors.

    Values are Python scalars (int, float, bool, str), NumPy arrays for numeric
    arrays (e.g. ``tokenizer.ggml.scores``), a ``StringArray`` (a read-only sequence
    of str, equal to the list of its items) for string arrays
    (``tokenizer.ggml.tokens``) and lists for nested arrays.

    Example::

        meta = read_gguf_metadata("gemma-3-270m.gguf")
        meta["general.architecture"], meta["gemma3.embedding_length"]   # 'gemma3', 640

    Raises:
        WeightsError: missing, truncated, corrupted or foreign file.
    """
    path = os.fspath(path)
    buf, size = _open(path)
    meta = _parse(path, buf, size, tensors=False).metadata
    meta["maxdecl.format"] = "gguf"
    return meta


def load_gguf(path) -> TensorDict:
    """Map every tensor of a GGUF file into a TensorDict keyed by its GGUF name.

    F32/F16/F64 and integer tensors become read-only arrays of shape
    ``reversed(ne)``; BF16 and block-quantized tensors (Q4_0, Q5_0, Q8_0, Q4_K,
    Q6_K, or any encoding registered under the GGML type's lower-case name)
    become ``QuantizedTensor`` s over the mapped bytes, without a copy.
    ``td.metadata`` holds the file's key/values (see ``read_gguf_metadata``).

    Raises:
        WeightsError: missing, truncated, corrupted or foreign file, or a tensor
            of a GGML type no registered encoding handles (named with its type).
    """
    path = os.fspath(path)
    buf, size = _open(path)
    header = _parse(path, buf, size)
    _release_header(buf, header.data_start)
    metadata = header.metadata
    metadata["maxdecl.format"] = "gguf"
    td = TensorDict(metadata=metadata)
    for name, ne, gtype, offset in header.tensors:
        td[name] = _tensor(path, buf, size, header, name, ne, gtype, offset)
    return td


def _release_header(buf, data_start: int) -> None:
    """Drop the parsed header's pages (a vocabulary: ~6 MB) from this process's resident
    memory: everything read from them was copied, and the mapping stays valid (pages
    fault back in from the page cache if touched)."""
    end = data_start - data_start % mmap.PAGESIZE
    if end > 0 and isinstance(buf, mmap.mmap) and hasattr(mmap, "MADV_DONTNEED"):
        try:
            buf.madvise(mmap.MADV_DONTNEED, 0, end)
        except OSError:
            pass


def _tensor(path, buf, size, header, name, ne, gtype, offset):
    where = f"{path}: tensor {name!r}"
    info = _ggml_type(gtype)
    if info is None:
        raise WeightsError(f"{where}: unknown GGML type {gtype}") from None
    if offset % header.alignment:
        raise WeightsError(f"{where}: offset {offset} is not a multiple of the alignment "
                           f"{header.alignment}: corrupted file")
    shape = tuple(int(d) for d in reversed(ne))
    n_elements = 1
    for d in ne:
        n_elements *= d
    start = header.data_start + offset

    if gtype in _ARRAY_TYPES:
        dt = _ARRAY_TYPES[gtype]
        nbytes = n_elements * dt.itemsize
        _check_range(where, start, nbytes, size)
        check_shape(where, shape, dt.itemsize)      # a zero dim may hide a huge one
        return np.frombuffer(buf, dt, n_elements, start).reshape(shape)

    gname, block_elements, block_bytes = info
    enc = _encoding(where, gname, (block_elements, block_bytes))
    if ne[0] % block_elements:
        raise WeightsError(f"{where}: {gname} row length {ne[0]} is not a multiple of "
                           f"the block size {block_elements}: corrupted file")
    row_bytes = ne[0] // block_elements * block_bytes
    nbytes = n_elements // block_elements * block_bytes
    _check_range(where, start, nbytes, size)
    check_shape(where, shape, 4)                    # as the float32 it decodes to
    data = np.frombuffer(buf, np.uint8, nbytes, start).reshape(*shape[:-1], row_bytes)
    try:
        return QuantizedTensor(data, shape, enc)
    except (QuantizationError, MaxdeclError) as e:
        raise WeightsError(f"{where}: {e}") from None


def _encoding(where: str, gname: str, sizes: tuple[int, int]) -> str:
    """The registered encoding for a GGML block type (its name and (block elements, block
    bytes)), checked against GGML's block sizes."""
    from .. import codecs

    name = gname.lower()
    try:
        enc = codecs.get(name)
    except QuantizationError:
        from gguf.constants import GGMLQuantizationType

        supported = sorted(t.name for t in GGMLQuantizationType
                           if t in _ARRAY_TYPES or t.name.lower() in codecs.names())
        raise WeightsError(f"{where}: GGML type {gname} is not supported "
                           f"(supported: {', '.join(supported)})") from None
    if (int(enc.block_elements), int(enc.block_bytes)) != tuple(sizes):
        raise WeightsError(
            f"{where}: encoding {name!r} has blocks of {enc.block_elements} elements / "
            f"{enc.block_bytes} bytes but GGML {gname} uses {tuple(sizes)}")
    return name


def _check_range(where: str, start: int, nbytes: int, size: int) -> None:
    if start + nbytes > size:
        raise WeightsError(f"{where}: data [{start}, {start + nbytes}) lies past the end of the "
                           f"file ({size} bytes): the file is truncated")
