import numpy as np
import pytest

import maxdecl as md
from maxdecl.ops import _registry


@pytest.fixture
def swiglu():
    @md.ops.register_custom("test_swiglu", inputs=("gate", "up"), infer=lambda g, u: g)
    def fn(gate, up):
        """SwiGLU: silu(gate) * up."""
        return (gate / (1 + np.exp(-gate)) * up).astype(gate.dtype)
    yield fn
    md.ops.unregister_custom("test_swiglu")


def test_custom_with_infer_and_signature(swiglu):
    sig = _registry.get("test_swiglu")
    assert sig.inputs == ("gate", "up") and sig.doc.startswith("SwiGLU")
    g = md.Graph("t", [md.TensorType("float32", ("seq", 8))] * 2)
    (y,) = md.ops.custom("test_swiglu", g.inputs)
    assert y.node.op == "test_swiglu" and y.shape == ("seq", 8)
    g.output(y)
    a = np.linspace(-2, 2, 24, dtype=np.float32).reshape(3, 8)
    (out,) = g.execute(a, a)
    np.testing.assert_allclose(out, swiglu(a, a))


def test_custom_several_outputs_out_types_and_attrs():
    @md.ops.register_custom("test_split2", attrs={"k": 2})
    def fn(x, k):
        return x[:, :k], x[:, k:]
    try:
        g = md.Graph("t", [md.TensorType("float32", (3, 5))])
        t = md.TensorType
        a, b = md.ops.custom("test_split2", g.inputs, k=1,
                             out_types=[t("float32", (3, 1)),
                                        {"dtype": "float32", "shape": [3, 4]}])
        g.output(a, b)
        x = np.arange(15, dtype=np.float32).reshape(3, 5)
        oa, ob = g.execute(x)
        np.testing.assert_array_equal(ob, x[:, 1:])
        with pytest.raises(md.GraphError, match="has no infer rule: pass out_types"):
            md.ops.custom("test_split2", g.inputs)
        # wrong declared type: caught when the graph runs
        g2 = md.Graph("t", [md.TensorType("float32", (3, 5))])
        outs = md.ops.custom("test_split2", g2.inputs, out_types=[t("float32", (3, 2))] * 2)
        g2.output(outs)
        with pytest.raises(md.GraphError, match=r"output 1 is float32\[3, 3\], declared"):
            g2.execute(x)
    finally:
        md.ops.unregister_custom("test_split2")


def test_custom_name_clash():
    with pytest.raises(md.GraphError, match="already registered"):
        md.ops.register_custom("add")(lambda x, y: x)


def test_entry_point_ops_load_on_demand(monkeypatch):
    """An op from an installed package (group maxdecl.ops) is found by name."""

    class EP:
        def load(self):
            md.ops.register_custom("test_plugin_double", infer=lambda x: x)(lambda x: x * 2)

    import importlib.metadata as im
    monkeypatch.setattr(im, "entry_points",
                        lambda group=None: [EP()] if group == "maxdecl.ops" else [])
    monkeypatch.setattr(_registry, "_ENTRY_POINTS_LOADED", False)
    try:
        assert _registry.get("test_plugin_double").name == "test_plugin_double"
    finally:
        md.ops.unregister_custom("test_plugin_double")


def test_a_kernel_failing_at_run_time_names_its_node_and_inputs():
    @md.ops.register_custom("test_fails", inputs=("x",), infer=lambda x: x)
    def fn(x):
        """Fails on rows of length 3."""
        if x.shape[-1] == 3:
            raise ValueError("three is not allowed")
        return x

    try:
        g = md.Graph("t", [md.TensorType("float32", ("n", "k"))])
        with g.layer("blk.0"):
            (h,) = md.ops.custom("test_fails", g.inputs)
        with g.layer("blk.1"):
            (y,) = md.ops.custom("test_fails", [md.ops.neg(h)])
        g.output(y)
        g.execute(np.ones((2, 4), np.float32))                     # fine
        with pytest.raises(md.GraphError,
                           match=r"blk\.0: test_fails: ValueError: three is not allowed "
                                 r"\(inputs: float32\[2, 3\]\)"):
            g.execute(np.ones((2, 3), np.float32))
    finally:
        md.ops.unregister_custom("test_fails")
