"""Every op is defined once (maxdecl.ops._registry.define): the definition is complete,
its runtime resolves, its public builder exists, and the Python builders' defaults are
the definition's defaults (YAML and Python give identical nodes)."""

import pytest

import maxdecl as md
from maxdecl.ops import _registry
from maxdecl.ops._registry import apply

SPEC_OPS = _registry.spec_ops()


@pytest.mark.parametrize("name", SPEC_OPS)
def test_every_op_definition_is_complete_and_runs(name):
    d = _registry.get(name)
    assert d.doc and d.rule_doc, f"{name}: doc and rule_doc document the op"
    assert callable(d.rule)
    assert callable(d.runner()), f"{name}: its runtime resolves"
    builder = getattr(md.ops, name, None)
    assert callable(builder), f"md.ops.{name} is its public builder"


def test_linear_attention_and_split_carry_their_output_counts():
    assert _registry.get("attention").n_outputs(3, {}) == 1
    assert _registry.get("attention").n_outputs(4, {}) == 2
    assert _registry.get("split").n_outputs(1, {"sizes": [1, 2, 3]}) == 3
    assert _registry.get("max_pool").n_outputs(1, {"kernel_size": 2}) == 1
    assert _registry.get("max_pool").n_outputs(1, {"return_indices": True}) == 2
    assert _registry.get("linear").arity() == (2, 3)


def f32(*shape):
    return md.TensorType("float32", shape)


CASES = [
    ("conv2d", [f32(1, 6, 6, 2), f32(3, 3, 2, 4)], lambda a, b: md.ops.conv2d(a, b)),
    ("conv3d", [f32(1, 3, 6, 6, 2), f32(1, 3, 3, 2, 4)], lambda a, b: md.ops.conv3d(a, b)),
    ("conv_transpose", [f32(1, 6, 6, 2), f32(3, 3, 4, 2)],
     lambda a, b: md.ops.conv_transpose(a, b)),
    ("avg_pool", [f32(1, 6, 6, 2)], lambda a: md.ops.avg_pool(a, kernel_size=2)),
    ("max_pool", [f32(1, 6, 6, 2)], lambda a: md.ops.max_pool(a, kernel_size=2)),
    ("layer_norm", [f32(3, 8), f32(8)], lambda a, b: md.ops.layer_norm(a, b)),
    ("rms_norm", [f32(3, 8), f32(8)], lambda a, b: md.ops.rms_norm(a, b)),
    ("rope", [f32(5, 2, 8), md.TensorType("int64", (5,))], lambda a, b: md.ops.rope(a, b)),
    ("attention", [f32(5, 2, 8)] * 3, lambda a, b, c: md.ops.attention(a, b, c)),
    ("softmax", [f32(3, 8)], lambda a: md.ops.softmax(a)),
    ("sum", [f32(3, 8)], lambda a: md.ops.sum(a)),
    ("argmax", [f32(3, 8)], lambda a: md.ops.argmax(a)),
]


@pytest.mark.parametrize("name,types,call", CASES, ids=[c[0] for c in CASES])
def test_python_defaults_equal_signature_defaults(name, types, call):
    g = md.Graph("t", types)
    required = {"avg_pool": {"kernel_size": 2}, "max_pool": {"kernel_size": 2}}.get(name, {})
    via_yaml = apply(name, list(g.inputs), **required)[0]   # what a spec does: names + attrs
    via_python = call(*g.inputs)
    assert via_yaml.node.attrs == via_python.node.attrs
    assert via_yaml.type == via_python.type


def test_no_numba_when_building():
    import subprocess
    import sys
    code = ("import sys, maxdecl as md, numpy as np\n"
            "g = md.Graph('t', [md.TensorType('float32', (1, 4, 4, 2))])\n"
            "md.ops.conv2d(g.inputs[0], np.ones((3, 3, 2, 2), np.float32), padding=1)\n"
            "assert 'numba' not in sys.modules\n")
    subprocess.run([sys.executable, "-c", code], check=True)


@pytest.mark.parametrize("name", [n for n in SPEC_OPS if _registry.get(n).kind != "custom"])
def test_public_builders_take_their_signature_from_the_definition(name):
    import inspect

    d = _registry.get(name)
    params = inspect.signature(getattr(md.ops, name)).parameters
    assert list(params)[:len(d.inputs)] == list(d.inputs)
    for attr, default in d.attrs.items():
        want = inspect.Parameter.empty if default is _registry.REQUIRED else default
        assert params[attr].default == want, f"{name}.{attr}"
    for opt in d.optional:
        assert params[opt].default is None
