"""``load_model`` starts numba on a background thread (``pipelines.warmup``): once per
process, only when numba is not loaded yet, and a model loaded meanwhile runs."""

import subprocess
import sys

CODE = """
import sys
from maxdecl.pipelines import warmup
import maxdecl as md
assert "numba" not in sys.modules
warmup.start()
warmup.start()
assert len(warmup._THREAD) == 1
model = md.load_model("specs/mlp.yaml")
import numpy as np
print(model(np.ones((2, 16), np.float32))[0].shape)
warmup._THREAD[0].join(60)
print(warmup._THREAD[0].is_alive(), "numba.core.registry" in sys.modules)
"""


def test_warmup_runs_beside_a_load():
    r = subprocess.run([sys.executable, "-c", CODE], capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split("\n")[:2] == ["(2, 8)", "False True"]


def test_no_warmup_once_numba_is_loaded():
    code = ("import numba, numba.core.registry\nfrom maxdecl.pipelines import warmup\n"
            "warmup.start()\nprint(len(warmup._THREAD))")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "0"
