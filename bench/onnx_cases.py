"""Count ONNX's own operator test cases that map onto maxdecl ops, and how many pass.

Run by hand: ``python bench/onnx_cases.py`` (needs the ``onnx`` test extra).
"""

import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tests", "ops"))
sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

import onnx_cases  # noqa: E402


def main() -> None:
    s = onnx_cases.summary()
    tot = {"total": 0, "mapped": 0, "passed": 0}
    print(f"{'op':<20}{'cases':>6}{'mapped':>8}{'passed':>8}")
    for op, r in s.items():
        print(f"{op:<20}{r['total']:>6}{r['mapped']:>8}{r['passed']:>8}")
        for k in tot:
            tot[k] += r[k]
    print(f"{'all':<20}{tot['total']:>6}{tot['mapped']:>8}{tot['passed']:>8}")
    for op, r in s.items():
        for line in r["failed"]:
            print(f"FAIL {line}")
        for line in r["unmapped"]:
            print(f"unmapped {line}")


if __name__ == "__main__":
    main()
