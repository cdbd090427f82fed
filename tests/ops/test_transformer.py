import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import maxdecl as md
from ophelp import close, run_op


# -- embedding --------------------------------------------------------------------------
def test_embedding_float(rng):
    table = rng.standard_normal((10, 6)).astype(np.float32)
    ids = np.array([[3, 0, 9], [9, 9, 1]], np.int64)
    out = run_op(md.ops.embedding, table, ids)
    np.testing.assert_array_equal(out, F.embedding(torch.from_numpy(ids),
                                                   torch.from_numpy(table)).numpy())


@pytest.mark.parametrize("n_ids", [3, 40])   # a few rows (decoded serially) and many
@pytest.mark.parametrize("enc", ["q8_0", "q4_0", "q5_0", "q4_k", "q6_k", "bf16"])
def test_embedding_quantized_dequantizes_gathered_rows(rng, enc, n_ids):
    table = rng.standard_normal((7, 256)).astype(np.float32)
    g = md.Graph("t", [md.TensorType("int32", ("seq",))])
    t = g.quantize(table, enc)
    y = md.ops.embedding(t, g.inputs[0])
    assert y.dtype == md.DType.float32 and y.shape == ("seq", 256)
    g.output(y)
    ids = rng.integers(0, 7, n_ids).astype(np.int32)
    (out,) = g.execute(ids)
    full = md.codecs.get(enc).dequantize(md.codecs.get(enc).quantize(table), table.shape)
    np.testing.assert_array_equal(out, full[ids])


def test_embedding_id_out_of_range():
    with pytest.raises(md.GraphError, match="id 10 is out of range for a table of 10 rows"):
        run_op(md.ops.embedding, np.zeros((10, 2), np.float32), np.array([10], np.int64))


