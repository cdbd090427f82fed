"""Int8-activation GEMV, opt-in (``md.compile(..., activations="q8")``): ``out[m, r] =
W[r] . x[m]`` with every 32 values of x rounded to int8 codes and one float32 scale.

The default GEMV (``gemv.py``) multiplies float32 weights by float32 x: exact products,
and measured bound by the decode arithmetic, not by memory. Here, as llama.cpp does for
its CPU matmuls, x is quantized once per call (``quantize_x``: ``d = max|x| / 127``
per 32-value block, codes ``round(x / d)``) and a weight unit of 64 values is a 64-byte
vector of unsigned codes ``c`` with ``value = a * (c - off)`` (``a`` a scale per group of
values, ``off`` a per-encoding constant). One ``vpdpbusd`` (AVX-512 VNNI) multiplies
the 64 code pairs and sums them in fours into 16 int32 lanes, starting from
``-off * (sum of the four x codes)`` (precomputed with x); each lane is converted once
and multiply-added with its scale ``a * d``. q4_k's ``- dmin * m`` term is added per
sub-block from x's block sums. Encodings: ``ENCODINGS``; others keep the float path.

Numbers: the integer sums are exact, so the result is the float32 evaluation of
``W . (d * codes)``: it differs from the float path by x's rounding, at most
``d / 2`` per value (tested against that bound and against ``gguf.quants`` weights).
Each x row runs the same instructions whether alone or with up to 7 others, so a
row's output is bit-identical in any batch (tested). Without VNNI the same integer
sums come from plain vector IR (widening multiplies and adds, lowered by LLVM for the
CPU at hand): the same bits, tested against the VNNI path.
"""

from __future__ import annotations

import threading

import numba
import numpy as np
from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic

from . import gemv as g
from .aligned import empty_aligned
from .config import ACTIVATION_MODE, CACHE
from .gemv import (
    _IR_F32,
    _IR_I8,
    _IR_I32,
    _IR_I64,
    ROW_CHUNKS,
    _f16_splat,
    _hsums,
    _intrinsic_fn,
    _ir_const,
    _ir_f16_pair,
    _ir_load,
    _ir_pick,
    _ir_splat,
    _q4_k_prepare,
    _q6_k_prepare,
    _target_has,
    _vb,
    _vi,
    for_row_chunks,
    lockstep_pointers,
    lockstep_types_ok,
    prefetch_locality,
    prefetch_out,
    q6_k_codes,
)

_V64 = ir.VectorType(_IR_I8, 64)
_VI16 = ir.VectorType(_IR_I32, 16)
_VF16 = ir.VectorType(_IR_F32, 16)
_VF8 = ir.VectorType(_IR_F32, 8)


def _cat(builder, a, b):
    n = a.type.count
    return builder.shuffle_vector(a, b, _vi(2 * n, list(range(2 * n))))


def _dpbusd(builder, acc, a, b, vnni):
    """``acc[l] + sum_{t<4} u8(a[4l+t]) * s8(b[4l+t])`` for the 16 lanes l (<16 x i32>)."""
    if vnni:
        fn = cgutils.get_or_insert_function(
            builder.module, ir.FunctionType(_VI16, [_VI16, _VI16, _VI16]),
            "llvm.x86.avx512.vpdpbusd.512")
        return builder.call(fn, [acc, builder.bitcast(a, _VI16), builder.bitcast(b, _VI16)])
    v64 = ir.VectorType(_IR_I32, 64)
    p = builder.mul(builder.zext(a, v64), builder.sext(b, v64))
    for t in range(4):
        acc = builder.add(acc, builder.shuffle_vector(
            p, ir.Constant(v64, ir.Undefined), _vi(16, [4 * lane + t for lane in range(16)])))
    return acc


# Software prefetch this many bytes ahead of each weight row being read. With the runs
# read in lockstep (four rows streaming per thread), 1 KB measured best: against 4 KB
# (16 KB for q8_0 before), into L2, one row of x, W from memory, calls alternating:
# 4096 x 14336 q8_0 1.15x, q6_k 1.06x, others 1.01-1.03x; 262144 x 640|768 1.00-1.07x;
# 2 KB between. Into L1 as well (T0) rather than L2 only: 4096 x 14336 1.00-1.03x,
# 262144 x 640|768 0.985-1.02x (q8_0 the 0.985x); 768 bytes, or T0 without the near
# prefetch, 0.96-1.04x.
FAR_PREFETCH = 1024


