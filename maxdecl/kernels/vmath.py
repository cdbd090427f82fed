"""Vectorisable float32 math for the kernels (no libm calls, so LLVM's loop vectoriser
keeps 8 lanes): ``expf``, and ``dot16``, a dot product in one fixed order."""

from __future__ import annotations

import numba
import numpy as np
from numba import types
from numba.extending import intrinsic

from .codec_common import bits_f32
from .config import CACHE


@numba.njit(cache=CACHE, inline="always")
def expf(x):
    """float32 exp(x), within 1.2 ulp of the exact value wherever that is a normal float32
    (measured over 2M points against float64; subnormal results are less precise); inf
    above 88.72, 0 below -104, NaN for NaN. Branch-free, so loops over it vectorise.

    x = n ln2 + r with |r| <= ln2 / 2; exp(r) by its degree-7 Taylor polynomial; 2**n as
    2**h * 2**(n-h), h = n // 2, each written into the exponent bits (both stay normal).
    """
    y = min(max(x, np.float32(-104.0)), np.float32(88.72284))
    n = np.floor(y * np.float32(1.4426950408889634) + np.float32(0.5))
    r = y - n * np.float32(0.693145751953125)        # ln 2, high bits (n * hi is exact)
    r = r - n * np.float32(1.4286068203094172e-06)   # ln 2, the rest
    p = np.float32(1.0 / 5040.0)
    p = p * r + np.float32(1.0 / 720.0)
    p = p * r + np.float32(1.0 / 120.0)
    p = p * r + np.float32(1.0 / 24.0)
    p = p * r + np.float32(1.0 / 6.0)
    p = p * r + np.float32(0.5)
    p = p * r + np.float32(1.0)
    p = p * r + np.float32(1.0)
    ni = np.int32(n)
    h = ni >> np.int32(1)
    e = (p * bits_f32((h + np.int32(127)) << np.int32(23))
         * bits_f32((ni - h + np.int32(127)) << np.int32(23)))
    if x < np.float32(-104.0):
        e = np.float32(0.0)
    if x > np.float32(88.72284):
        e = np.float32(np.inf)
    if x != x:
        e = x
    return e


def _dot_codegen(context, builder, sig, args):
    """IR of ``dot16``: two <16 x float> accumulators over 32-element chunks (chunk c
    into accumulator c % 2), added lane by lane, halved to one lane by a fixed tree, then
    the tail in order. No fast-math flags: LLVM keeps this order and every product's
    rounding (no FMA), whatever it inlines the code into."""
    from llvmlite import ir
    from numba.core import cgutils

    f32, i64 = ir.FloatType(), ir.IntType(64)
    vt = ir.VectorType(f32, 16)
    aty, bty, _ = sig.args
    a = context.make_array(aty)(context, builder, args[0])
    b = context.make_array(bty)(context, builder, args[1])
    n = context.cast(builder, args[2], sig.args[2], types.int64)
    pa = builder.bitcast(a.data, f32.as_pointer())
    pb = builder.bitcast(b.data, f32.as_pointer())
    zero = ir.Constant(vt, [0.0] * 16)
    accs = [cgutils.alloca_once_value(builder, zero) for _ in range(2)]
    pairs = builder.sdiv(n, ir.Constant(i64, 32))

    def load(p, off):
        return builder.load(builder.bitcast(builder.gep(p, [off]), vt.as_pointer()), align=4)

    with cgutils.for_range(builder, pairs) as loop:
        base = builder.mul(loop.index, ir.Constant(i64, 32))
        for h, acc in enumerate(accs):
            off = builder.add(base, ir.Constant(i64, 16 * h))
            prod = builder.fmul(load(pa, off), load(pb, off))
            builder.store(builder.fadd(builder.load(acc), prod), acc)
    v = builder.fadd(builder.load(accs[0]), builder.load(accs[1]))
    width = 16
    while width > 1:                      # lanes j and j + width/2 added, halving
        half = width // 2
        lo = builder.shuffle_vector(v, v, ir.Constant(ir.VectorType(ir.IntType(32), half),
                                                       list(range(half))))
        hi = builder.shuffle_vector(v, v, ir.Constant(ir.VectorType(ir.IntType(32), half),
                                                       list(range(half, width))))
        v, width = builder.fadd(lo, hi), half
    total = cgutils.alloca_once_value(builder, builder.extract_element(v, ir.Constant(
        ir.IntType(32), 0)))
    start = builder.mul(pairs, ir.Constant(i64, 32))
    with cgutils.for_range(builder, builder.sub(n, start)) as loop:
        i = builder.add(start, loop.index)
        x = builder.load(builder.gep(pa, [i]))
        y = builder.load(builder.gep(pb, [i]))
        builder.store(builder.fadd(builder.load(total), builder.fmul(x, y)), total)
    return builder.load(total)


@intrinsic
def dot16(typingctx, a, b, n):
    """``sum(a[i] * b[i] for i < n)`` for contiguous float32 1-D arrays a, b (n at most
    their length), in float32 in one fixed order (``_dot_codegen``): the same bits in
    every kernel that uses it, inlined or not, parallel or not."""
    ok = all(isinstance(t, types.Array) and t.ndim == 1 and t.dtype == types.float32
             and t.layout == "C" for t in (a, b)) and isinstance(n, types.Integer)
    if not ok:
        return None
    return types.float32(a, b, n), _dot_codegen


def _prefetch_codegen(context, builder, sig, args):
    from llvmlite import ir
    from numba.core import cgutils

    i8p, i32 = ir.IntType(8).as_pointer(), ir.IntType(32)
    arr = context.make_array(sig.args[0])(context, builder, args[0])
    off = context.cast(builder, args[1], sig.args[1], types.int64)
    size = context.get_abi_sizeof(context.get_data_type(sig.args[0].dtype))
    p = builder.gep(builder.bitcast(arr.data, i8p), [builder.mul(off, ir.Constant(
        ir.IntType(64), size))])
    fn = cgutils.get_or_insert_function(builder.module, ir.FunctionType(
        ir.VoidType(), [i8p, i32, i32, i32]), "llvm.prefetch.p0i8")
    builder.call(fn, [p, ir.Constant(i32, 0), ir.Constant(i32, 3), ir.Constant(i32, 1)])
    return context.get_dummy_value()


@intrinsic
def prefetch(typingctx, a, i):
    """A read prefetch of the cache line holding flat element ``i`` of the contiguous
    array ``a``; it never faults, so ``i`` may run past the end. No effect on results."""
    if not (isinstance(a, types.Array) and a.layout == "C" and isinstance(i, types.Integer)):
        return None
    return types.void(a, i), _prefetch_codegen
