"""Shared fixtures for the codec tests: random GGML blocks whose scales are finite and non-zero."""

from __future__ import annotations

import numpy as np
import pytest

# fp16 scale fields (byte offsets) of each block encoding
FP16_FIELDS = {"q4_0": (0,), "q5_0": (0,), "q8_0": (0,), "q4_k": (0, 2), "q6_k": (208,),
               "q4_1": (0, 2), "q5_1": (0, 2), "q2_k": (80, 82), "q3_k": (108,),
               "q5_k": (0, 2), "iq4_nl": (0,), "iq4_xs": (0,), "tq1_0": (52,), "tq2_0": (64,)}


def _finite_nonzero_fp16(rng, n):
    """n random fp16 bit patterns that are finite and non-zero (normals and subnormals)."""
    h = rng.integers(0, 1 << 16, n, dtype=np.uint32).astype(np.uint16)
    bad = ((h & 0x7C00) == 0x7C00) | ((h & 0x7FFF) == 0)
    while bad.any():
        h[bad] = rng.integers(0, 1 << 16, int(bad.sum()), dtype=np.uint32).astype(np.uint16)
        bad = ((h & 0x7C00) == 0x7C00) | ((h & 0x7FFF) == 0)
    return h


def pack_q4_k_scales(sc, m):
    """Pack 6-bit scales ``sc[..., 8]`` and mins ``m[..., 8]`` into GGML's 12 bytes.

    bytes 0-3:  sc0..sc3 (bits 5-0) | sc4..sc7 bits 5-4 (in bits 7-6)
    bytes 4-7:  m0..m3   (bits 5-0) | m4..m7   bits 5-4 (in bits 7-6)
    bytes 8-11: sc4..sc7 bits 3-0 (low nibble) | m4..m7 bits 3-0 (high nibble)
    """
    sc = sc.astype(np.uint8)
    m = m.astype(np.uint8)
    out = np.zeros((*sc.shape[:-1], 12), dtype=np.uint8)
    out[..., 0:4] = sc[..., 0:4] | ((sc[..., 4:8] >> 4) << 6)
    out[..., 4:8] = m[..., 0:4] | ((m[..., 4:8] >> 4) << 6)
    out[..., 8:12] = (sc[..., 4:8] & 0x0F) | ((m[..., 4:8] & 0x0F) << 4)
    return out


@pytest.fixture
def rng():
    return np.random.default_rng(1234)


@pytest.fixture
def random_blocks():
    """``make(name, n_blocks, rng)`` -> uint8 blocks whose scales are all finite and non-zero."""
    from maxdecl import codecs

    def make(name, n_blocks, rng):
        enc = codecs.get(name)
        b = rng.integers(0, 256, (n_blocks, enc.block_bytes), dtype=np.uint16).astype(np.uint8)
        for off in FP16_FIELDS.get(name, ()):
            h = _finite_nonzero_fp16(rng, n_blocks)
            b[:, off:off + 2] = h.view(np.uint8).reshape(n_blocks, 2)
        if name == "q4_k":   # the 6-bit sub-block scales and mins, all in 1..63
            sc = rng.integers(1, 64, (n_blocks, 8))
            m = rng.integers(1, 64, (n_blocks, 8))
            b[:, 4:16] = pack_q4_k_scales(sc, m)
        if name == "q6_k":   # int8 sub-block scales, all non-zero
            s = rng.integers(-128, 127, (n_blocks, 16))
            s[s >= 0] += 1
            b[:, 192:208] = s.astype(np.int8).view(np.uint8)
        return b

    return make
