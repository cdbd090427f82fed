"""``scatter`` against torch's ``Tensor.scatter`` and ``Tensor.scatter_reduce``."""

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import maxdecl as md
from ophelp import run_op

REDUCES = [None, "sum", "prod", "mean", "amax", "amin"]


def _torch(x, axis, idx, vals, reduce, include_self):
    t, i = torch.from_numpy(x.copy()), torch.from_numpy(idx.astype(np.int64))
    v = torch.from_numpy(np.array(np.broadcast_to(vals, idx.shape)))
    if reduce is None:
        return t.scatter(axis, i, v).numpy()
    return t.scatter_reduce(axis, i, v, reduce, include_self=include_self).numpy()


@st.composite
def _cases(draw):
    rank = draw(st.integers(1, 3))
    xs = draw(st.lists(st.integers(1, 5), min_size=rank, max_size=rank))
    axis = draw(st.integers(-rank, rank - 1))
    ids = [draw(st.integers(1, d)) for d in xs]           # torch: not longer than x
    ids[axis] = draw(st.integers(0, 7))                    # any count along the axis
    reduce = draw(st.sampled_from(REDUCES))
    include_self = draw(st.booleans())
    dtype = draw(st.sampled_from([np.float32, np.int64, np.int32]))
    seed = draw(st.integers(0, 2**32 - 1))
    return xs, ids, axis, reduce, include_self, dtype, seed


@settings(max_examples=150, deadline=None, derandomize=True)
@given(_cases())
def test_scatter_matches_torch(case):
    xs, ids, axis, reduce, include_self, dtype, seed = case
    rng = np.random.default_rng(seed)
    # small integers: sums and products stay exact in float32, repeats are frequent
    x = rng.integers(-4, 5, xs).astype(dtype)
    idx = rng.integers(0, xs[axis], ids).astype(np.int64)
    vals = rng.integers(-4, 5, ids).astype(dtype)
    if reduce is None:      # torch leaves a repeated index's winner unspecified: no repeats
        idx = _distinct_along(rng, xs[axis], ids, axis)
        vals = vals[tuple(slice(0, n) for n in idx.shape)]
    out = run_op(lambda a, b, c: md.ops.scatter(a, b, c, axis=axis, reduce=reduce,
                                                include_self=include_self), x, idx, vals)
    np.testing.assert_array_equal(out, _torch(x, axis, idx, vals, reduce, include_self))
    assert out.dtype == x.dtype


def _distinct_along(rng, n, ids, axis):
    """Indices with no repeat along ``axis`` (a permutation's first entries per line)."""
    k = min(ids[axis], n)
    ids = list(ids)
    ids[axis] = k
    lines = np.moveaxis(np.zeros(ids, np.int64), axis, -1)
    for pos in np.ndindex(lines.shape[:-1]):
        lines[pos] = rng.permutation(n)[:k]
    return np.ascontiguousarray(np.moveaxis(lines, -1, axis))


def test_repeated_index_takes_the_later_value_and_negative_counts_from_the_end():
    x = np.zeros((2, 4), np.float32)
    idx = np.array([[1, -3, 3], [0, 0, -1]])
    vals = np.array([[1, 2, 3], [4, 5, 6]], np.float32)
    out = run_op(lambda a, b, c: md.ops.scatter(a, b, c, axis=1), x, idx, vals)
    np.testing.assert_array_equal(out, [[0, 2, 0, 3], [5, 0, 0, 6]])


def test_scalar_values_fill_like_masked_scatter():
    """``x.scatter(1, ids, 0.0)``: a value broadcast to every index (top-k masking)."""
    x = np.arange(12, dtype=np.float32).reshape(3, 4)
    idx = np.array([[0], [3], [1]])
    out = run_op(lambda a, b, c: md.ops.scatter(a, b, c, axis=1), x, idx,
                 np.array(-1.0, np.float32))
    ref = torch.from_numpy(x).scatter(1, torch.from_numpy(idx), -1.0).numpy()
    np.testing.assert_array_equal(out, ref)


