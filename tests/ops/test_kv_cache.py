"""KV caches that grow in place equal plain concatenation, and branching stays safe."""

import numpy as np

from maxdecl.kernels.kv_cache import KVCache, append_kv


def _concat(past, k, v):
    return np.concatenate([past, np.stack([k, v])], axis=-3)


def test_growing_in_place_equals_concatenation():
    rng = np.random.default_rng(0)
    ref = cache = np.zeros((2, 0, 2, 8), np.float32)
    for s in [5, 1, 1, 70, 1, 3]:          # crosses the first capacity
        k, v = (rng.standard_normal((s, 2, 8)).astype(np.float32) for _ in range(2))
        cache, ref = append_kv(cache, k, v), _concat(ref, k, v)
        np.testing.assert_array_equal(cache, ref)
    assert isinstance(cache, KVCache) and cache.room is not None


def test_old_values_never_change_and_branches_copy():
    rng = np.random.default_rng(1)
    k0, v0 = (rng.standard_normal((4, 1, 8)).astype(np.float32) for _ in range(2))
    past = append_kv(np.zeros((2, 0, 1, 8), np.float32), k0, v0)
    snapshot = np.array(past)
    ka, va, kb, vb = (rng.standard_normal((1, 1, 8)).astype(np.float32) for _ in range(4))
    a = append_kv(past, ka, va)           # writes into the room after `past`
    b = append_kv(past, kb, vb)           # same past again: that room is taken, so it copies
    np.testing.assert_array_equal(past, snapshot)
    np.testing.assert_array_equal(a, _concat(snapshot, ka, va))
    np.testing.assert_array_equal(b, _concat(snapshot, kb, vb))
    assert not np.shares_memory(a, b)


def test_slices_of_a_cache_do_not_own_its_room():
    past = append_kv(np.zeros((2, 0, 1, 4), np.float32), np.ones((3, 1, 4), np.float32),
                     np.ones((3, 1, 4), np.float32))
    head = past[:, :2]
    assert head.room is None
    grown = append_kv(head, np.zeros((1, 1, 4), np.float32), np.zeros((1, 1, 4), np.float32))
    np.testing.assert_array_equal(past[:, 2], 1)   # the original third position is intact
    assert grown.shape == (2, 3, 1, 4) and not grown[:, 2].any()


def test_kv_addresses_are_the_views_addresses_and_only_for_float32():
    from maxdecl.kernels.aligned import address
    from maxdecl.kernels.kv_cache import append_kv, kv_addresses, truncate_kv

    rng = np.random.default_rng(1)
    for dtype in (np.float32, np.float16):
        cache = np.zeros((2, 0, 2, 8), dtype)
        for n in (3, 1, 1, 70):                 # the last one outgrows the buffer
            k = rng.standard_normal((n, 2, 8)).astype(np.float32)
            cache = append_kv(cache, k, k)
            got = kv_addresses(cache)
            if dtype == np.float16:
                assert got is None
            else:
                assert got == (address(cache[0]), address(cache[1]))
        cut = truncate_kv(cache, 4)
        assert kv_addresses(cut) == (None if dtype == np.float16 else
                                     (address(cut[0]), address(cut[1])))
        assert kv_addresses(cache[:, :2]) is None     # a slice does not own the room
        assert kv_addresses(np.asarray(cache)) is None


def _batched_attention(pasts, q, k, v, rows):
    from maxdecl.kernels.transformer import RUN_BATCH

    attrs = {"scale": None, "causal": True, "sliding_window": None, "alibi_slopes": None,
             "softcap": None}
    return RUN_BATCH["attention"]([q, k, v, pasts], rows, attrs)


def _solo_attention(past, q, k, v):
    from maxdecl.kernels.transformer import RUN

    attrs = {"scale": None, "causal": True, "sliding_window": None, "alibi_slopes": None,
             "softcap": None}
    return RUN["attention"]([q, k, v, past], attrs)


def _caches(rng, lengths, heads=2, d=8):
    return [append_kv(np.zeros((2, 0, heads, d), np.float32),
                      *(rng.standard_normal((t, heads, d)).astype(np.float32) for _ in range(2)))
            for t in lengths]


