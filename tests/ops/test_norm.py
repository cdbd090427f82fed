import numpy as np
import pytest
import torch
import torch.nn.functional as F

import maxdecl as md
from ophelp import close, run_op


@pytest.mark.parametrize("with_beta", [True, False])
def test_layer_norm_matches_torch(rng, with_beta):
    x = (rng.standard_normal((2, 5, 48)) * 3 + 1).astype(np.float32)
    g = rng.standard_normal(48).astype(np.float32)
    b = rng.standard_normal(48).astype(np.float32) if with_beta else None
    out = run_op(lambda *v: md.ops.layer_norm(*v, epsilon=1e-3), x, g, b)
    ref = F.layer_norm(torch.from_numpy(x), (48,), torch.from_numpy(g),
                       None if b is None else torch.from_numpy(b), eps=1e-3)
    close(out, ref.numpy(), atol=1e-5)


def test_rms_norm_matches_torch(rng):
    x = rng.standard_normal((3, 64)).astype(np.float32)
    w = rng.standard_normal(64).astype(np.float32)
    out = run_op(md.ops.rms_norm, x, w)
    ref = F.rms_norm(torch.from_numpy(x), (64,), torch.from_numpy(w), eps=1e-6)
    close(out, ref.numpy(), atol=1e-5)


def test_norm_float16_computes_in_float32(rng):
    x = rng.standard_normal((4, 32)).astype(np.float16)
    w = np.ones(32, np.float16)
    out = run_op(md.ops.rms_norm, x, w)
    assert out.dtype == np.float16
    ref = x.astype(np.float32) / np.sqrt((x.astype(np.float32) ** 2).mean(-1, keepdims=True) + 1e-6)
    close(out, ref.astype(np.float16), atol=2e-3, rtol=2e-3)


def test_norm_weight_size_mismatch():
    g = md.Graph("t", [md.TensorType("float32", ("seq", 64)), md.TensorType("float32", (32,))])
    with g.layer("blk"):
        with pytest.raises(md.GraphError,
                           match=r"blk: rms_norm: weight\[32\] must be x's trailing dims"):
            md.ops.rms_norm(*g.inputs)


@pytest.mark.parametrize("op", ["layer_norm", "rms_norm"])
def test_per_head_gains_match_torch(rng, op):
    """Gains of x's trailing shape ([heads, head_dim] on [seq, heads, head_dim]): each head
    its own gain (and bias), statistics over the last axis only, as torch with the gain
    broadcast; a [heads, head_dim] gain that does not match x's heads is refused."""
    x = (rng.standard_normal((5, 3, 16)) * 2 + 0.5).astype(np.float32)
    g = rng.standard_normal((3, 16)).astype(np.float32)
    b = rng.standard_normal((3, 16)).astype(np.float32)
    t = torch.from_numpy(x)
    if op == "layer_norm":
        out = run_op(lambda *v: md.ops.layer_norm(*v, epsilon=1e-5), x, g, b)
        ref = F.layer_norm(t, (16,), eps=1e-5) * torch.from_numpy(g) + torch.from_numpy(b)
    else:
        out = run_op(lambda *v: md.ops.rms_norm(*v, epsilon=1e-6), x, g)
        ref = F.rms_norm(t, (16,), eps=1e-6) * torch.from_numpy(g)
    close(out, ref.numpy(), atol=1e-5)
    gr = md.Graph("t", [md.TensorType("float32", ("seq", 4, 16)),
                        md.TensorType("float32", (3, 16))])
    with pytest.raises(md.GraphError, match=r"\[3, 16\] must be x's trailing dims"):
        getattr(md.ops, op)(*gr.inputs)


@pytest.mark.parametrize("channels_last", [True, False])
@pytest.mark.parametrize("shape, groups", [((2, 7, 5, 6), 3), ((3, 11, 8), 8), ((2, 4), 2),
                                           ((1, 3, 2, 2, 6), 1), ((2, 9, 4), 4)])
