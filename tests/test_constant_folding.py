"""md.compile folds the nodes that read only constants (maxdecl.runtime._fold_constants):
they run once, at compile time, with the same results; graph outputs, custom ops and
values too large to keep still run at every call, and an error in a folded node names it."""

import numpy as np
import pytest

import maxdecl as md
from maxdecl import runtime

F32 = md.DType.float32


def _dft_graph():
    """x[batch, 8] @ cos(2 pi j k / 8): the table built from constants in the graph."""
    g = md.Graph("dft", input_types=[md.TensorType(F32, ("batch", 8))])
    with g.layer("table"):
        j = g.constant(np.arange(8, dtype=np.float32).reshape(8, 1))
        k = g.constant(np.arange(8, dtype=np.float32).reshape(1, 8))
        angle = md.ops.mul(md.ops.mul(j, k), g.constant(np.float32(2 * np.pi / 8)))
        table = md.ops.cos(angle)
    with g.layer("mix"):
        y = md.ops.matmul(g.inputs[0], table)
    g.output(y)
    return g


def test_constant_tables_fold_once_with_the_same_numbers():
    g = _dft_graph()
    run = md.compile(g)
    assert [run._nodes[s.nodes[0]].op for s in run.steps] == ["matmul"]
    x = np.random.default_rng(0).standard_normal((3, 8)).astype(np.float32)
    j = np.arange(8, dtype=np.float32)
    want = x @ np.cos(np.outer(j, j) * np.float32(2 * np.pi / 8))
    (got,) = run(x)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    (again,) = run(x)
    assert again.tobytes() == got.tobytes()


def test_folded_values_are_read_only():
    g = _dft_graph()
    run = md.compile(g)
    tables = [a for a in run._bound if isinstance(a, np.ndarray) and a.shape == (8, 8)]
    assert tables and not tables[0].flags.writeable


def test_a_constant_output_is_computed_at_every_call():
    """A caller may write into what a call returns: outputs are never shared."""
    g = md.Graph("c", input_types=[md.TensorType(F32, (2,))])
    c = md.ops.neg(g.constant(np.ones(2, np.float32)))
    g.output(c, md.ops.add(g.inputs[0], c))
    run = md.compile(g)
    a, _ = run(np.zeros(2, np.float32))
    a += 5
    b, s = run(np.zeros(2, np.float32))
    assert b.tolist() == [-1, -1] and s.tolist() == [-1, -1]


def test_custom_ops_are_not_folded():
    calls = []

    @md.ops.register_custom("fold_probe_counter", inputs=["x"])
    def counter(x):
        calls.append(1)
        return x * 2

    try:
        g = md.Graph("p", input_types=[md.TensorType(F32, (2,))])
        doubled = md.ops.custom("fold_probe_counter", [g.constant(np.ones(2, np.float32))],
                                md.TensorType(F32, (2,)))[0]
        g.output(md.ops.add(g.inputs[0], doubled))
        run = md.compile(g)
        for _ in range(3):
            (y,) = run(np.zeros(2, np.float32))
        assert len(calls) == 3 and y.tolist() == [2, 2]
    finally:
        md.ops.unregister_custom("fold_probe_counter")


@pytest.mark.parametrize("limit", ["FOLD_MAX_BYTES", "FOLD_TOTAL_BYTES"])
def test_values_over_the_size_limit_are_not_kept(monkeypatch, limit):
    monkeypatch.setattr(runtime, limit, 100)
    run = md.compile(_dft_graph())                      # the 8 x 8 table is 256 bytes
    assert "cos" in [run._nodes[s.nodes[0]].op for s in run.steps]
    x = np.ones((1, 8), np.float32)
    np.testing.assert_allclose(run(x)[0], md.compile(_dft_graph())(x)[0], rtol=0, atol=0)


def test_an_error_in_a_folded_node_names_it_at_compile_time():
    g = md.Graph("bad", input_types=[md.TensorType(F32, (2,))])
    with g.layer("blk.0.table"):
        ids = g.constant(np.array([0, 7], np.int64))
        rows = md.ops.gather(g.constant(np.ones((3, 2), np.float32)), ids, axis=0)
    g.output(md.ops.add(g.inputs[0], md.ops.sum(rows, axis=0)))
    with pytest.raises(md.GraphError, match="blk.0.table"):
        md.compile(g)


def test_the_callers_arrays_stay_writeable():
    """Folding never changes the flags of an array the caller gave as a constant, also
    when an op hands it through (a cast to its own dtype) or a view of it (reshape)."""
    given = np.arange(6, dtype=np.float32)
    g = md.Graph("w", input_types=[md.TensorType(F32, (2, 3))])
    c = g.constant(given)
    same = md.ops.cast(c, dtype="float32")
    view = md.ops.reshape(same, shape=[2, 3])
    g.output(md.ops.add(g.inputs[0], view), md.ops.add(md.ops.sum(same, axis=0), 1.0))
    run = md.compile(g)
    run(np.zeros((2, 3), np.float32))
    assert given.flags.writeable
