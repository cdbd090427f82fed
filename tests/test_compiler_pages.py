"""The compiler's resident pages go back once kernels are loaded (``kernels/compiler_pages``):
only clean read-only mappings of the library are advised, the process keeps compiling
and running kernels afterwards, and a compiled graph releases after a run that loaded
kernels, not after one that did not."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

from maxdecl.kernels import compiler_pages

SMAPS = """\
7f0000000000-7f0000100000 r--p 00000000 fd:01 42   /site/llvmlite/binding/libllvmlite.so
Rss:                1024 kB
Anonymous:             0 kB
Private_Dirty:         0 kB
VmFlags: rd mr mw me sd
7f0000100000-7f0000900000 r-xp 00100000 fd:01 42   /site/llvmlite/binding/libllvmlite.so
Rss:                8192 kB
Anonymous:             0 kB
Private_Dirty:         0 kB
Swap:                  0 kB
VmFlags: rd ex mr mw me sd
7f0000900000-7f0000a00000 r--p 00900000 fd:01 42   /site/llvmlite/binding/libllvmlite.so
Rss:                1024 kB
Anonymous:          1024 kB
Private_Dirty:      1024 kB
7f0000a00000-7f0000a10000 rw-p 00a00000 fd:01 42   /site/llvmlite/binding/libllvmlite.so
Rss:                  64 kB
Anonymous:             0 kB
7f0000b00000-7f0000c00000 r-xp 00000000 fd:01 43   /usr/lib/libc.so.6
Rss:                1024 kB
Anonymous:             0 kB
7f0000c00000-7f0000d00000 r--p 00000000 fd:01 42   /site/llvmlite/binding/libllvmlite.so
Rss:                1024 kB
Swap:                  4 kB
7f0000d00000-7f0000e00000 r--p 00000000 00:00 0
Rss:                   0 kB
7f0000e00000-7f0000f00000 r-xp 00e00000 fd:01 42   /site/llvmlite/binding/libllvmlite.so
Rss:                 512 kB
"""


def test_clean_ranges_picks_read_only_clean_mappings_of_the_library():
    assert compiler_pages.clean_ranges(SMAPS) == [
        (0x7f0000000000, 0x7f0000100000),      # read-only data, clean
        (0x7f0000100000, 0x7f0000900000),      # code
        (0x7f0000e00000, 0x7f0000f00000),      # the last mapping of the text
    ]  # not: copy-on-write (relocated) pages, writable data, other files, swapped pages


def test_clean_ranges_of_nothing():
    assert compiler_pages.clean_ranges("") == []
    assert compiler_pages.clean_ranges(SMAPS, library="libnothing") == []


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
