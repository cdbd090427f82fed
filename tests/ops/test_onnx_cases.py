"""ONNX operator test cases (Conv, ConvTranspose, AveragePool, MaxPool, LayerNormalization,
Tile, Where) mapped onto our ops: every case maps and passes, every output compared.
``bench/onnx_cases.py`` prints the counts."""

import pytest

onnx = pytest.importorskip("onnx")
import onnx_cases  # noqa: E402  (tests/ops is on sys.path via conftest's rootdir)

CASES = onnx_cases.load_cases()


@pytest.mark.parametrize("case", CASES, ids=[f"{c.op}-{c.name}" for c in CASES])
def test_onnx_case(case):
    status, detail = onnx_cases.run_case(case)
    assert status == "pass", f"{status}: {detail}"


def test_onnx_counts_are_reported(capsys):
    s = onnx_cases.summary()
    mapped = sum(r["mapped"] for r in s.values())
    passed = sum(r["passed"] for r in s.values())
    total = sum(r["total"] for r in s.values())
    with capsys.disabled():
        print(f"\nONNX node cases: {total} total, {mapped} mapped, {passed} passed")
    assert set(s) == set(onnx_cases.OPS)
    assert total >= 79 and passed == mapped == total, \
        [line for r in s.values() for line in r["failed"] + r["unmapped"]]
