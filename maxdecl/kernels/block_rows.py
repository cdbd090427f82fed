"""GGML block rows, decoded exactly: scalar helpers and one row decoder per encoding.

The decoders perform the same float32 operations, in the same order, as gguf-py,
so a decoded row equals ``dequantize`` bit for bit. The GEMM path of
``qmatmul`` decodes weight tiles with them; the GEMV kernels (``gemv.py``)
share the scalar helpers.

Block layouts (byte offsets inside one block; fp16 and u32 little-endian):

    q4_0  18 B / 32:  d f16 @0 | qs[16] @2      x[j] <- lo nibble of qs[j], x[j+16] <- hi
    q5_0  22 B / 32:  d f16 @0 | qh u32 @2 | qs[16] @6   5th bit of element j is qh bit j
    q8_0  34 B / 32:  d f16 @0 | qs int8[32] @2
    q4_k 144 B / 256: d f16 @0 | dmin f16 @2 | scales[12] @4 | qs[128] @16
                      chunk c (64 values): qs[32c:32c+32] lo -> sub-block 2c, hi -> 2c+1
                      value = d * sc[s] * q - dmin * m[s]
    q6_k 210 B / 256: ql[128] @0 | qh[64] @128 | scales int8[16] @192 | d f16 @208
    bf16   2 B / 1:   the top 16 bits of a float32
"""

from __future__ import annotations

import math

import numba
import numpy as np

from ..blocks import GGML_BLOCKS
from .codec_common import bits_f32
from .config import CACHE
from .step_outputs import empty

# Typed constants keep the lane arithmetic in int32 (numba widens int literals to
# int64, and LLVM then unpacks bytes through 64-bit lanes).
_I1 = np.int32(1)
_I4 = np.int32(4)
_I8 = np.int32(8)
_I15 = np.int32(15)
_I16 = np.int32(16)
_I32 = np.int32(32)
_I48 = np.int32(48)
_I63 = np.int32(63)
_I128 = np.int32(128)


# -- scalar helpers -----------------------------------------------------------------
@numba.njit(inline="always")
def _f16(lo, hi):
    """float32 value of the little-endian fp16 in bytes (lo, hi); exact, inf/NaN kept.

    Branch-free for finite values (block scales have random signs): the fp16 bits
    moved into float32 position, then the exponent rebiased by a multiply, which
    is also right for fp16 subnormals and keeps the sign.
    """
    h = np.uint32(lo) | (np.uint32(hi) << np.uint32(8))
    bits = ((h & np.uint32(0x8000)) << np.uint32(16)) | ((h & np.uint32(0x7FFF)) << np.uint32(13))
    f = bits_f32(bits) * np.float32(5.192296858534828e33)  # 2**112
    if (h & np.uint32(0x7C00)) == np.uint32(0x7C00):       # inf / NaN: rare, predictable
        f = bits_f32(bits | np.uint32(0x7F800000))
    return f


@numba.njit(inline="always")
def _bf16(u):
    return bits_f32(np.uint32(u) << np.uint32(16))


@numba.njit(inline="always")
def _i8(u):
    """A uint8 byte read as int8 (two's complement), as int32."""
    return (np.int32(u) ^ _I128) - _I128


@numba.njit(inline="always")
def _q4k_scale_min(w, o, j):
    """6-bit (scale, min) of sub-block ``j`` from q4_k's 12 packed bytes ``w[o:o+12]``.

    byte | 7 6 | 5 4 3 2 1 0          (sc_j, m_j: 6-bit scale / min of sub-block j)
    -----+-----+------------
      0  | sc4 hi | sc0               bits 7-6 of bytes 0-3: sc4..sc7 bits 5-4
      1  | sc5 hi | sc1
      2  | sc6 hi | sc2
      3  | sc7 hi | sc3
      4  | m4 hi  | m0                bits 7-6 of bytes 4-7: m4..m7 bits 5-4
      5  | m5 hi  | m1
      6  | m6 hi  | m2
      7  | m7 hi  | m3
         | 7 6 5 4 | 3 2 1 0
      8  | m4 lo   | sc4 lo           bytes 8-11: low 4 bits of sc4..sc7 (low nibble)
      9  | m5 lo   | sc5 lo                        and of m4..m7 (high nibble)
     10  | m6 lo   | sc6 lo
     11  | m7 lo   | sc7 lo
    """
    if j < 4:
        sc = np.int32(w[o + j]) & _I63
        m = np.int32(w[o + j + 4]) & _I63
    else:
        b = np.int32(w[o + j + 4])
        sc = (b & _I15) | ((np.int32(w[o + j - 4]) >> np.int32(6)) << _I4)
        m = (b >> _I4) | ((np.int32(w[o + j]) >> np.int32(6)) << _I4)
    return sc, m


