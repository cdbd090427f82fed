"""The few-query-rows attention path (decode) equals the general blocked kernel."""

import numpy as np
import pytest

import maxdecl as md
from maxdecl.kernels import attention as kern


@pytest.mark.parametrize("seed", range(6))
def test_few_rows_path_matches_general_kernel(seed, monkeypatch):
    rng = np.random.default_rng(seed)
    s = int(rng.integers(1, 5))
    t = s + int(rng.integers(0, 40))
    hkv = int(rng.choice([1, 2]))
    hq = hkv * int(rng.choice([1, 2, 4]))
    d = int(rng.choice([8, 16, 64]))
    q = rng.standard_normal((2, s, hq, d)).astype(np.float32)
    k = rng.standard_normal((2, t, hkv, d)).astype(np.float32)
    v = rng.standard_normal((2, t, hkv, d)).astype(np.float32)
    window = [None, 3, 7][seed % 3]
    slopes = None if seed % 2 else list(rng.uniform(0.01, 0.5, hq))
    softcap = None if seed < 3 else 5.0
    args = (q, k, v, 0.3, True, window, slopes, softcap, t - s)
    few = kern.attention(*args)
    monkeypatch.setattr(kern, "_FEW_ROWS", 0)
    general = kern.attention(*args)
    np.testing.assert_allclose(few, general, rtol=2e-5, atol=2e-6)


@pytest.mark.parametrize("seed", range(4))
def test_rows_kernel_batches_sequences_exactly(seed):
    """attention_rows over several sequences (different lengths and row counts, each
    reading its own cache in place) gives each sequence bit for bit what it gets alone,
    from either the parallel or the serial twin, and matches a float64 reference."""
    from maxdecl.kernels import attention_rows as ar

    rng = np.random.default_rng(100 + seed)
    hkv = int(rng.choice([1, 2]))
    hq, d = hkv * int(rng.choice([1, 4])), int(rng.choice([16, 64]))
    window = [None, 5][seed % 2]
    slopes = None if seed < 2 else rng.uniform(0.01, 0.5, hq).astype(np.float32)
    softcap = None if seed % 3 else 4.0
    seqs = []
    for _ in range(int(rng.integers(2, 6))):
        t = int(rng.integers(1, 60))
        s = int(rng.integers(1, min(t, 4) + 1))
        seqs.append((rng.standard_normal((s, hq, d)).astype(np.float32),
                     rng.standard_normal((t, hkv, d)).astype(np.float32),
                     rng.standard_normal((t, hkv, d)).astype(np.float32)))
    args = (0.25, True, window, slopes, softcap)
    together = ar.attention_rows(*map(list, zip(*seqs)), *args)
    for (q, k, v), got in zip(seqs, together):
        alone = ar.attention_rows([q], [k], [v], *args)[0]
        assert got.tobytes() == alone.tobytes()
        want = _reference(q[None], k[None], v[None], 0.25, True, window, slopes, softcap,
                          k.shape[0] - q.shape[0])[0]
        np.testing.assert_allclose(got, want, rtol=2e-5, atol=2e-6)
    twins = []
    for twin in ar._attention_rows:                  # (parallel, serial): same numbers
        ar_pick = ar.pick
        try:
            ar.pick = lambda pair, work, twin=twin: twin
            twins.append(np.concatenate(ar.attention_rows(*map(list, zip(*seqs)), *args)))
        finally:
            ar.pick = ar_pick
    assert twins[0].tobytes() == twins[1].tobytes()


