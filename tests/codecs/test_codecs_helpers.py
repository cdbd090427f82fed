"""The scalar helpers the K-quant kernels depend on for bit-exactness."""

from __future__ import annotations

import numpy as np


def test_f32_to_f16_bits_matches_numpy():
    import numba

    from maxdecl.kernels.codec_common import f32_to_f16_bits

    @numba.njit
    def conv(f, out):
        for i in range(f.size):
            out[i] = f32_to_f16_bits(f[i])

    rng = np.random.default_rng(0)
    u = rng.integers(0, 1 << 32, 200_000, dtype=np.uint64).astype(np.uint32)
    # every fp16 rounding boundary (halfway points and their neighbours) and the range edges
    h = np.arange(1 << 15, dtype=np.uint32).astype(np.uint16).view(np.float16).astype(np.float32)
    mid = h.view(np.uint32)
    edges = np.concatenate([mid, mid + 0x1000, mid + 0x0FFF, mid + 0x1001, mid + 0x2000,
                            np.array([0x477FEFFF, 0x477FF000, 0x477FE000, 0x33000000, 0x33000001,
                                      0x387FE000, 0x387FF000, 0x7F800000], np.uint32)])
    u = np.concatenate([u, edges, edges | 0x80000000]).astype(np.uint32)
    f = u.view(np.float32)
    f = f[~np.isnan(f)]
    out = np.empty(f.size, dtype=np.uint16)
    conv(f, out)
    with np.errstate(all="ignore"):
        ref = f.astype(np.float16).view(np.uint16)
    np.testing.assert_array_equal(out, ref)


def test_nearest_int_rounds_half_to_even():
    import numba

    from maxdecl.kernels.codec_common import nearest_int

    @numba.njit
    def run(f, out):
        for i in range(f.size):
            out[i] = nearest_int(f[i])

    f = np.array([0.5, 1.5, 2.5, -0.5, -1.5, 2.4999998, 7.5, -7.5, 4194303.0, 0.0, np.nan],
                 dtype=np.float32)
    out = np.empty(f.size, dtype=np.int32)
    run(f, out)
    np.testing.assert_array_equal(out, [0, 2, 2, 0, -2, 2, 8, -8, 4194303, 0, 0])
