"""The kernels' vectorisable float32 exp against float64 exp."""

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
