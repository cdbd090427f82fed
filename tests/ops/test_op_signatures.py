"""The numpy-free signature table and the op registry agree, and the Python builders'
defaults are the signature's defaults (YAML and Python give identical nodes)."""

import pytest

import maxdecl as md
from maxdecl.ops import _registry
from maxdecl.ops._registry import apply
from maxdecl.signatures import SIGNATURES

OTHERS = {"qmatmul"}  # owned by another module


def test_every_signature_has_an_op_and_back():
    missing = [n for n in SIGNATURES if n not in _registry.REGISTRY and n not in OTHERS]
    assert not missing, f"signatures without ops: {missing}"
    leaves = {"constant", "weight", "quantize"}
    unsigned = [n for n, d in _registry.REGISTRY.items() if n not in SIGNATURES and n not in leaves]
    assert not unsigned, f"ops without signatures: {unsigned}"


def f32(*shape):
    return md.TensorType("float32", shape)


CASES = [
    ("conv2d", [f32(1, 6, 6, 2), f32(3, 3, 2, 4)], lambda a, b: md.ops.conv2d(a, b)),
    ("conv3d", [f32(1, 3, 6, 6, 2), f32(1, 3, 3, 2, 4)], lambda a, b: md.ops.conv3d(a, b)),
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
