"""Hand-built blocks: each test spells out the GGML byte layout and the floats it must decode to."""

from __future__ import annotations

import numpy as np

from maxdecl import codecs


def _f16(v):
    return list(np.array([v], dtype=np.float16).view(np.uint8))


def test_bf16_layout():
    # 1.0 = 0x3F80_0000 -> bf16 0x3F80 stored little-endian: 80 3F; -2.0 -> 0xC000: 00 C0
    data = np.array([0x80, 0x3F, 0x00, 0xC0], dtype=np.uint8)
    np.testing.assert_array_equal(codecs.get("bf16").dequantize(data, (2,)), [1.0, -2.0])
    x = np.array([[1.0, -2.0]], dtype=np.float32)
    np.testing.assert_array_equal(codecs.get("bf16").quantize(x), data.reshape(1, 4))


def test_q4_0_layout():
    # bytes 0-1: d = 0.5 (fp16); bytes 2-17: byte j = q[j] (low nibble) | q[j+16] << 4
    # q[j] = j % 16 and q[j+16] = 15 - j % 16, so x[j] = 0.5 * (q - 8)
    q_lo = np.arange(16)
    q_hi = 15 - np.arange(16)
    block = np.array(_f16(0.5) + list(q_lo | (q_hi << 4)), dtype=np.uint8)
    want = 0.5 * (np.concatenate([q_lo, q_hi]) - 8)
    got = codecs.get("q4_0").dequantize(block, (32,))
    np.testing.assert_array_equal(got, want.astype(np.float32))
    # quantize: the element of largest magnitude (-4.0) maps to q = 0 and fixes d = -4 / -8
    x = want.astype(np.float32).reshape(1, 32)
    np.testing.assert_array_equal(codecs.get("q4_0").quantize(x).reshape(-1), block)


def test_q5_0_layout():
    # bytes 0-1: d = 0.25; bytes 2-5: qh, bit j = bit 4 of q[j]; bytes 6-21: q[j] | q[j+16] << 4
    q = np.arange(32)                       # q[j] = j: bit 4 is set for j >= 16
    qh = np.uint32(0xFFFF0000)
    qs = (q[:16] & 0x0F) | ((q[16:] & 0x0F) << 4)
    qh_bytes = list(np.array([qh], "<u4").view(np.uint8))
    block = np.array(_f16(0.25) + qh_bytes + list(qs), dtype=np.uint8)
    got = codecs.get("q5_0").dequantize(block, (1, 32))
    np.testing.assert_array_equal(got, (0.25 * (q - 16)).astype(np.float32).reshape(1, 32))


def test_q8_0_layout():
    # bytes 0-1: d = 2.0; bytes 2-33: int8 q[j] in element order; x = d * q
    q = np.arange(-16, 16, dtype=np.int8)
    block = np.array(_f16(2.0) + list(q.view(np.uint8)), dtype=np.uint8)
    got = codecs.get("q8_0").dequantize(block, (32,))
    np.testing.assert_array_equal(got, 2.0 * q.astype(np.float32))
    # quantize: d = max|x| / 127, so x = d * q round-trips exactly when d is fp16-exact
    x = (q.astype(np.float32) * np.float32(127 / 16)).reshape(1, 32)
    y = codecs.get("q8_0").dequantize(codecs.get("q8_0").quantize(x), x.shape)
    np.testing.assert_allclose(y, x, rtol=0, atol=np.float32(127 / 16) / 2 * 1.01)


def test_q4_k_layout():
    # bytes 0-1: d = 1.0; bytes 2-3: dmin = 0.5
    # bytes 4-15: sub-block s has scale sc[s] = s + 1 and min m[s] = 2 s + 3 (6 bits each):
    #   bytes 4-7   = sc0..sc3 | (sc4..sc7 >> 4) << 6
    #   bytes 8-11  = m0..m3   | (m4..m7   >> 4) << 6
    #   bytes 12-15 = (sc4..sc7 & 15) | (m4..m7 & 15) << 4
    # bytes 16-143: 4 groups of 32 bytes; byte l of group g = q[64g + l] | q[64g + 32 + l] << 4
    sc = np.arange(8) + 1
    m = 2 * np.arange(8) + 3
    m[7] = 63                                      # 63 = 0b111111 exercises the high bits
    scales = [*(sc[:4] | ((sc[4:] >> 4) << 6)), *(m[:4] | ((m[4:] >> 4) << 6)),
              *((sc[4:] & 15) | ((m[4:] & 15) << 4))]
    q = np.arange(256) % 16                        # q[i] = i mod 16
    qs = []
    for g in range(4):
        qs += list(q[64 * g:64 * g + 32] | (q[64 * g + 32:64 * g + 64] << 4))
    block = np.array(_f16(1.0) + _f16(0.5) + scales + qs, dtype=np.uint8)
    assert block.size == 144
    got = codecs.get("q4_k").dequantize(block, (256,))
    s = np.arange(256) // 32                       # sub-block of each element
    want = 1.0 * sc[s] * q - 0.5 * m[s]
    np.testing.assert_array_equal(got, want.astype(np.float32))


