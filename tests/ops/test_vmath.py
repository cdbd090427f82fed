"""The kernels' vectorisable float32 exp against float64 exp; dot16's fixed order; the
prefetch intrinsic."""

import numba
import numpy as np

from maxdecl.kernels.vmath import expf


@numba.njit
def _expf_all(x, out):
    for i in range(x.size):
        out[i] = expf(x[i])


def test_expf_within_1_2_ulp_and_exact_at_the_edges():
    x = np.concatenate([np.linspace(-110, 95, 400_001, dtype=np.float32),
                        np.float32([0.0, -0.0, 1.0, -1.0, 88.72284, 88.72285, -104.0, -104.1,
                                    np.inf, -np.inf, np.nan])])
    out = np.empty_like(x)
    _expf_all(x, out)
    with np.errstate(over="ignore"):
        ref = np.exp(x.astype(np.float64))
        ref32 = ref.astype(np.float32)
    normal = np.isfinite(ref32) & (ref32 >= np.finfo(np.float32).tiny)
    ulps = np.abs(out[normal] - ref[normal]) / np.spacing(ref32[normal]).astype(np.float64)
    assert ulps.max() <= 1.25
    assert np.all(np.isinf(out[np.isinf(ref32) & (x > 0)]))       # overflow: inf, as exp
    assert np.all(out[x < -104.0] == 0) and np.isnan(out[-1])
    tiny = (ref32 < np.finfo(np.float32).tiny) & (x >= -104.0)     # subnormal results
    np.testing.assert_allclose(out[tiny], ref[tiny], rtol=0, atol=2e-45)
    assert out[x == 0].tolist() == [1.0, 1.0]


def test_dot16_sums_in_its_documented_order():
    """dot16 is two 16-lane running sums over 32-element chunks, added lane by lane,
    halved by a fixed tree, then the tail in order: reproduced here in float32 NumPy,
    bit for bit, for lengths around the chunk edges; and it is close to float64."""
    from maxdecl.kernels.vmath import dot16

    run = numba.njit(lambda a, b, n: dot16(a, b, n))
    rng = np.random.default_rng(3)
    for n in (0, 1, 15, 16, 31, 32, 33, 63, 64, 65, 256, 1000):
        a, b = (rng.standard_normal((2, n)) * 3).astype(np.float32)
        p = a * b                                        # float32 products, one rounding
        m = n - n % 32
        acc = np.zeros((2, 16), np.float32)
        for c in range(0, m, 32):
            acc[0] = acc[0] + p[c:c + 16]
            acc[1] = acc[1] + p[c + 16:c + 32]
        v = acc[0] + acc[1]
        while v.size > 1:
            v = v[:v.size // 2] + v[v.size // 2:]
        t = v[0]
        for i in range(m, n):
            t = np.float32(t + p[i])
        got = run(a, b, n)
        assert np.float32(got).tobytes() == np.float32(t).tobytes(), n
        assert abs(got - float(a.astype(np.float64) @ b)) <= 1e-5 * (1 + np.abs(p).sum())


def test_prefetch_past_the_end_is_harmless():
    from maxdecl.kernels.vmath import prefetch

    @numba.njit
    def touch(a):
        for i in range(0, a.size + 4096, 16):
            prefetch(a, i)
        return a.sum()

    a = np.arange(100, dtype=np.float32)
    assert touch(a) == a.sum()
