"""``StringArray``: a read-only list of str kept as one UTF-8 blob and offsets.

A GGUF vocabulary is 262,144 strings: as Python ``str`` objects they cost ~22 MB,
as a blob and an offset array ~3 MB. Items are decoded (``surrogateescape``, so
invalid UTF-8 survives a round trip) when they are read.

Example::

    a = StringArray.from_strings(["<pad>", "▁the", "b\\udcff"])
    a[1], len(a), a.item_bytes(2)          # ('▁the', 3, b'b\\xff')
"""

from __future__ import annotations

from array import array
from collections.abc import Iterable, Sequence

import numpy as np

__all__ = ["StringArray"]


def _offset_array(offsets) -> array:
    """Offsets as a compact ``array`` (4-byte items when they fit)."""
    offsets = np.asarray(offsets, dtype=np.int64)
    code = "i" if (offsets.size == 0 or offsets[-1] < 1 << 31) else "q"
    return array(code, offsets.astype("i4" if code == "i" else "i8").tobytes())


def _encode(s: str) -> bytes:
    """``s`` as the bytes it was read from: UTF-8, a ``surrogateescape`` surrogate as its byte."""
    try:
        return s.encode("utf-8")
    except UnicodeEncodeError:
        b = s.encode("utf-8", "surrogateescape")
        if b.decode("utf-8", "surrogateescape") != s:
            raise UnicodeEncodeError("utf-8", s, 0, len(s),
                                     "surrogates that do not decode back from bytes") from None
        return b


class StringArray(Sequence):
    """Strings ``blob[offsets[i]:offsets[i + 1]]`` decoded on access; compares equal to
    a list or tuple of the same strings.

    Args:
        blob: the UTF-8 bytes of every item, one after the other.
        offsets: ``len + 1`` byte offsets into ``blob`` (non-decreasing, first 0).
    """

    __slots__ = ("blob", "offsets")

    def __init__(self, blob: bytes, offsets) -> None:
        self.blob = bytes(blob)
        self.offsets = offsets if isinstance(offsets, array) else _offset_array(offsets)

    @classmethod
    def from_strings(cls, items: Iterable[str]) -> StringArray:
        """Pack strings (``str`` or ``bytes``) into one blob.

        Raises:
            UnicodeEncodeError: a str whose surrogates do not stand for the bytes that
                ``surrogateescape`` writes (it is not text read from bytes).
        """
        if isinstance(items, StringArray):
            return items
        parts = [s if isinstance(s, bytes) else _encode(s) for s in items]
        lengths = np.fromiter((len(p) for p in parts), np.int64, len(parts))
        offsets = np.zeros(len(parts) + 1, np.int64)
        np.cumsum(lengths, out=offsets[1:])
        return cls(b"".join(parts), offsets)

    def __len__(self) -> int:
        return len(self.offsets) - 1

    def __getitem__(self, i):
        if isinstance(i, slice):
            return [self[k] for k in range(*i.indices(len(self)))]
        off = self.offsets
        if i < 0:
            i += len(off) - 1
        if not 0 <= i < len(off) - 1:
            raise IndexError("StringArray index out of range")
        return self.blob[off[i]:off[i + 1]].decode("utf-8", "surrogateescape")

    def item_bytes(self, i: int) -> bytes:
        """The stored bytes of item ``i`` (``self[i]`` encoded back)."""
        off = self.offsets
        if not 0 <= i < len(off) - 1:
            raise IndexError("StringArray index out of range")
        return self.blob[off[i]:off[i + 1]]

    def __iter__(self):
        blob, off = self.blob, self.offsets
        for k in range(len(off) - 1):
            yield blob[off[k]:off[k + 1]].decode("utf-8", "surrogateescape")

    def lengths(self) -> np.ndarray:
        """Byte length of every item (int64)."""
        return np.diff(np.frombuffer(self.offsets, self.offsets.typecode)).astype(np.int64)

    def tolist(self) -> list[str]:
        return list(self)

    def __eq__(self, other) -> bool:
        if isinstance(other, StringArray):
            return self.blob == other.blob and np.array_equal(
                np.frombuffer(self.offsets, self.offsets.typecode),
                np.frombuffer(other.offsets, other.offsets.typecode))
        if isinstance(other, (list, tuple)):
            return len(other) == len(self) and all(a == b for a, b in zip(self, other))
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        head = ", ".join(repr(s) for s in self[:3])
        return f"StringArray([{head}{', ...' if len(self) > 3 else ''}], {len(self)} items)"

    def __getstate__(self):
        return self.blob, self.offsets

    def __setstate__(self, state) -> None:
        self.blob, self.offsets = state

