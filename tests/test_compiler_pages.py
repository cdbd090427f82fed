"""The compiler's resident pages go back once kernels are loaded (``kernels/compiler_pages``):
only clean read-only mappings of the library are advised, the process keeps compiling
and running kernels afterwards, and a compiled graph releases after a run that loaded
kernels, not after one that did not."""

from __future__ import annotations

import subprocess
import sys

import struct

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from maxdecl.kernels import compiler_pages

MAPS = """\
7f0000000000-7f0000002000 r--p 00000000 fd:01 42   /site/llvmlite/binding/libllvmlite.so
7f0000002000-7f0000006000 r-xp 00002000 fd:01 42   /site/llvmlite/binding/libllvmlite.so
7f0000006000-7f0000007000 r--p 00006000 fd:01 42   /site/llvmlite/binding/libllvmlite.so
7f0000007000-7f0000008000 rw-p 00007000 fd:01 42   /site/llvmlite/binding/libllvmlite.so
7f0000008000-7f0000009000 rw-p 00000000 00:00 0
7f0000100000-7f0000200000 r-xp 00000000 fd:01 43   /usr/lib/libc.so.6
7f0000300000-7f0000301000 r--p 00000000 fd:01 44   /tmp/a libllvmlite copy.so
"""
PAGE = compiler_pages._PAGE


def _elf(segments, dynamic=((0, 0),)):
    """A 64-bit little-endian ELF image: ``segments`` = (flags, offset, size) loadable
    segments, then a dynamic section of (tag, value) entries."""
    phnum = len(segments) + 1
    dyn_at = 64 + 56 * phnum
    dyn = b"".join(struct.pack("<qQ", t, v) for t, v in dynamic)
    head = bytearray(64)
    head[:6] = b"\x7fELF\x02\x01"
    struct.pack_into("<Q", head, 0x20, 64)
    struct.pack_into("<HH", head, 0x36, 56, phnum)
    table = b"".join(struct.pack("<IIQQQQQQ", 1, flags, off, off, off, size, size, PAGE)
                     for flags, off, size in segments)
    table += struct.pack("<IIQQQQQQ", 2, 6, dyn_at, dyn_at, dyn_at, len(dyn), len(dyn), 8)
    return bytes(head) + table + dyn


def _reader(image):
    return lambda offset, size: image[offset:offset + size]


def test_read_only_segments_of_an_elf_image():
    image = _elf([(4, 0, 100), (5, PAGE, 3 * PAGE + 10), (6, 5 * PAGE, 100)])
    assert compiler_pages.read_only_segments(_reader(image)) == [
        (0, PAGE), (PAGE, 5 * PAGE)]                     # whole pages; not the writable one


def test_a_library_that_patches_its_code_has_no_read_only_segments():
    for dynamic in (((22, 0), (0, 0)), ((30, 4), (0, 0)), ((1, 5),)):   # no DT_NULL: unsure
        image = _elf([(5, 0, PAGE)], dynamic)
        assert compiler_pages.read_only_segments(_reader(image)) == []


@settings(max_examples=200, deadline=None, derandomize=True)
@given(st.binary(max_size=600), st.integers(0, 599), st.binary(max_size=8))
def test_read_only_segments_of_hostile_bytes_never_raise(junk, at, patch):
    base = bytearray(_elf([(5, 0, PAGE), (6, PAGE, 10)]) + junk)
    base[at:at + len(patch)] = patch
    segs = compiler_pages.read_only_segments(_reader(bytes(base)))
    assert all(lo % PAGE == 0 and hi % PAGE == 0 and lo <= hi for lo, hi in segs)


