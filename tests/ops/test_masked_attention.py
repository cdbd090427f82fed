"""masked_attention against torch's scaled_dot_product_attention with a float or bool
attn_mask: grouped-query heads, a mask broadcast over batch or heads, combined with
causal and sliding windows, ALiBi and soft-capping; with a kv cache equal to one call
over every key; and its type rule's refusals."""

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import maxdecl as md
from ophelp import close


def _torch(q, k, v, mask, causal=False, window=None, scale=None, slopes=None, softcap=None):
    """The reference: scores built as the op documents, softmax, values (float64)."""
    qt, kt, vt = (torch.from_numpy(a).double().movedim(-2, -3) for a in (q, k, v))
    group = qt.shape[-3] // kt.shape[-3]
    kt, vt = kt.repeat_interleave(group, -3), vt.repeat_interleave(group, -3)
    s, t = qt.shape[-2], kt.shape[-2]
    scale = scale if scale is not None else qt.shape[-1] ** -0.5
    sc = qt @ kt.transpose(-1, -2) * scale
    if softcap:
        sc = softcap * torch.tanh(sc / softcap)
    pos = (t - s) + torch.arange(s)[:, None]
    j = torch.arange(t)[None, :]
    if slopes is not None:
        sc = sc + torch.tensor(slopes, dtype=torch.float64)[:, None, None] * (j - pos)
    allowed = torch.ones(s, t, dtype=torch.bool)
    if causal:
        allowed &= j <= pos
    if window:
        allowed &= pos - j < window
    m = torch.from_numpy(mask)
    if m.dtype == torch.bool:
        allowed = allowed & m
    else:
        sc = sc + m.double()
    out = torch.softmax(sc.masked_fill(~allowed, -torch.inf), -1) @ vt
    return out.movedim(-3, -2).float().numpy()


def _run(q, k, v, mask, **attrs):
    g = md.Graph("t", [md.TensorType(md.DType.from_numpy(a.dtype), a.shape)
                       for a in (q, k, v, mask)])
    g.output(md.ops.masked_attention(*g.inputs, **attrs))
    return md.compile(g)(q, k, v, mask)[0]


def test_float_mask_matches_torch_sdpa(rng):
    q = rng.standard_normal((2, 5, 4, 8)).astype(np.float32)
    k = rng.standard_normal((2, 7, 2, 8)).astype(np.float32)
    v = rng.standard_normal((2, 7, 2, 6)).astype(np.float32)
    mask = rng.standard_normal((4, 5, 7)).astype(np.float32)          # per head: T5's bias
    out = _run(q, k, v, mask, causal=False)
    qt, kt, vt = (torch.from_numpy(a).movedim(-2, -3) for a in (q, k, v))
    ref = F.scaled_dot_product_attention(qt, kt.repeat_interleave(2, -3),
                                         vt.repeat_interleave(2, -3),
                                         attn_mask=torch.from_numpy(mask)).movedim(-3, -2)
    close(out, ref.numpy(), atol=2e-6, rtol=2e-5, label="float mask")


@pytest.mark.parametrize("kw", [dict(causal=True), dict(causal=True, sliding_window=3),
                                dict(causal=False, alibi_slopes=[0.5, 0.25, 0.125, 0.0625]),
                                dict(causal=True, softcap=2.0, scale=0.3)])
@pytest.mark.parametrize("kind", ["float", "bool"])
def test_masks_combine_with_the_other_rules(rng, kw, kind):
    q = rng.standard_normal((3, 6, 4, 8)).astype(np.float32)
    k = rng.standard_normal((3, 9, 4, 8)).astype(np.float32)
    v = rng.standard_normal((3, 9, 4, 8)).astype(np.float32)
    if kind == "float":        # a padding mask: batch row 1 may not see its last 3 keys
        mask = np.zeros((3, 1, 1, 9), np.float32)
        mask[1, ..., 6:] = -np.inf
    else:
        mask = rng.random((3, 1, 6, 9)) > 0.3
    out = _run(q, k, v, mask, **kw)
    ref = _torch(q, k, v, mask, causal=kw["causal"], window=kw.get("sliding_window"),
                 scale=kw.get("scale"), slopes=kw.get("alibi_slopes"), softcap=kw.get("softcap"))
    ref = np.nan_to_num(ref)                       # a query that sees no key: zeros
    close(out, ref, atol=3e-6, rtol=3e-5, label=f"{kind} {kw}")


