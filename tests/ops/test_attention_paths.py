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
