"""The compiler's resident pages, given back once the kernels are loaded.

numba compiles kernels, and loads them from its on-disk cache, with LLVM
(``libllvmlite.so``). LLVM's code and read-only data pages that this work touches stay
in the process's resident set (about 70 MB with Gemma 3 270M here) though a running
model never executes them. ``release()`` unmaps them from this process with
``madvise(MADV_DONTNEED)``: they are clean pages of the library file, so the page cache
keeps them and the next compile maps them back with minor faults. Only mappings that lie
inside a read-only loadable segment of the library (per its ELF program headers: code,
constants, symbol tables; never the relocated data, whose pages are private copies)
are advised, and none of a library that patches its code at load (``TEXTREL``), so no
byte changes.

``CompiledGraph`` calls ``release()`` after a run in which numba compiled or loaded a
kernel (``loads()`` changed), and ``md.load_model`` once its imports are done.
Measured, ``bench/generate.py`` (Gemma 3 270M Q4_K_M): peak RSS 418 -> 386-390 MB,
resident after the first token 403 -> 340-342 MB. Linux only; elsewhere a no-op.
"""

from __future__ import annotations

import ctypes
import mmap
import os
import struct
import sys

from numba.core import event

LIBRARY = "libllvmlite"          # mappings whose file name contains this are released
_MADV_DONTNEED = 4
_PAGE = mmap.PAGESIZE            # the segments are mapped in whole pages
_PT_LOAD, _PT_DYNAMIC, _PF_W = 1, 2, 2
_DT_TEXTREL, _DT_FLAGS, _DF_TEXTREL = 22, 30, 4
_loads = 0                       # numba compiler-lock sections ended: compiles, cache loads
_SEGMENTS: dict = {}             # (library path, inode) -> its read-only segments


class _LoadCounter(event.Listener):
    def on_start(self, ev):
        pass

    def on_end(self, ev):
        global _loads
        _loads += 1


event.register("numba:compiler_lock", _LoadCounter())


def loads() -> int:
    """How many times numba has taken its compiler lock (a compile or a cache load)."""
    return _loads


def read_only_segments(read) -> list[tuple[int, int]]:
    """File ranges ``[lo, hi)``, widened to whole pages, of the loadable segments without
    write permission of a 64-bit little-endian ELF file, read through ``read(offset,
    size) -> bytes``; [] for anything else, or for a library that patches its code at
    load (TEXTREL)."""
    head = read(0, 64)
    if len(head) < 64 or head[:4] != b"\x7fELF" or head[4] != 2 or head[5] != 1:
        return []
    phoff, = struct.unpack_from("<Q", head, 0x20)
    phentsize, phnum = struct.unpack_from("<HH", head, 0x36)
    table = read(phoff, phnum * phentsize)
    if phentsize < 56 or len(table) < phnum * phentsize:
        return []
    out, dynamic = [], b""
    for i in range(phnum):
        p_type, p_flags, p_offset, _, _, p_filesz = struct.unpack_from(
            "<IIQQQQ", table, i * phentsize)
        if p_type == _PT_LOAD and not p_flags & _PF_W:     # mapped in whole pages
            out.append((p_offset // _PAGE * _PAGE, -(-(p_offset + p_filesz) // _PAGE) * _PAGE))
        elif p_type == _PT_DYNAMIC and p_filesz <= 1 << 20:
            dynamic = read(p_offset, p_filesz)
    for j in range(0, len(dynamic) - 15, 16):
        tag, val = struct.unpack_from("<qQ", dynamic, j)
        if tag == 0:
            return out
        if tag == _DT_TEXTREL or (tag == _DT_FLAGS and val & _DF_TEXTREL):
            return []
    return []                          # no dynamic section read to its end: leave it alone


def _segments(path: str, inode: int) -> list:
    """``read_only_segments`` of the file at ``path`` if it is still the mapped one (its
    inode is ``inode``; a library replaced on disk since it was mapped gets [])."""
    seg = _SEGMENTS.get((path, inode))
    if seg is None:
        try:
            with open(path, "rb") as f:
                def read(offset, size):
                    f.seek(offset)
                    return f.read(size)
                seg = read_only_segments(read) if os.fstat(f.fileno()).st_ino == inode else []
        except (OSError, ValueError, struct.error):
            seg = []
        _SEGMENTS[(path, inode)] = seg
    return seg


def clean_ranges(maps: str, segments=_segments, library: str = LIBRARY) -> list[tuple[int, int]]:
    """(start, end) of each mapping in ``maps`` (the text of ``/proc/<pid>/maps``) of a
    file whose name contains ``library``, mapped without write permission, that lies
    inside one of the file's read-only segments (``segments(path, inode)``: file ranges)."""
    out = []
    for line in maps.splitlines():
        f = line.split(None, 5)
        if len(f) < 6 or library not in f[5] or "w" in f[1]:
            continue
        lo, _, hi = f[0].partition("-")
        lo, hi, off = int(lo, 16), int(hi, 16), int(f[2], 16)
        end = off + hi - lo
        if any(a <= off and end <= b for a, b in segments(f[5].strip(), int(f[4]))):
            out.append((lo, hi))
    return out


def release() -> int:
    """Unmap the compiler library's clean read-only pages from this process; returns the
    bytes of the mappings advised (0 where nothing applies or off Linux)."""
    if not sys.platform.startswith("linux"):
        return 0
    try:
        with open("/proc/self/maps") as f:
            ranges = clean_ranges(f.read())
    except OSError:
        return 0
    if not ranges:
        return 0
    madvise = ctypes.CDLL(None, use_errno=True).madvise
    madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    done = 0
    for lo, hi in ranges:
        if madvise(lo, hi - lo, _MADV_DONTNEED) == 0:
            done += hi - lo
    return done
