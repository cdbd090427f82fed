"""GEMV kernels: ``out[m, r] = W[r] . x[m]`` for 1 to ``GEMV_MAX_ROWS`` rows of x on
packed GGML blocks (decode, batched decode, prompt-lookup verify steps).

Every encoding runs the same scheme, written as LLVM vector IR (an intrinsic per
encoding) so that the arithmetic is pinned:

* the weight row is walked in **units of 64 values** (two 32-value blocks, or a
  quarter of a 256-value K-quant super-block, a 32-value tail when the block count
  is odd); each unit is **decoded once** into L-lane float vectors holding exactly
  the dequantized weights (``d * q``, ``d * sc * q - dmin * m``: products of small
  integers and fp16 scales, exact in float32), shared by all the x rows;
* for every x row, two accumulators: ``a = fmuladd(wi, xi, a)`` over the first half of
  the unit's vectors, ``b = ...`` over the second half (one multiply-add per vector,
  two dependency chains, so even one row keeps the FMA units busy); at the end one
  horizontal sum of ``a + b`` (a fixed halving tree). Measured at 65536 x 640 q8_0, one
  thread: 8 rows 4.4-8.1 ms against 7.3-8.5 ms with a separate unit sum added to one
  accumulator; one row unchanged.

No fast-math flag is set on this IR, so LLVM cannot reassociate, and every x row is
computed by the same instructions whether it runs alone or with up to 7 others: a
row's output is bit-identical for any number of rows (tested), which is what lets a
sequence decoded in a batch get exactly its solo logits. Up to 8 rows are taken in
one pass (``ROW_CHUNKS``). L is 16 (zmm) where the CPU has AVX-512, else 8; both are tested. With
16 lanes, q4_0, q5_0 and q4_k decode through per-block tables and q6_k puts its codes
together 64 bytes at a time (``TABLE_LAYOUT``); x
rows are read from 64-byte boundaries (``aligned_rows``). A call can take several weight
rows (``wrows``) that share each load of x; each output keeps its own accumulators and
instructions, so the numbers do not change.
Block layouts: ``block_rows.py``.
"""

from __future__ import annotations

import itertools
import threading

import numba
import numpy as np
from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic

from .aligned import empty_aligned, rows_aligned
from .block_rows import _bf16
from .config import CACHE, FASTMATH

_IR_I8 = ir.IntType(8)
_IR_I32 = ir.IntType(32)
_IR_I64 = ir.IntType(64)
_IR_F32 = ir.FloatType()
# x rows per decode of a weight unit, largest first: any count up to 8 in one pass. With
# 8, 4, 2, 1 only, 7 rows decoded every weight unit three times (4 + 2 + 1); measured, 2
# threads, 262144 x 640 q8_0 (Gemma's head), ms: 3 rows 16.2 -> 12.9, 5 rows 21.7 -> 16.4,
# 6 rows 25.5 -> 18.6, 7 rows 31.4 -> 20.2; 1 and 8 rows even; each row's bits unchanged.
# Gemma 3 270M, N prompts decoding together, old and new kernels alternating in one
# process: 3 prompts 1.25x tokens/s, 6 prompts 1.29x, 7 prompts 1.44x; 8 prompts 0.97x and
# 0.99x (two runs: noise, or a little of the larger kernel's cost).
ROW_CHUNKS = (8, 7, 6, 5, 4, 3, 2, 1)
UNIT = 64                             # values per unit


def _target_has(feature):
    """True if numba compiles for a CPU with ``feature`` (e.g. "f16c")."""
    import llvmlite.binding as ll
    from numba.core import config

    if config.CPU_FEATURES:
        return f"+{feature}" in config.CPU_FEATURES.split(",")
    if config.CPU_NAME and config.CPU_NAME != "host":
        return False
    return bool(ll.get_host_cpu_features().get(feature, False))


def host_lanes() -> int:
    """float32 lanes per vector the GEMV kernels use on this CPU: 16 with AVX-512, else 8."""
    return 16 if _target_has("avx512f") else 8


# -- IR helpers -----------------------------------------------------------------------
def _ir_const(ty, v):
    return ir.Constant(ty, v)


def _vi(lanes, vals):
    """<lanes x i32> constant."""
    if not isinstance(vals, (list, tuple)):
        vals = [vals] * lanes
    return ir.Constant(ir.VectorType(_IR_I32, lanes), [ir.Constant(_IR_I32, int(v)) for v in vals])


def _vb(lanes, v):
    """<lanes x i8> splat constant."""
    return ir.Constant(ir.VectorType(_IR_I8, lanes), [ir.Constant(_IR_I8, int(v))] * lanes)


def _ir_load(builder, base, off, ty):
    """Unaligned load of ``ty`` at byte offset ``off`` (int) from the i8* ``base``."""
    p = builder.gep(base, [_ir_const(_IR_I64, off)]) if off else base
    return builder.load(builder.bitcast(p, ty.as_pointer()), align=1)


def _bytes(builder, bp, off, lanes, signed=False):
    """``lanes`` bytes at ``off`` widened to <lanes x i32>."""
    v = _ir_load(builder, bp, off, ir.VectorType(_IR_I8, lanes))
    wide = ir.VectorType(_IR_I32, lanes)
    return builder.sext(v, wide) if signed else builder.zext(v, wide)


def _ir_f16(builder, word, soft=None):
    """float32 of the fp16 in the low 16 bits of the i32 ``word``; exact, inf/NaN kept.

    F16C (vcvtph2ps) where the target has it; else the bit moves of ``_f16``.
    Converting a <2 x half> from the whole word avoids a 16-bit insert into a stale
    vector register (a false dependency, measured).
    """
    if soft is None:
        soft = not _target_has("f16c")
    if not soft:
        v = builder.bitcast(word, ir.VectorType(ir.HalfType(), 2))
        v = builder.fpext(v, ir.VectorType(_IR_F32, 2))
        return builder.extract_element(v, _ir_const(_IR_I32, 0))
    i32 = lambda v: _ir_const(_IR_I32, v)  # noqa: E731
    h = builder.and_(word, i32(0xFFFF))
    bits = builder.or_(builder.shl(builder.and_(h, i32(0x8000)), i32(16)),
                       builder.shl(builder.and_(h, i32(0x7FFF)), i32(13)))
    f = builder.fmul(builder.bitcast(bits, _IR_F32),
                     _ir_const(_IR_F32, 5.192296858534828e33))               # 2**112
    special = builder.icmp_unsigned("==", builder.and_(h, i32(0x7C00)), i32(0x7C00))
    infnan = builder.bitcast(builder.or_(bits, i32(0x7F800000)), _IR_F32)
    return builder.select(special, infnan, f)


def _ir_f16_pair(builder, word, soft=None):
    """float32 of the two fp16 in the i32 ``word`` (low half, high half); as ``_ir_f16``."""
    if soft is None:
        soft = not _target_has("f16c")
    if not soft:
        v = builder.fpext(builder.bitcast(word, ir.VectorType(ir.HalfType(), 2)),
                          ir.VectorType(_IR_F32, 2))
        return (builder.extract_element(v, _ir_const(_IR_I32, 0)),
                builder.extract_element(v, _ir_const(_IR_I32, 1)))
    return (_ir_f16(builder, word, soft=True),
            _ir_f16(builder, builder.lshr(word, _ir_const(_IR_I32, 16)), soft=True))


def _ir_splat(builder, v, lanes=8):
    vt = ir.VectorType(v.type, lanes)
    u = builder.insert_element(ir.Constant(vt, ir.Undefined), v, _ir_const(_IR_I32, 0))
    return builder.shuffle_vector(u, ir.Constant(vt, ir.Undefined), _vi(lanes, 0))


def _ir_lane(builder, v, s, lanes):
    """Lane ``s`` of the vector ``v`` broadcast to a <lanes x ...> vector."""
    return builder.shuffle_vector(v, ir.Constant(v.type, ir.Undefined), _vi(lanes, s))


def _ir_pick(builder, v, idx):
    return builder.shuffle_vector(v, ir.Constant(v.type, ir.Undefined), _vi(len(idx), list(idx)))


def _hsums(builder, vs):
    """The horizontal sums of the float vectors ``vs``, each in one fixed order (lane i
    plus lane i + n/2, halving n); several vectors' halves share each shuffle and add (in
    groups of 8, 4, 2 and 1), and a vector's sum is the same bits whatever others it is
    reduced with (so a row's dot is the same alone or in a batch)."""
    if len(vs) & (len(vs) - 1):                  # not a power of two: in such groups
        size = 1 << (len(vs).bit_length() - 1)
        return _hsums(builder, vs[:size]) + _hsums(builder, vs[size:])
    lanes = vs[0].type.count
    width = lanes                       # lanes per vector's partial sums
    while width > 1:
        half = width // 2
        if len(vs) > 1:                 # pair neighbours: both vectors' halves in one
            pairs = []
            for a, b in zip(vs[0::2], vs[1::2]):
                groups = [(v, g) for v, off in ((a, 0), (b, lanes)) for g in
                          range(off, off + lanes, width)]
                lo = [g + i for _, g in groups for i in range(half)]
                hi = [g + half + i for _, g in groups for i in range(half)]
                pairs.append(builder.fadd(builder.shuffle_vector(a, b, _vi(lanes, lo)),
                                          builder.shuffle_vector(a, b, _vi(lanes, hi))))
            vs = pairs
        else:                           # one vector left: halve its length
            v = vs[0]
            n = v.type.count
            lo = [g + i for g in range(0, n, width) for i in range(half)]
            hi = [g + half + i for g in range(0, n, width) for i in range(half)]
            vs = [builder.fadd(_ir_pick(builder, v, lo), _ir_pick(builder, v, hi))]
        width = half
    out = []
    for v in vs:
        out += [builder.extract_element(v, _ir_const(_IR_I32, j)) for j in range(v.type.count)]
    return out


def _intrinsic_fn(builder, name, vt, nargs):
    suffix = f"v{vt.count}{'f32' if vt.element == _IR_F32 else 'i32'}"
    return cgutils.get_or_insert_function(builder.module, ir.FunctionType(vt, [vt] * nargs),
                                          f"{name}.{suffix}")


def _tofloat(builder, q, lanes):
    return builder.sitofp(q, ir.VectorType(_IR_F32, lanes))