# -- exact row decoders: the same float32 operations, in the same order, as gguf-py --
# Not fastmath and not numba-inlined, so callers' flags never reach them (LLVM may
# still inline them; instruction flags stay exact).
# _OPAQUE_TRIP: inner trip counts are written so LLVM cannot see them as constants
# (16 + 16 * (k < 0)). A constant 16/32 gets the loop fully unrolled, and the
# unrolled stores (f32 dst may alias u8 w) stay scalar; an unknown count goes to
# the loop vectorizer, which checks aliasing at run time (measured 2-4x faster).
@numba.njit(cache=CACHE)
def _dec_q4_0(w, dst):
    # w: (K//be*bb,) u8 one row -> dst: (K,) f32
    k = dst.shape[0]
    n16 = 16 + 16 * np.int64(k < 0)   # see _OPAQUE_TRIP
    for b in range(k // 32):
        o = b * 18
        d = _f16(w[o], w[o + 1])
        for j in range(n16):
            q = np.int32(w[o + 2 + j])
            dst[b * 32 + j] = d * np.float32((q & _I15) - _I8)
            dst[b * 32 + 16 + j] = d * np.float32((q >> _I4) - _I8)


@numba.njit(cache=CACHE)
def _dec_q5_0(w, dst):
    # w: (K//be*bb,) u8 one row -> dst: (K,) f32
    k = dst.shape[0]
    n16 = 16 + 16 * np.int64(k < 0)   # see _OPAQUE_TRIP
    for b in range(k // 32):
        o = b * 22
        d = _f16(w[o], w[o + 1])
        qh = (np.int32(w[o + 2]) | (np.int32(w[o + 3]) << np.int32(8))
              | (np.int32(w[o + 4]) << _I16) | (np.int32(w[o + 5]) << np.int32(24)))
        for j in range(n16):
            q = np.int32(w[o + 6 + j])
            sh = np.int32(j)
            lo = (q & _I15) | (((qh >> sh) & _I1) << _I4)
            hi = (q >> _I4) | (((qh >> (sh + _I16)) & _I1) << _I4)
            dst[b * 32 + j] = d * np.float32(lo - _I16)
            dst[b * 32 + 16 + j] = d * np.float32(hi - _I16)


@numba.njit(cache=CACHE)
def _dec_q8_0(w, dst):
    # w: (K//be*bb,) u8 one row -> dst: (K,) f32
    k = dst.shape[0]
    n16 = 16 + 16 * np.int64(k < 0)   # see _OPAQUE_TRIP
    n32 = 2 * n16
    for b in range(k // 32):
        o = b * 34
        d = _f16(w[o], w[o + 1])
        for j in range(n32):
            dst[b * 32 + j] = d * np.float32(_i8(w[o + 2 + j]))


@numba.njit(cache=CACHE)
def _dec_q4_k(w, dst):
    # w: (K//be*bb,) u8 one row -> dst: (K,) f32
    k = dst.shape[0]
    n16 = 16 + 16 * np.int64(k < 0)   # see _OPAQUE_TRIP
    n32 = 2 * n16
    for b in range(k // 256):
        o = b * 144
        d = _f16(w[o], w[o + 1])
        dmin = _f16(w[o + 2], w[o + 3])
        for c in range(4):
            sc0, m0 = _q4k_scale_min(w, o + 4, 2 * c)
            sc1, m1 = _q4k_scale_min(w, o + 4, 2 * c + 1)
            d0 = d * np.float32(sc0)
            d1 = d * np.float32(sc1)
            dm0 = dmin * np.float32(m0)
            dm1 = dmin * np.float32(m1)
            qo = o + 16 + 32 * c
            xo = b * 256 + 64 * c
            for j in range(n32):
                q = np.int32(w[qo + j])
                dst[xo + j] = d0 * np.float32(q & _I15) - dm0
                dst[xo + 32 + j] = d1 * np.float32(q >> _I4) - dm1


@numba.njit(cache=CACHE)
def _dec_q6_k(w, dst):
    # w: (K//be*bb,) u8 one row -> dst: (K,) f32
    # One half h (128 floats) of a block uses ql[64h:64h+64], qh[32h:32h+32], sc[8h:8h+8]:
    #   x[128h +  0 + l] = ql[l]      low nibble  | qh[l] bits 1-0 << 4   scale sc[l//16 + 0]
    #   x[128h + 32 + l] = ql[l + 32] low nibble  | qh[l] bits 3-2 << 4   scale sc[l//16 + 2]
    #   x[128h + 64 + l] = ql[l]      high nibble | qh[l] bits 5-4 << 4   scale sc[l//16 + 4]
    #   x[128h + 96 + l] = ql[l + 32] high nibble | qh[l] bits 7-6 << 4   scale sc[l//16 + 6]
    # (l in 0..31; every 6-bit q is stored with an offset of 32; d * sc first, as GGML)
    k = dst.shape[0]
    n16 = 16 + 16 * np.int64(k < 0)   # see _OPAQUE_TRIP
    for b in range(k // 256):
        o = b * 210
        d = _f16(w[o + 208], w[o + 209])
        for h in range(2):
            ql = o + h * 64
            qh = o + 128 + h * 32
            so = o + 192 + h * 8
            xo = b * 256 + h * 128
            for half in range(2):
                s0 = d * np.float32(_i8(w[so + half]))
                s1 = d * np.float32(_i8(w[so + half + 2]))
                s2 = d * np.float32(_i8(w[so + half + 4]))
                s3 = d * np.float32(_i8(w[so + half + 6]))
                for j in range(16 * half, 16 * half + n16):
                    a = np.int32(w[ql + j])
                    c = np.int32(w[ql + 32 + j])
                    e = np.int32(w[qh + j])
                    dst[xo + j] = s0 * np.float32(((a & _I15) | ((e << _I4) & _I48)) - _I32)
                    dst[xo + 32 + j] = s1 * np.float32(
                        ((c & _I15) | ((e << np.int32(2)) & _I48)) - _I32)
                    dst[xo + 64 + j] = s2 * np.float32(((a >> _I4) | (e & _I48)) - _I32)
                    dst[xo + 96 + j] = s3 * np.float32(
                        ((c >> _I4) | ((e >> np.int32(2)) & _I48)) - _I32)


@numba.njit(cache=CACHE)
def _dec_bf16(w, dst):
    # w: (K//be*bb,) u8 one row -> dst: (K,) f32
    k = dst.shape[0]
    for i in range(k):
        dst[i] = bits_f32((np.uint32(w[2 * i]) << np.uint32(16))
                           | (np.uint32(w[2 * i + 1]) << np.uint32(24)))


@numba.njit(cache=CACHE)
def _dec_q4_1(w, dst):
    # w: (K//32*20,) u8 one row -> dst: (K,) f32; x = d * q + m
    k = dst.shape[0]
    n16 = 16 + 16 * np.int64(k < 0)   # see _OPAQUE_TRIP
    for b in range(k // 32):
        o = b * 20
        d = _f16(w[o], w[o + 1])
        m = _f16(w[o + 2], w[o + 3])
        for j in range(n16):
            q = np.int32(w[o + 4 + j])
            dst[b * 32 + j] = d * np.float32(q & _I15) + m
            dst[b * 32 + 16 + j] = d * np.float32(q >> _I4) + m


@numba.njit(cache=CACHE)
def _dec_q5_1(w, dst):
    # w: (K//32*24,) u8 one row -> dst: (K,) f32; x = d * q + m, q 5 bits (qh bit j)
    k = dst.shape[0]
    n16 = 16 + 16 * np.int64(k < 0)   # see _OPAQUE_TRIP
    for b in range(k // 32):
        o = b * 24
        d = _f16(w[o], w[o + 1])
        m = _f16(w[o + 2], w[o + 3])
        qh = (np.int32(w[o + 4]) | (np.int32(w[o + 5]) << np.int32(8))
              | (np.int32(w[o + 6]) << _I16) | (np.int32(w[o + 7]) << np.int32(24)))
        for j in range(n16):
            q = np.int32(w[o + 8 + j])
            sh = np.int32(j)
            lo = (q & _I15) | (((qh >> sh) & _I1) << _I4)
            hi = (q >> _I4) | (((qh >> (sh + _I16)) & _I1) << _I4)
            dst[b * 32 + j] = d * np.float32(lo) + m
            dst[b * 32 + 16 + j] = d * np.float32(hi) + m


@numba.njit(cache=CACHE)
def _dec_q2_k(w, dst):
    # w: (K//256*84,) u8 one row -> dst: (K,) f32
    # scales[16] @0 (low nibble: scale, high: min of 16 values) | qs[64] @16 | d @80 | dmin @82
    # value i = 128g + 32s + l (g < 2, s < 4, l < 32): 2 bits (qs[32g + l] >> 2s) & 3,
    # sub-block i // 16: x = d * sc * q - dmin * m
    k = dst.shape[0]
    n16 = 16 + 16 * np.int64(k < 0)   # see _OPAQUE_TRIP
    for b in range(k // 256):
        o = b * 84
        d = _f16(w[o + 80], w[o + 81])
        dmin = _f16(w[o + 82], w[o + 83])
        for g in range(2):
            for s in range(4):
                for half in range(2):
                    sb = 8 * g + 2 * s + half
                    sc = np.int32(w[o + sb])
                    dl = d * np.float32(sc & _I15)
                    ml = dmin * np.float32(sc >> _I4)
                    qo = o + 16 + 32 * g + 16 * half
                    xo = b * 256 + 16 * sb
                    sh = np.int32(2 * s)
                    for j in range(n16):
                        q = (np.int32(w[qo + j]) >> sh) & np.int32(3)
                        dst[xo + j] = dl * np.float32(q) - ml


@numba.njit(inline="always")
def _q3k_scale(w, o, i):
    # 6-bit scale i (0..15) of q3_k's 12 bytes at w[o:o+12], minus 32: low 4 bits are
    # nibble i // 8 of byte i % 8, high 2 bits are bits 2 * (i // 4) of byte 8 + i % 4
    lo = (np.int32(w[o + (i & 7)]) >> np.int32(4 * (i >> 3))) & _I15
    hi = (np.int32(w[o + 8 + (i & 3)]) >> np.int32(2 * (i >> 2))) & np.int32(3)
    return (lo | (hi << _I4)) - _I32


@numba.njit(cache=CACHE)
def _dec_q3_k(w, dst):
    # w: (K//256*110,) u8 one row -> dst: (K,) f32
    # hmask[32] @0 | qs[64] @32 | scales[12] @96 | d @108
    # value i = 128g + 32s + l: low 2 bits (qs[32g + l] >> 2s) & 3, minus 4 unless bit
    # (4g + s) of hmask[l] is set; x = d * (scale[i // 16] - 32) * q
    k = dst.shape[0]
    n16 = 16 + 16 * np.int64(k < 0)   # see _OPAQUE_TRIP
    for b in range(k // 256):
        o = b * 110
        d = _f16(w[o + 108], w[o + 109])
        for g in range(2):
            for s in range(4):
                sh = np.int32(2 * s)
                hb = np.int32(4 * g + s)
                for half in range(2):
                    sb = 8 * g + 2 * s + half
                    dl = d * np.float32(_q3k_scale(w, o + 96, sb))
                    qo = o + 32 + 32 * g + 16 * half
                    ho = o + 16 * half
                    xo = b * 256 + 16 * sb
                    for j in range(n16):
                        q = (np.int32(w[qo + j]) >> sh) & np.int32(3)
                        h = (np.int32(w[ho + j]) >> hb) & _I1
                        dst[xo + j] = dl * np.float32(q - ((h ^ _I1) << np.int32(2)))


@numba.njit(cache=CACHE)
def _dec_q5_k(w, dst):
    # w: (K//256*176,) u8 one row -> dst: (K,) f32
    # d @0 | dmin @2 | scales[12] @4 (q4_k's packing) | qh[32] @16 | qs[128] @48
    # chunk c (64 values): qs[32c + l] low nibble -> value 64c + l, high -> 64c + 32 + l;
    # 5th bit of value 32t + l is bit t of qh[l]; x = d * sc * q - dmin * m
    k = dst.shape[0]
    n16 = 16 + 16 * np.int64(k < 0)   # see _OPAQUE_TRIP
    n32 = 2 * n16
    for b in range(k // 256):
        o = b * 176
        d = _f16(w[o], w[o + 1])
        dmin = _f16(w[o + 2], w[o + 3])
        for c in range(4):
            sc0, m0 = _q4k_scale_min(w, o + 4, 2 * c)
            sc1, m1 = _q4k_scale_min(w, o + 4, 2 * c + 1)
            d0 = d * np.float32(sc0)
            d1 = d * np.float32(sc1)
            dm0 = dmin * np.float32(m0)
            dm1 = dmin * np.float32(m1)
            qo = o + 48 + 32 * c
            xo = b * 256 + 64 * c
            b0 = np.int32(2 * c)
            for j in range(n32):
                q = np.int32(w[qo + j])
                h = np.int32(w[o + 16 + j])
                lo = (q & _I15) | (((h >> b0) & _I1) << _I4)
                hi = (q >> _I4) | (((h >> (b0 + _I1)) & _I1) << _I4)
                dst[xo + j] = d0 * np.float32(lo) - dm0
                dst[xo + 32 + j] = d1 * np.float32(hi) - dm1


# GGML's non-linear 4-bit grid (kvalues_iq4nl)
IQ4_GRID = np.array([-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113],
                    np.float32)


@numba.njit(cache=CACHE)
def _dec_iq4_nl(w, dst):
    # w: (K//32*18,) u8 one row -> dst: (K,) f32; d @0 | qs[16] @2: x = d * grid[nibble]
    k = dst.shape[0]
    grid = IQ4_GRID
    n16 = 16 + 16 * np.int64(k < 0)   # see _OPAQUE_TRIP
    for b in range(k // 32):
        o = b * 18
        d = _f16(w[o], w[o + 1])
        for j in range(n16):
            q = np.int32(w[o + 2 + j])
            dst[b * 32 + j] = d * grid[q & _I15]
            dst[b * 32 + 16 + j] = d * grid[q >> _I4]


@numba.njit(cache=CACHE)
def _dec_iq4_xs(w, dst):
    # w: (K//256*136,) u8 one row -> dst: (K,) f32
    # d @0 | scales_h u16 @2 (2 bits per sub-block) | scales_l[4] @4 (a nibble per
    # sub-block) | qs[128] @8 (16 bytes per 32-value sub-block, iq4_nl's order)
    k = dst.shape[0]
    grid = IQ4_GRID
    n16 = 16 + 16 * np.int64(k < 0)   # see _OPAQUE_TRIP
    for b in range(k // 256):
        o = b * 136
        d = _f16(w[o], w[o + 1])
        sh = np.int32(w[o + 2]) | (np.int32(w[o + 3]) << np.int32(8))
        for i in range(8):
            lo = (np.int32(w[o + 4 + i // 2]) >> np.int32(4 * (i % 2))) & _I15
            hi = (sh >> np.int32(2 * i)) & np.int32(3)
            dl = d * np.float32((lo | (hi << _I4)) - _I32)
            qo = o + 8 + 16 * i
            xo = b * 256 + 32 * i
            for j in range(n16):
                q = np.int32(w[qo + j])
                dst[xo + j] = dl * grid[q & _I15]
                dst[xo + 16 + j] = dl * grid[q >> _I4]


@numba.njit(cache=CACHE)
def _dec_tq1_0(w, dst):
    # w: (K//256*54,) u8 one row -> dst: (K,) f32; qs[48] @0 | qh[4] @48 | d @52
    # base-3 digits: byte v holds 5 (qh: 4) trits, digit n read as ((v * 3^n mod 256) * 3) >> 8
    # values: qs[0:32] digit n -> 32n + l, qs[32:48] -> 160 + 16n + l, qh -> 240 + 4n + l
    k = dst.shape[0]
    for b in range(k // 256):
        o = b * 54
        d = _f16(w[o + 52], w[o + 53])
        xo = b * 256
        pw = np.int32(1)
        for n in range(5):
            for j in range(32):
                v = (np.int32(w[o + j]) * pw) & np.int32(255)
                dst[xo + 32 * n + j] = d * np.float32(((v * np.int32(3)) >> _I8) - _I1)
            for j in range(16):
                v = (np.int32(w[o + 32 + j]) * pw) & np.int32(255)
                dst[xo + 160 + 16 * n + j] = d * np.float32(((v * np.int32(3)) >> _I8) - _I1)
            if n < 4:
                for j in range(4):
                    v = (np.int32(w[o + 48 + j]) * pw) & np.int32(255)
                    dst[xo + 240 + 4 * n + j] = d * np.float32(
                        ((v * np.int32(3)) >> _I8) - _I1)
            pw = pw * np.int32(3)


@numba.njit(cache=CACHE)
def _dec_tq2_0(w, dst):
    # w: (K//256*66,) u8 one row -> dst: (K,) f32; qs[64] @0 | d @64
    # value 128g + 32s + l = ((qs[32g + l] >> 2s) & 3) - 1, times d
    k = dst.shape[0]
    n32 = 32 + 32 * np.int64(k < 0)   # see _OPAQUE_TRIP
    for b in range(k // 256):
        o = b * 66
        d = _f16(w[o + 64], w[o + 65])
        for g in range(2):
            for s in range(4):
                sh = np.int32(2 * s)
                xo = b * 256 + 128 * g + 32 * s
                for j in range(n32):
                    q = (np.int32(w[o + 32 * g + j]) >> sh) & np.int32(3)
                    dst[xo + j] = d * np.float32(q - _I1)


KINDS = {"q4_0": 0, "q5_0": 1, "q8_0": 2, "q4_k": 3, "q6_k": 4, "bf16": 5,
         "q4_1": 6, "q5_1": 7, "q2_k": 8, "q3_k": 9, "q5_k": 10, "iq4_nl": 11,
         "iq4_xs": 12, "tq1_0": 13, "tq2_0": 14}
# Every kind has an exact row decoder (dequantize, embedding rows, the prefill GEMM)
# and a GEMV kernel (gemv.py; GEMV_KINDS, which has_kernel checks, lists them all).
GEMV_KINDS = ("q4_0", "q5_0", "q8_0", "q4_k", "q6_k", "bf16", "q5_k", "q4_1", "q5_1",
              "q3_k", "q2_k", "iq4_nl", "iq4_xs", "tq2_0", "tq1_0")
# (block_elements, block_bytes) of each kind: GGML's sizes (maxdecl.blocks, the one table)
ROW_LAYOUTS = {k: GGML_BLOCKS[k] for k in KINDS}
LAYOUTS = {k: GGML_BLOCKS[k] for k in GEMV_KINDS}


@numba.njit(cache=CACHE)
def _decode_row(kind, w, r, dst):
    # w: (N, K//be*bb) u8, row r -> dst: (K,) f32; kind indexes KINDS
    if kind == 0:
        _dec_q4_0(w[r], dst)
    elif kind == 1:
        _dec_q5_0(w[r], dst)
    elif kind == 2:
        _dec_q8_0(w[r], dst)
    elif kind == 3:
        _dec_q4_k(w[r], dst)
    elif kind == 4:
        _dec_q6_k(w[r], dst)
    elif kind == 5:
        _dec_bf16(w[r], dst)
    elif kind == 6:
        _dec_q4_1(w[r], dst)
    elif kind == 7:
        _dec_q5_1(w[r], dst)
    elif kind == 8:
        _dec_q2_k(w[r], dst)
    elif kind == 9:
        _dec_q3_k(w[r], dst)
    elif kind == 10:
        _dec_q5_k(w[r], dst)
    elif kind == 11:
        _dec_iq4_nl(w[r], dst)
    elif kind == 12:
        _dec_iq4_xs(w[r], dst)
    elif kind == 13:
        _dec_tq1_0(w[r], dst)
    else:
        _dec_tq2_0(w[r], dst)


@numba.njit(cache=CACHE, parallel=True)
def _deq_tile(kind, w, r0, r1, out):
    # w: (N, ...) u8 rows [r0, r1) -> out: (r1 - r0, K) f32
    for i in numba.prange(r1 - r0):
        _decode_row(kind, w, r0 + i, out[i])


@numba.njit(cache=CACHE)
def _gather_rows(kind, w, ids, out):
    # rows ids[i] of w -> out[i], on the calling thread (a decode step's few embeddings:
    # no parallel region to wake)
    for i in range(ids.shape[0]):
        _decode_row(kind, w, ids[i], out[i])


def gather_rows(w: np.ndarray, encoding: str, k: int, ids: np.ndarray,
                step=None) -> np.ndarray:
    """Rows ``ids`` (int64, each in range: checked by the caller) of the packed ``w``
    (N, K // be * bb) decoded exactly to float32 (len(ids), k), serially (into an array
    of ``step``'s, a ``StepOutputs``, where given)."""
    out = empty(step, 0, (ids.shape[0], k))
    _gather_rows(KINDS[encoding], w, ids, out)
    return out


def dequantize_blocks(encoding: str, blocks: np.ndarray, out: np.ndarray) -> None:
    """Decode ``blocks`` (n_blocks, block_bytes) uint8 into the C-contiguous float32
    ``out`` (n_blocks * block_elements values), in parallel over runs of whole blocks
    of about 4096 values (the codecs' ``dequantize``)."""
    nb, bb = blocks.shape
    if nb == 0:
        return
    be = out.size // nb
    if out.size != nb * be or not out.flags.c_contiguous:
        raise ValueError(f"dequantize_blocks: {nb} blocks cannot fill {out.size} values")
    per = math.gcd(nb, max(1, 4096 // be))      # blocks per task; 4096 // be is a power of 2
    tasks = nb // per
    _deq_tile(KINDS[encoding], blocks.reshape(tasks, per * bb), 0, tasks,
              out.reshape(tasks, per * be))


def dequantize_rows(w: np.ndarray, encoding: str, k: int, r0: int, r1: int) -> np.ndarray:
    """Rows [r0, r1) of ``w`` decoded exactly to float32 (r1 - r0, k)."""
    be, bb = ROW_LAYOUTS[encoding]
    if not 0 <= r0 <= r1 <= w.shape[0] or k % be or w.ndim != 2 or w.shape[1] != k // be * bb:
        raise ValueError(f"dequantize_rows: rows [{r0}, {r1}) of K={k} {encoding} need "
                         f"w[>={r1}, {k // be * bb}], got {list(w.shape)}")
    out = np.empty((r1 - r0, k), np.float32)
    _deq_tile(KINDS[encoding], w, r0, r1, out)
    return out
