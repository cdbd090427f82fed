"""The compiler's resident pages, given back once the kernels are loaded.

numba compiles kernels, and loads them from its on-disk cache, with LLVM
(``libllvmlite.so``). LLVM's code and read-only data pages that this work touches stay
in the process's resident set (about 70 MB with Gemma 3 270M here) though a running
model never executes them. ``release()`` unmaps them from this process with
``madvise(MADV_DONTNEED)``: they are clean pages of the library file, so the page cache
keeps them and the next compile maps them back with minor faults. Only mappings that
are read-only and hold no private (copy-on-write) page are advised, so no byte changes.

``CompiledGraph`` calls ``release()`` after a run in which numba compiled or loaded a
kernel (``loads()`` changed), and ``md.load_model`` once its imports are done.
Measured, ``bench/generate.py`` (Gemma 3 270M Q4_K_M): peak RSS 418 -> 385 MB, resident
after the first token 403 -> 337 MB. Linux only; elsewhere a no-op.
"""

from __future__ import annotations

import ctypes
import sys

from numba.core import event

LIBRARY = "libllvmlite"          # mappings whose file name contains this are released
_MADV_DONTNEED = 4
_loads = 0                       # numba compiler-lock sections ended: compiles, cache loads


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


def clean_ranges(smaps: str, library: str = LIBRARY) -> list[tuple[int, int]]:
    """(start, end) of each mapping in ``smaps`` (the text of ``/proc/<pid>/smaps``) of a
    file whose name contains ``library``, mapped without write permission and holding
    no anonymous or dirty page."""
    out, cur = [], None
    for line in smaps.splitlines():
        head = line.split(None, 5)
        if len(head) >= 5 and "-" in head[0] and ":" not in head[0]:      # a mapping
            if cur is not None and cur[2]:
                out.append(cur[:2])
            name = head[5] if len(head) == 6 else ""
            lo, _, hi = head[0].partition("-")
            cur = [int(lo, 16), int(hi, 16), library in name and "w" not in head[1]]
        elif cur is not None and cur[2] and head and head[0] in (
                "Anonymous:", "Private_Dirty:", "Shared_Dirty:", "Swap:"):
            if len(head) > 1 and head[1] != "0":
                cur[2] = False
    if cur is not None and cur[2]:
        out.append(cur[:2])
    return [(a, b) for a, b in out]


def release() -> int:
    """Unmap the compiler library's clean read-only pages from this process; returns the
    bytes of the mappings advised (0 where nothing applies or off Linux)."""
    if not sys.platform.startswith("linux"):
        return 0
    try:
        with open("/proc/self/smaps") as f:
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