@pytest.mark.parametrize("seed", range(6))
def test_rows_kernel_numbers_do_not_depend_on_twin_or_task_split(seed):
    """Every (parallel, serial) twin and every split of the query heads into tasks gives
    the same bits (so a row's output does not depend on which path its batch took), and
    a lone decode row with enough keys takes the spread path (its query heads spread over the threads)."""
    from maxdecl.kernels import attention_rows as ar
    from maxdecl.kernels.aligned import address

    rng = np.random.default_rng(200 + seed)
    hkv = int(rng.choice([1, 2]))
    group = int(rng.choice([2, 4]))
    hq, d, t = hkv * group, int(rng.choice([32, 64, 80, 256])), int(rng.integers(100, 400))
    window = [0, 50][seed % 2]
    softcap = np.float32(0 if seed % 3 else 5.0)
    slopes = (np.zeros(hq, np.float32) if seed < 3
              else rng.uniform(0.01, 0.5, hq).astype(np.float32))
    rows = int(rng.integers(1, 3))
    if rows * hkv == 1:                                   # enough keys to spread
        t = max(t, ar.SPREAD_MIN_WORK // (hq * d) + 1)
    q = rng.standard_normal((rows, hq, d)).astype(np.float32)
    k = rng.standard_normal((t, hkv, d)).astype(np.float32)
    v = rng.standard_normal((t, hkv, d)).astype(np.float32)
    seqs = np.array([(address(k), address(v), t)], np.int64)
    pos = np.array([(0, t - rows + i) for i in range(rows)], np.int64)
    outs = []
    for twin in ar._attention_rows:
        for per in (1, group):
            out = np.empty((rows, hq, d), np.float32)
            twin(q, pos, seqs, hkv, out, np.float32(0.125), True, window, slopes, softcap, per,
                 np.full(hq, -np.inf, np.float32))          # no sinks
            outs.append(out.tobytes())
    assert len(set(outs)) == 1
    got = ar.attention_rows([q], [k], [v], 0.125, True, window or None,
                            slopes if seed >= 3 else None, float(softcap) or None)[0]
    assert got.tobytes() == outs[0]
    ref = _reference(q[None], k[None], v[None], 0.125, True, window or None,
                     slopes if seed >= 3 else None, float(softcap) or None, t - rows)[0]
    np.testing.assert_allclose(got, ref, rtol=2e-5, atol=2e-6)


def test_rows_kernel_rejects_mismatched_sequences():
    from maxdecl.kernels import attention_rows as ar

    q = np.zeros((1, 4, 8), np.float32)
    k = np.zeros((3, 2, 8), np.float32)
    with pytest.raises(ValueError, match="sequences must agree"):
        ar.attention_rows([q, q], [k, np.zeros((3, 2, 16), np.float32)], [k, k],
                          1.0, True, None, None, None)
    with pytest.raises(ValueError, match="sequences must agree"):
        ar.attention_rows([np.zeros((5, 4, 8), np.float32)], [k], [k], 1.0, True, None,
                          None, None)


def _reference(q, k, v, scale, causal, window, slopes, softcap, q_offset):
    """float64 attention, one query row at a time (q, k, v: (B, S|T, H, D))."""
    B, S, Hq, _ = q.shape
    T, Hkv = k.shape[1], k.shape[2]
    out = np.zeros((B, S, Hq, v.shape[3]))
    for b in range(B):
        for h in range(Hq):
            hk = h // (Hq // Hkv)
            for i in range(S):
                pos = q_offset + i
                j = np.arange(T)
                ok = np.ones(T, bool)
                if causal:
                    ok &= j <= pos
                if window:
                    ok &= pos - j < window
                if not ok.any():
                    continue
                s = k[b, :, hk].astype(np.float64) @ q[b, i, h].astype(np.float64) * scale
                if softcap:
                    s = softcap * np.tanh(s / softcap)
                if slopes is not None:
                    s = s + slopes[h] * (j - pos)
                p = np.exp(s[ok] - s[ok].max())
                out[b, i, h] = (p / p.sum()) @ v[b, ok, hk].astype(np.float64)
    return out


@pytest.mark.parametrize("lanes", [8, 16])
@pytest.mark.parametrize("case", range(8))
def test_blocked_kernel_matches_float64(case, lanes, monkeypatch):
    """Many query rows (the blocked micro-kernel path), 8- and 16-lane kernels: ragged
    blocks of 8 rows, key counts and value widths off the vector width, windows, ALiBi,
    soft-capping, GQA, a cached prefix (q_offset), and no mask (encoders)."""
    monkeypatch.setattr(kern, "default_lanes", lambda: lanes)
    rng = np.random.default_rng(100 + case)
    s = [17, 40, 130, 23, 64, 33, 19, 150][case]
    t = s + [0, 5, 0, 37, 0, 0, 200, 3][case]
    hkv = [1, 2, 1, 1, 2, 1, 1, 1][case]
    hq = hkv * [4, 1, 2, 4, 2, 1, 4, 2][case]
    d, dv = [(256, 256), (64, 40), (16, 16), (96, 72), (32, 8), (40, 33), (64, 64), (8, 8)][case]
    causal = case != 5
    window = [None, 7, 50, None, 16, None, 100, 1][case]
    slopes = list(rng.uniform(0.01, 0.5, hq)) if case in (1, 4) else None
    softcap = 5.0 if case in (3, 4) else None
    q = rng.standard_normal((2, s, hq, d)).astype(np.float32)
    k = rng.standard_normal((2, t, hkv, d)).astype(np.float32)
    v = rng.standard_normal((2, t, hkv, dv)).astype(np.float32)
    args = (q, k, v, 1 / np.sqrt(d), causal, window, slopes, softcap, t - s)
    got = kern.attention(*args)
    want = _reference(*args)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=2e-5)