def test_clean_ranges_picks_mappings_inside_read_only_segments_of_the_library():
    segs = {"/site/llvmlite/binding/libllvmlite.so": [(0, 0x2000), (0x2000, 0x7000)],
            "/tmp/a libllvmlite copy.so": [(0, 0x1000)]}
    got = compiler_pages.clean_ranges(MAPS, lambda path, inode: segs.get(path, []))
    assert got == [(0x7f0000000000, 0x7f0000002000), (0x7f0000002000, 0x7f0000006000),
                   (0x7f0000006000, 0x7f0000007000), (0x7f0000300000, 0x7f0000301000)]
    segs["/site/llvmlite/binding/libllvmlite.so"] = [(0, 0x2000), (0x2000, 0x6000)]
    got = compiler_pages.clean_ranges(MAPS, lambda path, inode: segs.get(path, []))
    assert (0x7f0000006000, 0x7f0000007000) not in got   # relocated data (made read-only)
    assert compiler_pages.clean_ranges("", lambda path, inode: [(0, 1 << 40)]) == []


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="/proc/self/maps")
def test_the_loaded_llvm_library_has_read_only_segments():
    import numba

    numba.njit(lambda a: a + 1)(1.0)                      # LLVM is loaded and used
    with open("/proc/self/maps") as f:
        libs = {(line.split(None, 5)[5].strip(), int(line.split()[4])) for line in f
                if compiler_pages.LIBRARY in line and len(line.split(None, 5)) == 6}
    assert len(libs) == 1
    path, inode = libs.pop()
    segs = compiler_pages._segments(path, inode)
    assert len(segs) >= 2 and all(lo < hi for lo, hi in segs)     # code and constants
    assert compiler_pages._segments(path, inode + 1) == []          # replaced on disk: none


CODE = """
import re
import numba
import numpy as np
from maxdecl.kernels import compiler_pages

def llvm_kb():
    kb, on = 0, False
    for line in open("/proc/self/smaps"):
        head = line.split()
        if head and "-" in head[0] and ":" not in head[0]:
            on = len(head) == 6 and compiler_pages.LIBRARY in head[5]
        elif on and head[0] == "Rss:":
            kb += int(head[1])
    return kb

@numba.njit
def before(a):
    return a.sum() * 2

assert before(np.arange(4.0)) == 12.0
kb = llvm_kb()
assert compiler_pages.release() > 0
after = llvm_kb()
assert after < kb / 2, (kb, after)

@numba.njit
def fresh(a, b):           # compiled after the release: LLVM's pages come back
    return (a * b).sum()

assert fresh(np.arange(3.0), np.arange(3.0)) == 5.0
assert before(np.arange(3.0)) == 6.0
print("ok", kb, after)
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="madvise on Linux only")
def test_release_unmaps_llvm_pages_and_numba_keeps_compiling():
    out = subprocess.run([sys.executable, "-c", CODE], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.startswith("ok")


def test_compiled_graph_releases_after_a_run_that_loaded_kernels(monkeypatch):
    import maxdecl as md
    from maxdecl import ops

    released = []
    monkeypatch.setattr(compiler_pages, "release", lambda: released.append(1) or 0)
    g = md.Graph("t", [md.TensorType(md.DType.float32, (3, 5))])
    g.output(ops.softmax(g.inputs[0]))
    run = md.compile(g)
    x = np.arange(15, dtype=np.float32).reshape(3, 5)
    # before and after each run: the first run loaded a kernel, the second did not
    monkeypatch.setattr(compiler_pages, "loads", iter([0, 1, 1, 1]).__next__)
    run(x)
    assert released == [1]
    (y,) = run(x)                        # nothing loaded: nothing released
    assert released == [1]
    np.testing.assert_allclose(y.sum(axis=1), 1.0, rtol=1e-6)


def test_loads_counts_numba_compiles():
    import numba

    @numba.njit
    def brand_new(a):
        return a.max() + 1

    n = compiler_pages.loads()
    assert brand_new(np.arange(3.0)) == 3.0
    assert compiler_pages.loads() > n
    n = compiler_pages.loads()
    brand_new(np.arange(4.0))            # compiled already: no compiler work
    assert compiler_pages.loads() == n