def test_kv_cache_equals_one_call_over_every_key(rng):
    q = rng.standard_normal((7, 2, 4)).astype(np.float32)
    k = rng.standard_normal((7, 2, 4)).astype(np.float32)
    v = rng.standard_normal((7, 2, 4)).astype(np.float32)
    bias = rng.standard_normal((2, 7, 7)).astype(np.float32)
    whole = _run(q, k, v, bias, causal=True)
    g = md.Graph("t", [md.TensorType("float32", ("seq", 2, 4))] * 3
                 + [md.TensorType("float32", (2, "seq", "past+seq")),
                    md.TensorType("float32", (2, "past", 2, 4))])
    out, cache = md.ops.masked_attention(*g.inputs[:4], kv_cache=g.inputs[4], causal=True)
    g.output([out, cache])
    run = md.compile(g)
    first, c = run(q[:4], k[:4], v[:4], bias[:, :4, :4], np.zeros((2, 0, 2, 4), np.float32))
    second, _ = run(q[4:], k[4:], v[4:], bias[:, 4:, :7], c)
    close(np.concatenate([first, second]), whole, atol=1e-6, label="cache")


@pytest.mark.parametrize("shape, dtype, match", [
    ((4, 6, 9), "int64", "must be bool or q's dtype"),
    ((5, 9), "float32", "must broadcast to the scores"),
    ((4, 6, 8), "float32", "must broadcast to the scores"),
])
def test_masks_that_do_not_fit_are_refused(shape, dtype, match):
    g = md.Graph("t", [md.TensorType("float32", (6, 4, 8)), md.TensorType("float32", (9, 4, 8)),
                       md.TensorType("float32", (9, 4, 8)), md.TensorType(dtype, shape)])
    with pytest.raises(md.GraphError, match=match):
        md.ops.masked_attention(*g.inputs)


def test_a_mask_of_any_rank_that_broadcasts(rng):
    q = rng.standard_normal((5, 2, 4)).astype(np.float32)
    k = rng.standard_normal((3, 2, 4)).astype(np.float32)
    v = rng.standard_normal((3, 2, 4)).astype(np.float32)
    whole = _run(q, k, v, np.ones((1, 1, 1), bool), causal=False)
    for mask in (np.array(True), np.ones((1,), bool), np.zeros((3,), np.float32)):
        np.testing.assert_allclose(_run(q, k, v, mask, causal=False), whole, rtol=1e-6)


@pytest.mark.parametrize("op", ["attention", "masked_attention"])
@pytest.mark.parametrize("s,t", [(0, 0), (0, 5), (4, 0), (20, 0)])
def test_empty_queries_or_keys_match_torch(op, s, t):
    """No queries gives an empty result; no keys gives zeros (torch's SDPA: an empty
    softmax times an empty V), for the few-row and the general kernel."""
    rng = np.random.default_rng(s * 31 + t)
    q = rng.standard_normal((2, s, 2, 8)).astype(np.float32)
    k, v = (rng.standard_normal((2, t, 2, 8)).astype(np.float32) for _ in range(2))
    types = [md.TensorType("float32", (2, n, 2, 8)) for n in ("s", "t", "t")]
    if op == "masked_attention":
        types.append(md.TensorType("float32", (2, 1, "s", "t")))
    g = md.Graph("t", types)
    with g.layer("attn"):
        g.output(getattr(md.ops, op)(*g.inputs, causal=False))
    extra = [np.zeros((2, 1, s, t), np.float32)] if op == "masked_attention" else []
    out = g.execute(q, k, v, *extra)[0]
    ref = F.scaled_dot_product_attention(*(torch.from_numpy(a).transpose(1, 2)
                                           for a in (q, k, v))).transpose(1, 2).numpy()
    assert out.shape == ref.shape and np.array_equal(out, ref)
