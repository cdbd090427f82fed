"""``attention`` and ``masked_attention`` with a KV cache for keys and values of
different head_dims (multi-head latent attention's v_head_dim): the cache holds both
at the wider one; the results equal torch's attention over the whole sequence."""

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import maxdecl as md
from maxdecl.ops import _registry

HQ, HKV = 4, 2


def _reference(q, k, v):
    """torch's causal SDPA over [T, H, D] arrays (grouped heads expanded)."""
    t = lambda a: torch.from_numpy(a).permute(1, 0, 2)  # noqa: E731
    kk = t(k).repeat_interleave(HQ // HKV, 0)
    vv = t(v).repeat_interleave(HQ // HKV, 0)
    out = F.scaled_dot_product_attention(t(q), kk, vv, is_causal=True)
    return out.permute(1, 0, 2).numpy()


def _step_graph(op, dk, dv, width):
    ins = [md.TensorType("float32", ("s", HQ, dk)), md.TensorType("float32", ("s", HKV, dk)),
           md.TensorType("float32", ("s", HKV, dv)),
           md.TensorType("float32", (2, "past", HKV, width))]
    g = md.Graph("step", ins)
    q, k, v, cache = g.inputs
    if op == "attention":
        out, new = md.ops.attention(q, k, v, cache, causal=True)
    else:
        out, new = md.ops.masked_attention(q, k, v, 0.0, cache, causal=True)
    assert new.type.shape[-1] == width and out.type.shape[-1] == dv
    g.output([out, new])
    return md.compile(g)


@pytest.mark.parametrize("op", ["attention", "masked_attention"])
@pytest.mark.parametrize("dk, dv", [(20, 12), (12, 28)])
def test_a_cache_of_the_wider_head_dim_matches_torch(op, dk, dv):
    rng = np.random.default_rng(dk + dv)
    t = 9
    q = rng.standard_normal((t, HQ, dk)).astype(np.float32)
    k = rng.standard_normal((t, HKV, dk)).astype(np.float32)
    v = rng.standard_normal((t, HKV, dv)).astype(np.float32)
    step = _step_graph(op, dk, dv, max(dk, dv))
    cache = np.zeros((2, 0, HKV, max(dk, dv)), np.float32)
    outs = []
    for a, b in ((0, 5), (5, 6), (6, 7), (7, 9)):       # a prefill, then decode steps
        out, cache = step(q[a:b], k[a:b], v[a:b], cache)
        outs.append(out)
    got = np.concatenate(outs)
    np.testing.assert_allclose(got, _reference(q, k, v), rtol=1e-5, atol=1e-5)
    assert cache.shape == (2, t, HKV, max(dk, dv))
    np.testing.assert_array_equal(cache[0, :, :, :dk], k)
    np.testing.assert_array_equal(cache[1, :, :, :dv], v)
    assert not cache[0, :, :, dk:].any() and not cache[1, :, :, dv:].any()


def test_a_batched_step_gives_each_sequence_its_solo_numbers():
    dk, dv = 20, 12
    rng = np.random.default_rng(3)
    step = _step_graph("attention", dk, dv, dk)
    batch = _registry.get("attention").batch_runner()
    attrs = dict(causal=True, scale=None, sliding_window=None, alibi_slopes=None, softcap=None)
    caches, solo, rows = [], [], []
    for n, past in ((1, 6), (2, 3)):
        cache = np.zeros((2, 0, HKV, dk), np.float32)
        _, cache = step(*(rng.standard_normal(s).astype(np.float32) for s in
                          ((past, HQ, dk), (past, HKV, dk), (past, HKV, dv))), cache)
        q, k, v = (rng.standard_normal(s).astype(np.float32) for s in
                   ((n, HQ, dk), (n, HKV, dk), (n, HKV, dv)))
        out, _ = step(q, k, v, cache.copy())
        caches.append(cache)
        solo.append(out)
        rows.append((q, k, v))
    args = [np.concatenate([r[i] for r in rows]) for i in range(3)] + [caches]
    out, new = batch(args, [1, 2], attrs)
    np.testing.assert_array_equal(out, np.concatenate(solo))
    assert [c.shape for c in new] == [(2, 7, HKV, dk), (2, 5, HKV, dk)]


def test_the_cache_width_must_be_the_wider_head_dim():
    g = md.Graph("t", [md.TensorType("float32", (3, HQ, 20)), md.TensorType("float32", (3, HKV, 20)),
                       md.TensorType("float32", (3, HKV, 12)),
                       md.TensorType("float32", (2, "past", HKV, 12))])
    with pytest.raises(md.GraphError, match=r"kv_cache\[2, past, 2, 12\] must be "
                                            r"\[2, T_past, 2, 20\]"):
        md.ops.attention(*g.inputs)
