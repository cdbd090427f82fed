"""``maxdecl validate`` start-to-exit time on the shipped specs (type checks included),
against the floor of the same interpreter importing the spec layer's own dependencies
(PyYAML, jsonschema) in the same run. Medians of ``--runs`` processes:

    python bench/validate.py [--runs 9]
"""

from __future__ import annotations

import argparse
import glob
import os
import statistics
import subprocess
import sys
import time

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")


def _time(cmd) -> float:
    t = time.perf_counter()
    subprocess.run(cmd, check=True, capture_output=True, cwd=ROOT)
    return time.perf_counter() - t


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=9)
    a = ap.parse_args()
    specs = sorted(glob.glob(os.path.join(ROOT, "specs", "*.yaml")))
    four = [s for s in specs if os.path.basename(s) in
            ("llama3.yaml", "gemma3.yaml", "replit.yaml", "tinystories.yaml")]
    cases = {
        "floor: import yaml, jsonschema": [sys.executable, "-c", "import yaml, jsonschema"],
        f"validate {len(four)} model specs": [sys.executable, "-m", "maxdecl", "validate", *four],
        f"validate all {len(specs)} specs": [sys.executable, "-m", "maxdecl", "validate", *specs],
    }
    for cmd in cases.values():
        _time(cmd)                                   # warm the file cache
    res = {k: [_time(c) for _ in range(a.runs)] for k, c in cases.items()}
    floor = statistics.median(res["floor: import yaml, jsonschema"])
    for k, ts in res.items():
        m = statistics.median(ts)
        print(f"{k:<34} median {m:.3f} s  (min {min(ts):.3f}, max {max(ts):.3f})  "
              f"{m / floor:4.2f}x the floor")


if __name__ == "__main__":
    main()
