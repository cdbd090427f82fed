import numpy as np
import pytest
import torch
import torch.nn.functional as F

import maxdecl as md
from ophelp import close, run_op

UNARY = {
    "neg": torch.neg, "abs": torch.abs, "exp": torch.exp, "log": torch.log, "sqrt": torch.sqrt,
    "rsqrt": torch.rsqrt, "tanh": torch.tanh, "sigmoid": torch.sigmoid, "relu": F.relu,
    "silu": F.silu, "gelu": F.gelu, "gelu_tanh": lambda t: F.gelu(t, approximate="tanh"),
    "sin": torch.sin, "cos": torch.cos, "expm1": torch.expm1, "log1p": torch.log1p,
    "floor": torch.floor, "ceil": torch.ceil, "round": torch.round, "sign": torch.sign,
    "log2": torch.log2, "log10": torch.log10, "exp2": torch.exp2, "tan": torch.tan,
    "atan": torch.atan, "logsigmoid": F.logsigmoid, "erf": torch.erf, "lgamma": torch.lgamma,
}
BINARY = {"add": torch.add, "sub": torch.sub, "mul": torch.mul, "div": torch.div,
          "pow": torch.pow, "maximum": torch.maximum, "minimum": torch.minimum,
          "mod": torch.remainder}


@pytest.mark.parametrize("name", sorted(UNARY))
def test_unary_matches_torch(name, rng):
    x = rng.standard_normal((3, 17)).astype(np.float32) * 3
    if name in ("log", "sqrt", "rsqrt", "log1p", "log2", "log10"):
        x = np.abs(x) + 0.1
    if name == "tan":
        x = np.clip(x, -1.4, 1.4)                          # away from the poles
    if name in ("expm1", "log1p"):
        x[0, :5] = [1e-7, -3e-8, 2e-6, 0.0, 5e-5]        # where exp(x) - 1 loses digits
    if name in ("floor", "ceil", "round", "sign"):
        x[0, :6] = [0.5, 1.5, -2.5, -0.0, 0.0, 3.0]        # halves round to even; zeros
    out = run_op(getattr(md.ops, name), x)
    close(out, UNARY[name](torch.from_numpy(x)).numpy(), atol=2e-6, rtol=2e-6, label=name)
    assert out.dtype == np.float32


@pytest.mark.parametrize("name", sorted(BINARY))
def test_binary_broadcasts_like_torch(name, rng):
    x = rng.standard_normal((2, 1, 5)).astype(np.float32)
    y = rng.standard_normal((4, 1)).astype(np.float32)
    if name == "pow":
        x = np.abs(x) + 0.5
    out = run_op(getattr(md.ops, name), x, y)
    close(out, BINARY[name](torch.from_numpy(x), torch.from_numpy(y)).numpy(), label=name)


def test_integer_div_and_mod_floor_and_keep_the_dtype():
    """div of integers is floor division (the type rule's int64, not NumPy's float64
    true division), mod takes the divisor's sign, as torch's floor div and remainder."""
    x = np.array([-7, 7, 6, -6, 0], np.int64)
    y = np.array([3, -3, 4, 4, 5], np.int64)
    for name, ref in (("div", lambda a, b: torch.div(a, b, rounding_mode="floor")),
                      ("mod", torch.remainder)):
        out = run_op(getattr(md.ops, name), x, y)
        assert out.dtype == np.int64
        np.testing.assert_array_equal(out, ref(torch.from_numpy(x), torch.from_numpy(y)))
    g = md.Graph("t", [md.TensorType("int64", ("s",))] * 2)
    g.output(md.ops.mod(*g.inputs))
    with pytest.raises(md.GraphError, match="integer modulo by zero"):
        g.execute(np.array([1]), np.array([0]))


def test_binary_shape_mismatch_is_graph_error():
    g = md.Graph("t", [md.TensorType("float32", (2, 3)), md.TensorType("float32", (4,))])
    with pytest.raises(md.GraphError, match=r"add.*\[2, 3\].*\[4\]"):
        md.ops.add(*g.inputs)


