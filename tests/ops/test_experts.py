"""topk and expert_linear against torch (and a per-token reference for the experts)."""

import numpy as np
import pytest
import torch

import maxdecl as md
from ophelp import close, run_op


@pytest.mark.parametrize("shape,k,axis", [((5, 8), 2, -1), ((3, 7, 4), 3, 1), ((9,), 9, 0),
                                          ((2, 300), 40, -1), ((4, 6), 1, 0)])
def test_topk_matches_torch(rng, shape, k, axis):
    x = rng.standard_normal(shape).astype(np.float32)
    v, i = run_op(lambda a: md.ops.topk(a, k, axis=axis), x)
    tv, ti = torch.topk(torch.from_numpy(x), k, dim=axis)
    assert i.dtype == np.int64
    np.testing.assert_array_equal(v, tv.numpy())
    np.testing.assert_array_equal(i, ti.numpy())


def test_topk_ties_take_the_lower_index_first():
    x = np.array([[1, 3, 3, 0, 3, 2], [5, 5, 5, 5, 5, 5]], np.float32)
    v, i = run_op(lambda a: md.ops.topk(a, 4), x)
    np.testing.assert_array_equal(i, [[1, 2, 4, 5], [0, 1, 2, 3]])
    np.testing.assert_array_equal(v, [[3, 3, 3, 2], [5, 5, 5, 5]])
    xi = np.array([4, -1, 7, 7], np.int64)
    v, i = run_op(lambda a: md.ops.topk(a, 3), xi)
    np.testing.assert_array_equal(v, [7, 7, 4])
    np.testing.assert_array_equal(i, [2, 3, 0])


def test_topk_rejects_k_larger_than_axis():
    g = md.Graph("t", input_types=[md.TensorType(md.DType.float32, (3, 4))])
    with pytest.raises(md.GraphError, match=r"topk: k=5 exceeds the size 4"):
        md.ops.topk(g.inputs[0], 5)


def _reference(x, w, ids, bias=None):
    """Token by token, slot by slot: x_j @ w[ids[j]].T (+ bias)."""
    t, k = ids.shape
    out = np.zeros((t, k, w.shape[1]), np.float64)
    for a in range(t):
        for j in range(k):
            row = x[a] if x.ndim == 2 else x[a, j]
            out[a, j] = w[ids[a, j]].astype(np.float64) @ row
            if bias is not None:
                out[a, j] += bias[ids[a, j]]
    return out


@pytest.mark.parametrize("per_slot", [False, True])
@pytest.mark.parametrize("tokens", [1, 7])
def test_expert_linear_float_matches_torch(rng, per_slot, tokens):
    e, n, kk, slots = 5, 6, 16, 2
    x = rng.standard_normal((tokens, slots, kk) if per_slot else (tokens, kk)).astype(np.float32)
    w = rng.standard_normal((e, n, kk)).astype(np.float32)
    b = rng.standard_normal((e, n)).astype(np.float32)
    ids = np.stack([rng.choice(e, slots, replace=False) for _ in range(tokens)]).astype(np.int64)
    out = run_op(lambda a, c, d, f: md.ops.expert_linear(a, c, d, f), x, w, ids, b)
    tw, tx = torch.from_numpy(w), torch.from_numpy(x)
    sel = tw[torch.from_numpy(ids)]                               # [T, k, N, K]
    xs = tx if per_slot else tx[:, None, :].expand(tokens, slots, kk)
    ref = torch.einsum("tjnk,tjk->tjn", sel, xs) + torch.from_numpy(b)[torch.from_numpy(ids)]
    close(out, ref.numpy(), atol=1e-5)


@pytest.mark.parametrize("enc", ["q4_0", "q8_0", "q4_k", "q6_k", "bf16"])
@pytest.mark.parametrize("tokens", [1, 9])
def test_expert_linear_quantized_reads_per_expert_blocks(rng, enc, tokens):
    e, n, kk, slots = 4, 24, 256, 2
    codec = md.codecs.get(enc)
    w = rng.standard_normal((e, n, kk)).astype(np.float32)
    wq = md.QuantizedTensor(codec.quantize(w), w.shape, enc)
    deq = wq.dequantize()
    x = rng.standard_normal((tokens, kk)).astype(np.float32)
    ids = np.stack([rng.choice(e, slots, replace=False) for _ in range(tokens)]).astype(np.int64)
    g = md.Graph("t", input_types=[md.TensorType(md.DType.float32, x.shape),
                                   md.TensorType(md.DType.int64, ids.shape)])
    wv = g.weight("w", md.TensorType(md.DType.float32, w.shape), enc)
    g.output(md.ops.expert_linear(g.inputs[0], wv, g.inputs[1]))
    (out,) = md.compile(g, {"w": wq})(x, ids)
    ref = _reference(x, deq, ids)
    assert np.abs(out - ref).max() <= 1e-5 * np.abs(ref).max()


def test_expert_linear_never_reads_unchosen_experts(rng):
    """Experts nobody chose hold NaN bytes: the output stays finite."""
    e, n, kk = 6, 8, 32
    w = rng.standard_normal((e, n, kk)).astype(np.float32)
    q = md.codecs.get("q8_0").quantize(w)
    q[[0, 2, 3, 5]] = 0xFF                    # f16 scale 0xFFFF: NaN
    wq = md.QuantizedTensor(q, w.shape, "q8_0")
    x = rng.standard_normal((1, kk)).astype(np.float32)
    ids = np.array([[4, 1]], np.int64)
    g = md.Graph("t", input_types=[md.TensorType(md.DType.float32, x.shape),
                                   md.TensorType(md.DType.int64, ids.shape)])
    g.output(md.ops.expert_linear(g.inputs[0], g.weight("w", md.TensorType(
        md.DType.float32, w.shape), "q8_0"), g.inputs[1]))
    (out,) = md.compile(g, {"w": wq})(x, ids)
    assert np.isfinite(out).all()
    ref = _reference(x, wq.dequantize(), ids)
    assert np.abs(out - ref).max() <= 1e-5 * np.abs(ref).max()


def test_expert_linear_rejects_bad_ids_and_shapes(rng):
    x = rng.standard_normal((2, 8)).astype(np.float32)
    w = rng.standard_normal((3, 4, 8)).astype(np.float32)
    with pytest.raises(md.GraphError, match=r"expert_linear: ids\[2, 1\] holds 3, outside 0..2"):
        run_op(md.ops.expert_linear, x, w, np.array([[0], [3]], np.int64))
    g = md.Graph("t", input_types=[md.TensorType(md.DType.float32, (2, 8)),
                                   md.TensorType(md.DType.float32, (3, 8)),
                                   md.TensorType(md.DType.int64, (2, 1))])
    with pytest.raises(md.GraphError, match=r"must be 3-D \[n_expert, N, K\]"):
        md.ops.expert_linear(*g.inputs)


def test_topk_ranks_nan_highest_as_torch():
    x = np.array([[0.5, np.nan, 2.0, -1.0, np.nan]], np.float32)
    v, i = run_op(lambda a: md.ops.topk(a, 3), x)
    tv, ti = torch.topk(torch.from_numpy(x), 3)
    np.testing.assert_array_equal(i, ti.numpy())
    np.testing.assert_array_equal(v, tv.numpy())
