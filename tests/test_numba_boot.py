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