def test_activation_kinds_match_transformers_act2fn(rng):
    """``activation(kind=...)`` for every kind equals transformers' ACT2FN[kind] (the
    functions config.json's ``hidden_act`` names; ``gelu_tanh``, ``identity``,
    ``softplus`` and torch's hard / exponential activations, not HF names, against
    torch); an unknown kind is a clear error."""
    act2fn = pytest.importorskip("transformers.activations").ACT2FN
    from maxdecl.ops.elementwise import ACTIVATIONS

    x = (rng.standard_normal((4, 33)) * 4).astype(np.float32)
    x[0, :3] = [0.0, -0.0, 6.5]
    for kind in ACTIVATIONS:
        t = torch.from_numpy(x)
        fn = {"identity": lambda v: v, "gelu_tanh": UNARY["gelu_tanh"],
              "softplus": F.softplus, "hardswish": F.hardswish, "hardsigmoid": F.hardsigmoid,
              "elu": F.elu, "selu": F.selu, "softsign": F.softsign}.get(kind)
        ref = (fn or act2fn[kind])(t).numpy()
        out = run_op(lambda v, k=kind: md.ops.activation(v, kind=k), x)
        close(out, ref, atol=3e-6, rtol=3e-6, label=kind)
        assert out.dtype == np.float32
    g = md.Graph("t", [md.TensorType("float32", (2, 3))])
    with pytest.raises(md.GraphError, match="unknown activation kind 'gelu_neww'.*gelu_new"):
        md.ops.activation(g.inputs[0], kind="gelu_neww")


@pytest.mark.parametrize("name, ref", [
    ("equal", torch.eq), ("not_equal", torch.ne), ("greater", torch.gt),
    ("greater_equal", torch.ge), ("less", torch.lt), ("less_equal", torch.le),
])
def test_comparisons_match_torch(name, ref, rng):
    """Comparisons broadcast like torch and give bool; a Python number takes the other
    input's dtype; the inputs must share a dtype."""
    x = rng.integers(-2, 3, (3, 1, 5)).astype(np.float32)
    y = rng.integers(-2, 3, (4, 1)).astype(np.float32)
    out = run_op(getattr(md.ops, name), x, y)
    assert out.dtype == np.bool_
    np.testing.assert_array_equal(out, ref(torch.from_numpy(x), torch.from_numpy(y)).numpy())
    g = md.Graph("t", [md.TensorType("float32", (3,)), md.TensorType("int64", (3,))])
    assert getattr(md.ops, name)(g.inputs[0], 1.0).type.dtype == md.DType.bool
    with pytest.raises(md.GraphError, match="dtypes differ"):
        getattr(md.ops, name)(*g.inputs)


def test_logical_ops_match_numpy_and_take_only_bools(rng):
    a = rng.random((2, 5)) > 0.5
    b = rng.random((5,)) > 0.5
    np.testing.assert_array_equal(run_op(md.ops.logical_and, a, b), a & b)
    np.testing.assert_array_equal(run_op(md.ops.logical_or, a, b), a | b)
    np.testing.assert_array_equal(run_op(md.ops.logical_not, a), ~a)
    g = md.Graph("t", [md.TensorType("float32", (3,))])
    with pytest.raises(md.GraphError, match="logical ops take bool inputs"):
        md.ops.logical_not(g.inputs[0])


def test_a_number_beside_a_bool_condition_takes_the_values_dtype():
    """``select(cond, 0.0, x)``: the literal takes x's dtype, not the condition's."""
    g = md.Graph("t", [md.TensorType("bool", (4,)), md.TensorType("float32", (4,))])
    y = md.ops.select(g.inputs[0], 0.0, g.inputs[1])
    assert y.type.dtype == md.DType.float32
    g.output(y)
    (out,) = g.execute(np.array([True, False, True, False]), np.arange(4, dtype=np.float32))
    np.testing.assert_array_equal(out, [0, 1, 0, 3])


def test_numbers_beside_only_a_bool_condition_keep_their_own_dtype(tmp_path):
    """``select(cond, 0.0, -100.0)`` (a mask from a bool): float32 values, in the Python
    API and in a spec (checked and built), not the condition's bool."""
    g = md.Graph("t", [md.TensorType("bool", (3,))])
    y = md.ops.select(g.inputs[0], 0.0, -100.0)
    z = md.ops.select(g.inputs[0], 1, 7)
    assert y.type.dtype == md.DType.float32 and z.type.dtype == md.DType.int64
    g.output(y, z)
    a, b = g.execute(np.array([True, False, True]))
    assert a.tolist() == [0.0, -100.0, 0.0] and b.tolist() == [1, 7, 1]
    spec = tmp_path / "mask.yaml"
    spec.write_text("""maxdecl: 1
name: mask
default_variant: one
variants: {one: {}}
dims: {seq: positions}
encodings: {default: f32}
inputs:
  keep: {dtype: bool, shape: [seq]}
  x: {dtype: float32, shape: [seq]}
layers:
  - {op: select, in: [keep, 0.0, -100.0], out: bias}
  - {op: add, in: [x, bias], out: y}
outputs: [y]
""")
    g = md.build(md.load_spec(spec))
    (out,) = g.execute(np.array([True, False]), np.array([1.0, 2.0], np.float32))
    assert out.tolist() == [1.0, -98.0]