def test_batched_appends_in_place_equal_each_sequence_alone():
    """The batched step writes each sequence's rows into its buffer's room (one call for
    all), and its outputs and grown caches equal each sequence's own step, bit for bit;
    a batch where two sequences share one buffer's room, or one has none, takes the
    copying path and still agrees."""
    from maxdecl.kernels.kv_cache import reserve_rows

    rng = np.random.default_rng(2)
    for lengths, rows, plain in (([5, 63, 1, 30], [1, 1, 1, 1], None),
                                 ([7, 2, 40], [3, 1, 2], None), ([7, 2, 40], [3, 1, 2], 1)):
        pasts = _caches(rng, lengths)
        if plain is not None:                           # a cache without a buffer's room
            pasts[plain] = np.array(pasts[plain])
        solo_pasts = [np.array(p) for p in pasts]      # plain copies: the general path
        q = rng.standard_normal((sum(rows), 4, 8)).astype(np.float32)
        k, v = (rng.standard_normal((sum(rows), 2, 8)).astype(np.float32) for _ in range(2))
        fast = reserve_rows(pasts, k, v, rows) is not None
        for p in pasts if fast else ():                # undo the probe's reservation
            p.room[1][0] = p.shape[1]
        out, caches = _batched_attention(pasts, q, k, v, rows)
        start = 0
        for n, cache, past in zip(rows, caches, solo_pasts):
            want, want_cache = _solo_attention(past, q[start:start + n], k[start:start + n],
                                               v[start:start + n])
            np.testing.assert_array_equal(out[start:start + n], want)
            np.testing.assert_array_equal(cache, want_cache)
            assert isinstance(cache, KVCache) and cache.room is not None
            start += n
        assert fast == (plain is None)
    shared = _caches(rng, [4])[0]
    q = rng.standard_normal((2, 4, 8)).astype(np.float32)
    k, v = (rng.standard_normal((2, 2, 8)).astype(np.float32) for _ in range(2))
    assert reserve_rows([shared, shared], k, v, [1, 1]) is None
    out, (a, b) = _batched_attention([shared, shared], q, k, v, [1, 1])
    assert not np.shares_memory(a, b)
    np.testing.assert_array_equal(a[:, -1], np.stack([k[0], v[0]]))
    np.testing.assert_array_equal(b[:, -1], np.stack([k[1], v[1]]))


def test_batched_appends_random_batches_equal_each_sequence_alone():
    """Seeded random batches (1-5 sequences, 1-4 rows each, pasts of 0-70 positions,
    grouped heads 1-4 per key/value head, some caches without room): outputs and grown
    caches equal each sequence's own step, bit for bit, over three steps."""
    rng = np.random.default_rng(11)
    for case in range(25):
        hkv, group, d = int(rng.integers(1, 3)), int(rng.integers(1, 5)), 8
        lengths = [int(t) for t in rng.integers(0, 71, int(rng.integers(1, 6)))]
        pasts = _caches(rng, lengths, heads=hkv, d=d)
        pasts = [np.array(p) if rng.random() < 0.2 else p for p in pasts]
        for step in range(3):
            rows = [int(n) for n in rng.integers(1, 5, len(pasts))]
            q = rng.standard_normal((sum(rows), hkv * group, d)).astype(np.float32)
            k, v = (rng.standard_normal((sum(rows), hkv, d)).astype(np.float32)
                    for _ in range(2))
            alone = [np.array(p) for p in pasts]
            out, caches = _batched_attention(pasts, q, k, v, rows)
            start = 0
            for n, cache, past in zip(rows, caches, alone):
                want, want_cache = _solo_attention(past, q[start:start + n],
                                                   k[start:start + n], v[start:start + n])
                np.testing.assert_array_equal(out[start:start + n], want)
                np.testing.assert_array_equal(cache, want_cache)
                start += n
            pasts = caches


def test_cached_rows_writes_the_caches_and_attends_as_attention_rows():
    """The one-call decode path (append in place, then attend) gives the bits of
    appending and running ``attention_rows`` on the grown caches, for random batches,
    head groupings, windows and soft-caps."""
    import numba

    from maxdecl.kernels import attention_rows as ar
    from maxdecl.kernels.kv_cache import reserve_rows

    rng = np.random.default_rng(11)
    for trial in range(12):
        hkv = int(rng.choice([1, 2]))
        hq, d = hkv * int(rng.choice([1, 2, 4])), int(rng.choice([16, 40, 64]))
        sizes = [int(rng.integers(1, 4)) for _ in range(int(rng.integers(1, 4)))]
        pasts = []
        for _ in sizes:
            t = int(rng.integers(1, 70))
            kv = rng.standard_normal((t, hkv, d)).astype(np.float32)
            pasts.append(append_kv(np.zeros((2, 0, hkv, d), np.float32), kv, kv * 0.5))
        k, v = rng.standard_normal((2, sum(sizes), hkv, d)).astype(np.float32)
        q = rng.standard_normal((sum(sizes), hq, d)).astype(np.float32)
        window, softcap = [None, 9][trial % 2], [None, 4.0][trial % 3 == 0]
        want_ks, want_vs, start = [], [], 0
        for past, n in zip(pasts, sizes):
            want_ks.append(np.concatenate([np.asarray(past[0]), k[start:start + n]]))
            want_vs.append(np.concatenate([np.asarray(past[1]), v[start:start + n]]))
            start += n
        qs = np.split(q, np.cumsum(sizes)[:-1])
        want = np.concatenate(ar.attention_rows(qs, want_ks, want_vs, 0.3, True, window,
                                                None, softcap))
        threads = numba.get_num_threads()
        numba.set_num_threads(1 if trial % 2 else threads)      # 1: never the spread path
        try:
            dst, caches = reserve_rows(pasts, k, v, sizes)
            got = ar.cached_rows(q, k, v, dst, 0.3, True, window, None, softcap)
        finally:
            numba.set_num_threads(threads)
        assert got.tobytes() == want.tobytes()
        for c, wk, wv in zip(caches, want_ks, want_vs):
            assert np.array_equal(c[0], wk) and np.array_equal(c[1], wv)
