"""Run a fuzz batch in one child process with bounded memory and time."""

import json
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
HERE = os.path.dirname(os.path.abspath(__file__))

_CHILD = r"""
import json, resource, sys, tempfile, time
limit = int(sys.argv[4])
resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
module = __import__(sys.argv[1])
t0 = time.perf_counter()
with tempfile.TemporaryDirectory() as work:
    result = module.run(int(sys.argv[2]), int(sys.argv[3]), work)
print(json.dumps({"result": result, "seconds": time.perf_counter() - t0}))
"""


def run_limited(module: str, n: int, seed: int, memory: int, timeout: float) -> dict:
    """``module.run(n, seed, workdir)`` in a child under RLIMIT_AS=``memory`` bytes;
    returns ``{"result": ..., "seconds": ...}``. A crash, a hang past ``timeout`` or a
    traceback fails the caller's assertion with the child's stderr."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([ROOT, HERE, os.environ.get(
        "PYTHONPATH", "")])}
    p = subprocess.run([sys.executable, "-c", _CHILD, module, str(n), str(seed), str(memory)],
                       cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)
    assert p.returncode == 0, f"fuzz child died (rc {p.returncode}):\n{p.stderr[-3000:]}"
    return json.loads(p.stdout.strip().splitlines()[-1])
