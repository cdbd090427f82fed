"""Graph API misuse gives a md.GraphError (or SpecError) with a clear message, never a raw
TypeError/ValueError; runtime inputs bind every symbolic dim consistently."""

import numpy as np
import pytest

import maxdecl as md


@pytest.mark.parametrize("make, fragment", [
    (lambda: md.Graph("g", input_types=["float32"]), "expected a md.TensorType"),
    (lambda: md.Graph("g", input_types=5), "input_types must be a list"),
    (lambda: md.TensorType("complex64", (2,)), "unknown dtype 'complex64'"),
    (lambda: md.TensorType("float32", (-1,)), "dim -1 must be non-negative"),
    (lambda: md.TensorType("float32", (1.5,)), "must be an int or a symbolic str"),
    (lambda: md.TensorType("float32", "ab"), "a shape must be a sequence"),
])
def test_bad_types_are_graph_errors(make, fragment):
    with pytest.raises(md.GraphError, match=fragment):
        make()


def _add_weight_graph():
    g = md.Graph("g", [md.TensorType("float32", ("n",))])
    w = g.weight("w", ("float32", (2,)))
    g.output(g.inputs[0] + w)
    return g


@pytest.mark.parametrize("weights, fragment", [
    ({"w": [[1.0, 2.0]]}, "must be a NumPy array or a QuantizedTensor, got list"),
    (5, "weights must be a TensorDict or mapping"),
    ({"w": np.ones(2, np.int32)}, "is int32, expected float32"),
    ({"w": np.ones(3, np.float32)}, r"has shape \[3\], expected \[2\]"),
    ({}, "is not bound"),
])
def test_bad_weights_are_graph_errors(weights, fragment):
    with pytest.raises(md.GraphError, match=fragment):
        _add_weight_graph().execute(np.ones(2, np.float32), weights=weights)


def test_missing_spec_file_is_a_spec_error():
    with pytest.raises(md.SpecError, match="cannot read the spec"):
        md.build("/nonexistent/spec.yaml")


def test_symbolic_dims_bind_once_across_inputs():
    g = md.Graph("g", [md.TensorType("float32", ("seq", 4)), md.TensorType("int64", ("seq",)),
                       md.TensorType("float32", ("past+seq", 4)),
                       md.TensorType("float32", ("past", 4))])
    g.output(g.inputs[0])
    run = md.compile(g)
    run(np.ones((3, 4), np.float32), np.zeros(3, np.int64), np.ones((5, 4), np.float32),
        np.ones((2, 4), np.float32))
    with pytest.raises(md.GraphError, match="dim 'seq' is 3 elsewhere but 2 here"):
        run(np.ones((3, 4), np.float32), np.zeros(2, np.int64), np.ones((5, 4), np.float32),
            np.ones((2, 4), np.float32))
    with pytest.raises(md.GraphError, match="'past\\+seq' is 5 by the other inputs but 6"):
        run(np.ones((3, 4), np.float32), np.zeros(3, np.int64), np.ones((6, 4), np.float32),
            np.ones((2, 4), np.float32))


def test_compiled_graph_owns_its_plan_and_binding():
    g = _add_weight_graph()
    run = md.compile(g, {"w": np.array([1.0, 2.0], np.float32)})
    assert not any(k.startswith("_plan") or k.startswith("_binding") for k in vars(g))
    np.testing.assert_array_equal(run(np.ones(2, np.float32))[0], [2.0, 3.0])
    np.testing.assert_array_equal(g.execute(np.ones(2, np.float32),
                                            weights={"w": np.array([1.0, 2.0], np.float32)})[0],
                                  [2.0, 3.0])


@pytest.mark.parametrize("make", [
    lambda g: md.TensorType("float32", (1 << 30, 1 << 30)),
    lambda g: md.ops.adaptive_avg_pool(g.inputs[0], output_size=10 ** 9),
    lambda g: md.ops.tile(g.inputs[0], repeats=[1, 10 ** 7, 10 ** 7, 1]),
])
def test_a_static_shape_past_the_element_limit_is_refused_when_made(make):
    """A value whose known dims hold more than MAX_STATIC_ELEMENTS is an error naming
    the limit when the node is made, not an allocation or a loop at run time."""
    import time

    g = md.Graph("t", [md.TensorType("float32", ("n", 4, 4, 2))])
    t = time.perf_counter()
    with pytest.raises(md.GraphError, match="MAX_STATIC_ELEMENTS"):
        make(g)
    assert time.perf_counter() - t < 5