# -- unit decoders ----------------------------------------------------------------------
# The 32-value encodings: ``unit(builder, bp, None, u, nblk)`` -> (codes <64 x i8>, scales
# <16 x float>), codes in value order (byte i is value i of the unit), scales per lane of
# 4 values; a unit is blocks b and b + 1 (``nblk`` 2) or a last block alone (``nblk`` 1:
# the second half's codes meet x's zero padding).
# The super-block encodings: ``unit(builder, bp, None, u, nblk)`` -> (codes, None), the
# scales from the super-block's, read once a step: ``prepare(builder, bp)`` -> (a float
# vector of one row's weight scales, the q4_k mins <8 x float> negated or None), unit u's
# lane scales being lanes ``lanes(u)`` of it. With one row of x and ``xd_lanes`` set, each
# row's scale vector times x's block scales (``xd``, arranged by ``xd_lanes``) makes the
# products ``a * d`` once a super-block, unit u's lane scales being lanes
# ``scale_lanes(u)`` of that; the scale vectors then come from ``rows_prepare(builder,
# bps)`` where set, which reads those of all the rows read in lockstep at once ->
# ([<16 x float>], [mins] or None), else from ``prepare`` a row at a time.
class _Layout8:
    def __init__(self, values, nbytes, off, unit, prepare=None, lanes=None, mins=False,
                 prefetch=FAR_PREFETCH, rows_prepare=None, xd_lanes=None, scale_lanes=None):
        self.values, self.nbytes, self.off = values, nbytes, off
        self.unit, self.prepare, self.lanes, self.mins = unit, prepare, lanes, mins
        self.prefetch, self.rows_prepare = prefetch, rows_prepare
        self.xd_lanes, self.scale_lanes = xd_lanes, scale_lanes
        self.units = max(1, values // 64)            # units per block
        self.per_step = max(1, 64 // values)         # blocks per unit
        # one prefetch per 64 bytes of a step, rounded up, so that consecutive prefetch
        # addresses are never more than a line apart and every line is asked for (rounded
        # to nearest, a 144-byte q4_k step took 2 and a 210-byte q6_k step 3, skipping
        # a line now and then: q6_k 1.05-1.08x with all lines, the others even)
        self.prefetch_lines = max(1, -(-nbytes * self.per_step // 64))


def _pair(builder, bp, nbytes, nblk, load):
    """``load(block pointer)`` for a unit's two blocks; zeros for a missing second."""
    a = load(bp)
    if nblk == 2:
        return a, load(builder.gep(bp, [_ir_const(_IR_I64, nbytes)]))
    return a, ir.Constant(a.type, None)


def _d_pair(builder, bp, nbytes, nblk):
    """<16 x float>: lanes 0-7 the first block's fp16 scale, lanes 8-15 the second's
    (zero without one); each converted from a broadcast word, the halves blended, no
    cross-lane shuffle (q8_0, one thread: 2.32 -> 2.14 ns a 64-value unit)."""
    da = _f16_splat(builder, bp, 0, 16)
    db = (_f16_splat(builder, builder.gep(bp, [_ir_const(_IR_I64, nbytes)]), 0, 16)
          if nblk == 2 else ir.Constant(_VF16, None))
    return builder.select(ir.Constant(ir.VectorType(ir.IntType(1), 16),
                                      [i >= 8 for i in range(16)]), db, da)


def _nibble_codes(builder, a, b):
    """Codes of two blocks whose 16 bytes ``a``, ``b`` hold values j (low nibble of byte
    j) and j + 16 (high nibble): bytes [a lo, a hi, b lo, b hi]."""
    full = builder.shuffle_vector(a, b, _vi(64, list(range(16)) * 2 + list(range(16, 32)) * 2))
    return _nibbles(builder, full, [False, False, True, True] * 2)


def _nibbles(builder, full, high):
    """The low nibble of each byte of ``full`` (<64 x i8>), its high nibble in the 64-bit
    lanes where ``high``: one variable shift and one mask, off the shuffle port (one
    thread, a 64-value unit: q5_0 2.62 -> 2.22 ns, q4_k 1.83 -> 1.64 ns)."""
    q = ir.VectorType(_IR_I64, 8)
    shifted = builder.lshr(builder.bitcast(full, q), ir.Constant(q, [4 * h for h in high]))
    return builder.and_(builder.bitcast(shifted, _V64), _vb(64, 15))


def _q8_0_unit8(builder, bp, ctx, u, nblk):
    # 34 B: d f16 @0 | qs int8[32] @2; code = q + 128 (q xor 0x80), off 128
    v32 = ir.VectorType(_IR_I8, 32)
    a, b = _pair(builder, bp, 34, nblk, lambda p: _ir_load(builder, p, 2, v32))
    return builder.xor(_cat(builder, a, b), _vb(64, 128)), _d_pair(builder, bp, 34, nblk)


def _q4_0_unit8(builder, bp, ctx, u, nblk):
    # 18 B: d f16 @0 | qs[16] @2; code = nibble, off 8
    v16 = ir.VectorType(_IR_I8, 16)
    a, b = _pair(builder, bp, 18, nblk, lambda p: _ir_load(builder, p, 2, v16))
    return _nibble_codes(builder, a, b), _d_pair(builder, bp, 18, nblk)


def _q5_0_unit8(builder, bp, ctx, u, nblk):
    # 22 B: d f16 @0 | qh u32 @2 | qs[16] @6; code j = nibble | (bit j of qh) << 4, off 16.
    # The two blocks' qh make a 64-bit mask, one bit per code (a k-register).
    v16 = ir.VectorType(_IR_I8, 16)
    a, b = _pair(builder, bp, 22, nblk, lambda p: _ir_load(builder, p, 6, v16))
    qa, qb = _pair(builder, bp, 22, nblk, lambda p: _ir_load(builder, p, 2, _IR_I32))
    bits = builder.or_(builder.zext(qa, _IR_I64),
                       builder.shl(builder.zext(qb, _IR_I64), _ir_const(_IR_I64, 32)))
    mask = builder.bitcast(bits, ir.VectorType(ir.IntType(1), 64))
    codes = builder.or_(_nibble_codes(builder, a, b),
                        builder.select(mask, _vb(64, 16), _vb(64, 0)))
    return codes, _d_pair(builder, bp, 22, nblk)


def _q4_k_unit8(builder, bp, ctx, u, nblk):
    # 144 B: qs[128] @16; unit u: qs[32u:32u+32] low nibbles = sub-block 2u, high =
    # 2u + 1; code = nibble, off 0, scale d * sc (the - dmin * m term: ``mins``)
    q = _ir_load(builder, bp, 16 + 32 * u, ir.VectorType(_IR_I8, 32))
    both = builder.shuffle_vector(q, ir.Constant(q.type, ir.Undefined),
                                  _vi(64, list(range(32)) * 2))
    return _nibbles(builder, both, [False] * 4 + [True] * 4), None


def _q4_k_rows_prepare(builder, bps):
    """The 6-bit (scale, min) pairs of the rows' q4_k super-blocks (12 bytes at 4, see
    ``block_rows._q4k_scale_min``), unpacked for all rows at once: each row's 16 bytes in
    one 128-bit lane, two in-lane byte shuffles, a shift and a mask make per row
    ``[sc0-3, m0-3, sc4-7, m4-7]``, then widened and scaled by (d, dmin) of the row.
    Returns per row ``[d sc0-3, dmin m0-3, d sc4-7, dmin m4-7]`` and ``-dmin m0-7`` (the
    products of ``gemv._q4_k_prepare``, the same bits). Unpacked one row at a time
    this took as many instructions as the row's four units."""
    n = len(bps)
    width = 1 << (n - 1).bit_length()                # rows in the vector: 1, 2 or 4
    raw = [_ir_load(builder, bp, 4, ir.VectorType(_IR_I8, 16)) for bp in bps]
    raw += raw[:1] * (width - n)
    while len(raw) > 1:
        raw = [_cat(builder, a, b) for a, b in zip(raw[0::2], raw[1::2])]
    sb = raw[0]
    nb = 16 * width

    def lanes(pattern):
        return builder.shuffle_vector(sb, ir.Constant(sb.type, ir.Undefined),
                                      _vi(nb, [16 * r + i for r in range(width)
                                               for i in pattern]))

    def dword_shift(v, amounts):
        vt = ir.VectorType(_IR_I32, nb // 4)
        return builder.bitcast(builder.lshr(builder.bitcast(v, vt), _vi(nb // 4, amounts * width)),
                               v.type)

    def mask(pattern):
        return ir.Constant(sb.type, pattern * width)

    # bytes q0-3 & 63 (sc0-3), q4-7 & 63 (m0-3), q8-11 & 15 (sc4-7), q8-11 >> 4 (m4-7)
    low = builder.and_(dword_shift(lanes(list(range(12)) + [8, 9, 10, 11]), [0, 0, 0, 4]),
                       mask([63] * 8 + [15] * 8))
    # bits 4-5 of sc4-7 and m4-7: the top two bits of q0-3 and of q4-7
    top = builder.and_(dword_shift(lanes(list(range(8)) * 2), [2] * 4), mask([0] * 8 + [48] * 8))
    packed = builder.or_(low, top)
    vt16 = ir.VectorType(_IR_I32, 16)
    scales, mins = [], []
    for r, bp in enumerate(bps):
        d, dmin = _ir_f16_pair(builder, _ir_load(builder, bp, 0, _IR_I32))
        pair = builder.insert_element(builder.insert_element(
            ir.Constant(ir.VectorType(_IR_F32, 2), None), d, _ir_const(_IR_I32, 0)),
            dmin, _ir_const(_IR_I32, 1))
        dd = builder.shuffle_vector(pair, ir.Constant(pair.type, ir.Undefined),
                                    _vi(16, ([0] * 4 + [1] * 4) * 2))
        ints = builder.zext(builder.shuffle_vector(
            packed, ir.Constant(packed.type, ir.Undefined), _vi(16, list(range(16 * r, 16 * r + 16)))),
            vt16)
        prod = builder.fmul(dd, builder.sitofp(ints, _VF16))
        scales.append(prod)
        mins.append(builder.fneg(builder.shuffle_vector(
            prod, ir.Constant(_VF16, ir.Undefined), _vi(8, [4, 5, 6, 7, 12, 13, 14, 15]))))
    return scales, mins


def _q4_k_lane(s):
    return s if s < 4 else s + 4            # sub-block s's lane in the scale vector


def _q6_k_unit8(builder, bp, ctx, u, nblk):
    # 210 B: the 6-bit codes of the unit (``gemv.q6_k_codes``), off 32
    return q6_k_codes(builder, bp, u), None


def _q4_k_row_prepare(builder, bp):
    # (d * sc, -dmin * m) of the 8 sub-blocks, <8 x float> each (``gemv._q4_k_prepare``)
    return _q4_k_prepare(builder, bp, 8)


def _q6_k_row_prepare(builder, bp):
    # d * sc for the 16 scales (one per 16 values, ``gemv._q6_k_prepare``)
    return _q6_k_prepare(builder, bp, 16), None


def _q6_k_lanes(u):
    return [4 * u + lane // 4 for lane in range(16)]


LAYOUT8 = {
    "q8_0": _Layout8(32, 34, 128, _q8_0_unit8),
    "q4_0": _Layout8(32, 18, 8, _q4_0_unit8),
    "q5_0": _Layout8(32, 22, 16, _q5_0_unit8),
    "q4_k": _Layout8(256, 144, 0, _q4_k_unit8, _q4_k_row_prepare,
                     lambda u: [2 * u] * 8 + [2 * u + 1] * 8, mins=True,
                     rows_prepare=_q4_k_rows_prepare, xd_lanes=[0, 1, 2, 3] * 2 + [4, 5, 6, 7] * 2,
                     scale_lanes=lambda u: [_q4_k_lane(2 * u)] * 8 + [_q4_k_lane(2 * u + 1)] * 8),
    "q6_k": _Layout8(256, 210, 32, _q6_k_unit8, _q6_k_row_prepare, _q6_k_lanes,
                     xd_lanes=[i // 2 for i in range(16)], scale_lanes=_q6_k_lanes),
}
ENCODINGS = tuple(LAYOUT8)


# Besides the far prefetch into L2 (``_Layout8.prefetch``), each step prefetches the
# weights NEAR_PREFETCH bytes ahead into L1. 2 threads, one row of x, calls alternating
# in one process, time without / with: 262144 x 640|768 q8_0 1.03x, q4_0 1.02x, q5_0
# 1.07x, q4_k 1.02x, q6_k 1.03x; 4096 x 14336 0.96-1.09x; 8 rows of x 0.98-1.04x (each
# variant alone, 262144 x 768 q6_k: 31-32 -> 34.4-34.9 GB/s). 1024 bytes measured even;
# measured on Intel only (AMD's far prefetch is non-temporal, ``prefetch_locality``).
NEAR_PREFETCH = 512


def has_vnni() -> bool:
    """Whether numba compiles for a CPU with AVX-512 VNNI (``vpdpbusd``)."""
    return _target_has("avx512vnni")


# -- x: (M, K) float32 -> codes, lane scales, lane offsets, block sums -----------------
_ROUND = np.float32(1.5 * 2 ** 23)    # (v + _ROUND) - _ROUND: v to the nearest integer, ties
                                      # to even (np.rint), for |v| < 2**22


def _c_matrix(a, dtype) -> bool:
    """Whether the numba type ``a`` is a 2-D C-contiguous array of ``dtype``."""
    return isinstance(a, types.Array) and a.ndim == 2 and a.dtype == dtype and a.layout == "C"


@intrinsic
def _quantize_block(typingctx, x, i, b, off, xq, xl, xc, xs, xd):
    """Block b (values 32b .. 32b + 31) of row i of x: its codes, lane scales, lane
    offsets, code sum times d and d, as ``quantize_x`` defines them, in vector IR."""
    mat = _c_matrix
    if not (mat(x, types.float32) and mat(xq, types.int8) and mat(xl, types.float32)
            and mat(xc, types.int32) and mat(xs, types.float32) and mat(xd, types.float32)
            and all(isinstance(t, types.Integer) for t in (i, b, off))):
        return None
    sig = types.void(x, i, b, off, xq, xl, xc, xs, xd)

    def codegen(context, builder, sig, args):
        arrays = [context.make_array(t)(context, builder, a)
                  for t, a in zip((sig.args[0],) + sig.args[4:], (args[0],) + args[4:])]
        row, blk, off = (context.cast(builder, v, t, types.int64)
                         for v, t in zip(args[1:4], sig.args[1:4]))
        i64 = lambda v: _ir_const(_IR_I64, v)

        def ptr(a, per_block, size):     # i8* to element per_block * blk of row ``row``
            base = builder.bitcast(a.data, _IR_I8.as_pointer())
            stride = cgutils.unpack_tuple(builder, a.strides)[0]
            return builder.gep(base, [builder.add(builder.mul(row, stride),
                                                  builder.mul(blk, i64(per_block * size)))])

        xa, qa, la, ca, sa, da = arrays
        px = ptr(xa, 32, 4)
        v = [_ir_load(builder, px, 64 * h, _VF16) for h in range(2)]
        fabs = _intrinsic_fn(builder, "llvm.fabs", _VF16, 1)
        a = [builder.call(fabs, [t]) for t in v]
        # any NaN: d is NaN (a max would skip it); the max itself is exact in any order
        isnan = [builder.fcmp_unordered("uno", t, t) for t in v]
        nan = builder.icmp_unsigned("!=", builder.bitcast(builder.or_(*isnan), ir.IntType(16)),
                                    ir.Constant(ir.IntType(16), 0))
        m = builder.select(builder.fcmp_ordered(">", a[0], a[1]), a[0], a[1])
        n = 16
        while n > 1:
            n //= 2
            lo, hi = _ir_pick(builder, m, range(n)), _ir_pick(builder, m, range(n, 2 * n))
            m = builder.select(builder.fcmp_ordered(">", lo, hi), lo, hi)
        amax = builder.extract_element(m, _ir_const(_IR_I32, 0))
        f32 = lambda c: _ir_const(_IR_F32, c)
        d = builder.select(nan, f32(float("nan")), builder.fdiv(amax, f32(127.0)))
        inv = builder.select(builder.fcmp_ordered(">", amax, f32(0.0)),
                             builder.fdiv(f32(127.0), amax), f32(0.0))
        splat = lambda s, k: _ir_splat(builder, s, k)
        rnd = splat(f32(float(_ROUND)), 16)
        codes = []
        for t in v:
            y = builder.fmul(t, splat(inv, 16))
            r = builder.fsub(builder.fadd(y, rnd), rnd)        # to nearest, ties to even
            ok = builder.fcmp_ordered("<=", builder.call(fabs, [y]), splat(f32(127.5), 16))
            codes.append(builder.select(ok, r, ir.Constant(_VF16, None)))    # NaN, inf: 0
        both = builder.shuffle_vector(codes[0], codes[1], _vi(32, list(range(32))))
        ints = builder.fptosi(both, ir.VectorType(_IR_I32, 32))
        pq = ptr(qa, 32, 1)
        builder.store(builder.trunc(ints, ir.VectorType(_IR_I8, 32)),
                      builder.bitcast(pq, ir.VectorType(_IR_I8, 32).as_pointer()), align=1)
        # the sums of each four codes (small integers: exact in float32 in any order)
        s2 = builder.fadd(_ir_pick(builder, both, range(0, 32, 2)),
                          _ir_pick(builder, both, range(1, 32, 2)))
        s4 = builder.fadd(_ir_pick(builder, s2, range(0, 16, 2)),
                          _ir_pick(builder, s2, range(1, 16, 2)))
        sums = builder.fptosi(s4, ir.VectorType(_IR_I32, 8))
        v8i = ir.VectorType(_IR_I32, 8)
        offs = builder.mul(sums, _ir_splat(builder, builder.neg(builder.trunc(off, _IR_I32)), 8))
        builder.store(offs, builder.bitcast(ptr(ca, 8, 4), v8i.as_pointer()), align=4)
        builder.store(splat(d, 8), builder.bitcast(ptr(la, 8, 4), _VF8.as_pointer()), align=4)
        t8 = sums
        n = 8
        while n > 1:
            n //= 2
            t8 = builder.add(_ir_pick(builder, t8, range(n)),
                             _ir_pick(builder, t8, range(n, 2 * n)))
        total = builder.extract_element(t8, _ir_const(_IR_I32, 0))
        f32p = _IR_F32.as_pointer()
        builder.store(builder.fmul(d, builder.sitofp(total, _IR_F32)),
                      builder.bitcast(ptr(sa, 1, 4), f32p), align=4)
        builder.store(d, builder.bitcast(ptr(da, 1, 4), f32p), align=4)
        return context.get_dummy_value()

    return sig, codegen


@numba.njit(cache=CACHE)
def _quantize_x(x, off, xq, xl, xc, xs, xd):
    # a block at a time in vector IR (``_quantize_block``), the same bits as the numba
    # loops before it (codes aside in a block with a NaN, whose d is NaN either way): a
    # row of 640, 2048, 14336 values, 1.15 -> 0.75, 2.62 -> 1.21, 15.3 -> 5.9 us. A NaN
    # in a block makes its d NaN, so the row's outputs are NaN as with float x; an inf
    # makes d inf and the codes 0, NaN outputs too.
    for i in range(x.shape[0]):
        for b in range(x.shape[1] // 32):
            _quantize_block(x, i, b, off, xq, xl, xc, xs, xd)


def quantize_x(x2: np.ndarray, off: int = 0, out=None):
    """x (M, K) float32, K a multiple of 32 -> (codes int8 (M, K64), lane scales float32
    (M, K64 / 4), lane offsets int32 (M, K64 / 4): ``-off`` times each four codes' sum,
    block sums float32 (M, K64 / 32): ``d`` times each block's code sum, block scales
    float32 (M, K64 / 32): ``d``, the lane scales' every eighth, kept apart so that a
    super-block's 8 are one load), K64 = K rounded up to 64, the padding zero.
    ``d = max|x| / 127`` per 32 values. ``out``: arrays made by ``x_buffers`` for this
    shape to fill instead of new ones."""
    parts = x_buffers(*x2.shape) if out is None else out
    _quantize_x(np.ascontiguousarray(x2, np.float32), off, *parts)
    return parts


def x_buffers(m: int, k: int) -> tuple:
    """New arrays for ``quantize_x`` of an (m, k) x, their padding zero (the kernel
    writes every value but the padding)."""
    k64 = -(-k // 64) * 64
    xq = empty_aligned((m, k64), np.int8)
    xl = empty_aligned((m, k64 // 4), np.float32)
    xc = empty_aligned((m, k64 // 4), np.int32)
    xq[:, k:], xl[:, k // 4:], xc[:, k // 4:] = 0, 0, 0
    xs, xd = (np.zeros((m, k64 // 32), np.float32) for _ in range(2))
    return xq, xl, xc, xs, xd


def _scratch(m: int, k: int) -> tuple:
    """This thread's ``x_buffers(m, k)``, made once: x's codes live only through one
    GEMV call, and a decode step makes a hundred such calls (fresh arrays each time:
    9.3 us a call at 1 x 640, most of it allocating)."""
    kept = _SCRATCH.__dict__.setdefault("by_shape", {})
    parts = kept.get((m, k))
    if parts is None:
        if len(kept) >= 64:
            kept.clear()
        parts = kept[(m, k)] = x_buffers(m, k)
    return parts


_SCRATCH = threading.local()


# -- the row intrinsic ----------------------------------------------------------------
def row8_intrinsic(enc: str, vnni: bool | None = None, wrows: int = 1):
    """An intrinsic ``(ws, rs, xq, xl, xc, xs, xd, out, cols) -> None``: ``out[m, cols[i]] =
    ws[i][rs[i]] . x[m]`` for every row m of the quantized x (``quantize_x`` with this
    encoding's ``off``) and each of the ``wrows`` weight rows i (tuples ``ws`` of 2-D
    uint8 arrays of ``enc`` blocks, C order, ``rs`` and ``cols`` of integers), the
    weight rows read in lockstep. ``vnni``: use ``vpdpbusd`` (default: where the CPU has
    it); the same bits either way, and a row's bits do not depend on ``wrows``."""
    lay = LAYOUT8[enc]
    vnni = has_vnni() if vnni is None else vnni

    def typer(typingctx, ws, rs, xq, xl, xc, xs, xd, out, cols):
        mat = _c_matrix
        ok = (lockstep_types_ok(ws, rs, cols, wrows)
              and mat(xq, types.int8) and mat(xl, types.float32)
              and mat(xc, types.int32) and mat(xs, types.float32) and mat(xd, types.float32)
              and isinstance(out, types.Array) and out.ndim == 2
              and out.dtype == types.float32)
        if not ok:
            return None

        def codegen(context, builder, sig, args):
            _emit_rows8(context, builder, sig, args, lay, vnni)
            return context.get_dummy_value()

        return types.void(ws, rs, xq, xl, xc, xs, xd, out, cols), codegen

    return intrinsic(typer)


def _emit_rows8(context, builder, sig, args, lay, vnni):
    ws_t, rs_t, *_, cols_t = sig.args
    wrows = ws_t.count
    qa, la, ca, sa, da, oa = [context.make_array(t)(context, builder, a)
                              for t, a in zip(sig.args[2:8], args[2:8])]
    i64 = lambda v: _ir_const(_IR_I64, v)
    rows, o_cols = lockstep_pointers(context, builder, (ws_t, args[0]), (rs_t, args[1]),
                                     (cols_t, args[8]), oa)
    o_strides = cgutils.unpack_tuple(builder, oa.strides)
    n_rows = cgutils.unpack_tuple(builder, qa.shape)[0]
    bases = [(builder.bitcast(a.data, _IR_I8.as_pointer()),
              cgutils.unpack_tuple(builder, a.strides)[0]) for a in (qa, la, ca, sa, da)]
    # blocks in a weight row (the x arrays are padded to 64 values, W is not); the rows of
    # one call share K (the group kernels' matrices multiply the same x)
    w0 = context.make_array(ws_t.dtype)(context, builder,
                                         cgutils.unpack_tuple(builder, args[0], wrows)[0])
    nb = builder.sdiv(cgutils.unpack_tuple(builder, w0.shape)[1], i64(lay.nbytes))

    def chunk(m, xrows):
        xs = [[builder.gep(base, [builder.mul(builder.add(m, i64(j)), stride)])
               for base, stride in bases] for j in range(xrows)]
        def outs():
            return [builder.gep(o_col, [builder.mul(builder.add(m, i64(j)), o_strides[0])])
                    for o_col in o_cols for j in range(xrows)]
        prefetch_out(builder, outs())    # see gemv.OUT_PREFETCH; the pointers made again
        # after the dots rather than kept across them: q8_0 1.08x, q4_0 1.03x
        dots = _emit_dots8(builder, rows, xs, nb, lay, vnni)
        for p, dot in zip(outs(), dots):
            builder.store(dot, builder.bitcast(p, _IR_F32.as_pointer()))

    # at most 8 (weight row, x row) pairs at once: 16 accumulators
    for_row_chunks(builder, n_rows, tuple(c for c in ROW_CHUNKS if c * wrows <= 8 or c == 1),
                   chunk, "rows8")


def _emit_dots8(builder, rows, xs, nb, lay, vnni):
    """The dots of the weight rows at ``rows`` (i8* each) with each quantized x row
    (``xs``: per row, pointers to its codes, lane scales, lane offsets, block sums), in
    the order [W row 0 . x row 0, W row 0 . x row 1, .., W row 1 . x row 0, ..]. Each
    step reads one unit of every weight row and x's vectors once for all of them; each
    (weight row, x row) pair sums in its own two accumulators, so its bits are the same
    whatever other rows share the call."""
    i64 = lambda v: _ir_const(_IR_I64, v)
    fma = _intrinsic_fn(builder, "llvm.fmuladd", _VF16, 3)
    fma8 = _intrinsic_fn(builder, "llvm.fmuladd", _VF8, 3)
    zero = ir.Constant(_VI16, None)

    def alloca(ty):
        return cgutils.alloca_once_value(builder, ir.Constant(ty, None))

    accs = [[[alloca(_VF16), alloca(_VF16)] for _ in xs] for _ in rows]
    mins = [[alloca(_VF8) for _ in xs] for _ in rows]
    pf = cgutils.get_or_insert_function(
        builder.module, ir.FunctionType(ir.VoidType(), [_IR_I8.as_pointer()] + [_IR_I32] * 3),
        "llvm.prefetch.p0i8")
    # far prefetch: into all levels (T0), or non-temporal where ``prefetch_locality``
    # says so (AMD Zen)
    far = 3 if prefetch_locality() else 0

    def vec(p, off, ty):
        return builder.load(builder.bitcast(builder.gep(p, [off]), ty.as_pointer()), align=1)

    def step(b, nblk):
        """Blocks b .. b + nblk - 1 (one unit of 32-value blocks, or one super-block)."""
        bps = []
        for row in rows:
            bp = builder.gep(row, [builder.mul(b, i64(lay.nbytes))])
            for ahead, keep in ((lay.prefetch, far), (NEAR_PREFETCH, 3)):
                for line in range(lay.prefetch_lines):  # read, kept in cache, data
                    builder.call(pf, [builder.gep(bp, [i64(ahead + 64 * line)]),
                                      _ir_const(_IR_I32, 0), _ir_const(_IR_I32, keep),
                                      _ir_const(_IR_I32, 1)])
            bps.append(bp)
        v0 = builder.mul(b, i64(lay.values))               # first value of the step
        blk = builder.sdiv(v0, i64(8))      # byte offset of x's block sums and scales
        # with one row of x, the products a * d once a super-block (a unit takes its lanes
        # of them; the same products, so the same bits); with more, each row of x would
        # hold such a vector for each weight row, and a unit multiplies its lanes of the
        # weight scales by x's lane scales. One row of x, with the q4_k scales of the 4
        # lockstep rows unpacked together (``_q4_k_rows_prepare``), against a unit's
        # shuffle and multiply and one row's unpacking at a time: W in cache, 2 threads,
        # 4096 x 768, q4_k 1.15x, q6_k 1.22x; streamed from memory, calls alternating,
        # q4_k 1.03x at 262144 x 768 and 1.07-1.09x at 4096 x 14336, q6_k 1.03x and even.
        # Two to eight rows of x: the same code as before (products for them too, W in
        # cache: 0.86-1.10x).
        once = lay.xd_lanes is not None and len(xs) == 1
        if once and lay.rows_prepare:
            wscales, ndms = lay.rows_prepare(builder, bps)
        elif lay.prepare:
            wscales, ndms = zip(*[lay.prepare(builder, bp) for bp in bps])
        if once:
            xd = builder.shuffle_vector(vec(xs[0][4], blk, _VF8), ir.Constant(_VF8, ir.Undefined),
                                        _vi(16, lay.xd_lanes))
            wscales = [builder.fmul(w, xd) for w in wscales]
        for u in range(lay.units):
            at = builder.add(v0, i64(64 * u))   # byte offset of x's codes and of its lanes
            xv = [(vec(c, at, _VI16) if lay.off else zero, vec(q, at, _V64),
                   None if once else vec(lx, at, _VF16)) for q, lx, c, _, _ in xs]
            for r, (bp, row_accs) in enumerate(zip(bps, accs)):
                codes, scales = lay.unit(builder, bp, None, u, nblk)
                if lay.prepare:
                    w = wscales[r]
                    scales = builder.shuffle_vector(w, ir.Constant(w.type, ir.Undefined), _vi(
                        16, lay.scale_lanes(u) if once else lay.lanes(u)))
                for (start, xcodes, xlanes), acc in zip(xv, row_accs):
                    isum = _dpbusd(builder, start, codes, xcodes, vnni)
                    ad = scales if once else builder.fmul(scales, xlanes)
                    part = acc[u % 2]
                    builder.store(builder.call(fma, [builder.sitofp(isum, _VF16), ad,
                                                     builder.load(part)]), part)
        if lay.mins:                                       # + sum_s (-dmin m_s) * d sum q_s
            xsums = [vec(s, blk, _VF8) for _, _, _, s, _ in xs]      # 4 B a block
            for ndm, row_mins in zip(ndms, mins):
                for xsum, macc in zip(xsums, row_mins):
                    builder.store(builder.call(fma8, [ndm, xsum, builder.load(macc)]), macc)

    n_steps = builder.sdiv(nb, i64(lay.per_step))
    with cgutils.for_range(builder, n_steps) as loop:
        step(builder.mul(loop.index, i64(lay.per_step)), lay.per_step)
    if lay.per_step > 1:           # an odd block count: the last block on its own
        with builder.if_then(builder.icmp_signed("!=", builder.srem(nb, i64(2)), i64(0))):
            step(builder.sub(nb, i64(1)), 1)
    totals = []
    for row_accs, row_mins in zip(accs, mins):
        for acc, macc in zip(row_accs, row_mins):
            t = builder.fadd(builder.load(acc[0]), builder.load(acc[1]))
            if lay.mins:
                wide = builder.shuffle_vector(builder.load(macc), ir.Constant(_VF8, None),
                                              _vi(16, list(range(16))))
                t = builder.fadd(t, wide)
            totals.append(t)
    return _hsums(builder, totals)


# -- kernels: ``gemv.GEMV_GROUP``'s group calls on quantized x ------------------------
# A thread walks its weight rows as ``gemv.STREAMS`` interleaved runs (``stream_stride``)
# and, with few rows of x, reads the runs in lockstep: one call takes a unit of every
# run's row in turn, so all the runs stream at once whatever the row length, and x's
# vectors are loaded once for them. Before, a call read one row at a time: with rows of
# 8 KB only one run streamed at a time. 2 threads, one row of x, W streamed from memory,
# calls alternating in one process (time before / after): 4096 x 14336 q4_0 1.31x,
# q5_0 1.27x, q4_k 1.28x, q6_k 1.20x, q8_0 1.10x; 262144 x 640|768 0.96-1.01x. Two
# rows of x 1.56-1.72x at 4096 x 14336; with three or four, two runs in lockstep
# (four rows of x: 1.17-1.58x, q6_k at 262144 x 768 0.96x; all four runs, 32
# accumulators that spill: 0.85-1.41x).
@numba.njit(inline="always")
def lockstep_rows(m: int) -> int:
    """Weight rows read in lockstep by one call for ``m`` rows of x: at most 8
    (weight row, x row) pairs, so that the accumulators stay in registers."""
    return 4 if m <= 2 else 2 if m <= 4 else 1


@numba.njit(inline="always")
def _take1(ws, offs, c):
    k = g._segment(offs, c)
    return (ws[k],), (c - offs[k],), (c,)


@numba.njit(inline="always")
def _take2(ws, offs, t, per, n, h):
    c0, c1 = g.run_row(t, h, per, n), g.run_row(t, h + 1, per, n)
    k0, k1 = g._segment(offs, c0), g._segment(offs, c1)
    return (ws[k0], ws[k1]), (c0 - offs[k0], c1 - offs[k1]), (c0, c1)


# written out per encoding as ``gemv``'s (a factory closing over the intrinsics would
# miss numba's on-disk cache)
_r8_q8_0 = row8_intrinsic("q8_0")
_r8x2_q8_0 = row8_intrinsic("q8_0", wrows=2)
_r8x4_q8_0 = row8_intrinsic("q8_0", wrows=4)


@numba.njit(cache=CACHE, parallel=True)
def _group8_q8_0(xq, xl, xc, xs, xd, ws, offs, out):
    n = offs[-1]
    per = g.stream_stride(n, xq.shape[0])
    lock = lockstep_rows(xq.shape[0]) if per < n else 1
    for t in numba.prange(per):
        if lock == 4:
            w, r, c = g.take_runs(ws, offs, t, per, n)
            _r8x4_q8_0(w, r, xq, xl, xc, xs, xd, out, c)
        elif lock == 2:
            for h in range(0, g.STREAMS, 2):
                w, r, c = _take2(ws, offs, t, per, n, h)
                _r8x2_q8_0(w, r, xq, xl, xc, xs, xd, out, c)
        else:
            for c in range(t, n, per):
                w, r, c1 = _take1(ws, offs, c)
                _r8_q8_0(w, r, xq, xl, xc, xs, xd, out, c1)


_r8_q4_0 = row8_intrinsic("q4_0")
_r8x2_q4_0 = row8_intrinsic("q4_0", wrows=2)
_r8x4_q4_0 = row8_intrinsic("q4_0", wrows=4)


@numba.njit(cache=CACHE, parallel=True)
def _group8_q4_0(xq, xl, xc, xs, xd, ws, offs, out):
    n = offs[-1]
    per = g.stream_stride(n, xq.shape[0])
    lock = lockstep_rows(xq.shape[0]) if per < n else 1
    for t in numba.prange(per):
        if lock == 4:
            w, r, c = g.take_runs(ws, offs, t, per, n)
            _r8x4_q4_0(w, r, xq, xl, xc, xs, xd, out, c)
        elif lock == 2:
            for h in range(0, g.STREAMS, 2):
                w, r, c = _take2(ws, offs, t, per, n, h)
                _r8x2_q4_0(w, r, xq, xl, xc, xs, xd, out, c)
        else:
            for c in range(t, n, per):
                w, r, c1 = _take1(ws, offs, c)
                _r8_q4_0(w, r, xq, xl, xc, xs, xd, out, c1)


_r8_q5_0 = row8_intrinsic("q5_0")
_r8x2_q5_0 = row8_intrinsic("q5_0", wrows=2)
_r8x4_q5_0 = row8_intrinsic("q5_0", wrows=4)


@numba.njit(cache=CACHE, parallel=True)
def _group8_q5_0(xq, xl, xc, xs, xd, ws, offs, out):
    n = offs[-1]
    per = g.stream_stride(n, xq.shape[0])
    lock = lockstep_rows(xq.shape[0]) if per < n else 1
    for t in numba.prange(per):
        if lock == 4:
            w, r, c = g.take_runs(ws, offs, t, per, n)
            _r8x4_q5_0(w, r, xq, xl, xc, xs, xd, out, c)
        elif lock == 2:
            for h in range(0, g.STREAMS, 2):
                w, r, c = _take2(ws, offs, t, per, n, h)
                _r8x2_q5_0(w, r, xq, xl, xc, xs, xd, out, c)
        else:
            for c in range(t, n, per):
                w, r, c1 = _take1(ws, offs, c)
                _r8_q5_0(w, r, xq, xl, xc, xs, xd, out, c1)


_r8_q4_k = row8_intrinsic("q4_k")
_r8x2_q4_k = row8_intrinsic("q4_k", wrows=2)
_r8x4_q4_k = row8_intrinsic("q4_k", wrows=4)


@numba.njit(cache=CACHE, parallel=True)
def _group8_q4_k(xq, xl, xc, xs, xd, ws, offs, out):
    n = offs[-1]
    per = g.stream_stride(n, xq.shape[0])
    lock = lockstep_rows(xq.shape[0]) if per < n else 1
    for t in numba.prange(per):
        if lock == 4:
            w, r, c = g.take_runs(ws, offs, t, per, n)
            _r8x4_q4_k(w, r, xq, xl, xc, xs, xd, out, c)
        elif lock == 2:
            for h in range(0, g.STREAMS, 2):
                w, r, c = _take2(ws, offs, t, per, n, h)
                _r8x2_q4_k(w, r, xq, xl, xc, xs, xd, out, c)
        else:
            for c in range(t, n, per):
                w, r, c1 = _take1(ws, offs, c)
                _r8_q4_k(w, r, xq, xl, xc, xs, xd, out, c1)


_r8_q6_k = row8_intrinsic("q6_k")
_r8x2_q6_k = row8_intrinsic("q6_k", wrows=2)
_r8x4_q6_k = row8_intrinsic("q6_k", wrows=4)


@numba.njit(cache=CACHE, parallel=True)
def _group8_q6_k(xq, xl, xc, xs, xd, ws, offs, out):
    n = offs[-1]
    per = g.stream_stride(n, xq.shape[0])
    lock = lockstep_rows(xq.shape[0]) if per < n else 1
    for t in numba.prange(per):
        if lock == 4:
            w, r, c = g.take_runs(ws, offs, t, per, n)
            _r8x4_q6_k(w, r, xq, xl, xc, xs, xd, out, c)
        elif lock == 2:
            for h in range(0, g.STREAMS, 2):
                w, r, c = _take2(ws, offs, t, per, n, h)
                _r8x2_q6_k(w, r, xq, xl, xc, xs, xd, out, c)
        else:
            for c in range(t, n, per):
                w, r, c1 = _take1(ws, offs, c)
                _r8_q6_k(w, r, xq, xl, xc, xs, xd, out, c1)


GROUP8 = {"q8_0": _group8_q8_0, "q4_0": _group8_q4_0, "q5_0": _group8_q5_0,
          "q4_k": _group8_q4_k, "q6_k": _group8_q6_k}


def run_group(encoding: str, x2: np.ndarray, ws: tuple, offs: np.ndarray,
              out: np.ndarray) -> None:
    """``gemv.run_group`` in the context's mode (``config.ACTIVATION_MODE``): with "q8"
    and an encoding of ``ENCODINGS``, x is quantized once and the int8 kernel runs;
    else the float path."""
    if ACTIVATION_MODE.get() == "q8" and encoding in GROUP8:
        parts = quantize_x(x2, LAYOUT8[encoding].off, _scratch(*x2.shape))
        GROUP8[encoding](*parts, ws, offs, out)
    else:
        g.run_group(encoding, x2, ws, offs, out)


def gemv(x2: np.ndarray, w: np.ndarray, encoding: str, out: np.ndarray) -> None:
    """``gemv.gemv`` in the context's mode: ``out = x2 @ W.T``."""
    if encoding == "bf16":
        g.gemv(x2, w, encoding, out)
    else:
        run_group(encoding, x2, (w,), g.offsets((w.shape[0],)), out)


def gemv_group(x2: np.ndarray, weights: list, encoding: str) -> np.ndarray:
    """``gemv.gemv_group`` in the context's mode."""
    offs = g.offsets(tuple(w.shape[0] for w in weights))
    out = np.empty((x2.shape[0], int(offs[-1])), np.float32)
    run_group(encoding, x2, tuple(weights), offs, out)
    return out