@pytest.mark.parametrize("s, t", [(40, 40), (5, 5), (3, 9)])
@pytest.mark.parametrize("window", [1, 3, 8])
def test_a_window_without_causal_is_two_sided(s, t, window):
    """causal false: query i sees key j when |pos_i - j| < W, in the blocked kernel (40
    rows), the few-rows kernel, the rows kernel and masked_attention alike, against
    torch's sdpa with that band as its mask."""
    import torch
    import torch.nn.functional as F
    from maxdecl.kernels import attention_rows as ar
    from maxdecl.kernels.transformer import masked_attention

    rng = np.random.default_rng(window * 100 + s)
    q = rng.standard_normal((1, s, 4, 16)).astype(np.float32)
    k = rng.standard_normal((1, t, 2, 16)).astype(np.float32)
    v = rng.standard_normal((1, t, 2, 16)).astype(np.float32)
    pos = (t - s) + np.arange(s)[:, None]
    band = np.abs(pos - np.arange(t)[None, :]) < window
    qt, kt, vt = (torch.from_numpy(a).double().movedim(-2, -3) for a in (q, k, v))
    ref = F.scaled_dot_product_attention(qt, kt.repeat_interleave(2, -3),
                                         vt.repeat_interleave(2, -3),
                                         attn_mask=torch.from_numpy(band), scale=0.25)
    ref = ref.movedim(-3, -2).float().numpy()
    got = kern.attention(q, k, v, 0.25, False, window, None, None, t - s)
    np.testing.assert_allclose(got, ref, rtol=2e-5, atol=2e-6)
    rows = ar.attention_rows([q[0]], [k[0]], [v[0]], 0.25, False, window, None, None)[0]
    np.testing.assert_allclose(rows, ref[0], rtol=2e-5, atol=2e-6)
    masked = masked_attention(q, k, v, np.ones((s, t), bool), 0.25, False, window, None, None)
    np.testing.assert_allclose(masked, ref, rtol=2e-5, atol=2e-6)


def test_spread_tasks_take_the_most_heads_that_keep_every_thread_busy():
    from maxdecl.kernels.attention_rows import spread_per

    assert spread_per(4, 1, 2) == 2          # Gemma 3 decode: two heads a task on 2 threads
    assert spread_per(4, 1, 4) == 1 and spread_per(4, 1, 16) == 1
    assert spread_per(6, 1, 4) == 1          # 3 heads a task would leave 2 threads idle
    assert spread_per(8, 2, 4) == 4


