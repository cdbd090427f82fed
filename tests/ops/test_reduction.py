import numpy as np
import pytest
import torch

import maxdecl as md
from ophelp import close, run_op


@pytest.mark.parametrize("axis,keepdims", [(-1, False), (0, True), ((0, 2), False), (None, False)])
def test_sum_mean_max(rng, axis, keepdims):
    x = rng.standard_normal((3, 4, 5)).astype(np.float32)
    t = torch.from_numpy(x)
    dim = tuple(range(3)) if axis is None else axis
    close(run_op(md.ops.sum, x, axis=axis, keepdims=keepdims),
          torch.sum(t, dim=dim, keepdim=keepdims).numpy(), atol=1e-5)
    close(run_op(md.ops.mean, x, axis=axis, keepdims=keepdims),
          torch.mean(t, dim=dim, keepdim=keepdims).numpy(), atol=1e-6)
    close(run_op(md.ops.max, x, axis=axis, keepdims=keepdims),
          torch.amax(t, dim=dim, keepdim=keepdims).numpy())
    close(run_op(md.ops.min, x, axis=axis, keepdims=keepdims),
          torch.amin(t, dim=dim, keepdim=keepdims).numpy())


def test_integer_sum_keeps_dtype():
    x = np.arange(12, dtype=np.int32).reshape(3, 4)
    out = run_op(md.ops.sum, x, axis=0)
    assert out.dtype == np.int32 and out.tolist() == x.sum(0).tolist()


@pytest.mark.parametrize("axis,keepdims", [(-1, False), (1, True), (None, False)])
def test_argmax_and_argmin(rng, axis, keepdims):
    x = rng.integers(0, 4, (3, 6)).astype(np.float32)  # ties: first index, as torch
    for name in ("argmax", "argmin"):
        out = run_op(getattr(md.ops, name), x, axis=axis, keepdims=keepdims)
        ref = getattr(torch, name)(torch.from_numpy(x), dim=axis, keepdim=keepdims).numpy()
        assert out.dtype == np.int64
        np.testing.assert_array_equal(out, ref)


@pytest.mark.parametrize("axis", [-1, 0, 1])
def test_softmax(rng, axis):
    x = (rng.standard_normal((4, 7, 3)) * 10).astype(np.float32)
    close(run_op(md.ops.softmax, x, axis=axis),
          torch.softmax(torch.from_numpy(x), dim=axis).numpy(), atol=1e-6)


def test_reduction_bad_axis_names_it():
    g = md.Graph("t", [md.TensorType("float32", (2, 3))])
    with pytest.raises(md.GraphError, match="axis 2 is out of range for rank 2"):
        md.ops.sum(g.inputs[0], axis=2)


@pytest.mark.parametrize("axis", [0, 1, -1])
def test_cumsum_matches_torch(rng, axis):
    import torch

    x = rng.standard_normal((3, 5, 4)).astype(np.float32)
    got = run_op(lambda v: md.ops.cumsum(v, axis=axis), x)
    want = torch.cumsum(torch.from_numpy(x), dim=axis).numpy()
    assert got.dtype == np.float32
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)
    # a long running sum of a value float32 cannot hold: torch's float64 accumulator
    third = np.full(700, np.float32(1 / 3), np.float32)
    got = run_op(md.ops.cumsum, third)
    np.testing.assert_array_equal(got, torch.cumsum(torch.from_numpy(third), 0).numpy())
    half = np.full(300, np.float16(0.1), np.float16)
    np.testing.assert_array_equal(run_op(md.ops.cumsum, half),
                                  torch.cumsum(torch.from_numpy(half), 0).numpy())
    ids = rng.integers(0, 3, (3, 7))
    mask = (ids != 1).astype(np.int64)                # RoBERTa's positions from a pad mask
    pos = run_op(lambda m: md.ops.add(md.ops.mul(md.ops.cumsum(m, axis=1), m), 1), mask)
    want = (torch.cumsum(torch.from_numpy(mask), dim=1) * torch.from_numpy(mask) + 1).numpy()
    assert pos.dtype == np.int64
    np.testing.assert_array_equal(pos, want)


