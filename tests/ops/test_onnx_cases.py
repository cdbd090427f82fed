"""ONNX operator test cases (Conv, AveragePool, MaxPool, LayerNormalization, Tile, Where)
mapped onto our ops: every mapped case must pass. ``bench/onnx_cases.py`` prints counts."""

import pytest

onnx = pytest.importorskip("onnx")
import onnx_cases  # noqa: E402  (tests/ops is on sys.path via conftest's rootdir)

CASES = onnx_cases.load_cases()


@pytest.mark.parametrize("case", CASES, ids=[f"{c.op}-{c.name}" for c in CASES])
def test_onnx_case(case):
    status, detail = onnx_cases.run_case(case)
    if status == "unmapped":
        pytest.skip(f"unmapped: {detail}")
    assert status == "pass", detail


def test_onnx_counts_are_reported(capsys):
    s = onnx_cases.summary()
    mapped = sum(r["mapped"] for r in s.values())
    passed = sum(r["passed"] for r in s.values())
    total = sum(r["total"] for r in s.values())
    with capsys.disabled():
        print(f"\nONNX node cases: {total} total, {mapped} mapped, {passed} passed")
    assert set(s) == set(onnx_cases.OPS)
    assert mapped >= 50 and passed == mapped
