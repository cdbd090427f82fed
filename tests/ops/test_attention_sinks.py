"""Attention sinks (gpt-oss): one learned logit per query head joins each softmax's
denominator. Every attention path (the blocked prefill kernel, the few-rows kernel, the
decode rows kernel, a batched step of several sequences, masked_attention) against a
float64 torch reference that appends the sink as one more score column and drops it
after the softmax; -inf sinks give the same bits as no sinks."""

import numpy as np
import pytest
import torch

import maxdecl as md
from maxdecl.runtime import PerSequence
from ophelp import close

HQ, HKV, D = 4, 2, 8


def _reference(q, k, v, sinks, causal=True, window=None, mask=None):
    """q [..., S, Hq, D], k, v [..., T, Hkv, D] (all keys): float64 softmax over [scores,
    sink] without the sink's column."""
    qt, kt, vt = (torch.from_numpy(a).double().movedim(-2, -3) for a in (q, k, v))
    group = qt.shape[-3] // kt.shape[-3]
    kt, vt = kt.repeat_interleave(group, -3), vt.repeat_interleave(group, -3)
    s, t = qt.shape[-2], kt.shape[-2]
    sc = qt @ kt.transpose(-1, -2) * qt.shape[-1] ** -0.5
    pos = (t - s) + torch.arange(s)[:, None]
    j = torch.arange(t)[None, :]
    allowed = torch.ones(s, t, dtype=torch.bool)
    if causal:
        allowed &= j <= pos
    if window:
        allowed &= pos - j < window
    if mask is not None:
        sc = sc + torch.from_numpy(mask).double()
    sc = sc.masked_fill(~allowed, -torch.inf)
    sink = torch.from_numpy(sinks).double()[:, None, None].expand(*sc.shape[:-1], 1)
    p = torch.softmax(torch.cat([sc, sink], -1), -1)[..., :-1]
    return (p @ vt).movedim(-3, -2).float().numpy()


def _graph(q, k, v, cache, sinks, masked=False, **attrs):
    arrays = [q, k, v] + ([attrs.pop("mask")] if masked else []) + [cache, sinks]
    g = md.Graph("t", [md.TensorType(md.DType.from_numpy(a.dtype), a.shape) for a in arrays])
    op = md.ops.masked_attention if masked else md.ops.attention
    g.output(op(*g.inputs, **attrs))
    return md.compile(g), arrays


def _qkv(rng, s, t=None, batch=()):
    t = s if t is None else t
    q = rng.standard_normal(batch + (s, HQ, D)).astype(np.float32)
    k = rng.standard_normal(batch + (t, HKV, D)).astype(np.float32)
    v = rng.standard_normal(batch + (t, HKV, D)).astype(np.float32)
    return q, k, v


def _step_graph():
    """attention(q, k, v, cache, sinks) over symbolic seq and past: a decode step."""
    g = md.Graph("t", [md.TensorType("float32", ("seq", HQ, D))]
                 + [md.TensorType("float32", ("seq", HKV, D))] * 2
                 + [md.TensorType("float32", (2, "past", HKV, D)),
                    md.TensorType("float32", (HQ,))])
    g.output(md.ops.attention(*g.inputs))
    return g


SINKS = np.array([0.5, -1.0, 3.0, 1.5], np.float32)   # one well above the scores


@pytest.mark.parametrize("s, window", [(40, None), (40, 7), (5, None), (3, 2)])
def test_sinks_match_the_reference(rng, s, window):
    # 40 rows: the blocked prefill kernel; 5 and 3 rows: the decode rows kernel
    q, k, v = _qkv(rng, s)
    run, arrays = _graph(q, k, v, np.zeros((2, 0, HKV, D), np.float32), SINKS,
                         sliding_window=window)
    out, cache = run(*arrays)
    close(out, _reference(q, k, v, SINKS, window=window), atol=1e-5)
    assert cache.shape == (2, s, HKV, D)


def test_sinks_with_a_cache_match_one_call_over_every_key(rng):
    q, k, v = _qkv(rng, 9)
    run, _ = _graph(q[:6], k[:6], v[:6], np.zeros((2, 0, HKV, D), np.float32), SINKS)
    g = _step_graph()
    step = md.compile(g)
    first, c = step(q[:6], k[:6], v[:6], np.zeros((2, 0, HKV, D), np.float32), SINKS)
    second, c = step(q[6:], k[6:], v[6:], c, SINKS)
    close(np.concatenate([first, second]), _reference(q, k, v, SINKS), atol=1e-5)


def test_sinks_in_the_batched_few_rows_kernel(rng):
    # batch dims: the general path's few-rows kernel (_attention_few)
    q, k, v = _qkv(rng, 5, batch=(2,))
    run, arrays = _graph(q, k, v, np.zeros((2, 2, 0, HKV, D), np.float32), SINKS,
                         causal=False)
    out, _ = run(*arrays)
    close(out, _reference(q, k, v, SINKS, causal=False), atol=1e-5)


def test_a_batched_step_gets_each_sequences_solo_numbers(rng):
    g = _step_graph()
    run = md.compile(g)
    seqs = [_qkv(rng, n) for n in (4, 1, 3)]
    empty = np.zeros((2, 0, HKV, D), np.float32)
    solo = [run(q, k, v, empty, SINKS)[0] for q, k, v in seqs]
    joined = [np.concatenate([s[i] for s in seqs]) for i in range(3)]
    out, caches = run(*joined, PerSequence([empty] * 3), SINKS, rows=[4, 1, 3])
    assert out.tobytes() == np.concatenate(solo).tobytes()
    assert len(caches) == 3


@pytest.mark.parametrize("s", [40, 5])
def test_minus_inf_sinks_give_the_bits_of_no_sinks(rng, s):
    q, k, v = _qkv(rng, s)
    empty = np.zeros((2, 0, HKV, D), np.float32)
    with_sinks, arrays = _graph(q, k, v, empty, np.full(HQ, -np.inf, np.float32))
    g = md.Graph("t", [md.TensorType("float32", a.shape) for a in (q, k, v, empty)])
    g.output(md.ops.attention(*g.inputs))
    plain = md.compile(g)(q, k, v, empty)[0]
    assert with_sinks(*arrays)[0].tobytes() == plain.tobytes()


def test_masked_attention_sinks_match_the_reference(rng):
    q, k, v = _qkv(rng, 6)
    bias = rng.standard_normal((HQ, 6, 6)).astype(np.float32)
    run, arrays = _graph(q, k, v, np.zeros((2, 0, HKV, D), np.float32), SINKS, masked=True,
                         mask=bias, causal=True)
    out, _ = run(*arrays)
    close(out, _reference(q, k, v, SINKS, mask=bias), atol=1e-5)


def test_a_query_that_sees_no_key_gives_zeros():
    # window 0 keys for nobody is not expressible; a bool mask hiding every key is
    q = np.ones((2, HQ, D), np.float32)
    k = v = np.ones((2, HKV, D), np.float32)
    run, arrays = _graph(q, k, v, np.zeros((2, 0, HKV, D), np.float32), SINKS, masked=True,
                         mask=np.zeros((2, 2), bool))
    assert not run(*arrays)[0].any()


def test_sinks_of_the_wrong_size_are_refused():
    g = md.Graph("t", [md.TensorType("float32", (3, HQ, D))] * 3
                 + [md.TensorType("float32", (2, 0, HKV, D)), md.TensorType("float32", (3,))])
    with pytest.raises(md.GraphError, match=r"sinks\[3\] must be \[4\]"):
        md.ops.attention(*g.inputs)