@pytest.mark.parametrize("axis", [0, 1, -1])
def test_cummax_matches_torch(rng, axis):
    import torch

    x = rng.standard_normal((3, 5, 4)).astype(np.float32)
    x[1, 2, 1] = np.nan                                     # stays the maximum onwards
    got = run_op(lambda v: md.ops.cummax(v, axis=axis), x)
    want = torch.cummax(torch.from_numpy(x), dim=axis).values.numpy()
    np.testing.assert_array_equal(got, want)
    ids = rng.integers(-5, 5, (2, 9))
    np.testing.assert_array_equal(run_op(md.ops.cummax, ids),
                                  torch.cummax(torch.from_numpy(ids), dim=-1).values.numpy())
    g = md.Graph("t", [md.TensorType("bool", (2, 3))])
    with pytest.raises(md.GraphError, match="cummax of a bool tensor"):
        md.ops.cummax(g.inputs[0])


def test_cumsum_refuses_bool_and_bad_axes():
    g = md.Graph("t", [md.TensorType("bool", (2, 3)), md.TensorType("float32", (2, 3))])
    with pytest.raises(md.GraphError, match="cumsum of a bool tensor"):
        md.ops.cumsum(g.inputs[0])
    with pytest.raises(md.GraphError, match="axis 2 is out of range"):
        md.ops.cumsum(g.inputs[1], axis=2)


@pytest.mark.parametrize("axis,keepdims", [(-1, False), (0, True), ((0, 2), False),
                                           (None, False)])
def test_prod_matches_torch(rng, axis, keepdims):
    x = (1 + 0.3 * rng.standard_normal((3, 4, 5))).astype(np.float32)
    out = run_op(lambda v: md.ops.prod(v, axis=axis, keepdims=keepdims), x)
    t = torch.from_numpy(x)
    if axis is None:
        ref = torch.prod(t)
    else:
        ref = t
        for a in sorted((axis,) if isinstance(axis, int) else axis, reverse=True):
            ref = torch.prod(ref, dim=a % 3, keepdim=keepdims)
    close(out, ref.numpy(), atol=1e-6, rtol=1e-5)
    assert out.dtype == np.float32
    xi = rng.integers(-3, 4, (4, 6))
    np.testing.assert_array_equal(run_op(lambda v: md.ops.prod(v, axis=1), xi),
                                  torch.prod(torch.from_numpy(xi), 1).numpy())


@pytest.mark.parametrize("dtype", [np.float32, np.int64, np.int32])
@pytest.mark.parametrize("axis,descending", [(-1, False), (-1, True), (0, True), (1, False)])
def test_sort_matches_torch_stable(rng, dtype, axis, descending):
    """Many ties (small integers) and, for floats, NaN and signed infinities: values and
    indices equal torch.sort(stable=True)'s in both directions."""
    x = rng.integers(-3, 4, (5, 7, 6)).astype(dtype)
    if dtype == np.float32:
        x[0, 1, :3] = [np.nan, np.inf, -np.inf]
        x[2, :3, 4] = [np.nan, np.nan, -np.inf]
    values, indices = run_op(lambda v: md.ops.sort(v, axis=axis, descending=descending), x)
    ref = torch.sort(torch.from_numpy(x), dim=axis, descending=descending, stable=True)
    np.testing.assert_array_equal(values, ref.values.numpy())
    np.testing.assert_array_equal(indices, ref.indices.numpy())
    assert indices.dtype == np.int64


def test_sort_along_a_symbolic_axis_types_and_runs():
    g = md.Graph("t", [md.TensorType("float32", ("b", "seq"))])
    values, indices = md.ops.sort(g.inputs[0], descending=True)
    assert values.type.shape == ("b", "seq") and indices.type.dtype == md.DType.int64
    g.output([values, indices])
    x = np.array([[3, 1, 3, 2]], np.float32)
    v, i = g.execute(x)
    assert v.tolist() == [[3, 3, 2, 1]] and i.tolist() == [[0, 2, 3, 1]]
    with pytest.raises(md.GraphError, match="descending must be true or false"):
        md.ops.sort(g.inputs[0], descending="yes")