@pytest.mark.parametrize("with_beta", [True, False])
def test_group_norm_matches_torch(shape, groups, channels_last, with_beta, rng):
    c = shape[-1]
    x = (rng.standard_normal(shape) * 3 + 1).astype(np.float32)
    gamma = rng.standard_normal(c).astype(np.float32)
    beta = rng.standard_normal(c).astype(np.float32) if with_beta else None
    first = np.ascontiguousarray(np.moveaxis(x, -1, 1))             # torch's [N, C, ...]
    out = run_op(md.ops.group_norm, x if channels_last else first, gamma, groups=groups,
                 beta=beta, epsilon=1e-4, channels_last=channels_last)
    ref = F.group_norm(torch.from_numpy(first), groups, torch.from_numpy(gamma),
                       None if beta is None else torch.from_numpy(beta), eps=1e-4).numpy()
    if channels_last:
        ref = np.moveaxis(ref, 1, -1)
    close(out, ref, atol=3e-6, rtol=3e-6, label=f"group_norm {shape} / {groups}")


@pytest.mark.parametrize("kw, match", [({"groups": 4}, "do not split into 4 groups"),
                                       ({"groups": 0}, "positive int"),
                                       ({"groups": 3, "epsilon": -1.0}, "epsilon")])
def test_group_norm_refuses(kw, match):
    g = md.Graph("t", [md.TensorType("float32", (2, 5, 6)), md.TensorType("float32", (6,))])
    with pytest.raises(md.GraphError, match=match):
        md.ops.group_norm(g.inputs[0], g.inputs[1], **kw)


def test_rms_norm_without_a_weight_has_a_gain_of_ones(rng):
    x = rng.standard_normal((3, 7)).astype(np.float32)
    ones = np.ones(7, np.float32)
    np.testing.assert_array_equal(run_op(lambda v: md.ops.rms_norm(v, epsilon=1e-5), x),
                                  run_op(lambda v, w: md.ops.rms_norm(v, w, epsilon=1e-5),
                                         x, ones))


@pytest.mark.parametrize("channels_last", [True, False])
@pytest.mark.parametrize("affine", [0, 1, 2])
def test_batch_norm_matches_torch_eval(channels_last, affine, rng):
    x = (rng.standard_normal((2, 5, 4, 6)) * 2 + 1).astype(np.float32)     # NHWC
    mean, gamma, beta = (rng.standard_normal(6).astype(np.float32) for _ in range(3))
    var = (rng.random(6) + 0.1).astype(np.float32)
    first = np.ascontiguousarray(np.moveaxis(x, -1, 1))
    ins = [mean, var, gamma, beta][:2 + affine]
    out = run_op(lambda *v: md.ops.batch_norm(*v, epsilon=1e-3, channels_last=channels_last),
                 x if channels_last else first, *ins)
    ref = F.batch_norm(torch.from_numpy(first), torch.from_numpy(mean), torch.from_numpy(var),
                       torch.from_numpy(gamma) if affine > 0 else None,
                       torch.from_numpy(beta) if affine > 1 else None,
                       training=False, eps=1e-3).numpy()
    close(out, np.moveaxis(ref, 1, -1) if channels_last else ref, atol=3e-6, rtol=3e-6,
          label="batch_norm")


def test_batch_norm_statistics_must_be_per_channel():
    g = md.Graph("t", [md.TensorType("float32", (2, 3, 6)), md.TensorType("float32", (5,)),
                       md.TensorType("float32", (6,))])
    with pytest.raises(md.GraphError, match=r"mean\[5\] must be \[6\]"):
        md.ops.batch_norm(*g.inputs)


@pytest.mark.parametrize("shape, axis, p", [((3, 16), -1, 2.0), ((2, 5, 8), 1, 2.0),
                                            ((4, 7), 0, 1.0), ((2, 3, 6), -1, 3.0)])
def test_normalize_matches_torch(shape, axis, p, rng):
    x = rng.standard_normal(shape).astype(np.float32)
    x[0] = 0.0                                           # a zero row: epsilon decides
    out = run_op(md.ops.normalize, x, axis=axis, p=p)
    ref = F.normalize(torch.from_numpy(x), p=p, dim=axis).numpy()
    close(out, ref, atol=1e-6, rtol=1e-5, label=f"normalize {shape} {axis} {p}")
    half = run_op(md.ops.normalize, x.astype(np.float16), axis=axis, p=p)
    assert half.dtype == np.float16
    close(half.astype(np.float32), ref, atol=2e-3, rtol=2e-3)


def test_normalize_refuses_bad_attributes():
    g = md.Graph("t", [md.TensorType("float32", (3, 4))])
    with pytest.raises(md.GraphError, match="axis 2 is out of range"):
        md.ops.normalize(g.inputs[0], axis=2)
    with pytest.raises(md.GraphError, match="p must be > 0"):
        md.ops.normalize(g.inputs[0], p=0)