def test_a_zero_sliding_window_is_no_window(rng):
    """``sliding_window: 0`` means none, as ``"{sliding_window or 0}"`` maps a config's
    null; a negative window is refused."""
    g = md.Graph("t", [md.TensorType("float32", ("seq", 2, 4))] * 3)
    q, k, v = g.inputs
    g.output([md.ops.attention(q, k, v, sliding_window=0), md.ops.attention(q, k, v)])
    x = rng.standard_normal((6, 2, 4)).astype(np.float32)
    a, b = g.execute(x, x, x)
    assert a.tobytes() == b.tobytes()
    with pytest.raises(md.GraphError, match="sliding_window must be a positive int, 0 or None"):
        md.ops.attention(q, k, v, sliding_window=-1)


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("s, t", [(40, 40), (5, 5), (3, 9), (1, 17)])
@pytest.mark.parametrize("chunk", [1, 4, 8])
def test_chunked_attention_matches_torch_band(s, t, chunk, causal):
    """``chunk``: query i sees key j when i // C == j // C (and j <= i when causal), in
    the blocked kernel, the few-rows kernel, the rows kernel and masked_attention alike,
    against torch's sdpa with that mask (Llama 4's chunked attention)."""
    import torch
    import torch.nn.functional as F
    from maxdecl.kernels import attention_rows as ar
    from maxdecl.kernels.transformer import masked_attention

    rng = np.random.default_rng(chunk * 1000 + s * 10 + t)
    q = rng.standard_normal((1, s, 4, 16)).astype(np.float32)
    k = rng.standard_normal((1, t, 2, 16)).astype(np.float32)
    v = rng.standard_normal((1, t, 2, 16)).astype(np.float32)
    pos = (t - s) + np.arange(s)[:, None]
    j = np.arange(t)[None, :]
    band = (pos // chunk) == (j // chunk)
    if causal:
        band &= j <= pos
    qt, kt, vt = (torch.from_numpy(a).double().movedim(-2, -3) for a in (q, k, v))
    ref = F.scaled_dot_product_attention(qt, kt.repeat_interleave(2, -3),
                                         vt.repeat_interleave(2, -3),
                                         attn_mask=torch.from_numpy(band), scale=0.25)
    ref = ref.movedim(-3, -2).float().numpy()
    got = kern.attention(q, k, v, 0.25, causal, -chunk, None, None, t - s)
    np.testing.assert_allclose(got, ref, rtol=2e-5, atol=2e-6)
    rows = ar.attention_rows([q[0]], [k[0]], [v[0]], 0.25, causal, -chunk, None, None)[0]
    np.testing.assert_allclose(rows, ref[0], rtol=2e-5, atol=2e-6)
    masked = masked_attention(q, k, v, np.ones((s, t), bool), 0.25, causal, -chunk, None,
                              None)
    np.testing.assert_allclose(masked, ref, rtol=2e-5, atol=2e-6)


def test_chunk_attr_through_a_kv_cache_decode(rng):
    """The ``chunk`` attribute of the op: a prefill then one-row decode steps through the
    KV cache give the rows of one whole-sequence call; it excludes sliding_window."""
    g = md.Graph("t", [md.TensorType("float32", ("seq", 4, 8)), md.TensorType("float32", ("seq", 2, 8)),
                       md.TensorType("float32", ("seq", 2, 8)),
                       md.TensorType("float32", (2, "past", 2, 8))])
    q, k, v, cache = g.inputs
    out, new = md.ops.attention(q, k, v, cache, chunk=3)
    g.output([out, new])
    n = 11
    qs, ks, vs = (rng.standard_normal((n, h, 8)).astype(np.float32) for h in (4, 2, 2))
    whole, _ = g.execute(qs, ks, vs, np.zeros((2, 0, 2, 8), np.float32))
    c = np.zeros((2, 0, 2, 8), np.float32)
    o, c = g.execute(qs[:4], ks[:4], vs[:4], c)
    steps = [o]
    for i in range(4, n):
        o, c = g.execute(qs[i:i + 1], ks[i:i + 1], vs[i:i + 1], c)
        steps.append(o)
    np.testing.assert_allclose(np.concatenate(steps), whole, rtol=1e-6, atol=1e-6)
    qf, kf = qs.astype(np.float64), np.repeat(ks, 2, axis=1).astype(np.float64)
    vf = np.repeat(vs, 2, axis=1).astype(np.float64)
    for i in (0, 2, 3, 7, 10):                       # row i sees keys [i - i % 3, i]
        keys = range(i - i % 3, i + 1)
        sc = np.einsum("hd,jhd->hj", qf[i], kf[list(keys)]) / np.sqrt(8)
        p = np.exp(sc - sc.max(1, keepdims=True))
        p /= p.sum(1, keepdims=True)
        np.testing.assert_allclose(whole[i], np.einsum("hj,jhd->hd", p, vf[list(keys)]),
                                   rtol=1e-5, atol=1e-6)
    with pytest.raises(md.GraphError, match="exclude each other"):
        md.ops.attention(q, k, v, sliding_window=4, chunk=3)