# -- block decoders: unit u of a block -> its dequantized <L x float> vectors -----------
# ``prepare(builder, bp, L)`` reads a block's scales once; ``unit(builder, bp, ctx, u, L)``
# returns the vectors of the block's unit u in value order.
class _Layout:
    def __init__(self, values, nbytes, prepare, unit, prefetch=0):
        self.values, self.nbytes = values, nbytes      # values and bytes per block
        self.units = max(1, values // UNIT)            # units per block
        self.per_step = max(1, UNIT // values)         # blocks per loop step
        self.prepare, self.unit, self.prefetch = prepare, unit, prefetch
        # one prefetch per 64 bytes a loop step reads, rounded: a 210-byte q6_k block
        # needs three, a 36-byte q4_0 step one
        self.prefetch_lines = max(1, (nbytes * self.per_step + 32) // 64)


def _f16_splat(builder, bp, off, lanes):
    """The fp16 at byte ``off`` of ``bp`` as a <lanes x float> splat. With F16C the 16-bit
    word is broadcast first and all lanes converted (vpbroadcastw + vcvtph2ps): a scalar
    convert makes LLVM insert the word into whatever vector register is free
    (``vpinsrw``), which ties the decode of a block to that register's last writer,
    sometimes an accumulator (measured: q4_0 with four accumulator chains, one thread,
    56 ps a weight against 31). Same bits. Gemma 3 270M decode, old and new alternating
    in separate processes, 9 runs each: median 93.7 -> 101.7 tokens/s."""
    if _target_has("f16c"):
        h = _ir_load(builder, bp, off, ir.IntType(16))
        hv = _ir_splat(builder, h, lanes)
        return builder.fpext(builder.bitcast(hv, ir.VectorType(ir.HalfType(), lanes)),
                             ir.VectorType(_IR_F32, lanes))
    return _ir_splat(builder, _ir_f16(builder, _ir_load(builder, bp, off, _IR_I32)), lanes)


def _f16_at(builder, bp, off):
    """The fp16 at byte ``off`` as a float32 scalar, read as the top half of the 32-bit
    word at ``off - 2`` so that a scale at a block's end is loaded inside the block."""
    return _ir_f16(builder, builder.lshr(_ir_load(builder, bp, off - 2, _IR_I32),
                                         _ir_const(_IR_I32, 16)))


def _d_at0(builder, bp, lanes):
    return _f16_splat(builder, bp, 0, lanes)


def _q8_0_unit(builder, bp, d, u, lanes):
    # 34 B: d f16 @0 | qs int8[32] @2
    return [builder.fmul(d, _tofloat(builder, _bytes(builder, bp, 2 + lanes * k, lanes, True),
                                     lanes)) for k in range(32 // lanes)]


def _nibbles(builder, bp, at, k, lanes):
    """Values kL..kL+L-1 of a 32-value block whose 16 bytes at ``at`` hold values j (low
    nibble of byte j) and j + 16 (high nibble)."""
    v0 = k * lanes
    q = _bytes(builder, bp, at + v0 % 16, lanes)
    return builder.and_(builder.lshr(q, _vi(lanes, 4 * (v0 // 16))), _vi(lanes, 15))


def _q4_0_unit(builder, bp, d, u, lanes):
    # 18 B: d f16 @0 | qs[16] @2; value = d * (nibble - 8)
    return [builder.fmul(d, _tofloat(builder, builder.sub(_nibbles(builder, bp, 2, k, lanes),
                                                          _vi(lanes, 8)), lanes))
            for k in range(32 // lanes)]


def _q5_0_unit(builder, bp, d, u, lanes):
    # 22 B: d f16 @0 | qh u32 @2 | qs[16] @6; value j = d * (nibble | (qh bit j) << 4) - 16d.
    # A per-lane rotate brings bit j of qh to bit 4.
    qh = _ir_splat(builder, _ir_load(builder, bp, 2, _IR_I32), lanes)
    rot = _intrinsic_fn(builder, "llvm.fshr", qh.type, 3)
    out = []
    for k in range(32 // lanes):
        amt = _vi(lanes, [(k * lanes + i - 4) % 32 for i in range(lanes)])
        hb = builder.and_(builder.call(rot, [qh, qh, amt]), _vi(lanes, 16))
        q = builder.or_(_nibbles(builder, bp, 6, k, lanes), hb)
        out.append(builder.fmul(d, _tofloat(builder, builder.sub(q, _vi(lanes, 16)), lanes)))
    return out


def _q4_k_prepare(builder, bp, lanes):
    # 144 B: d f16 @0 | dmin f16 @2 | scales[12] @4 | qs[128] @16. The 8 (scale, min)
    # pairs of 6 bits (see block_rows._q4k_scale_min) unpacked as two <8 x i32>.
    d, dmin = _ir_f16_pair(builder, _ir_load(builder, bp, 0, _IR_I32))
    sb = _ir_load(builder, bp, 4, ir.VectorType(_IR_I8, 16))      # bytes 0-11 used
    v8 = ir.VectorType(_IR_I32, 8)
    a = builder.zext(_ir_pick(builder, sb, [0, 1, 2, 3, 8, 9, 10, 11]), v8)
    b = builder.zext(_ir_pick(builder, sb, [4, 5, 6, 7, 8, 9, 10, 11]), v8)
    c = builder.zext(_ir_pick(builder, sb, [0, 1, 2, 3, 0, 1, 2, 3]), v8)
    e = builder.zext(_ir_pick(builder, sb, [4, 5, 6, 7, 4, 5, 6, 7]), v8)
    low = _vi(8, [63] * 4 + [15] * 4)
    top = _vi(8, [0] * 4 + [48] * 4)
    sc = builder.or_(builder.and_(a, low), builder.and_(builder.lshr(c, _vi(8, 2)), top))
    m = builder.or_(builder.and_(builder.lshr(b, _vi(8, [0] * 4 + [4] * 4)), low),
                    builder.and_(builder.lshr(e, _vi(8, 2)), top))
    dsc = builder.fmul(_ir_splat(builder, d), _tofloat(builder, sc, 8))
    ndm = builder.fneg(builder.fmul(_ir_splat(builder, dmin), _tofloat(builder, m, 8)))
    return dsc, ndm


def _q4_k_unit(builder, bp, ctx, u, lanes):
    # unit u = chunk u: qs[32u:32u+32] low nibbles -> sub-block 2u, high -> 2u+1;
    # value = d*sc * q - dmin*m (one rounding: d*sc*q is exact)
    dsc, ndm = ctx
    fma = _intrinsic_fn(builder, "llvm.fmuladd", ir.VectorType(_IR_F32, lanes), 3)
    out = []
    for half in range(2):
        s = 2 * u + half
        scale, bias = _ir_lane(builder, dsc, s, lanes), _ir_lane(builder, ndm, s, lanes)
        for k in range(32 // lanes):
            q = _bytes(builder, bp, 16 + 32 * u + lanes * k, lanes)
            q = builder.lshr(q, _vi(lanes, 4)) if half else builder.and_(q, _vi(lanes, 15))
            out.append(builder.call(fma, [_tofloat(builder, q, lanes), scale, bias]))
    return out


def _q5_k_unit(builder, bp, ctx, u, lanes):
    # 176 B: q4_k's first 16 bytes | qh[32] @16 | qs[128] @48. Chunk u: qs[32u + j] low
    # nibble -> sub-block 2u, high -> 2u+1; bit 2u (2u+1) of qh[j] is the 5th bit; value =
    # d*sc * q - dmin*m, one rounding as q4_k (d*sc*q is exact: 11 + 6 + 5 bits)
    dsc, ndm = ctx
    fma = _intrinsic_fn(builder, "llvm.fmuladd", ir.VectorType(_IR_F32, lanes), 3)
    out = []
    for half in range(2):
        s = 2 * u + half
        scale, bias = _ir_lane(builder, dsc, s, lanes), _ir_lane(builder, ndm, s, lanes)
        for k in range(32 // lanes):
            q = _bytes(builder, bp, 48 + 32 * u + lanes * k, lanes)
            q = builder.lshr(q, _vi(lanes, 4)) if half else builder.and_(q, _vi(lanes, 15))
            qh = _bytes(builder, bp, 16 + lanes * k, lanes)
            hb = (builder.lshr(qh, _vi(lanes, s - 4)) if s >= 4
                  else builder.shl(qh, _vi(lanes, 4 - s)))
            q = builder.or_(q, builder.and_(hb, _vi(lanes, 16)))
            out.append(builder.call(fma, [_tofloat(builder, q, lanes), scale, bias]))
    return out


def _d_m_at0(builder, bp, lanes):
    # q4_1 / q5_1: d f16 @0, m f16 @2 as <lanes x float> splats
    d, m = _ir_f16_pair(builder, _ir_load(builder, bp, 0, _IR_I32))
    return _ir_splat(builder, d, lanes), _ir_splat(builder, m, lanes)


def _q4_1_unit(builder, bp, ctx, u, lanes):
    # 20 B: d | m | qs[16] @4; value = d * nibble + m (one rounding: d * q is exact)
    d, m = ctx
    fma = _intrinsic_fn(builder, "llvm.fmuladd", ir.VectorType(_IR_F32, lanes), 3)
    return [builder.call(fma, [_tofloat(builder, _nibbles(builder, bp, 4, k, lanes), lanes),
                               d, m]) for k in range(32 // lanes)]


def _q5_1_unit(builder, bp, ctx, u, lanes):
    # 24 B: d | m | qh u32 @4 | qs[16] @8; value j = d * (nibble | (qh bit j) << 4) + m
    d, m = ctx
    fma = _intrinsic_fn(builder, "llvm.fmuladd", ir.VectorType(_IR_F32, lanes), 3)
    qh = _ir_splat(builder, _ir_load(builder, bp, 4, _IR_I32), lanes)
    rot = _intrinsic_fn(builder, "llvm.fshr", qh.type, 3)
    out = []
    for k in range(32 // lanes):
        amt = _vi(lanes, [(k * lanes + i - 4) % 32 for i in range(lanes)])
        hb = builder.and_(builder.call(rot, [qh, qh, amt]), _vi(lanes, 16))
        q = builder.or_(_nibbles(builder, bp, 8, k, lanes), hb)
        out.append(builder.call(fma, [_tofloat(builder, q, lanes), d, m]))
    return out


def _q6_k_prepare(builder, bp, lanes):
    # 210 B: ql[128] @0 | qh[64] @128 | scales int8[16] @192 | d f16 @208 -> d * scales
    d = _f16_at(builder, bp, 208)
    sc = _bytes(builder, bp, 192, 16, signed=True)
    return builder.fmul(_ir_splat(builder, d, 16), _tofloat(builder, sc, 16))


def _q6_k_unit(builder, bp, dsc, u, lanes):
    # Half h = u // 2 (128 values); value w of the half, j = w % 32, quarter = w // 32:
    # low 4 bits from ql[64h + 32 (quarter % 2) + j] (low nibble for quarters 0-1, high
    # for 2-3), bits 4-5 = bits 2*quarter of qh[32h + j]; value = d*sc[8h + w // 16] * (q - 32)
    h = u // 2
    out = []
    for k in range(UNIT // lanes):
        w = 64 * (u % 2) + lanes * k
        quarter, j = w // 32, w % 32
        ql = _bytes(builder, bp, 64 * h + 32 * (quarter % 2) + j, lanes)
        lo = builder.lshr(ql, _vi(lanes, 4)) if quarter >= 2 else builder.and_(ql, _vi(lanes, 15))
        qh = _bytes(builder, bp, 128 + 32 * h + j, lanes)
        shift = 2 * quarter - 4                      # bits 2q..2q+1 -> bits 4..5
        hi = builder.and_(builder.shl(qh, _vi(lanes, -shift)) if shift < 0 else
                          builder.lshr(qh, _vi(lanes, shift)), _vi(lanes, 48))
        q = builder.sub(builder.or_(lo, hi), _vi(lanes, 32))
        out.append(builder.fmul(_ir_lane(builder, dsc, 8 * h + w // 16, lanes),
                                _tofloat(builder, q, lanes)))
    return out


def _q3_k_prepare(builder, bp, lanes):
    # 110 B: hmask[32] @0 | qs[64] @32 | scales[12] @96 | d f16 @108 -> d * (scale - 32)
    # for the 16 sub-blocks. Scale s: low 4 bits nibble s // 8 of byte s % 8, high 2 bits
    # bits 2 (s // 4) of byte 8 + s % 4. The 16 bytes read start at 94 (two qs bytes
    # first) so that the load stays inside the block. Returns (dl, -4 dl).
    d = _f16_at(builder, bp, 108)
    sb = _ir_load(builder, bp, 94, ir.VectorType(_IR_I8, 16))
    v16 = ir.VectorType(_IR_I32, 16)
    lo = builder.zext(_ir_pick(builder, sb, [2 + s % 8 for s in range(16)]), v16)
    hi = builder.zext(_ir_pick(builder, sb, [10 + s % 4 for s in range(16)]), v16)
    lo = builder.and_(builder.lshr(lo, _vi(16, [4 * (s // 8) for s in range(16)])), _vi(16, 15))
    hi = builder.and_(builder.lshr(hi, _vi(16, [2 * (s // 4) for s in range(16)])), _vi(16, 3))
    sc = builder.sub(builder.or_(lo, builder.shl(hi, _vi(16, 4))), _vi(16, 32))
    dl = builder.fmul(_ir_splat(builder, d, 16), _tofloat(builder, sc, 16))
    return dl, builder.fmul(dl, ir.Constant(ir.VectorType(_IR_F32, 16), [-4.0] * 16))


def _q3_k_unit(builder, bp, ctx, u, lanes):
    # Unit u: values 64u..64u+63, g = u // 2; value w = 128g + 32s + l has the code
    # c = (qs[32g + l] >> 2s) & 3 | (bit 4g + s of hmask[l]) << 2 and is d*(sc - 32) * (c - 4)
    # = fmuladd(c, dl, -4 dl), the same number: every product is exact (11 + 6 + 3 bits)
    dsc, m4 = ctx
    fma = _intrinsic_fn(builder, "llvm.fmuladd", ir.VectorType(_IR_F32, lanes), 3)
    g = u // 2
    out = []
    for k in range(UNIT // lanes):
        w = 64 * u + lanes * k
        s, l0 = (w % 128) // 32, w % 32
        # the code is put together on the bytes, a quarter of the i32 vectors' width
        # (one thread, 4096 x 14336, M=1, alternating: 0.89x the time of the same on i32)
        q = _ir_load(builder, bp, 32 + 32 * g + l0, ir.VectorType(_IR_I8, lanes))
        q = builder.and_(builder.lshr(q, _vb(lanes, 2 * s)), _vb(lanes, 3))
        hm = _ir_load(builder, bp, l0, ir.VectorType(_IR_I8, lanes))
        bit = 4 * g + s - 2                          # bit 4g + s -> bit 2
        h = builder.lshr(hm, _vb(lanes, bit)) if bit >= 0 else builder.shl(hm, _vb(lanes, -bit))
        q = builder.zext(builder.or_(q, builder.and_(h, _vb(lanes, 4))),
                         ir.VectorType(_IR_I32, lanes))
        out.append(builder.call(fma, [_tofloat(builder, q, lanes),
                                      _ir_lane(builder, dsc, w // 16, lanes),
                                      _ir_lane(builder, m4, w // 16, lanes)]))
    return out


def _q2_k_prepare(builder, bp, lanes):
    # 84 B: scales[16] @0 (low nibble scale, high nibble min) | qs[64] @16 | d f16 @80 |
    # dmin f16 @82 -> (d * sc, -(dmin * m)) for the 16 sub-blocks
    d, dmin = _ir_f16_pair(builder, _ir_load(builder, bp, 80, _IR_I32))
    sb = _bytes(builder, bp, 0, 16)
    sc = builder.and_(sb, _vi(16, 15))
    m = builder.lshr(sb, _vi(16, 4))
    dsc = builder.fmul(_ir_splat(builder, d, 16), _tofloat(builder, sc, 16))
    ndm = builder.fneg(builder.fmul(_ir_splat(builder, dmin, 16), _tofloat(builder, m, 16)))
    return dsc, ndm


def _q2_k_unit(builder, bp, ctx, u, lanes):
    # value w = 128g + 32s + l: (qs[32g + l] >> 2s) & 3; value = d*sc * q - dmin*m, one
    # rounding (d*sc*q and dmin*m are exact: 11 + 4 + 2 bits)
    dsc, ndm = ctx
    fma = _intrinsic_fn(builder, "llvm.fmuladd", ir.VectorType(_IR_F32, lanes), 3)
    g = u // 2
    out = []
    for k in range(UNIT // lanes):
        w = 64 * u + lanes * k
        s, l0 = (w % 128) // 32, w % 32
        q = _bytes(builder, bp, 16 + 32 * g + l0, lanes)
        q = builder.and_(builder.lshr(q, _vi(lanes, 2 * s)), _vi(lanes, 3))
        out.append(builder.call(fma, [_tofloat(builder, q, lanes),
                                      _ir_lane(builder, dsc, w // 16, lanes),
                                      _ir_lane(builder, ndm, w // 16, lanes)]))
    return out


# -- iq4_nl / iq4_xs: a 4-bit code indexes GGML's non-linear grid (block_rows.IQ4_GRID);
# value = d * grid[code] (iq4_xs: d * (scale - 32) * grid[code]), every product exact
# (11 + 6 + 7 bits), so looking the grid up before or after the scaling is the same number
_IQ4 = [-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113]


def _grid_lookup(builder, grid, codes, lanes, how=None):
    """``grid[codes & 15]`` as <lanes x float>: ``grid`` 16 floats (a constant list or a
    <16 x float> value), ``codes`` <lanes x i32>. AVX-512: one vpermps over 16 entries;
    AVX2: two 8-entry vpermps and a blend on bit 3 per 8 lanes; elsewhere (or ``how=
    "select"``) a tree of selects on the code's bits. The same values every way."""
    how = how or ("permvar" if lanes == 16 and _target_has("avx512f") else
                  "permps" if _target_has("avx2") else "select")
    vf16 = ir.VectorType(_IR_F32, 16)
    table = ir.Constant(vf16, [float(g) for g in grid]) if isinstance(grid, list) else grid
    if how == "permvar":
        return _permvar(builder, table, codes)
    if how == "permps":
        v8, vi8 = ir.VectorType(_IR_F32, 8), ir.VectorType(_IR_I32, 8)
        fn = cgutils.get_or_insert_function(
            builder.module, ir.FunctionType(v8, [v8, vi8]), "llvm.x86.avx2.permps")
        lo = _ir_pick(builder, table, range(8))
        hi = _ir_pick(builder, table, range(8, 16))
        parts = []
        for c0 in range(0, lanes, 8):
            c = _ir_pick(builder, codes, range(c0, c0 + 8))
            top = builder.icmp_unsigned("!=", builder.and_(c, _vi(8, 8)), _vi(8, 0))
            parts.append(builder.select(top, builder.call(fn, [hi, c]),
                                        builder.call(fn, [lo, c])))
        return parts[0] if lanes == 8 else builder.shuffle_vector(
            parts[0], parts[1], _vi(16, list(range(16))))
    entries = [builder.shuffle_vector(table, ir.Constant(vf16, ir.Undefined),
                                      _vi(lanes, e)) for e in range(16)]
    for bit in range(4):                  # halve the candidates on each bit of the code
        on = builder.icmp_unsigned("!=", builder.and_(codes, _vi(lanes, 1 << bit)),
                                   _vi(lanes, 0))
        entries = [builder.select(on, b, a) for a, b in zip(entries[0::2], entries[1::2])]
    return entries[0]


def _iq4_nl_unit(builder, bp, d, u, lanes):
    # 18 B: d f16 @0 | qs[16] @2 (q4_0's nibble order); value = d * grid[nibble]
    return [builder.fmul(d, _grid_lookup(builder, _IQ4, _nibbles(builder, bp, 2, k, lanes),
                                         lanes)) for k in range(32 // lanes)]


def _iq4_xs_prepare(builder, bp, lanes):
    # 136 B: d f16 @0 | scales_h u16 @2 (2 bits a sub-block) | scales_l[4] @4 (a nibble a
    # sub-block) | qs[128] @8 -> d * (scale - 32) for the 8 sub-blocks of 32 values
    d = _ir_splat(builder, _ir_f16(builder, _ir_load(builder, bp, 0, _IR_I32)), 8)
    sb = _ir_load(builder, bp, 0, ir.VectorType(_IR_I8, 8))
    v8 = ir.VectorType(_IR_I32, 8)
    lo = builder.zext(_ir_pick(builder, sb, [4 + i // 2 for i in range(8)]), v8)
    lo = builder.and_(builder.lshr(lo, _vi(8, [4 * (i % 2) for i in range(8)])), _vi(8, 15))
    sh = builder.or_(builder.zext(_ir_pick(builder, sb, [2] * 8), v8),
                     builder.shl(builder.zext(_ir_pick(builder, sb, [3] * 8), v8), _vi(8, 8)))
    hi = builder.and_(builder.lshr(sh, _vi(8, [2 * i for i in range(8)])), _vi(8, 3))
    sc = builder.sub(builder.or_(lo, builder.shl(hi, _vi(8, 4))), _vi(8, 32))
    return builder.fmul(d, _tofloat(builder, sc, 8))


def _iq4_xs_unit(builder, bp, dl, u, lanes):
    # unit u: sub-blocks 2u and 2u + 1, each 16 bytes at 8 + 16 s in iq4_nl's order
    out = []
    for s in (2 * u, 2 * u + 1):
        scale = _ir_lane(builder, dl, s, lanes)
        out += [builder.fmul(scale, _grid_lookup(
            builder, _IQ4, _nibbles(builder, bp, 8 + 16 * s, k, lanes), lanes))
            for k in range(32 // lanes)]
    return out


# -- tq2_0 / tq1_0 (ternary: value = d * (digit - 1), exact) ------------------------------
def _d_at(off):
    def prepare(builder, bp, lanes):
        return _ir_splat(builder, _f16_at(builder, bp, off), lanes)
    return prepare


def _tq2_0_unit(builder, bp, d, u, lanes):
    # 66 B: qs[64] @0 | d @64; value 128g + 32s + l = ((qs[32g + l] >> 2s) & 3) - 1
    out = []
    for k in range(UNIT // lanes):
        w = 64 * u + lanes * k
        g, s, l0 = w // 128, (w % 128) // 32, w % 32
        q = builder.and_(builder.lshr(_bytes(builder, bp, 32 * g + l0, lanes),
                                      _vi(lanes, 2 * s)), _vi(lanes, 3))
        out.append(builder.fmul(d, _tofloat(builder, builder.sub(q, _vi(lanes, 1)), lanes)))
    return out


def _trits(builder, v, pw, lanes):
    """Base-3 digit of the bytes ``v`` (<lanes x i32>) at the per-lane powers ``pw``:
    ``((v * 3^n mod 256) * 3) >> 8`` (GGML's tq1_0 packing)."""
    v = builder.and_(builder.mul(v, _vi(lanes, pw)), _vi(lanes, 255))
    return builder.lshr(builder.mul(v, _vi(lanes, 3)), _vi(lanes, 8))


def _tq1_0_unit(builder, bp, d, u, lanes):
    # 54 B: qs[48] @0 | qh[4] @48 | d @52. Digit n of qs[l] (l < 32) is value 32n + l, of
    # qs[32 + l] (l < 16) value 160 + 16n + l, of qh[l] (n < 4) value 240 + 4n + l
    out = []
    for k in range(UNIT // lanes):
        w = 64 * u + lanes * k
        if w < 160:
            q = _trits(builder, _bytes(builder, bp, w % 32, lanes), 3 ** (w // 32), lanes)
        elif w < 240:
            q = _trits(builder, _bytes(builder, bp, 32 + (w - 160) % 16, lanes),
                       3 ** ((w - 160) // 16), lanes)
        else:
            qh = _bytes(builder, bp, 48, 4)
            lane = [(w - 240 + i) for i in range(lanes)]
            q = _trits(builder, _ir_pick(builder, qh, [v % 4 for v in lane]),
                       [3 ** (v // 4) for v in lane], lanes)
        out.append(builder.fmul(d, _tofloat(builder, builder.sub(q, _vi(lanes, 1)), lanes)))
    return out


# -- table decoders (16 lanes, AVX-512): a 4-bit or 5-bit code indexes a per-block table
# of its dequantized values (vpermps / vpermt2ps read only the index's low 4 / 5 bits),
# which replaces the per-vector mask, int->float convert and multiply. The table entries
# are the same operations on the same numbers as above (``d * (i - 8)``, ``d * (i - 16)``),
# so the decoded floats are bit-identical to the plain decoders' (tested). One thread,
# M=1, W in cache: q4_0 1.13x, q5_0 1.10x; q4_k even with one weight row a call, faster
# with two (see WROWS_Q4_K).
def _permvar(builder, table, idx):
    fn = cgutils.get_or_insert_function(
        builder.module, ir.FunctionType(table.type, [table.type, idx.type]),
        "llvm.x86.avx512.permvar.sf.512")
    return builder.call(fn, [table, idx])


def _permvar2(builder, lo, idx, hi):
    fn = cgutils.get_or_insert_function(
        builder.module, ir.FunctionType(lo.type, [lo.type, idx.type, lo.type]),
        "llvm.x86.avx512.vpermi2var.ps.512")
    return builder.call(fn, [lo, idx, hi])


def _ramp(lo, hi):
    return ir.Constant(ir.VectorType(_IR_F32, hi - lo), [float(i) for i in range(lo, hi)])


def _q4_0_table(builder, bp, lanes):
    return builder.fmul(_d_at0(builder, bp, 16), _ramp(-8, 8))


def _q4_0_unit_t(builder, bp, table, u, lanes):
    q = _bytes(builder, bp, 2, 16)                   # low nibbles: values 0-15, high: 16-31
    return [_permvar(builder, table, q), _permvar(builder, table, builder.lshr(q, _vi(16, 4)))]


def _q5_0_table(builder, bp, lanes):
    d = _d_at0(builder, bp, 16)
    return builder.fmul(d, _ramp(-16, 0)), builder.fmul(d, _ramp(0, 16))


def _q5_0_unit_t(builder, bp, tables, u, lanes):
    # index bits 0-3: the nibble; bit 4: bit j of qh, set under a 16-lane mask made of
    # qh's 16 bits (a k-register on AVX-512; bits 5+ of the index are ignored)
    qh = _ir_load(builder, bp, 2, _IR_I32)
    q = _bytes(builder, bp, 6, 16)
    zero, sixteen = _vi(16, 0), _vi(16, 16)
    out = []
    for k, nib in enumerate((builder.and_(q, _vi(16, 15)), builder.lshr(q, _vi(16, 4)))):
        half = builder.trunc(builder.lshr(qh, _ir_const(_IR_I32, 16 * k)), ir.IntType(16))
        bits = builder.bitcast(half, ir.VectorType(ir.IntType(1), 16))
        idx = builder.or_(nib, builder.select(bits, sixteen, zero))
        out.append(_permvar2(builder, tables[0], idx, tables[1]))
    return out


def _q4_k_unit_t(builder, bp, ctx, u, lanes):
    # as _q4_k_unit: sub-block s's table holds fmuladd(i, d*sc_s, -dmin*m_s) for codes
    # i = 0..15, the plain decoder's operation on the same numbers
    dsc, ndm = ctx
    fma = _intrinsic_fn(builder, "llvm.fmuladd", ir.VectorType(_IR_F32, 16), 3)
    q = _bytes(builder, bp, 16 + 32 * u, 16), _bytes(builder, bp, 32 + 32 * u, 16)
    out = []
    for half in range(2):
        s = 2 * u + half
        table = builder.call(fma, [_ramp(0, 16), _ir_lane(builder, dsc, s, 16),
                                   _ir_lane(builder, ndm, s, 16)])
        for v in q:
            out.append(_permvar(builder, table, builder.lshr(v, _vi(16, 4)) if half else v))
    return out


def q6_k_codes(builder, bp, u):
    """The 6-bit codes (0-63) of q6_k unit ``u`` as <64 x i8>, in value order: half
    h = u // 2, quarters 2 (u % 2) and 2 (u % 2) + 1; low 4 bits from the 64 ql bytes at
    64h (low nibbles for u even, high for odd), bits 4-5 from the 32 qh bytes at
    128 + 32h (bits 0-1 and 2-3, or 4-5 and 6-7)."""
    h, odd = u // 2, u % 2
    ql = _ir_load(builder, bp, 64 * h, ir.VectorType(_IR_I8, 64))
    qh = _ir_load(builder, bp, 128 + 32 * h, ir.VectorType(_IR_I8, 32))
    lo = builder.and_(builder.lshr(ql, _vb(64, 4)) if odd else ql, _vb(64, 15))
    if odd:
        ha, hb = qh, builder.lshr(qh, _vb(32, 2))
    else:
        ha, hb = builder.shl(qh, _vb(32, 4)), builder.shl(qh, _vb(32, 2))
    hi = builder.and_(builder.shuffle_vector(ha, hb, _vi(64, list(range(64)))),
                      _vb(64, 48))
    return builder.or_(lo, hi)


def _q6_k_unit_b(builder, bp, dsc, u, lanes):
    # as _q6_k_unit, with the 6-bit codes of the unit's 64 values put together as 64
    # bytes at once (a zmm with AVX-512BW) and widened 16 at a time: the same codes and
    # the same float operations on them, so the same bits. Half h, quarters 2 (u % 2) and
    # 2 (u % 2) + 1: low 4 bits from the 64 ql bytes at 64h (low nibbles for u even,
    # high for odd), bits 4-5 from the 32 qh bytes at 128 + 32h (bits 0-1 and 2-3, or 4-5
    # and 6-7). One thread, 1024 x 768 in L2: 106 -> 88 us.
    h, odd = u // 2, u % 2
    q = builder.sub(q6_k_codes(builder, bp, u), _vb(64, 32))
    out = []
    for k in range(UNIT // 16):
        qk = builder.sext(_ir_pick(builder, q, range(16 * k, 16 * k + 16)),
                          ir.VectorType(_IR_I32, 16))
        w = 64 * odd + 16 * k
        out.append(builder.fmul(_ir_lane(builder, dsc, 8 * h + w // 16, 16),
                                _tofloat(builder, qk, 16)))
    return out


def _iq4_nl_table(builder, bp, lanes):
    return builder.fmul(_d_at0(builder, bp, 16), ir.Constant(ir.VectorType(_IR_F32, 16),
                                                              [float(g) for g in _IQ4]))


def _iq4_nl_unit_t(builder, bp, table, u, lanes):
    q = _bytes(builder, bp, 2, 16)                   # low nibbles: values 0-15, high: 16-31
    return [_permvar(builder, table, q), _permvar(builder, table, builder.lshr(q, _vi(16, 4)))]


def _iq4_xs_unit_t(builder, bp, dl, u, lanes):
    grid = ir.Constant(ir.VectorType(_IR_F32, 16), [float(g) for g in _IQ4])
    out = []
    for s in (2 * u, 2 * u + 1):
        table = builder.fmul(_ir_lane(builder, dl, s, 16), grid)
        q = _bytes(builder, bp, 8 + 16 * s, 16)
        out += [_permvar(builder, table, q),
                _permvar(builder, table, builder.lshr(q, _vi(16, 4)))]
    return out


LAYOUT = {
    "q8_0": _Layout(32, 34, _d_at0, _q8_0_unit, prefetch=16384),
    "q4_0": _Layout(32, 18, _d_at0, _q4_0_unit, prefetch=4096),
    "q5_0": _Layout(32, 22, _d_at0, _q5_0_unit, prefetch=4096),
    "q4_k": _Layout(256, 144, _q4_k_prepare, _q4_k_unit, prefetch=4096),
    "q6_k": _Layout(256, 210, _q6_k_prepare, _q6_k_unit, prefetch=4096),
    "q5_k": _Layout(256, 176, _q4_k_prepare, _q5_k_unit, prefetch=4096),
    "q4_1": _Layout(32, 20, _d_m_at0, _q4_1_unit, prefetch=4096),
    "q5_1": _Layout(32, 24, _d_m_at0, _q5_1_unit, prefetch=4096),
    "q3_k": _Layout(256, 110, _q3_k_prepare, _q3_k_unit, prefetch=4096),
    "q2_k": _Layout(256, 84, _q2_k_prepare, _q2_k_unit, prefetch=4096),
    "iq4_nl": _Layout(32, 18, _d_at0, _iq4_nl_unit, prefetch=4096),
    "iq4_xs": _Layout(256, 136, _iq4_xs_prepare, _iq4_xs_unit, prefetch=4096),
    "tq2_0": _Layout(256, 66, _d_at(64), _tq2_0_unit, prefetch=4096),
    "tq1_0": _Layout(256, 54, _d_at(52), _tq1_0_unit, prefetch=4096),
}
TABLE_LAYOUT = {     # the 16-lane decoders where a table lookup does the work
    "q4_0": _Layout(32, 18, _q4_0_table, _q4_0_unit_t, prefetch=4096),
    "q5_0": _Layout(32, 22, _q5_0_table, _q5_0_unit_t, prefetch=4096),
    "q4_k": _Layout(256, 144, _q4_k_prepare, _q4_k_unit_t, prefetch=4096),
    "iq4_nl": _Layout(32, 18, _iq4_nl_table, _iq4_nl_unit_t, prefetch=4096),
    "iq4_xs": _Layout(256, 136, _iq4_xs_prepare, _iq4_xs_unit_t, prefetch=4096),
}
if _target_has("avx512bw"):     # byte vectors of 64 lanes (else LLVM splits them in two)
    TABLE_LAYOUT["q6_k"] = _Layout(256, 210, _q6_k_prepare, _q6_k_unit_b, prefetch=4096)
# Software prefetch ahead of the row being read, for weights streamed from DRAM: q8_0 16 KiB
# (Gemma's tied output head: +15-20%, measured on the earlier 8-lane kernel); q4_0 and
# q5_0 4 KiB (one thread, 4096 x 14336, M=1: q4_0 4.4 -> 2.1 ms, q8_0 6.8 -> 3.0 ms; no
# change where W sits in cache); the K-quants 4 KiB, one prefetch per 64 bytes of a block
# (one per block left most lines to the hardware and measured no gain; 2 threads,
# 4096 x 14336: q6_k 9.4 -> 16.8 GB/s, q4_k 12.1 -> 21.8; 262144 x 768 even).
# The prefetch's locality hint depends on the CPU (``prefetch_locality``).


def prefetch_locality() -> int:
    """The GEMV's software prefetch locality: 0 (non-temporal) on AMD Zen, 2 elsewhere.

    On Zen 4 a weight read once a step stays out of the outer caches, which keeps the
    interpreter's and the activations' lines there: Gemma 3 270M, 4 alternating runs
    each, solo decode step 12.3 -> 10.4 ms, 8 sequences batched 30.9 -> 28.7 ms (the GEMV
    alone measured even). On Intel (Emerald Rapids) a non-temporal prefetch this far ahead
    halves the GEMV's speed (2 threads, 262144 x 640, q8_0 20.0 -> 9.1-9.9 ms with
    locality 1-3; q4_0 9.7 -> 6.8-7.3), so other CPUs prefetch into the caches."""
    import llvmlite.binding as ll
    from numba.core import config

    name = config.CPU_NAME if config.CPU_NAME and config.CPU_NAME != "host" else \
        ll.get_host_cpu_name()
    return 0 if name.startswith("znver") else 2


# -- the row intrinsic ----------------------------------------------------------------
def _matrix(a, dtype) -> bool:
    return isinstance(a, types.Array) and a.ndim == 2 and a.dtype == dtype


def row_intrinsic(enc: str, lanes: int | None = None, table: bool = True, wrows: int = 1):
    """An intrinsic ``(w, r, x, out, col) -> None``: ``out[m, col + i] = W[r + i] . x[m]``
    for every row m of x and i < ``wrows``, with W the packed ``enc`` blocks ``w`` (2-D
    uint8, C order), x (M, K) float32 C order and out (M, *) float32. ``lanes``: 16 or 8
    (default: the CPU's); ``table``: with 16 lanes, the table decoders where an encoding
    has one (the same numbers as the plain decoders, fewer instructions). ``wrows`` weight
    rows share each load of x; every output is computed by the same instructions as with
    ``wrows=1``, so the numbers are the same."""
    lanes = lanes or host_lanes()
    lay = TABLE_LAYOUT.get(enc, LAYOUT[enc]) if lanes == 16 and table else LAYOUT[enc]

    def typer(typingctx, w, r, x, out, col):
        ok = (_matrix(w, types.uint8) and w.layout == "C" and _matrix(x, types.float32)
              and x.layout == "C" and _matrix(out, types.float32)
              and isinstance(r, types.Integer) and isinstance(col, types.Integer))
        if not ok:
            return None

        def codegen(context, builder, sig, args):
            _emit_rows(context, builder, sig, args, lay, lanes, wrows)
            return context.get_dummy_value()

        return types.void(w, r, x, out, col), codegen

    return intrinsic(typer)


def for_row_chunks(builder, n_rows, chunks, emit, name):
    """Emit a walk over x's rows 0 .. ``n_rows`` - 1: while rows are left, the largest of
    ``chunks`` (descending, ending in 1) that fits; ``emit(m, rows)`` emits the code of
    the chunk starting at row ``m`` (an i64 value)."""
    i64 = lambda v: _ir_const(_IR_I64, v)  # noqa: E731
    m_ptr = cgutils.alloca_once_value(builder, i64(0))
    cond = builder.append_basic_block(f"{name}.cond")
    done = builder.append_basic_block(f"{name}.done")
    builder.branch(cond)
    builder.position_at_end(cond)
    m = builder.load(m_ptr)
    body = builder.append_basic_block(f"{name}.body")
    builder.cbranch(builder.icmp_signed("<", m, n_rows), body, done)
    builder.position_at_end(body)
    left = builder.sub(n_rows, m)
    for rows in chunks:
        take = builder.append_basic_block(f"{name}.{rows}")
        skip = builder.append_basic_block(f"{name}.not{rows}")
        builder.cbranch(builder.icmp_signed(">=", left, i64(rows)), take, skip)
        builder.position_at_end(take)
        emit(m, rows)
        builder.store(builder.add(m, i64(rows)), m_ptr)
        builder.branch(cond)
        builder.position_at_end(skip)
    builder.branch(cond)           # unreachable: left >= 1 takes the 1-row chunk
    builder.position_at_end(done)


def _emit_rows(context, builder, sig, args, lay, lanes, wrows):
    wt, _, xt, ot, _ = sig.args
    wa = context.make_array(wt)(context, builder, args[0])
    oa = context.make_array(ot)(context, builder, args[3])
    r = context.cast(builder, args[1], sig.args[1], types.intp)
    col = context.cast(builder, args[4], sig.args[4], types.intp)
    o_stride = cgutils.unpack_tuple(builder, oa.strides)[1]
    w_stride = cgutils.unpack_tuple(builder, wa.strides)[0]
    i64 = lambda v: _ir_const(_IR_I64, v)  # noqa: E731
    w8 = builder.bitcast(wa.data, _IR_I8.as_pointer())
    rows_w = [builder.gep(w8, [builder.mul(builder.add(r, i64(i)), w_stride)])
              for i in range(wrows)]
    o8 = builder.bitcast(oa.data, _IR_I8.as_pointer())
    o_cols = [builder.gep(o8, [builder.mul(builder.add(col, i64(i)), o_stride)])
              for i in range(wrows)]
    _emit_row_chunks(context, builder, xt, args[2], oa, rows_w, o_cols, lay, lanes)


def runs_intrinsic(enc: str, wrows: int, lanes: int | None = None, table: bool = True):
    """An intrinsic ``(ws, rs, x, out, cols) -> None``: ``out[m, cols[i]] = ws[i][rs[i]]
    . x[m]`` for every row m of x and each of the ``wrows`` weight rows i (tuples ``ws``
    of packed ``enc`` matrices, C order, ``rs`` and ``cols`` of integers), read in
    lockstep, one step of every row in turn; x and out as in ``row_intrinsic``. Every
    output comes from the same instructions as with ``row_intrinsic``: the same bits."""
    lanes = lanes or host_lanes()
    lay = TABLE_LAYOUT.get(enc, LAYOUT[enc]) if lanes == 16 and table else LAYOUT[enc]

    def typer(typingctx, ws, rs, x, out, cols):
        ok = (lockstep_types_ok(ws, rs, cols, wrows) and _matrix(x, types.float32)
              and x.layout == "C" and _matrix(out, types.float32))
        if not ok:
            return None

        def codegen(context, builder, sig, args):
            ws_t, rs_t, xt, ot, cols_t = sig.args
            oa = context.make_array(ot)(context, builder, args[3])
            rows_w, o_cols = lockstep_pointers(context, builder, (ws_t, args[0]),
                                               (rs_t, args[1]), (cols_t, args[4]), oa)
            _emit_row_chunks(context, builder, xt, args[2], oa, rows_w, o_cols, lay, lanes)
            return context.get_dummy_value()

        return types.void(ws, rs, x, out, cols), codegen

    return intrinsic(typer)


def lockstep_types_ok(ws, rs, cols, wrows) -> bool:
    """Whether a lockstep intrinsic's ``ws`` is a tuple of ``wrows`` C-order 2-D uint8
    arrays and ``rs`` and ``cols`` tuples of ``wrows`` integers."""
    def ints(t):
        return (isinstance(t, types.BaseTuple) and len(t) == wrows
                and all(isinstance(v, types.Integer) for v in t))

    return (isinstance(ws, types.UniTuple) and ws.count == wrows
            and _matrix(ws.dtype, types.uint8) and ws.dtype.layout == "C"
            and ints(rs) and ints(cols))


def lockstep_pointers(context, builder, ws, rs, cols, oa):
    """(row pointers, column pointers), i8* each: weight row ``rs[i]`` of ``ws[i]`` and
    column ``cols[i]`` of the output array ``oa``; ``ws``, ``rs``, ``cols`` as (numba
    type, IR value) pairs of tuples."""
    (ws_t, ws_v), (rs_t, rs_v), (cols_t, cols_v) = ws, rs, cols
    n = ws_t.count

    def intp(tup_t, tup):
        return [context.cast(builder, v, t, types.intp)
                for v, t in zip(cgutils.unpack_tuple(builder, tup, n), tup_t)]

    rows_w = []
    for w, r in zip(cgutils.unpack_tuple(builder, ws_v, n), intp(rs_t, rs_v)):
        wa = context.make_array(ws_t.dtype)(context, builder, w)
        rows_w.append(builder.gep(builder.bitcast(wa.data, _IR_I8.as_pointer()),
                                  [builder.mul(r, cgutils.unpack_tuple(builder, wa.strides)[0])]))
    o_stride = cgutils.unpack_tuple(builder, oa.strides)[1]
    o8 = builder.bitcast(oa.data, _IR_I8.as_pointer())
    return rows_w, [builder.gep(o8, [builder.mul(c, o_stride)]) for c in intp(cols_t, cols_v)]


# Each call prefetches the output lines OUT_PREFETCH bytes past its columns into L2
# (read, T1). The group kernels' calls store a float to each of up to 4 far-apart
# columns and come back to the same lines 16 calls later; a store whose line is not in
# L2 then waits on L3 or memory (with a 262144-float output, every 16th). W streamed
# from memory, one row of x, calls alternating, 262144 x 640|768, int8 x (time without /
# with): q4_0 1.08x, q5_0 1.07x, q8_0 1.09x, q4_k 1.08x, q6_k 1.07x at 512 bytes (256 to
# 2048 alike, 4096 less); into L1 (T0) or for writing (prefetchw): 1.00-1.03x. With a
# small output, which stays in cache (4096 x 14336: 16 KB), it costs 1-2% (without /
# with 1.01-1.025x; skipped there by a branch on the output's size, the branch changed
# the code around it: q4_0 and q6_k 0.85-0.94x everywhere). Measured on Intel.
OUT_PREFETCH = 512


def prefetch_out(builder, ptrs):
    """Prefetch into L2 the line ``OUT_PREFETCH`` bytes past each of ``ptrs`` (i8*)."""
    pf = cgutils.get_or_insert_function(
        builder.module, ir.FunctionType(ir.VoidType(), [_IR_I8.as_pointer()] + [_IR_I32] * 3),
        "llvm.prefetch.p0i8")
    for p in ptrs:
        builder.call(pf, [builder.gep(p, [_ir_const(_IR_I64, OUT_PREFETCH)]),
                          _ir_const(_IR_I32, 0), _ir_const(_IR_I32, 2), _ir_const(_IR_I32, 1)])


def _emit_row_chunks(context, builder, xt, x, oa, rows_w, o_cols, lay, lanes):
    """Each row of x against the weight rows at ``rows_w`` (i8*), a chunk of x's rows at
    a time; the dot of weight row i stored at ``o_cols[i]`` (i8*, column i's start in
    out) in the x row's line of out."""
    xa = context.make_array(xt)(context, builder, x)
    n_rows, k = cgutils.unpack_tuple(builder, xa.shape)
    x_stride = cgutils.unpack_tuple(builder, xa.strides)[0]
    o_row = cgutils.unpack_tuple(builder, oa.strides)[0]
    i64 = lambda v: _ir_const(_IR_I64, v)  # noqa: E731
    x8 = builder.bitcast(xa.data, _IR_I8.as_pointer())
    nb = builder.sdiv(k, i64(lay.values))
    wrows = len(rows_w)

    def chunk(m, rows):
        xs = [builder.bitcast(builder.gep(x8, [builder.mul(builder.add(m, i64(j)), x_stride)]),
                              _IR_F32.as_pointer()) for j in range(rows)]
        def ats():
            return [builder.mul(builder.add(m, i64(j)), o_row) for j in range(rows)]
        prefetch_out(builder, [builder.gep(o_col, [at]) for at in ats() for o_col in o_cols])
        dots = _emit_dots(builder, rows_w, xs, nb, lay, lanes)
        for j, at in enumerate(ats()):      # made again, not kept across the dots
            for i, o_col in enumerate(o_cols):
                builder.store(dots[j * wrows + i],
                              builder.bitcast(builder.gep(o_col, [at]), _IR_F32.as_pointer()))

    for_row_chunks(builder, n_rows, [c for c in ROW_CHUNKS if c * wrows <= ROW_CHUNKS[0]],
                   chunk, "rows")


def _emit_dots(builder, rows_w, xs, nb, lay, lanes):
    """The dots of each weight row pointer in ``rows_w`` with each x row pointer in ``xs``
    (see module doc), x row major: ``[x0.w0, x0.w1, ..., x1.w0, ...]``."""
    vf = ir.VectorType(_IR_F32, lanes)
    accs = [[[cgutils.alloca_once_value(builder, ir.Constant(vf, None)) for _ in range(2)]
             for _ in rows_w] for _ in xs]
    _emit_blocks(builder, rows_w, xs, _ir_const(_IR_I64, 0), nb, accs, lay, lanes)
    return _hsums(builder, [builder.fadd(builder.load(a), builder.load(b))
                            for acc_x in accs for a, b in acc_x])


def _emit_blocks(builder, rows_w, xs, b_lo, b_hi, accs, lay, lanes):
    """Blocks ``b_lo`` .. ``b_hi - 1`` of each weight row into the accumulators ``accs``
    (allocas, [x row][weight row][2]). ``b_hi - b_lo`` is a multiple of ``lay.per_step``
    except for the last range of a row, whose odd block comes last, as in a whole row."""
    i64 = lambda v: _ir_const(_IR_I64, v)  # noqa: E731
    vf = ir.VectorType(_IR_F32, lanes)
    fma = _intrinsic_fn(builder, "llvm.fmuladd", vf, 3)
    per_unit = UNIT // lanes
    locality = prefetch_locality()
    if lay.prefetch:
        pf = cgutils.get_or_insert_function(
            builder.module, ir.FunctionType(ir.VoidType(), [_IR_I8.as_pointer()] + [_IR_I32] * 3),
            "llvm.prefetch.p0i8")

    def step(b0, nblocks):
        """Blocks b0 .. b0+nblocks-1: decode, then every row's unit sums."""
        per_row = []
        for row in rows_w:
            vecs = []
            for p in range(nblocks):
                b = builder.add(b0, i64(p))
                bp = builder.gep(row, [builder.mul(b, i64(lay.nbytes))])
                if lay.prefetch and p == 0:   # read, non-temporal, data; never faults
                    for line in range(lay.prefetch_lines):
                        builder.call(pf, [builder.gep(bp, [i64(lay.prefetch + 64 * line)]),
                                          _ir_const(_IR_I32, 0),
                                          _ir_const(_IR_I32, locality),
                                          _ir_const(_IR_I32, 1)])
                ctx = lay.prepare(builder, bp, lanes)
                for u in range(lay.units):
                    vecs += lay.unit(builder, bp, ctx, u, lanes)
            per_row.append(vecs)
        base = builder.mul(b0, i64(lay.values))
        for u0 in range(0, len(per_row[0]), per_unit):
            n_vec = len(per_row[0][u0:u0 + per_unit])
            half = (n_vec + 1) // 2                 # first half into acc[0], rest into acc[1]
            for xp, acc_x in zip(xs, accs):
                xb = builder.gep(xp, [builder.add(base, i64(u0 * lanes))])
                xv = [builder.load(builder.bitcast(builder.gep(xb, [i64(lanes * i)]),
                                                   vf.as_pointer()), align=4)
                      for i in range(n_vec)]
                for vecs, acc in zip(per_row, acc_x):
                    unit = vecs[u0:u0 + per_unit]
                    for part, lo, hi in ((acc[0], 0, half), (acc[1], half, n_vec)):
                        if lo == hi:
                            continue
                        a = builder.load(part)
                        for wv, xi in zip(unit[lo:hi], xv[lo:hi]):
                            a = builder.call(fma, [wv, xi, a])
                        builder.store(a, part)

    nb = builder.sub(b_hi, b_lo)
    n_steps = builder.sdiv(nb, i64(lay.per_step))
    with cgutils.for_range(builder, n_steps) as loop:
        step(builder.add(b_lo, builder.mul(loop.index, i64(lay.per_step))), lay.per_step)
    if lay.per_step > 1:           # an odd block count: the last block on its own
        with builder.if_then(builder.icmp_signed("!=", builder.srem(nb, i64(2)), i64(0))):
            step(builder.sub(b_hi, i64(1)), 1)


# -- the K-range intrinsic: the same dots in pieces of K, for x rows too long to stay in L1
def part_intrinsic(enc: str, lanes: int | None = None, table: bool = True):
    """An intrinsic ``(w, r, x, out, col, b0, b1, acc, t, last) -> None``: blocks ``b0``
    to ``b1 - 1`` of weight row ``r`` against every row m of x, continuing the two
    accumulators kept in ``acc[t, m]`` (float32 (T, M, 2 * lanes), zero before a row's
    first range); with ``last`` (the row's final range) ``out[m, col]`` gets their sum.
    Over ranges that split a row at step boundaries (even block counts for 32-value
    blocks), the instructions and their order are those of ``row_intrinsic``, so the
    numbers are the same."""
    lanes = lanes or host_lanes()
    lay = TABLE_LAYOUT.get(enc, LAYOUT[enc]) if lanes == 16 and table else LAYOUT[enc]

    def typer(typingctx, w, r, x, out, col, b0, b1, acc, t, last):
        ints = (r, col, b0, b1, t)
        ok = (_matrix(w, types.uint8) and w.layout == "C" and _matrix(x, types.float32)
              and x.layout == "C" and _matrix(out, types.float32)
              and isinstance(acc, types.Array) and acc.ndim == 3 and acc.layout == "C"
              and acc.dtype == types.float32 and isinstance(last, types.Boolean)
              and all(isinstance(v, types.Integer) for v in ints))
        if not ok:
            return None

        def codegen(context, builder, sig, args):
            _emit_part(context, builder, sig, args, lay, lanes)
            return context.get_dummy_value()

        return types.void(w, r, x, out, col, b0, b1, acc, t, last), codegen

    return intrinsic(typer)


def _emit_part(context, builder, sig, args, lay, lanes):
    wt, _, xt, ot, _, _, _, at, _, _ = sig.args
    wa = context.make_array(wt)(context, builder, args[0])
    xa = context.make_array(xt)(context, builder, args[2])
    oa = context.make_array(ot)(context, builder, args[3])
    aa = context.make_array(at)(context, builder, args[7])
    r, col, b0, b1, t = (context.cast(builder, args[i], sig.args[i], types.intp)
                         for i in (1, 4, 5, 6, 8))
    last = args[9]
    i64 = lambda v: _ir_const(_IR_I64, v)  # noqa: E731
    vf = ir.VectorType(_IR_F32, lanes)
    n_rows = cgutils.unpack_tuple(builder, xa.shape)[0]
    x_stride = cgutils.unpack_tuple(builder, xa.strides)[0]
    o_strides = cgutils.unpack_tuple(builder, oa.strides)
    a_strides = cgutils.unpack_tuple(builder, aa.strides)
    w_stride = cgutils.unpack_tuple(builder, wa.strides)[0]
    row = builder.gep(builder.bitcast(wa.data, _IR_I8.as_pointer()), [builder.mul(r, w_stride)])
    x8 = builder.bitcast(xa.data, _IR_I8.as_pointer())
    o_col = builder.gep(builder.bitcast(oa.data, _IR_I8.as_pointer()),
                        [builder.mul(col, o_strides[1])])
    a_t = builder.gep(builder.bitcast(aa.data, _IR_I8.as_pointer()),
                      [builder.mul(t, a_strides[0])])

    def chunk(m, rows):
        xs, kept, accs = [], [], []
        for j in range(rows):
            mj = builder.add(m, i64(j))
            xs.append(builder.bitcast(builder.gep(x8, [builder.mul(mj, x_stride)]),
                                      _IR_F32.as_pointer()))
            pa = builder.bitcast(builder.gep(a_t, [builder.mul(mj, a_strides[1])]),
                                 vf.as_pointer())
            halves = (pa, builder.gep(pa, [i64(1)]))
            kept.append(halves)
            accs.append([[cgutils.alloca_once_value(builder, builder.load(h, align=4))
                          for h in halves]])
        _emit_blocks(builder, [row], xs, b0, b1, accs, lay, lanes)
        for acc_x, halves in zip(accs, kept):
            for a, h in zip(acc_x[0], halves):
                builder.store(builder.load(a), h, align=4)
        with builder.if_then(last):
            dots = _hsums(builder, [builder.fadd(builder.load(a), builder.load(b))
                                    for acc_x in accs for a, b in acc_x])
            for j, v in enumerate(dots):
                p = builder.gep(o_col, [builder.mul(builder.add(m, i64(j)), o_strides[0])])
                builder.store(v, builder.bitcast(p, _IR_F32.as_pointer()))

    for_row_chunks(builder, n_rows, ROW_CHUNKS, chunk, "part")


# -- kernels: x (M, K) f32 C order, w (N, K // be * bb) u8 -> out (M, N) f32 -------------
# With few rows of x, a group kernel's thread walks its weight rows as STREAMS interleaved
# runs (prange iteration t takes rows t, t + per, t + 2 per, ...): the hardware
# prefetcher follows each run, so more of memory's latency overlaps. 2 threads, GB/s of
# packed weights, one run -> 4, one row of x: 262144 x 640 q8_0 26 -> 29 (float x),
# q4_0 26.5 -> 29.6 (int8 x); 262144 x 768 q6_k 19.3 -> 21.5 (float x) and 25 -> 30
# (int8 x); 4096 x 14336 (rows of 8-10 KB) even. The int8 kernels, 262144 x 768 q6_k,
# 2 and 4 rows of x: 0.83x and 0.93x the time; 8 rows (bound by arithmetic): 1.05x.
# Gemma's small layer matrices, weights out of the caches as in a decode step, int8 x:
# runs from 64 rows up (not 256) took q4_k 640 x 1024 from 29 to 22 us a call and
# 640 x 2048 from 48 to 41; float x even. With one row of x (and with one or two, int8
# x) a call reads the 4 runs' rows in lockstep (``runs_intrinsic``), so that all 4
# stream whatever the row length: with a row a call, rows of 8 KB left one run
# streaming at a time. Float x, W from memory, calls alternating (time before / after):
# 4096 x 14336 q4_0 1.23x, q8_0 1.25x, q6_k 1.17x, q5_0 1.09x; 262144 x 640|768
# 0.99-1.06x; q4_k 1.27x and 1.07x (its two adjacent rows a call stay for groups of
# fewer rows than runs need).
STREAMS = 4
STREAM_MIN_ROWS = 64           # fewer weight rows a run: one run
STREAM_MAX_X_ROWS = 4          # more rows of x: one run

_row_q4_0 = row_intrinsic("q4_0")
_runs_q4_0 = runs_intrinsic("q4_0", STREAMS)
_row_q5_0 = row_intrinsic("q5_0")
_runs_q5_0 = runs_intrinsic("q5_0", STREAMS)
_row_q8_0 = row_intrinsic("q8_0")
_runs_q8_0 = runs_intrinsic("q8_0", STREAMS)
_row_q4_k = row_intrinsic("q4_k")
_runs_q4_k = runs_intrinsic("q4_k", STREAMS)
_row_q6_k = row_intrinsic("q6_k")
_runs_q6_k = runs_intrinsic("q6_k", STREAMS)
_row_q5_k = row_intrinsic("q5_k")
_runs_q5_k = runs_intrinsic("q5_k", STREAMS)
_row_q4_1 = row_intrinsic("q4_1")
_runs_q4_1 = runs_intrinsic("q4_1", STREAMS)
_row_q5_1 = row_intrinsic("q5_1")
_runs_q5_1 = runs_intrinsic("q5_1", STREAMS)
_row_q3_k = row_intrinsic("q3_k")
_runs_q3_k = runs_intrinsic("q3_k", STREAMS)
_row_q2_k = row_intrinsic("q2_k")
_runs_q2_k = runs_intrinsic("q2_k", STREAMS)
_row_iq4_nl = row_intrinsic("iq4_nl")
_runs_iq4_nl = runs_intrinsic("iq4_nl", STREAMS)
_row_iq4_xs = row_intrinsic("iq4_xs")
_runs_iq4_xs = runs_intrinsic("iq4_xs", STREAMS)
_row_tq2_0 = row_intrinsic("tq2_0")
_runs_tq2_0 = runs_intrinsic("tq2_0", STREAMS)
_row_tq1_0 = row_intrinsic("tq1_0")
_runs_tq1_0 = runs_intrinsic("tq1_0", STREAMS)
# q4_k with one row of x, in groups too small for interleaved runs (``take_runs``), takes
# two weight rows per call: four accumulator chains, one
# load of x for both. Measured, 2 threads, variants interleaved in one process (GB/s of
# W): 4096 x 14336 22.6 -> 27.8, 262144 x 768 19.9 -> 23.9. The other encodings measured
# even or slower with W streamed from DRAM (q8_0 at 4096 x 14336: 43.3 -> 36.9), so they
# take one.
WROWS_Q4_K = 2
_rows_q4_k = row_intrinsic("q4_k", wrows=WROWS_Q4_K)
# x rows longer in all than X_TILE_BYTES no longer stay in L1 beside the streamed weights
# (8 rows of K = 14336: 458 KB, read again for every weight row). The tiled kernels walk
# TILE_ROWS weight rows a piece of K at a time, each piece of x (X_PIECE_BYTES in all)
# read from L1, carrying every row's accumulators between pieces (``part_intrinsic``).
# Measured, 2 threads, whole rows against tiled (ms, two runs): 4096 x 14336, 8 rows of
# x: q8_0 6.96 -> 5.00 and 8.38 -> 5.24, q4_k 7.54 -> 4.44 and 7.56 -> 4.83, q5_0 7.11 ->
# 6.10 and 7.82 -> 5.35; 4 rows: q8_0 4.16 -> 2.87, q4_k 4.50 -> 2.83 and 3.35 -> 3.47;
# 640 x 2048 q5_0 (Gemma 3's ffn_down), 8 rows: 0.18 -> 0.12 and 0.10 -> 0.10. q4_0 and
# q6_k measured slower tiled (8 rows: 6.25 -> 7.54, 8.41 -> 9.20), 2 and 16 rows of x
# slower for every encoding, so those stay whole.
X_TILE_BYTES = 49152
X_PIECE_BYTES = 32768
TILE_ROWS = 16
TILED_ROWS = (4, 8)          # rows of x (M) that take the tiled kernels
LANES = host_lanes()
_part_q5_0 = part_intrinsic("q5_0")
_part_q8_0 = part_intrinsic("q8_0")
_part_q4_k = part_intrinsic("q4_k")


@numba.njit(cache=CACHE, parallel=True, fastmath=FASTMATH)
def _gemv_bf16(x, w, out):
    # w: (N, K) uint16 view; every row of x by the same loop (one inlined code path)
    k = x.shape[1]
    for r in numba.prange(w.shape[0]):
        for m in range(x.shape[0]):
            s = np.float32(0)
            for i in range(k):
                s += _bf16(w[r, i]) * x[m, i]
            out[m, r] = s


# -- kernels: one or several weights of one encoding that read the same x (q/k/v,
# gate/up) in one call; ws: a tuple of packed matrices with the same bytes per row;
# columns offs[i]:offs[i+1] of out are W_i . x. One row of x (decode) takes WROWS weight
# rows per intrinsic call (q4_k), more rows of x one. Each output column comes from the
# same instructions either way, so it is bit-identical to running each weight on its own.
# The kernels are written out per encoding: made by a factory closing over the
# intrinsic, numba's on-disk cache misses them in every new process (measured), and a
# decode step would compile at start-up.
@numba.njit(cache=CACHE, parallel=True)
def _group_q4_0(x, ws, offs, out):
    n = offs[-1]
    per = stream_stride(n, x.shape[0])
    lockstep = per < n and x.shape[0] == 1
    for t in numba.prange(per):
        if lockstep:
            w, r, c = take_runs(ws, offs, t, per, n)
            _runs_q4_0(w, r, x, out, c)
        else:
            for c in range(t, n, per):
                g = _segment(offs, c)
                _row_q4_0(ws[g], c - offs[g], x, out, c)


@numba.njit(cache=CACHE, parallel=True)
def _group_q5_0(x, ws, offs, out):
    n = offs[-1]
    per = stream_stride(n, x.shape[0])
    lockstep = per < n and x.shape[0] == 1
    for t in numba.prange(per):
        if lockstep:
            w, r, c = take_runs(ws, offs, t, per, n)
            _runs_q5_0(w, r, x, out, c)
        else:
            for c in range(t, n, per):
                g = _segment(offs, c)
                _row_q5_0(ws[g], c - offs[g], x, out, c)


@numba.njit(cache=CACHE, parallel=True)
def _group_q8_0(x, ws, offs, out):
    n = offs[-1]
    per = stream_stride(n, x.shape[0])
    lockstep = per < n and x.shape[0] == 1
    for t in numba.prange(per):
        if lockstep:
            w, r, c = take_runs(ws, offs, t, per, n)
            _runs_q8_0(w, r, x, out, c)
        else:
            for c in range(t, n, per):
                g = _segment(offs, c)
                _row_q8_0(ws[g], c - offs[g], x, out, c)


@numba.njit(cache=CACHE, parallel=True)
def _group_q4_k(x, ws, offs, out):
    n = offs[-1]
    if x.shape[0] == 1 and stream_stride(n, 1) < n:
        per = stream_stride(n, 1)
        for t in numba.prange(per):
            w, r, c = take_runs(ws, offs, t, per, n)
            _runs_q4_k(w, r, x, out, c)
    elif x.shape[0] == 1:
        for b in numba.prange(_blocks(offs, WROWS_Q4_K)):
            c, g = _block_start(offs, b, WROWS_Q4_K)
            if c + WROWS_Q4_K <= offs[g + 1]:
                _rows_q4_k(ws[g], c - offs[g], x, out, c)
            else:
                for c in range(c, min(c + WROWS_Q4_K, offs[-1])):
                    g = _segment(offs, c)
                    _row_q4_k(ws[g], c - offs[g], x, out, c)
    else:
        per = stream_stride(n, x.shape[0])
        for t in numba.prange(per):
            for c in range(t, n, per):
                g = _segment(offs, c)
                _row_q4_k(ws[g], c - offs[g], x, out, c)


@numba.njit(cache=CACHE, parallel=True)
def _group_q6_k(x, ws, offs, out):
    n = offs[-1]
    per = stream_stride(n, x.shape[0])
    lockstep = per < n and x.shape[0] == 1
    for t in numba.prange(per):
        if lockstep:
            w, r, c = take_runs(ws, offs, t, per, n)
            _runs_q6_k(w, r, x, out, c)
        else:
            for c in range(t, n, per):
                g = _segment(offs, c)
                _row_q6_k(ws[g], c - offs[g], x, out, c)


@numba.njit(cache=CACHE, parallel=True)
def _group_q5_k(x, ws, offs, out):
    n = offs[-1]
    per = stream_stride(n, x.shape[0])
    lockstep = per < n and x.shape[0] == 1
    for t in numba.prange(per):
        if lockstep:
            w, r, c = take_runs(ws, offs, t, per, n)
            _runs_q5_k(w, r, x, out, c)
        else:
            for c in range(t, n, per):
                g = _segment(offs, c)
                _row_q5_k(ws[g], c - offs[g], x, out, c)


@numba.njit(cache=CACHE, parallel=True)
def _group_q4_1(x, ws, offs, out):
    n = offs[-1]
    per = stream_stride(n, x.shape[0])
    lockstep = per < n and x.shape[0] == 1
    for t in numba.prange(per):
        if lockstep:
            w, r, c = take_runs(ws, offs, t, per, n)
            _runs_q4_1(w, r, x, out, c)
        else:
            for c in range(t, n, per):
                g = _segment(offs, c)
                _row_q4_1(ws[g], c - offs[g], x, out, c)


@numba.njit(cache=CACHE, parallel=True)
def _group_q5_1(x, ws, offs, out):
    n = offs[-1]
    per = stream_stride(n, x.shape[0])
    lockstep = per < n and x.shape[0] == 1
    for t in numba.prange(per):
        if lockstep:
            w, r, c = take_runs(ws, offs, t, per, n)
            _runs_q5_1(w, r, x, out, c)
        else:
            for c in range(t, n, per):
                g = _segment(offs, c)
                _row_q5_1(ws[g], c - offs[g], x, out, c)


@numba.njit(cache=CACHE, parallel=True)
def _group_q3_k(x, ws, offs, out):
    n = offs[-1]
    per = stream_stride(n, x.shape[0])
    lockstep = per < n and x.shape[0] == 1
    for t in numba.prange(per):
        if lockstep:
            w, r, c = take_runs(ws, offs, t, per, n)
            _runs_q3_k(w, r, x, out, c)
        else:
            for c in range(t, n, per):
                g = _segment(offs, c)
                _row_q3_k(ws[g], c - offs[g], x, out, c)


@numba.njit(cache=CACHE, parallel=True)
def _group_q2_k(x, ws, offs, out):
    n = offs[-1]
    per = stream_stride(n, x.shape[0])
    lockstep = per < n and x.shape[0] == 1
    for t in numba.prange(per):
        if lockstep:
            w, r, c = take_runs(ws, offs, t, per, n)
            _runs_q2_k(w, r, x, out, c)
        else:
            for c in range(t, n, per):
                g = _segment(offs, c)
                _row_q2_k(ws[g], c - offs[g], x, out, c)


@numba.njit(cache=CACHE, parallel=True)
def _group_iq4_nl(x, ws, offs, out):
    n = offs[-1]
    per = stream_stride(n, x.shape[0])
    lockstep = per < n and x.shape[0] == 1
    for t in numba.prange(per):
        if lockstep:
            w, r, c = take_runs(ws, offs, t, per, n)
            _runs_iq4_nl(w, r, x, out, c)
        else:
            for c in range(t, n, per):
                g = _segment(offs, c)
                _row_iq4_nl(ws[g], c - offs[g], x, out, c)


@numba.njit(cache=CACHE, parallel=True)
def _group_iq4_xs(x, ws, offs, out):
    n = offs[-1]
    per = stream_stride(n, x.shape[0])
    lockstep = per < n and x.shape[0] == 1
    for t in numba.prange(per):
        if lockstep:
            w, r, c = take_runs(ws, offs, t, per, n)
            _runs_iq4_xs(w, r, x, out, c)
        else:
            for c in range(t, n, per):
                g = _segment(offs, c)
                _row_iq4_xs(ws[g], c - offs[g], x, out, c)


@numba.njit(cache=CACHE, parallel=True)
def _group_tq2_0(x, ws, offs, out):
    n = offs[-1]
    per = stream_stride(n, x.shape[0])
    lockstep = per < n and x.shape[0] == 1
    for t in numba.prange(per):
        if lockstep:
            w, r, c = take_runs(ws, offs, t, per, n)
            _runs_tq2_0(w, r, x, out, c)
        else:
            for c in range(t, n, per):
                g = _segment(offs, c)
                _row_tq2_0(ws[g], c - offs[g], x, out, c)


@numba.njit(cache=CACHE, parallel=True)
def _group_tq1_0(x, ws, offs, out):
    n = offs[-1]
    per = stream_stride(n, x.shape[0])
    lockstep = per < n and x.shape[0] == 1
    for t in numba.prange(per):
        if lockstep:
            w, r, c = take_runs(ws, offs, t, per, n)
            _runs_tq1_0(w, r, x, out, c)
        else:
            for c in range(t, n, per):
                g = _segment(offs, c)
                _row_tq1_0(ws[g], c - offs[g], x, out, c)


@numba.njit(cache=CACHE, parallel=True)
def _tiled_q5_0(x, ws, offs, out, chunk):
    nb = x.shape[1] // 32
    for t in numba.prange(_blocks(offs, TILE_ROWS)):
        c0, acc = t * TILE_ROWS, np.zeros((TILE_ROWS, x.shape[0], 2 * LANES), np.float32)
        for b0 in range(0, nb, chunk):
            b1 = min(b0 + chunk, nb)
            for c in range(c0, min(c0 + TILE_ROWS, offs[-1])):
                g = _segment(offs, c)
                _part_q5_0(ws[g], c - offs[g], x, out, c, b0, b1, acc, c - c0, b1 == nb)


@numba.njit(cache=CACHE, parallel=True)
def _tiled_q8_0(x, ws, offs, out, chunk):
    nb = x.shape[1] // 32
    for t in numba.prange(_blocks(offs, TILE_ROWS)):
        c0, acc = t * TILE_ROWS, np.zeros((TILE_ROWS, x.shape[0], 2 * LANES), np.float32)
        for b0 in range(0, nb, chunk):
            b1 = min(b0 + chunk, nb)
            for c in range(c0, min(c0 + TILE_ROWS, offs[-1])):
                g = _segment(offs, c)
                _part_q8_0(ws[g], c - offs[g], x, out, c, b0, b1, acc, c - c0, b1 == nb)


@numba.njit(cache=CACHE, parallel=True)
def _tiled_q4_k(x, ws, offs, out, chunk):
    nb = x.shape[1] // 256
    for t in numba.prange(_blocks(offs, TILE_ROWS)):
        c0, acc = t * TILE_ROWS, np.zeros((TILE_ROWS, x.shape[0], 2 * LANES), np.float32)
        for b0 in range(0, nb, chunk):
            b1 = min(b0 + chunk, nb)
            for c in range(c0, min(c0 + TILE_ROWS, offs[-1])):
                g = _segment(offs, c)
                _part_q4_k(ws[g], c - offs[g], x, out, c, b0, b1, acc, c - c0, b1 == nb)


@numba.njit(inline="always")
def _blocks(offs, rows):
    return (offs[-1] + rows - 1) // rows


@numba.njit(inline="always")
def _block_start(offs, b, rows):
    """First output column of block b and the weight it falls in."""
    c = b * rows
    return c, _segment(offs, c)




@numba.njit(inline="always")
def stream_stride(n, m):
    """The distance between the weight rows one prange iteration of a group kernel takes
    for ``m`` rows of x: ``STREAMS`` interleaved runs, or all ``n`` rows in one."""
    if m > STREAM_MAX_X_ROWS or n < STREAMS * STREAM_MIN_ROWS:
        return n
    return (n + STREAMS - 1) // STREAMS


@numba.njit(inline="always")
def _segment(offs, c):
    g = 0
    while offs[g + 1] <= c:
        g += 1
    return g


@numba.njit(inline="always")
def run_row(t, j, per, n):
    """Run j's row at step t of a group walk (``stream_stride``); a run past the group's
    last row repeats run 0's (the same value written twice to one column, by one thread)."""
    c = np.int64(t) + j * per
    return c if c < n else np.int64(t)


@numba.njit(inline="always")
def take_runs(ws, offs, t, per, n):
    """(weights, rows, columns): the row of each of the STREAMS (4) runs at step t, for
    a ``runs_intrinsic`` call that reads them in lockstep."""
    c0, c1 = run_row(t, 0, per, n), run_row(t, 1, per, n)
    c2, c3 = run_row(t, 2, per, n), run_row(t, 3, per, n)
    k0, k1 = _segment(offs, c0), _segment(offs, c1)
    k2, k3 = _segment(offs, c2), _segment(offs, c3)
    return ((ws[k0], ws[k1], ws[k2], ws[k3]),
            (c0 - offs[k0], c1 - offs[k1], c2 - offs[k2], c3 - offs[k3]), (c0, c1, c2, c3))


GEMV_GROUP = {"q4_0": _group_q4_0, "q5_0": _group_q5_0, "q8_0": _group_q8_0,
              "q4_k": _group_q4_k, "q6_k": _group_q6_k, "q5_k": _group_q5_k,
              "q4_1": _group_q4_1, "q5_1": _group_q5_1, "q3_k": _group_q3_k,
              "q2_k": _group_q2_k, "iq4_nl": _group_iq4_nl, "iq4_xs": _group_iq4_xs,
              "tq2_0": _group_tq2_0, "tq1_0": _group_tq1_0}
GEMV_TILED = {"q5_0": _tiled_q5_0, "q8_0": _tiled_q8_0, "q4_k": _tiled_q4_k}
_BLOCK_VALUES = {"q5_0": 32, "q8_0": 32, "q4_k": 256}


def run_group(encoding: str, x2: np.ndarray, ws: tuple, offs: np.ndarray,
              out: np.ndarray) -> None:
    """``out[:, offs[i]:offs[i+1]] = x2 @ ws[i].T``: the group kernel of ``encoding``, or
    its tiled twin (the same numbers) when there is one, x has 4 to 8 rows and they
    together pass X_TILE_BYTES."""
    x2 = aligned_rows(x2)
    m, k = x2.shape
    if (m * k * 4 <= X_TILE_BYTES or not TILED_ROWS[0] <= m <= TILED_ROWS[1]
            or encoding not in GEMV_TILED):
        GEMV_GROUP[encoding](x2, ws, offs, out)
        return
    # pieces of whole 256-value spans: an even block count for the 32-value encodings
    piece = max(256, X_PIECE_BYTES // (4 * m) // 256 * 256)
    GEMV_TILED[encoding](x2, ws, offs, out, piece // _BLOCK_VALUES[encoding])


def aligned_rows(x2: np.ndarray) -> np.ndarray:
    """x2 itself when every row starts on a 64-byte boundary, else an aligned copy. The
    row intrinsic reads each x row in 64-byte vectors once per weight unit; a vector that
    straddles two cache lines costs two loads. Measured, one thread, 2048 x 640, 8 rows:
    q8_0 236 -> 141 us, q5_0 235 -> 163, q4_k 291 -> 174. One row is copied only when it
    is longer than ONE_ROW_BYTES, when it no longer sits in L1 beside the weights: 2
    threads, 4096 x 14336, x 16 bytes past a boundary against on one, median ms: q4_0
    2.77 -> 2.25, q8_0 2.85 -> 2.49, q6_k 5.01 -> 4.45, q4_k 4.34 -> 4.06, q5_0 3.38 ->
    3.12; a short row gains less than the copy costs (Gemma 3 270M decode, K <= 2048,
    every row copied, in one process alternating: 0.971x). The arithmetic is the same
    either way."""
    if rows_aligned(x2) or (x2.shape[0] == 1 and x2.shape[1] * 4 <= ONE_ROW_BYTES):
        return x2
    # the copy lives only through the kernel call: one scratch per thread and shape
    scratch = _SCRATCH.__dict__.setdefault("by_shape", {})
    out = scratch.get(x2.shape)
    if out is None:
        if len(scratch) >= 64:
            scratch.clear()
        out = scratch[x2.shape] = empty_aligned(x2.shape)   # K: whole blocks: 128n bytes a row
    np.copyto(out, x2)
    return out


_SCRATCH = threading.local()
ONE_ROW_BYTES = 32768        # a single x row longer than this is read from an aligned copy


def gemv(x2: np.ndarray, w: np.ndarray, encoding: str, out: np.ndarray) -> None:
    """``out = x2 @ W.T`` for up to GEMV_MAX_ROWS rows of x: the group kernel with one
    weight (the same row intrinsic, so the same numbers as in a group); bf16 (w as a
    uint16 view) by its own loop."""
    if encoding == "bf16":
        _gemv_bf16(x2, w, out)
    else:
        run_group(encoding, x2, (w,), offsets((w.shape[0],)), out)


def gemv_group(x2: np.ndarray, weights: list, encoding: str) -> np.ndarray:
    """``[x2 @ W_i.T for W_i in weights]`` side by side in one (M, sum N_i) float32 array, in
    one parallel call. x2 (M, K) float32 C order with M <= GEMV_MAX_ROWS; weights: packed
    (N_i, bytes) uint8 C-order matrices of ``encoding`` (a key of ``GEMV_GROUP``), equal
    bytes per row."""
    offs = offsets(tuple(w.shape[0] for w in weights))
    out = np.empty((x2.shape[0], int(offs[-1])), np.float32)
    run_group(encoding, x2, tuple(weights), offs, out)
    return out


_OFFSETS: dict = {}


def offsets(sizes: tuple) -> np.ndarray:
    """``[0, s0, s0+s1, ...]`` as a read-only int64 array, made once per ``sizes`` (a
    decode step asks for the same few hundred times)."""
    offs = _OFFSETS.get(sizes)
    if offs is None:
        offs = np.array((0, *itertools.accumulate(sizes)), np.int64)
        offs.flags.writeable = False
        if len(_OFFSETS) < 4096:
            _OFFSETS[sizes] = offs
    return offs
