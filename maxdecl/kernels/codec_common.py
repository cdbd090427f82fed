"""Scalar helpers shared by the kernels: bit casts, fp16 rounding, GGML's rounding.

Every helper is plain IEEE float32 arithmetic (``EXACT``: no contraction, no
reassociation), so the kernels that call them reproduce GGML's C reference bit
for bit. Imported only from inside codec methods (never at package import).
"""

from __future__ import annotations

import numpy as np
from numba import njit, types
from numba.extending import intrinsic

from .config import CACHE, EXACT


@intrinsic
def f32_bits(typingctx, x):
    """Reinterpret a float32 as its uint32 bit pattern (C ``memcpy`` of a float)."""
    if x != types.float32:
        return None

    def codegen(context, builder, sig, args):
        return builder.bitcast(args[0], context.get_value_type(types.uint32))

    return types.uint32(types.float32), codegen


@intrinsic
def bits_f32(typingctx, u):
    """Reinterpret the low 32 bits of an integer as a float32 (narrower: zero-extended)."""
    if not isinstance(u, types.Integer):
        return None

    def codegen(context, builder, sig, args):
        v = args[0]
        i32 = context.get_value_type(types.uint32)
        width = sig.args[0].bitwidth
        if width > 32:
            v = builder.trunc(v, i32)
        elif width < 32:
            v = builder.zext(v, i32)
        return builder.bitcast(v, context.get_value_type(types.float32))

    return types.float32(u), codegen


@njit(cache=CACHE, fastmath=EXACT)
def f32_to_f16_bits(f):
    """fp16 bits of float32 ``f``, rounded to nearest even (as F16C ``vcvtps2ph``).

    Quirks: |f| >= 65520 gives +-inf; a NaN keeps its sign and top payload bits
    and is made quiet (0x7e00); fp16 subnormals round at the 2**-24 grid.
    """
    u = f32_bits(np.float32(f))
    sign = (u >> np.uint32(16)) & np.uint32(0x8000)
    a = u & np.uint32(0x7FFFFFFF)
    if a >= np.uint32(0x7F800000):                       # inf or NaN
        if a == np.uint32(0x7F800000):
            return np.uint16(sign | np.uint32(0x7C00))
        return np.uint16(sign | np.uint32(0x7E00) | ((a >> np.uint32(13)) & np.uint32(0x3FF)))
    if a >= np.uint32(0x477FF000):                       # rounds to >= 65520: overflow
        return np.uint16(sign | np.uint32(0x7C00))
    if a >= np.uint32(0x38800000):                       # fp16 normal: rebias 127 -> 15
        lsb = (a >> np.uint32(13)) & np.uint32(1)
        r = a - np.uint32(0x38000000) + np.uint32(0xFFF) + lsb
        return np.uint16(sign | (r >> np.uint32(13)))
    e = a >> np.uint32(23)
    if e < np.uint32(102):                               # below half the smallest subnormal
        return np.uint16(sign)
    m = (a & np.uint32(0x7FFFFF)) | np.uint32(0x800000)
    shift = np.uint32(126) - e                           # 14..24
    n = m >> shift
    rem = m & ((np.uint32(1) << shift) - np.uint32(1))
    half = np.uint32(1) << (shift - np.uint32(1))
    if rem > half or (rem == half and (n & np.uint32(1)) == np.uint32(1)):
        n += np.uint32(1)
    return np.uint16(sign | n)


@njit(cache=CACHE, fastmath=EXACT)
def f16_round(f, table):
    """``GGML_FP16_TO_FP32(GGML_FP32_TO_FP16(f))``: ``f`` rounded through fp16."""
    return table[f32_to_f16_bits(f)]


@njit(cache=CACHE, fastmath=EXACT)
def all_finite(row):
    """True unless ``row`` holds a NaN or an infinity (quantizers flag such blocks)."""
    for v in row:
        if not (abs(v) < np.float32(np.inf)):
            return False
    return True


@njit(cache=CACHE, fastmath=EXACT)
def nearest_int(f):
    """GGML's ``nearest_int``: add 1.5 * 2**23 and read the low mantissa bits.

    Rounds half to even for |f| <= 4194303; outside that range (and for NaN, which
    gives 0) it keeps the C code's wrap-around, which bit-exactness depends on.
    """
    v = np.float32(f) + np.float32(12582912.0)
    i = np.int32(f32_bits(v) & np.uint32(0x007FFFFF))
    return i - np.int32(0x00400000)


@njit(cache=CACHE, fastmath=EXACT)
def c_trunc_u8(t):
    """``(uint8)`` of a float the way NumPy and x86 C compilers do it.

    Truncate to int32 (``cvttss2si``: NaN, Inf and |t| >= 2**31 give INT_MIN),
    then keep the low byte. Only reached on degenerate blocks, but gguf-py's
    bytes depend on it there.
    """
    if not (abs(t) < np.float32(2147483648.0)):
        return np.int32(0)
    return np.int32(np.int64(t) & 0xFF)
