"""The few-query-rows attention path (decode) equals the general blocked kernel."""

import numpy as np
import pytest

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


def _reference(q, k, v, scale, window, slopes, softcap):
    """float64 attention of the last len(q) of len(k) positions (causal)."""
    s, hq, _ = q.shape
    t, hkv, _ = k.shape
    out = np.zeros((s, hq, v.shape[2]))
    for i in range(s):
        pos = t - s + i
        lo = max(0, pos - window + 1) if window else 0
        for h in range(hq):
            hk = h // (hq // hkv)
            sc = (k[lo:pos + 1, hk].astype(np.float64) @ q[i, h]) * scale
            if softcap:
                sc = softcap * np.tanh(sc / softcap)
            if slopes is not None:
                sc = sc + slopes[h] * (np.arange(lo, pos + 1) - pos)
            p = np.exp(sc - sc.max())
            out[i, h] = (p / p.sum()) @ v[lo:pos + 1, hk]
    return out


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
        want = _reference(q, k, v, 0.25, window, slopes, softcap)
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
