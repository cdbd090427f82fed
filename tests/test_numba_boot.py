"""Running a graph loads numba's NumPy support without importing scipy.linalg
(numba's eager BLAS probe), and compiled code can still use BLAS."""

from __future__ import annotations

import subprocess
import sys

import pytest

pytest.importorskip("scipy")   # without SciPy there is no probe to skip

CODE = """
import sys
import numpy as np
import maxdecl as md
from maxdecl import ops

g = md.Graph("t", [md.TensorType(md.DType.float32, (4,))])
g.output(ops.silu(g.inputs[0]))
g.execute(np.ones(4, np.float32))
print("scipy.linalg" in sys.modules)

import numba

@numba.njit
def dot(a, b):
    return np.dot(a, b)

print(dot(np.arange(3.0), np.arange(3.0)))
"""


def test_graph_run_skips_scipy_linalg_but_blas_still_works():
    out = subprocess.run([sys.executable, "-c", CODE], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["False", "5.0"]


LIGHT = """
import sys
import numpy as np
import maxdecl as md
from maxdecl import ops

rng = np.random.default_rng(7)
blocks = np.frombuffer(rng.bytes(48 * 2 * 34), np.uint8).reshape(48, 68).copy()
blocks[:, 0:2] = blocks[:, 34:36] = np.frombuffer(np.float16(0.01).tobytes(), np.uint8)
w = md.QuantizedTensor(blocks, (48, 64), "q8_0")
g = md.Graph("t", [md.TensorType(md.DType.float32, (1, 64))])
with g.layer("proj"):
    g.output(ops.silu(ops.qmatmul(g.inputs[0], g.constant(w))))
x = np.linspace(-1, 1, 64, dtype=np.float32)[None]
print(g.execute(x)[0].tobytes().hex())
print(sorted(m for m in ("numba.np.random.generator_core", "numba.typed.typeddict")
             if m in sys.modules))
"""


def test_cached_kernels_load_without_the_whole_numba_context():
    """The second process loads the (parallel) GEMV and silu kernels from numba's cache
    without installing numba's lowering registries (``kernels.cache_load``) and gets the
    same bits as the process that compiled or loaded them first."""
    runs = [subprocess.run([sys.executable, "-c", LIGHT], capture_output=True, text=True,
                           check=True).stdout.split("\n") for _ in range(2)]
    assert runs[0][0] == runs[1][0] and len(runs[0][0]) == 48 * 8
    assert runs[1][1] == "[]"
