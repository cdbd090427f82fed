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


def test_integer_sum_keeps_dtype():
    x = np.arange(12, dtype=np.int32).reshape(3, 4)
    out = run_op(md.ops.sum, x, axis=0)
    assert out.dtype == np.int32 and out.tolist() == x.sum(0).tolist()


@pytest.mark.parametrize("axis,keepdims", [(-1, False), (1, True), (None, False)])
def test_argmax(rng, axis, keepdims):
    x = rng.integers(0, 4, (3, 6)).astype(np.float32)  # ties: first index, as torch
    out = run_op(md.ops.argmax, x, axis=axis, keepdims=keepdims)
    ref = torch.argmax(torch.from_numpy(x), dim=axis, keepdim=keepdims).numpy()
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