def test_q6_k_layout():
    # bytes 0-127 ql, 128-191 qh, 192-207 int8 scales, 208-209 d = 0.125 (fp16)
    # for half h (floats 128h..128h+127) and l in 0..31, with q in 0..63:
    #   ql[64h + l]      = q[128h + l]      & 15 | (q[128h + 64 + l] & 15) << 4
    #   ql[64h + 32 + l] = q[128h + 32 + l] & 15 | (q[128h + 96 + l] & 15) << 4
    #   qh[32h + l]      = q[128h+l] >> 4      | q[128h+32+l] >> 4 << 2
    #                    | q[128h+64+l] >> 4 << 4 | q[128h+96+l] >> 4 << 6
    # x[i] = d * sc[i // 16] * (q[i] - 32)
    q = (np.arange(256) * 7) % 64
    sc = np.array([1, -1, 2, -2, 3, -3, 4, -4, 127, -128, 5, -5, 6, -6, 7, -7])
    ql = np.zeros(128, dtype=np.int64)
    qh = np.zeros(64, dtype=np.int64)
    for h in range(2):
        b = 128 * h
        for l in range(32):
            ql[64 * h + l] = (q[b + l] & 15) | ((q[b + 64 + l] & 15) << 4)
            ql[64 * h + 32 + l] = (q[b + 32 + l] & 15) | ((q[b + 96 + l] & 15) << 4)
            qh[32 * h + l] = ((q[b + l] >> 4) | ((q[b + 32 + l] >> 4) << 2)
                              | ((q[b + 64 + l] >> 4) << 4) | ((q[b + 96 + l] >> 4) << 6))
    block = np.array(list(ql) + list(qh) + list(sc.astype(np.int8).view(np.uint8)) + _f16(0.125),
                     dtype=np.uint8)
    assert block.size == 210
    got = codecs.get("q6_k").dequantize(block, (1, 256))
    ds = np.float32(0.125) * sc[np.arange(256) // 16].astype(np.float32)
    want = ds * (q - 32).astype(np.float32)
    np.testing.assert_array_equal(got.reshape(-1), want)


def test_block_sizes_equal_ggml():
    want = {"bf16": (1, 2), "q4_0": (32, 18), "q4_k": (256, 144), "q6_k": (256, 210),
            "q5_0": (32, 22), "q8_0": (32, 34)}
    for name, (be, bb) in want.items():
        enc = codecs.get(name)
        assert (enc.name, enc.block_elements, enc.block_bytes) == (name, be, bb)
    gguf = __import__("pytest").importorskip("gguf")
    for name, (be, bb) in want.items():
        assert gguf.GGML_QUANT_SIZES[getattr(gguf.GGMLQuantizationType, name.upper())] == (be, bb)


def test_edge_shapes_and_magnitudes(rng):
    for name in ["bf16", "q4_0", "q5_0", "q8_0", "q4_k", "q6_k"]:
        enc = codecs.get(name)
        k = max(enc.block_elements, 32) * 2
        # zero rows, a zero-width last axis, 3-D input
        for shape in [(0, k), (3, 0), (2, 3, k), (k,)]:
            x = rng.standard_normal(shape).astype(np.float32)
            q = enc.quantize(x)
            assert q.shape == (*shape[:-1], shape[-1] // enc.block_elements * enc.block_bytes)
            assert enc.dequantize(q, shape).shape == shape
        # constant rows decode to (nearly) the constant; zeros to exact zeros
        for c in [0.0, 0.3, -7.0]:
            x = np.full((2, k), c, dtype=np.float32)
            y = enc.dequantize(enc.quantize(x), x.shape)
            np.testing.assert_allclose(y, x, rtol=0.02, atol=1e-6, err_msg=name)
        # tiny and huge magnitudes stay finite-or-inf and keep the sign of large entries
        for scale in [1e-30, 1e30]:
            x = (rng.standard_normal((2, k)) * scale).astype(np.float32)
            with np.errstate(all="ignore"):
                y = enc.dequantize(enc.quantize(x), x.shape)
            assert y.dtype == np.float32 and y.shape == x.shape


def test_kernel_offsets_agree_with_block_tables():
    from maxdecl.kernels import codec_q4_k, codec_q6_k

    assert codec_q4_k._QS + codec_q4_k.QK_K // 2 == codecs.get("q4_k").block_bytes
    assert (codec_q4_k._D, codec_q4_k._DMIN, codec_q4_k._SC) == (0, 2, 4)
    assert codec_q6_k._D + 2 == codecs.get("q6_k").block_bytes
    assert (codec_q6_k._QH, codec_q6_k._SC) == (128, 192)
