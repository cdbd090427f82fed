"""Graph core (API.md section 2): layer scopes, build-time inference, execution, errors."""

import numpy as np
import pytest

import maxdecl as md

F32 = md.DType.float32


def _graph(*shape):
    return md.Graph("t", input_types=[md.TensorType(F32, shape)])


def test_api_example_runs():
    g = _graph("batch", 16)
    x = g.inputs[0]
    with g.layer("foo"):
        with g.layer("bar"):
            assert g.current_layer() == "foo.bar"
            c = g.constant(np.int64(1))
            y = md.ops.add(x, g.constant(np.ones(16, np.float32)))
    assert g.current_layer() == ""
    g.output(y)
    assert c.dtype == md.DType.int64 and c.shape == ()
    assert y.shape == ("batch", 16) and y.rank == 2 and y.dtype == F32
    (out,) = g.execute(np.ones((2, 16), np.float32))
    np.testing.assert_array_equal(out, np.full((2, 16), 2, np.float32))


def test_nodes_record_layer_path_in_insertion_order():
    g = _graph(4)
    x = g.inputs[0]
    with g.layer("blk"), g.layer("3"), g.layer("attn_q"):
        y = md.ops.relu(x)
    z = md.ops.neg(y)
    assert [(n.op, n.layer) for n in g.nodes] == [("relu", "blk.3.attn_q"), ("neg", "")]
    assert g.nodes[0].inputs == [x] and g.nodes[0].outputs == [y]
    assert z.node is g.nodes[1]


def test_layer_scope_is_restored_on_exception():
    g = _graph(4)
    with pytest.raises(RuntimeError):
        with g.layer("a"):
            with g.layer("b"):
                raise RuntimeError("boom")
    assert g.current_layer() == ""


def test_shape_mismatch_fails_at_build_time_naming_layer_op_and_shapes():
    g = _graph("seq", 4096)
    w = g.constant(np.zeros((4095, 1024), np.float32))
    with g.layer("blocks"), g.layer("3"), g.layer("attn"):
        with pytest.raises(md.GraphError) as err:
            md.ops.matmul(g.inputs[0], w)
    msg = str(err.value)
    assert "blocks.3.attn" in msg and "matmul" in msg
    assert "4096" in msg and "4095" in msg


def test_dtype_mismatch_is_a_graph_error():
    g = _graph(3)
    with pytest.raises(md.GraphError, match="dtypes differ"):
        md.ops.add(g.inputs[0], g.constant(np.ones(3, np.int32)))


def test_with_graph_makes_it_current():
    g = _graph(3)
    assert md.Graph.current() is None
    with g:
        assert md.Graph.current() is g
        y = md.ops.add(g.inputs[0], 1.0)
    assert md.Graph.current() is None
    g.output(y)
    np.testing.assert_allclose(g.execute(np.zeros(3, np.float32))[0], 1.0)


def test_operator_sugar_matches_numpy():
    g = _graph(2, 3)
    x = g.inputs[0]
    w = g.constant(np.arange(12, dtype=np.float32).reshape(3, 4))
    g.output((x * 2.0 + 1.0) @ w - x @ w / 4.0)
    a = np.random.default_rng(0).standard_normal((2, 3)).astype(np.float32)
    want = (a * 2 + 1) @ w.node.attrs["value"] - a @ w.node.attrs["value"] / 4
    np.testing.assert_allclose(g.execute(a)[0], want, rtol=1e-6)


def test_weights_bind_by_name_and_errors_name_the_weight():
    g = _graph(4)
    with g.layer("fc"):
        w = g.weight("fc.weight", md.TensorType(F32, (4, 2)))
        g.output(md.ops.matmul(g.inputs[0], w))
    td = md.TensorDict({"fc.weight": np.ones((4, 2), np.float32)})
    np.testing.assert_allclose(g.execute(np.ones(4, np.float32), weights=td)[0], [4, 4])
    with pytest.raises(md.GraphError, match="fc.weight"):
        g.execute(np.ones(4, np.float32))
    bad = md.TensorDict({"fc.weight": np.ones((4, 3), np.float32)})
    with pytest.raises(md.GraphError, match=r"fc\.weight.*\[4, 3\]"):
        g.execute(np.ones(4, np.float32), weights=bad)


def test_runtime_input_checks():
    g = _graph("seq", 4)
    g.output(md.ops.relu(g.inputs[0]))
    with pytest.raises(md.GraphError, match="expected float32"):
        g.execute(np.ones((2, 4), np.int32))
    with pytest.raises(md.GraphError, match="expected 1 inputs"):
        g.execute()
    with pytest.raises(md.GraphError, match=r"\[2, 5\]"):
        g.execute(np.ones((2, 5), np.float32))


def test_runtime_errors_are_graph_errors_with_layer():
    g = _graph(-1 + 3)
    with g.layer("reshape_me"):
        y = md.ops.reshape(g.inputs[0], ("n", 1))
    g.output(y)
    assert y.shape == ("n", 1)
    (out,) = g.execute(np.ones(2, np.float32))
    assert out.shape == (2, 1)


def test_origin_is_recorded_and_reported():
    g = _graph(3)
    with g.origin("specs/x.yaml:12:5"), g.layer("blk.0"):
        with pytest.raises(md.GraphError, match=r"specs/x\.yaml:12:5: blk\.0: matmul"):
            md.ops.matmul(g.inputs[0], g.constant(np.ones((2, 2), np.float32)))
        y = md.ops.relu(g.inputs[0])
    assert y.node.origin == "specs/x.yaml:12:5" and y.node.layer == "blk.0"


def test_unknown_op_suggests_closest():
    g = _graph(3)
    with pytest.raises(md.GraphError, match="did you mean 'softmax'"):
        g._add_node("sofmax", [g.inputs[0]], {})


def test_unknown_attribute_is_rejected():
    g = _graph(3)
    with pytest.raises(md.GraphError, match="did you mean 'axis'"):
        md.ops._registry.apply("softmax", [g.inputs[0]], axes=0)


def test_format_system_stack_innermost_last_and_folds_library_frames():
    def inner():
        return md.format_system_stack()

    text = inner()
    lines = [ln for ln in text.splitlines() if " in " in ln]
    assert lines[-1].endswith("in inner")
    assert "test_format_system_stack" in lines[-2]
    assert "maxdecl/graph.py" not in text


def test_values_from_two_graphs_do_not_mix():
    g1, g2 = _graph(3), _graph(3)
    with pytest.raises(md.GraphError, match="belongs to graph"):
        md.ops.add(g1.inputs[0], g2.inputs[0])