def test_float_mean_amax_with_nan_and_float_sums_in_index_order():
    x = np.array([0.5, 1.0, -2.0, 3.0], np.float32)
    idx = np.array([0, 0, 2, 3, 3, 3])
    vals = np.array([0.1, 0.7, np.nan, 1e8, 1.0, -1e8], np.float32)
    for reduce in ("mean", "amax", "amin", "sum"):
        out = run_op(lambda a, b, c: md.ops.scatter(a, b, c, axis=0, reduce=reduce), x, idx,
                     vals)
        np.testing.assert_array_equal(out, _torch(x, 0, idx, vals, reduce, True),
                                      err_msg=reduce)


def test_float16_and_bool_and_bfloat16_replace():
    x16 = np.array([1, 2, 3], np.float16)
    out = run_op(lambda a, b, c: md.ops.scatter(a, b, c, axis=0, reduce="sum"), x16,
                 np.array([2, 2]), np.array([0.5, 0.25], np.float16))
    assert out.dtype == np.float16 and out.tolist() == [1, 2, 3.75]
    xb = np.array([True, False, False])
    out = run_op(lambda a, b, c: md.ops.scatter(a, b, c, axis=0), xb, np.array([1]),
                 np.array([True]))
    assert out.tolist() == [True, True, False]
    g = md.Graph("t", [md.TensorType("bfloat16", (3,)), md.TensorType("int64", (1,)),
                       md.TensorType("bfloat16", (1,))])
    g.output(md.ops.scatter(*g.inputs, axis=0))
    (out,) = g.execute(np.array([1, 2, 3], np.uint16), np.array([0]), np.array([9], np.uint16))
    assert out.tolist() == [9, 2, 3]
    with pytest.raises(md.GraphError, match="bfloat16 is storage only"):
        md.ops.scatter(*g.inputs, axis=0, reduce="sum")


def test_scatter_refuses_bad_types_and_indices():
    g = md.Graph("t", [md.TensorType("float32", (4, 5)), md.TensorType("int64", (4,)),
                       md.TensorType("int64", (5, 2)), md.TensorType("float32", (4, 2)),
                       md.TensorType("int64", (4, 2)), md.TensorType("float32", (3, 2)),
                       md.TensorType("int64", ("n", 2)), md.TensorType("int32", (4, 2))])
    x, i1, i_long, v, idx, v_bad, i_sym, v_int = g.inputs
    with pytest.raises(md.GraphError, match="indices must have x.s rank"):
        md.ops.scatter(x, i1, v, axis=1)
    with pytest.raises(md.GraphError, match="must not be longer than x"):
        md.ops.scatter(x, i_long, v, axis=1)
    with pytest.raises(md.GraphError, match="must broadcast to indices"):
        md.ops.scatter(x, idx, v_bad, axis=1)
    with pytest.raises(md.GraphError, match="dtypes differ"):
        md.ops.scatter(x, idx, v_int, axis=1)
    with pytest.raises(md.GraphError, match="reduce must be null"):
        md.ops.scatter(x, idx, v, axis=1, reduce="max")
    with pytest.raises(md.GraphError, match="out of range"):
        md.ops.scatter(x, idx, v, axis=2)
    g.output(md.ops.scatter(x, i_sym, md.ops.slice(v, [0], [1]), axis=1))
    args = [np.zeros((4, 5), np.float32), np.zeros(4, np.int64), np.zeros((5, 2), np.int64),
            np.zeros((4, 2), np.float32), np.zeros((4, 2), np.int64),
            np.zeros((3, 2), np.float32)]
    with pytest.raises(md.GraphError, match="index 5 is out of range for axis 1 of size 5"):
        g.execute(*args, np.full((3, 2), 5, np.int64), np.zeros((4, 2), np.int32))
    with pytest.raises(md.GraphError, match=r"indices \[6, 2\] are longer than x"):
        g.execute(*args, np.zeros((6, 2), np.int64), np.zeros((4, 2), np.int32))