# -- rope -------------------------------------------------------------------------------
def rope_ref(x, pos, theta, style, scale=1.0, dim=None, factors=None):
    """torch reference: HF rotate_half for neox, Meta's complex pairs for normal;
    ``factors`` divide the frequencies (llama.cpp's rope_freqs)."""
    t = torch.from_numpy(x).double()
    d = dim or x.shape[-1]
    inv = 1.0 / (theta ** (torch.arange(0, d, 2, dtype=torch.float64) / d))
    if factors is not None:
        inv = inv / torch.from_numpy(np.asarray(factors, np.float64))
    ang = (torch.from_numpy(pos).double() / scale)[:, None] * inv[None]   # [S, d/2]
    rot, rest = t[..., :d], t[..., d:]
    if style == "neox":
        cos = torch.cat([ang.cos(), ang.cos()], -1)[:, None]
        sin = torch.cat([ang.sin(), ang.sin()], -1)[:, None]
        half = torch.cat([-rot[..., d // 2:], rot[..., :d // 2]], -1)
        out = rot * cos + half * sin
    else:
        c = torch.view_as_complex(rot.reshape(*rot.shape[:-1], d // 2, 2).contiguous())
        out = torch.view_as_real(c * torch.polar(torch.ones_like(ang), ang)[:, None])
        out = out.reshape(rot.shape)
    return torch.cat([out, rest], -1).numpy()


@pytest.mark.parametrize("style", ["normal", "neox"])
@pytest.mark.parametrize("scale,dim", [(1.0, None), (4.0, 8)])
def test_rope_matches_reference(rng, style, scale, dim):
    x = rng.standard_normal((2, 5, 3, 16)).astype(np.float32)
    pos = np.array([0, 1, 7, 100, 2047], np.int64)
    out = run_op(lambda v, p: md.ops.rope(v, p, theta=10000.0, style=style, scale=scale,
                                          dim=dim), x, pos)
    close(out, rope_ref(x, pos, 10000.0, style, scale, dim), atol=2e-6)
    if dim:
        np.testing.assert_array_equal(out[..., dim:], x[..., dim:])


@pytest.mark.parametrize("style", ["normal", "neox"])
def test_rope_takes_a_position_per_row(rng, style):
    """positions [batch, seq] (left-padded rows start at different positions): each row
    rotated by its own positions, as HF's position_ids; a wrong shape is refused."""
    x = rng.standard_normal((3, 4, 2, 16)).astype(np.float32)
    pos = np.array([[0, 1, 2, 3], [0, 0, 0, 1], [5, 6, 7, 8]], np.int64)
    out = run_op(lambda v, p: md.ops.rope(v, p, theta=10000.0, style=style), x, pos)
    for b in range(3):
        close(out[b], rope_ref(x[b], pos[b], 10000.0, style), atol=2e-6)
    g = md.Graph("t", [md.TensorType("float32", (3, 4, 2, 16)),
                       md.TensorType("int64", (4, 3))])
    with pytest.raises(md.GraphError, match="or x's leading dims"):
        md.ops.rope(*g.inputs, theta=10000.0)


def test_rope_neox_matches_hf_llama(rng):
    from transformers.models.llama.modeling_llama import apply_rotary_pos_emb
    q = rng.standard_normal((1, 4, 6, 32)).astype(np.float32)      # HF: [B, H, S, D]
    pos = np.arange(3, 9)
    inv = 1.0 / (500000.0 ** (torch.arange(0, 32, 2).float() / 32))
    freqs = torch.from_numpy(pos).float()[:, None] * inv[None]
    emb = torch.cat([freqs, freqs], -1)[None]
    ref, _ = apply_rotary_pos_emb(torch.from_numpy(q), torch.from_numpy(q), emb.cos(), emb.sin())
    out = run_op(lambda v, p: md.ops.rope(v, p, theta=500000.0, style="neox"),
                 q.transpose(0, 2, 1, 3).copy(), pos)
    close(out, ref.numpy().transpose(0, 2, 1, 3), atol=1e-5)


@pytest.mark.parametrize("style", ["normal", "neox"])
@pytest.mark.parametrize("dim", [None, 8])
def test_rope_freq_factors_divide_the_frequencies(rng, style, dim):
    x = rng.standard_normal((2, 5, 3, 16)).astype(np.float32)
    pos = np.array([0, 1, 7, 100, 2047], np.int64)
    f = rng.uniform(0.5, 8.0, (dim or 16) // 2).astype(np.float32)
    out = run_op(lambda v, p, ff: md.ops.rope(v, p, theta=500000.0, style=style, dim=dim,
                                              freq_factors=ff), x, pos, f)
    close(out, rope_ref(x, pos, 500000.0, style, 1.0, dim, f), atol=2e-6)
    plain = run_op(lambda v, p: md.ops.rope(v, p, theta=500000.0, style=style, dim=dim), x, pos)
    assert np.abs(out - plain).max() > 0.1                       # the factors matter
    ones = run_op(lambda v, p, ff: md.ops.rope(v, p, theta=500000.0, style=style, dim=dim,
                                               freq_factors=ff),
                  x, pos, np.ones_like(f))
    np.testing.assert_array_equal(ones, plain)                   # ...and 1 is the identity


def test_rope_freq_factors_match_hf_llama3_scaling(rng):
    """Llama 3.1 rope_scaling: llama3_rope_factors + rope == HF's llama3 rotary embedding."""
    import transformers
    from transformers.models.llama.modeling_llama import (LlamaRotaryEmbedding,
                                                          apply_rotary_pos_emb)

    from maxdecl.spec.expr import llama3_rope_factors

    scaling = dict(rope_type="llama3", factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0,
                   original_max_position_embeddings=64)
    cfg = transformers.LlamaConfig(hidden_size=256, num_attention_heads=4,
                                   max_position_embeddings=256, rope_theta=500000.0,
                                   rope_scaling=scaling)
    emb = LlamaRotaryEmbedding(cfg)
    q = rng.standard_normal((1, 4, 6, 64)).astype(np.float32)       # HF: [B, H, S, D]
    pos = np.array([0, 3, 17, 63, 64, 200])
    cos, sin = emb(torch.from_numpy(q), torch.from_numpy(pos)[None])
    ref, _ = apply_rotary_pos_emb(torch.from_numpy(q), torch.from_numpy(q), cos, sin)
    f = np.asarray(llama3_rope_factors(64, 500000.0, 8.0, 1.0, 4.0, 64), np.float32)
    assert f.min() == 1.0 and f.max() == 8.0 and ((f > 1) & (f < 8)).any()
    out = run_op(lambda v, p, ff: md.ops.rope(v, p, theta=500000.0, style="neox",
                                              freq_factors=ff),
                 q.transpose(0, 2, 1, 3).copy(), pos, f)
    # HF rounds the angles to float32 (at position 200 that is ~1.5e-5 of a radian)
    close(out, ref.numpy().transpose(0, 2, 1, 3), atol=5e-5)


@pytest.mark.parametrize("factors,match", [
    (np.ones(3, np.float32), r"freq_factors\[3\] must be \[4\]"),
    (np.ones((4, 1), np.float32), r"freq_factors\[4, 1\] must be \[4\]"),
    (np.ones(4, np.int64), "freq_factors must be a float tensor"),
])
def test_rope_freq_factors_shape_and_dtype_are_checked(factors, match):
    g = md.Graph("t", [md.TensorType("float32", (5, 2, 8)), md.TensorType("int64", (5,))])
    with pytest.raises(md.GraphError, match=match):
        md.ops.rope(g.inputs[0], g.inputs[1], freq_factors=factors)


def test_rope_zero_freq_factor_is_an_error(rng):
    x = rng.standard_normal((3, 2, 8)).astype(np.float32)
    with pytest.raises(md.GraphError, match="finite and non-zero"):
        run_op(lambda v, p, ff: md.ops.rope(v, p, freq_factors=ff), x,
               np.arange(3), np.array([1, 0, 1, 1], np.float32))


# -- attention --------------------------------------------------------------------------
def attn_ref(q, k, v, causal=True, scale=None, window=None, slopes=None, softcap=None):
    """float64 torch reference on [B, S, H, D] inputs, HF/llama.cpp semantics."""
    q, k, v = (torch.from_numpy(a).double().transpose(1, 2) for a in (q, k, v))
    hq, hkv = q.shape[1], k.shape[1]
    k = k.repeat_interleave(hq // hkv, 1)
    v = v.repeat_interleave(hq // hkv, 1)
    s_len, t_len = q.shape[2], k.shape[2]
    scale = scale or 1 / math.sqrt(q.shape[-1])
    s = q @ k.transpose(-1, -2) * scale
    if softcap:
        s = softcap * torch.tanh(s / softcap)
    i = torch.arange(s_len)[:, None] + t_len - s_len
    j = torch.arange(t_len)[None]
    if slopes is not None:
        s = s + torch.tensor(slopes, dtype=torch.float64)[:, None, None] * (j - i)
    mask = torch.ones(s_len, t_len, dtype=torch.bool)
    if causal:
        mask &= j <= i
    if window:
        mask &= (i - j) < window
        if not causal:                   # a window without causal is two-sided
            mask &= (j - i) < window
    p = torch.softmax(s.masked_fill(~mask, -math.inf), -1)
    return (p @ v).transpose(1, 2).numpy()


def qkv(rng, b=2, s=9, t=13, hq=4, hkv=2, d=16, dv=None):
    f = np.float32
    return (rng.standard_normal((b, s, hq, d)).astype(f),
            rng.standard_normal((b, t, hkv, d)).astype(f),
            rng.standard_normal((b, t, hkv, dv or d)).astype(f))


@pytest.mark.parametrize("kw", [
    {}, {"causal": False}, {"sliding_window": 4}, {"scale": 0.3, "softcap": 2.0},
    {"alibi_slopes": [0.5, 0.25, 0.125, 0.0625]}, {"causal": False, "sliding_window": 3},
])
def test_attention_matches_reference(rng, kw):
    q, k, v = qkv(rng)
    out = run_op(lambda a, b, c: md.ops.attention(a, b, c, **kw), q, k, v)
    ref = attn_ref(q, k, v, kw.get("causal", True), kw.get("scale"), kw.get("sliding_window"),
                   kw.get("alibi_slopes"), kw.get("softcap"))
    close(out, ref, atol=2e-5)


def test_attention_matches_torch_sdpa_gqa(rng):
    q, k, v = qkv(rng, s=16, t=16, hq=8, hkv=2, d=32, dv=24)
    out = run_op(md.ops.attention, q, k, v)
    tq, tk, tv = (torch.from_numpy(a).transpose(1, 2) for a in (q, k, v))
    ref = F.scaled_dot_product_attention(tq, tk, tv, is_causal=True, enable_gqa=True)
    close(out, ref.transpose(1, 2).numpy(), atol=2e-5)


def test_attention_kv_cache_decode_equals_prefill(rng):
    q, k, v = qkv(rng, b=1, s=6, t=6, hq=4, hkv=2, d=8)
    q, k, v = q[0], k[0], v[0]                         # [S, H, D]: no batch
    full = run_op(md.ops.attention, q, k, v)
    empty = np.zeros((2, 0, 2, 8), np.float32)
    out1, cache1 = run_op(lambda a, b, c, kv: md.ops.attention(a, b, c, kv_cache=kv),
                          q[:4], k[:4], v[:4], empty)
    assert cache1.shape == (2, 4, 2, 8)
    close(out1, full[:4], atol=1e-6)
    out2, cache2 = run_op(lambda a, b, c, kv: md.ops.attention(a, b, c, kv_cache=kv),
                          q[4:], k[4:], v[4:], cache1)
    close(out2, full[4:], atol=1e-6)
    np.testing.assert_array_equal(cache2, np.stack([k, v]))


def test_attention_cache_types_and_errors():
    f = md.DType.float32
    g = md.Graph("t", [md.TensorType(f, ("seq", 4, 8)), md.TensorType(f, ("seq", 2, 8)),
                       md.TensorType(f, (2, "past", 2, 8)), md.TensorType(f, ("seq", 3, 8))])
    q, kv, cache, bad = g.inputs
    out, new = md.ops.attention(q, kv, kv, kv_cache=cache)
    assert out.shape == ("seq", 4, 8) and new.shape == (2, "past+seq", 2, 8)
    with g.layer("blocks"), g.layer("3"), g.layer("attn"):
        with pytest.raises(md.GraphError, match=r"blocks\.3\.attn: attention: query heads 4 "
                                                r"must be a multiple of kv heads 3"):
            md.ops.attention(q, bad, bad)


def test_attention_float16_and_decode_row(rng):
    q, k, v = qkv(rng, b=1, s=1, t=300, hq=4, hkv=1, d=16)
    out = run_op(md.ops.attention, q, k, v)
    close(out, attn_ref(q, k, v), atol=2e-5)
    h = run_op(md.ops.attention, *(a.astype(np.float16) for a in (q, k, v)))
    assert h.dtype == np.float16
    close(h, attn_ref(q, k, v), atol=5e-3, rtol=5e-3)


def test_attention_query_without_keys_gives_zeros(rng):
    q, k, v = qkv(rng, b=1, s=5, t=3, hq=2, hkv=2, d=4)   # S > T: first queries see nothing
    out = run_op(md.ops.attention, q, k, v)
    assert not out[:, :2].any()
    close(out[:, 2:], attn_ref(q, k, v)[:, 2:], atol=1e-5)


@pytest.mark.parametrize("s, t", [(13, 6), (3, 2), (40, 5)])
def test_cross_attention_with_fewer_keys_than_queries(rng, s, t):
    """With causal false, q may be longer than k and v (BART's decoder over a shorter
    source): every query sees every key, as torch's SDPA."""
    q = rng.standard_normal((2, s, 4, 8)).astype(np.float32)
    k = rng.standard_normal((2, t, 2, 8)).astype(np.float32)
    v = rng.standard_normal((2, t, 2, 8)).astype(np.float32)
    for qq, kk, vv in ((q, k, v), (q[0], k[0], v[0])):          # with and without a batch dim
        out = run_op(lambda *a: md.ops.attention(*a, causal=False), qq, kk, vv)
        qt, kt, vt = (torch.from_numpy(a).movedim(-2, -3) for a in (qq, kk, vv))
        ref = F.scaled_dot_product_attention(qt, kt.repeat_interleave(2, -3),
                                             vt.repeat_interleave(2, -3)).movedim(-3, -2)
        close(out, ref.numpy(), atol=2e-6, rtol=2e-5, label=f"cross {s} x {t}")