@pytest.mark.parametrize("lo, hi", [(-1.0, 0.5), (None, 0.25), (-0.5, None), (None, None),
                                    (0.3, 0.3)])
@pytest.mark.parametrize("dtype", [np.float32, np.int64])
def test_clamp_matches_torch(lo, hi, dtype, rng):
    x = (rng.standard_normal((4, 9)) * 3).astype(dtype)
    if dtype == np.float32:
        x[0, 0] = np.nan
    else:
        lo, hi = (None if v is None else int(np.floor(v * 4)) for v in (lo, hi))
    out = run_op(md.ops.clamp, x, min=lo, max=hi)
    # torch refuses two None bounds; here that is the identity (OLMo's clip_qkv null)
    want = x if lo is None and hi is None else torch.clamp(torch.from_numpy(x), lo, hi).numpy()
    np.testing.assert_array_equal(out, want)
    assert out.dtype == dtype


@pytest.mark.parametrize("attrs, match", [({"min": 1.0, "max": 0.0}, "greater than max"),
                                          ({"min": "a"}, "a number or None"),
                                          ({"max": True}, "a number or None")])
def test_clamp_bad_bounds_are_refused(attrs, match):
    g = md.Graph("t", [md.TensorType("float32", (3,))])
    with pytest.raises(md.GraphError, match=match):
        md.ops.clamp(g.inputs[0], **attrs)


def test_expm1_and_log1p_keep_their_digits_near_zero():
    x = np.array([1e-7, -3e-8, 2e-6], np.float32)
    for name, ref in (("expm1", np.expm1), ("log1p", np.log1p)):
        out = run_op(getattr(md.ops, name), x)
        np.testing.assert_allclose(out, ref(x.astype(np.float64)), rtol=1e-6)


@pytest.mark.parametrize("shape,axis", [((3, 8), -1), ((4, 6, 5), 1), ((2, 3), 0)])
def test_glu_matches_torch(rng, shape, axis):
    x = rng.standard_normal(shape).astype(np.float32)
    out = run_op(lambda v: md.ops.glu(v, axis=axis), x)
    want = torch.nn.functional.glu(torch.from_numpy(x), axis).numpy()
    assert out.shape == want.shape
    np.testing.assert_allclose(out, want, rtol=1e-6, atol=1e-7)


def test_glu_halves_the_axis():
    g = md.Graph("t", [md.TensorType("float32", ("seq", 6)), md.TensorType("float32", (5,))])
    assert md.ops.glu(g.inputs[0], axis=0).shape == ("div(seq,2)", 6)
    with pytest.raises(md.GraphError, match="whose size 5 is not even"):
        md.ops.glu(g.inputs[1])
    g.output(md.ops.glu(g.inputs[0], axis=0))
    with pytest.raises(md.GraphError, match="odd"):
        md.compile(g)(np.zeros((3, 6), np.float32), np.zeros(5, np.float32))


@pytest.mark.parametrize("slope", [0.01, 0.2, 0.15, -0.5])
def test_leaky_relu_matches_torch(rng, slope):
    x = rng.standard_normal((3, 17)).astype(np.float32) * 3
    x[0, :3] = [0.0, -0.0, np.inf]
    out = run_op(lambda v: md.ops.leaky_relu(v, negative_slope=slope), x)
    np.testing.assert_array_equal(out, F.leaky_relu(torch.from_numpy(x), slope).numpy())


def test_lgamma_poles_and_specials_match_torch():
    """lgamma at the poles (0 and the negative integers: inf), near them, at inf and NaN,
    and far out (1e30), as torch.lgamma gives them."""
    x = np.array([0.0, -0.0, -1.0, -7.0, -0.5, -1e-6, 1e-8, 1.0, 2.0, 3.5, 40.0, 1e30, -3.3,
                  np.inf, -np.inf, np.nan], np.float32)
    out = run_op(md.ops.lgamma, x)
    np.testing.assert_allclose(out, torch.lgamma(torch.from_numpy(x)).numpy(), rtol=1e-6,
                               atol=1e-6)
