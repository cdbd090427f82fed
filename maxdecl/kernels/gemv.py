"""GEMV kernels (M == 1, decode): ``out[r] = W[r] . x`` on packed GGML blocks.

One kernel per encoding reads each weight row's blocks once, in place, with the
block scales folded into the products and one horizontal sum per row; rows run
under ``prange``. Every kernel but bf16 writes the row dot as LLVM vector IR
(``_row_dot_intrinsic`` for 32-value blocks, ``_superblock_dot_intrinsic`` for
the K-quants): 8-lane vectors, F16C scales. Block layouts: ``block_rows.py``.
"""

from __future__ import annotations

import numba
import numpy as np
from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic

from .block_rows import _bf16
from .config import CACHE, FASTMATH


@numba.njit(cache=CACHE, fastmath=FASTMATH)
def _block_sums(x, n):
    # x: (K,) f32 -> (K // n,) f32 sums of consecutive groups of n
    out = np.empty(x.shape[0] // n, np.float32)
    for b in range(out.shape[0]):
        s = np.float32(0)
        for j in range(n):
            s += x[b * n + j]
        out[b] = s
    return out


# -- GEMV kernels: x (K,) f32, w (N, K//be*bb) u8 -> out (N,) f32 -------------------
# -- q5_0 / q8_0 GEMV: one row's dot product written as LLVM vector IR -------------------
# Left to numba + LLVM, these loops came out as scalar code or as 64-bit-lane SLP code
# (numba widens int32 arithmetic to int64; the 5th bit of q5_0 took 64-bit variable
# shifts), ~2 GB/s for q5_0. Here each 32-value block is four explicit <8 x float>
# vectors: the quants widened to int32 and converted, the block's dot with x summed
# into one vector, scaled by d and added to a single 8-lane accumulator; one horizontal
# sum per row. Measured on the 2-core Zen 3 machine (Gemma 3 270M shapes, K=640):
# q5_0 ~3x faster, q8_0 (262144 x 640) from ~10 to ~15 GB/s.
_FM = tuple(sorted(FASTMATH))         # the same float flags the kernels compile with
_IR_I8 = ir.IntType(8)
_IR_I16 = ir.IntType(16)
_IR_I32 = ir.IntType(32)
_IR_I64 = ir.IntType(64)
_IR_F32 = ir.FloatType()
_V8B = ir.VectorType(_IR_I8, 8)
_V8I = ir.VectorType(_IR_I32, 8)
_V8F = ir.VectorType(_IR_F32, 8)
# q8_0 streams the biggest matrices from DRAM: a software prefetch this far ahead of
# the block being read measured +15-20% at 262144 x 640 (2 threads; 2-32 KiB tried,
# 8-16 KiB best). q5_0 is compute-bound and measured slower with it.
_Q8_PREFETCH = 16384
# q5_0 5th bits: byte v of qh -> 8 int32 offsets (0 where bit i of v is set, else -16),
# so value - 16 = nibble + offset is one add per 8 lanes.
_Q5_OFFSETS = np.array([[0 if (v >> i) & 1 else -16 for i in range(8)] for v in range(256)],
                       np.int32)


def _target_has(feature):
    """True if numba compiles for a CPU with ``feature`` (e.g. "f16c")."""
    import llvmlite.binding as ll
    from numba.core import config

    if config.CPU_FEATURES:
        return f"+{feature}" in config.CPU_FEATURES.split(",")
    if config.CPU_NAME and config.CPU_NAME != "host":
        return False
    return bool(ll.get_host_cpu_features().get(feature, False))


def _ir_const(ty, v):
    return ir.Constant(ty, v)


def _ir_v8i(vals):
    return ir.Constant(_V8I, [ir.Constant(_IR_I32, int(v)) for v in vals])


def _ir_load(builder, base, off, ty):
    """Unaligned load of ``ty`` at byte offset ``off`` (int) from the i8* ``base``."""
    p = builder.gep(base, [_ir_const(_IR_I64, off)]) if off else base
    return builder.load(builder.bitcast(p, ty.as_pointer()), align=1)


def _ir_f16(builder, word, soft=None):
    """float32 of the fp16 in the low 16 bits of the i32 ``word``; exact, inf/NaN kept.

    F16C (vcvtph2ps) where the target has it; else the bit moves of ``_f16``.
    Converting a <2 x half> from the whole word avoids a 16-bit insert into a stale
    vector register (a false dependency on the accumulator, measured).
    """
    if soft is None:
        soft = not _target_has("f16c")
    if not soft:
        v = builder.bitcast(word, ir.VectorType(ir.HalfType(), 2))
        v = builder.fpext(v, ir.VectorType(_IR_F32, 2))
        return builder.extract_element(v, _ir_const(_IR_I32, 0))
    h = builder.and_(word, _ir_const(_IR_I32, 0xFFFF))
    bits = builder.or_(builder.shl(builder.and_(h, _ir_const(_IR_I32, 0x8000)), _ir_const(_IR_I32, 16)),
                       builder.shl(builder.and_(h, _ir_const(_IR_I32, 0x7FFF)), _ir_const(_IR_I32, 13)))
    f = builder.fmul(builder.bitcast(bits, _IR_F32), _ir_const(_IR_F32, 5.192296858534828e33))  # 2**112
    special = builder.icmp_unsigned("==", builder.and_(h, _ir_const(_IR_I32, 0x7C00)),
                                    _ir_const(_IR_I32, 0x7C00))
    infnan = builder.bitcast(builder.or_(bits, _ir_const(_IR_I32, 0x7F800000)), _IR_F32)
    return builder.select(special, infnan, f)


def _ir_splat(builder, v):
    vt = ir.VectorType(v.type, 8)
    u = builder.insert_element(ir.Constant(vt, ir.Undefined), v, _ir_const(_IR_I32, 0))
    return builder.shuffle_vector(u, ir.Constant(vt, ir.Undefined),
                                  ir.Constant(ir.VectorType(_IR_I32, 8), [0] * 8))


def _ir_hsum(builder, v):
    def pick(a, idx):
        return builder.shuffle_vector(a, ir.Constant(a.type, ir.Undefined),
                                      ir.Constant(ir.VectorType(_IR_I32, len(idx)), idx))

    v4 = builder.fadd(pick(v, [0, 1, 2, 3]), pick(v, [4, 5, 6, 7]), flags=_FM)
    v2 = builder.fadd(pick(v4, [0, 1]), pick(v4, [2, 3]), flags=_FM)
    return builder.fadd(builder.extract_element(v2, _ir_const(_IR_I32, 0)),
                        builder.extract_element(v2, _ir_const(_IR_I32, 1)), flags=_FM)


def _ir_block_dot(builder, d, fs, xs, acc):
    """acc + d * sum_k fs[k] * xs[k] (all <8 x float>)."""
    t = builder.fmul(fs[0], xs[0], flags=_FM)
    for k in range(1, 4):
        t = builder.fadd(t, builder.fmul(fs[k], xs[k], flags=_FM), flags=_FM)
    return builder.fadd(acc, builder.fmul(_ir_splat(builder, d), t, flags=_FM), flags=_FM)


def _ir_q8_0_block(builder, bp, xs, acc, table):
    # 34 B: d f16 @0 | qs int8[32] @2; group k (8 lanes) = values 8k..8k+7
    d = _ir_f16(builder, _ir_load(builder, bp, 0, _IR_I32))
    fs = [builder.sitofp(builder.sext(_ir_load(builder, bp, 2 + 8 * k, _V8B), _V8I), _V8F)
          for k in range(4)]
    return _ir_block_dot(builder, d, fs, xs, acc)


def _ir_q5_0_block(builder, bp, xs, acc, table):
    # 22 B: d f16 @0 | qh u32 @2 | qs[16] @6. Groups: values 0-7 = lo nibbles of qs[0:8],
    # 8-15 = lo of qs[8:16], 16-23 = hi of qs[0:8], 24-31 = hi of qs[8:16]; the 5th bits
    # of group k are byte k of qh, turned into offsets by the table (see _Q5_OFFSETS).
    d = _ir_f16(builder, _ir_load(builder, bp, 0, _IR_I32))
    a = builder.zext(_ir_load(builder, bp, 6, _V8B), _V8I)
    c = builder.zext(_ir_load(builder, bp, 14, _V8B), _V8I)
    nib = [builder.and_(a, _ir_v8i([15] * 8)), builder.and_(c, _ir_v8i([15] * 8)),
           builder.lshr(a, _ir_v8i([4] * 8)), builder.lshr(c, _ir_v8i([4] * 8))]
    fs = []
    for k in range(4):
        byte = builder.zext(_ir_load(builder, bp, 2 + k, _IR_I8), _IR_I64)
        off = builder.load(builder.gep(table, [byte]), align=4)
        fs.append(builder.sitofp(builder.add(nib[k], off), _V8F))
    return _ir_block_dot(builder, d, fs, xs, acc)


def _row_args_ok(w, r, x, nb) -> bool:
    """Typing check shared by the row-dot intrinsics: a C-contiguous 2-D byte matrix,
    an integer row index and block count, and a contiguous float32 vector x."""
    return (isinstance(w, types.Array) and w.ndim == 2 and w.layout == "C"
            and w.dtype in (types.uint8, types.int8)
            and isinstance(x, types.Array) and x.ndim == 1 and x.layout == "C"
            and x.dtype == types.float32
            and isinstance(r, types.Integer) and isinstance(nb, types.Integer))


def _row_pointers(context, builder, sig, args):
    """(pointer to row r's bytes, float pointer to x, block count as intp) for an
    intrinsic called as ``f(w, r, x, nb, extra)``."""
    wa = context.make_array(sig.args[0])(context, builder, args[0])
    xa = context.make_array(sig.args[2])(context, builder, args[2])
    r64 = context.cast(builder, args[1], sig.args[1], types.intp)
    nb64 = context.cast(builder, args[3], sig.args[3], types.intp)
    stride = cgutils.unpack_tuple(builder, wa.strides)[0]
    row = builder.gep(builder.bitcast(wa.data, _IR_I8.as_pointer()),
                      [builder.mul(r64, stride)])
    return row, builder.bitcast(xa.data, _IR_F32.as_pointer()), nb64


def _row_dot_intrinsic(block_bytes, block, prefetch=0):
    """An intrinsic ``(w, r, x, nb, table) -> float32``: the dot of row r of the packed
    blocks ``w`` (2-D uint8/int8, C order) with ``x`` (1-D float32, C order) over ``nb``
    blocks of 32 values. ``table`` (2-D int32, C order) is handed to ``block``."""

    def typer(typingctx, w, r, x, nb, table):
        ok = (_row_args_ok(w, r, x, nb)
              and isinstance(table, types.Array) and table.dtype == types.int32
              and table.layout == "C")
        if not ok:
            return None

        def codegen(context, builder, sig, args):
            row, xp, nb64 = _row_pointers(context, builder, sig, args)
            ta = context.make_array(sig.args[4])(context, builder, args[4])
            tp = builder.bitcast(ta.data, _V8I.as_pointer())
            acc = cgutils.alloca_once_value(builder, ir.Constant(_V8F, None))
            if prefetch:
                pf = cgutils.get_or_insert_function(
                    builder.module,
                    ir.FunctionType(ir.VoidType(), [_IR_I8.as_pointer()] + [_IR_I32] * 3),
                    "llvm.prefetch.p0i8")
            with cgutils.for_range(builder, nb64) as loop:
                b = loop.index
                bp = builder.gep(row, [builder.mul(b, _ir_const(_IR_I64, block_bytes))])
                if prefetch:   # read, keep in all cache levels, data; never faults
                    builder.call(pf, [builder.gep(bp, [_ir_const(_IR_I64, prefetch)]),
                                      _ir_const(_IR_I32, 0), _ir_const(_IR_I32, 3),
                                      _ir_const(_IR_I32, 1)])
                xb = builder.gep(xp, [builder.mul(b, _ir_const(_IR_I64, 32))])
                xs = [builder.load(builder.bitcast(builder.gep(xb, [_ir_const(_IR_I64, 8 * k)]),
                                                   _V8F.as_pointer()), align=4)
                      for k in range(4)]
                builder.store(block(builder, bp, xs, builder.load(acc), tp), acc)
            return _ir_hsum(builder, builder.load(acc))

        return types.float32(w, r, x, nb, table), codegen

    return intrinsic(typer)


_dot_q5_0 = _row_dot_intrinsic(22, _ir_q5_0_block)
_dot_q8_0 = _row_dot_intrinsic(34, _ir_q8_0_block, prefetch=_Q8_PREFETCH)
_NO_TABLE = np.zeros((1, 8), np.int32)


@numba.njit(cache=CACHE, parallel=True, fastmath=FASTMATH)
def _gemv_q5_0(x, w, out):
    nb = x.shape[0] // 32
    for r in numba.prange(w.shape[0]):
        out[r] = _dot_q5_0(w, r, x, nb, _Q5_OFFSETS)


@numba.njit(cache=CACHE, parallel=True, fastmath=FASTMATH)
def _gemv_q8_0(x, w, out):
    nb = x.shape[0] // 32
    for r in numba.prange(w.shape[0]):
        out[r] = _dot_q8_0(w, r, x, nb, _NO_TABLE)


# -- q4_0 / q4_k / q6_k GEMV: the same technique ------------------------------------------
# q4_0 goes through _row_dot_intrinsic. The K-quants have 256-value super-blocks with one
# scale per 32 (q4_k) or 16 (q6_k) values: each sub-block's products are summed into an
# 8-lane vector, scaled by a lane broadcast of the super-block's scale vector (d * sc,
# unpacked with vector integer ops) and added to an accumulator; q4_k's min term is one
# vector product per super-block with the sums of x per sub-block. Measured on the 2-core
# Zen 3 machine, 4096 x 4096, against the plain loops (numba widened them to 64-bit lanes):
# 1 thread CPU time q4_k ~2x, q6_k ~1.6-2x, q4_0 ~1.2-1.5x; 2 threads see bench/qmatmul.py.
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


def _ir_lane(builder, v, s):
    """Lane ``s`` of the 8-lane ``v`` broadcast to all 8 lanes."""
    return builder.shuffle_vector(v, ir.Constant(v.type, ir.Undefined),
                                  ir.Constant(ir.VectorType(_IR_I32, 8), [s] * 8))


def _ir_pick(builder, v, idx):
    return builder.shuffle_vector(v, ir.Constant(v.type, ir.Undefined),
                                  ir.Constant(ir.VectorType(_IR_I32, len(idx)), idx))


def _ir_xload(builder, xb, off):
    p = builder.gep(xb, [_ir_const(_IR_I64, off)]) if off else xb
    return builder.load(builder.bitcast(p, _V8F.as_pointer()), align=4)


def _ir_u8x8(builder, bp, off):
    """8 bytes at ``off`` zero-extended to <8 x i32>."""
    return builder.zext(_ir_load(builder, bp, off, _V8B), _V8I)


def _ir_dot4(builder, fs, xs):
    t = builder.fmul(fs[0], xs[0], flags=_FM)
    for f, xv in zip(fs[1:], xs[1:]):
        t = builder.fadd(t, builder.fmul(f, xv, flags=_FM), flags=_FM)
    return t


def _ir_q4_0_block(builder, bp, xs, acc, table):
    # 18 B: d f16 @0 | qs[16] @2. Groups as q5_0: lo nibbles of qs[0:8], of qs[8:16],
    # hi nibbles of qs[0:8], of qs[8:16]; value = nibble - 8.
    d = _ir_f16(builder, _ir_load(builder, bp, 0, _IR_I32))
    a = _ir_u8x8(builder, bp, 2)
    c = _ir_u8x8(builder, bp, 10)
    nib = [builder.and_(a, _ir_v8i([15] * 8)), builder.and_(c, _ir_v8i([15] * 8)),
           builder.lshr(a, _ir_v8i([4] * 8)), builder.lshr(c, _ir_v8i([4] * 8))]
    fs = [builder.sitofp(builder.sub(q, _ir_v8i([8] * 8)), _V8F) for q in nib]
    return _ir_block_dot(builder, d, fs, xs, acc)


def _ir_q4_k_block(builder, bp, xb, ab, accs):
    # 144 B / 256 values. The 8 sub-block (scale, min) pairs unpacked as two <8 x i32>
    # (see _q4k_scale_min); the min term is dmin * m . (sums of x per sub-block), one
    # vector per block from ``ab``; sub-block s = 2c (lo nibbles of qs[32c:32c+32]) and
    # 2c+1 (hi nibbles) each summed into a vector, scaled by lane s of d * sc.
    lo_acc, hi_acc, m_acc = accs
    d, dmin = _ir_f16_pair(builder, _ir_load(builder, bp, 0, _IR_I32))
    sb = _ir_load(builder, bp, 4, ir.VectorType(_IR_I8, 16))      # bytes 0-11 used
    a = builder.zext(_ir_pick(builder, sb, [0, 1, 2, 3, 8, 9, 10, 11]), _V8I)
    b = builder.zext(_ir_pick(builder, sb, [4, 5, 6, 7, 8, 9, 10, 11]), _V8I)
    c = builder.zext(_ir_pick(builder, sb, [0, 1, 2, 3, 0, 1, 2, 3]), _V8I)
    e = builder.zext(_ir_pick(builder, sb, [4, 5, 6, 7, 4, 5, 6, 7]), _V8I)
    low = _ir_v8i([63] * 4 + [15] * 4)
    top = _ir_v8i([0] * 4 + [48] * 4)
    two = _ir_v8i([2] * 8)
    sc = builder.or_(builder.and_(a, low), builder.and_(builder.lshr(c, two), top))
    m = builder.or_(builder.and_(builder.lshr(b, _ir_v8i([0] * 4 + [4] * 4)), low),
                    builder.and_(builder.lshr(e, two), top))
    dsc = builder.fmul(_ir_splat(builder, d), builder.sitofp(sc, _V8F), flags=_FM)
    dm = builder.fmul(_ir_splat(builder, dmin), builder.sitofp(m, _V8F), flags=_FM)
    m_acc = builder.fadd(m_acc, builder.fmul(dm, _ir_xload(builder, ab, 0), flags=_FM),
                         flags=_FM)
    for ch in range(4):
        qs = [_ir_u8x8(builder, bp, 16 + 32 * ch + 8 * k) for k in range(4)]
        flo = [builder.sitofp(builder.and_(q, _ir_v8i([15] * 8)), _V8F) for q in qs]
        fhi = [builder.sitofp(builder.lshr(q, _ir_v8i([4] * 8)), _V8F) for q in qs]
        tlo = _ir_dot4(builder, flo, [_ir_xload(builder, xb, 64 * ch + 8 * k) for k in range(4)])
        thi = _ir_dot4(builder, fhi, [_ir_xload(builder, xb, 64 * ch + 32 + 8 * k)
                                      for k in range(4)])
        lo_acc = builder.fadd(lo_acc, builder.fmul(_ir_lane(builder, dsc, 2 * ch), tlo,
                                                   flags=_FM), flags=_FM)
        hi_acc = builder.fadd(hi_acc, builder.fmul(_ir_lane(builder, dsc, 2 * ch + 1), thi,
                                                   flags=_FM), flags=_FM)
    return lo_acc, hi_acc, m_acc


def _ir_q6_k_block(builder, bp, xb, ab, accs):
    # 210 B / 256 values: ql[128] @0 | qh[64] @128 | scales int8[16] @192 | d f16 @208.
    # Half h (128 values), 8 lanes j0..j0+7 (j0 = 8g): ql[64h+j] lo/hi -> values j / j+64,
    # ql[64h+32+j] lo/hi -> j+32 / j+96, qh[32h+j] bit pairs -> j, j+32, j+64, j+96;
    # value - 32 scaled by scales[8h + 2k + j // 16] for value 32k + j.
    acc0, acc1 = accs
    d = _ir_f16(builder, builder.lshr(_ir_load(builder, bp, 206, _IR_I32),
                                      _ir_const(_IR_I32, 16)))   # the word stays in the block
    sb = _ir_load(builder, bp, 192, ir.VectorType(_IR_I8, 16))
    dd = _ir_splat(builder, d)
    dsc = []                                         # d * scales of half h, 8 lanes
    for h in range(2):
        sc = builder.sext(_ir_pick(builder, sb, list(range(8 * h, 8 * h + 8))), _V8I)
        dsc.append(builder.fmul(dd, builder.sitofp(sc, _V8F), flags=_FM))
    v15, v48, v32 = _ir_v8i([15] * 8), _ir_v8i([48] * 8), _ir_v8i([32] * 8)
    v2, v4 = _ir_v8i([2] * 8), _ir_v8i([4] * 8)
    accs = [acc0, acc1]
    for h in range(2):
        t = [[None, None] for _ in range(4)]
        for g in range(4):
            j0 = 8 * g
            a = _ir_u8x8(builder, bp, 64 * h + j0)
            c = _ir_u8x8(builder, bp, 64 * h + 32 + j0)
            e = _ir_u8x8(builder, bp, 128 + 32 * h + j0)
            qs = [builder.or_(builder.and_(a, v15), builder.and_(builder.shl(e, v4), v48)),
                  builder.or_(builder.and_(c, v15), builder.and_(builder.shl(e, v2), v48)),
                  builder.or_(builder.lshr(a, v4), builder.and_(e, v48)),
                  builder.or_(builder.lshr(c, v4), builder.and_(builder.lshr(e, v2), v48))]
            for k in range(4):
                f = builder.sitofp(builder.sub(qs[k], v32), _V8F)
                p = builder.fmul(f, _ir_xload(builder, xb, 128 * h + 32 * k + j0), flags=_FM)
                half = g // 2
                t[k][half] = p if t[k][half] is None else builder.fadd(t[k][half], p, flags=_FM)
        for k in range(4):
            for half in range(2):
                s = _ir_lane(builder, dsc[h], 2 * k + half)
                accs[half] = builder.fadd(accs[half], builder.fmul(s, t[k][half], flags=_FM),
                                          flags=_FM)
    return tuple(accs)


def _superblock_dot_intrinsic(block_bytes, block_values, block, naccs, signs):
    """An intrinsic ``(w, r, x, nb, aux) -> float32``: the dot of row r of the packed
    blocks ``w`` (2-D uint8, C order) with ``x`` (1-D float32, C order) over ``nb``
    blocks of ``block_values``. ``block(builder, bp, xb, ab, accs)`` gets the block's
    bytes, x and ``aux`` (1-D float32, C order) at 8 floats a block, and returns the
    ``naccs`` new <8 x float> accumulators; the result is the horizontal sum of
    sum_i signs[i] * accs[i]."""

    def typer(typingctx, w, r, x, nb, aux):
        ok = (_row_args_ok(w, r, x, nb)
              and isinstance(aux, types.Array) and aux.ndim == 1 and aux.layout == "C"
              and aux.dtype == types.float32)
        if not ok:
            return None

        def codegen(context, builder, sig, args):
            row, xp, nb64 = _row_pointers(context, builder, sig, args)
            aa = context.make_array(sig.args[4])(context, builder, args[4])
            ap = builder.bitcast(aa.data, _IR_F32.as_pointer())
            accs = [cgutils.alloca_once_value(builder, ir.Constant(_V8F, None))
                    for _ in range(naccs)]
            with cgutils.for_range(builder, nb64) as loop:
                b = loop.index
                bp = builder.gep(row, [builder.mul(b, _ir_const(_IR_I64, block_bytes))])
                xb = builder.gep(xp, [builder.mul(b, _ir_const(_IR_I64, block_values))])
                ab = builder.gep(ap, [builder.mul(b, _ir_const(_IR_I64, 8))])
                new = block(builder, bp, xb, ab, [builder.load(a) for a in accs])
                for a, v in zip(accs, new):
                    builder.store(v, a)
            tot = ir.Constant(_V8F, None)
            for a, sgn in zip(accs, signs):
                tot = (builder.fadd if sgn > 0 else builder.fsub)(tot, builder.load(a), flags=_FM)
            return _ir_hsum(builder, tot)

        return types.float32(w, r, x, nb, aux), codegen

    return intrinsic(typer)


_dot_q4_0 = _row_dot_intrinsic(18, _ir_q4_0_block)
_dot_q4_k = _superblock_dot_intrinsic(144, 256, _ir_q4_k_block, 3, (1, 1, -1))
_dot_q6_k = _superblock_dot_intrinsic(210, 256, _ir_q6_k_block, 2, (1, 1))


@numba.njit(cache=CACHE, parallel=True, fastmath=FASTMATH)
def _gemv_q4_0(x, w, out):
    nb = x.shape[0] // 32
    for r in numba.prange(w.shape[0]):
        out[r] = _dot_q4_0(w, r, x, nb, _NO_TABLE)


@numba.njit(cache=CACHE, parallel=True, fastmath=FASTMATH)
def _gemv_q4_k(x, w, out):
    nb = x.shape[0] // 256
    xs = _block_sums(x, 32)                          # the min term uses sums of x per sub-block
    for r in numba.prange(w.shape[0]):
        out[r] = _dot_q4_k(w, r, x, nb, xs)


@numba.njit(cache=CACHE, parallel=True, fastmath=FASTMATH)
def _gemv_q6_k(x, w, out):
    nb = x.shape[0] // 256
    for r in numba.prange(w.shape[0]):
        out[r] = _dot_q6_k(w, r, x, nb, x)


@numba.njit(cache=CACHE, parallel=True, fastmath=FASTMATH)
def _gemv_bf16(x, w, out):
    # w: (N, K) uint16 view
    k = x.shape[0]
    for r in numba.prange(w.shape[0]):
        s = np.float32(0)
        for i in range(k):
            s += _bf16(w[r, i]) * x[i]
        out[r] = s


# -- a few rows at once (batched decode): x (M, K) f32, w (N, ...) u8 -> out (M, N) f32 ----
# Each weight row is read from memory once and dotted with every row of x by the same
# row-dot intrinsic the one-row GEMV uses, so each output equals that row's GEMV output
# bit for bit: a sequence decoded in a batch gets exactly the logits it gets alone.
@numba.njit(cache=CACHE, parallel=True, fastmath=FASTMATH)
def _gemvm_q5_0(x, w, out):
    nb = x.shape[1] // 32
    for r in numba.prange(w.shape[0]):
        for m in range(x.shape[0]):
            out[m, r] = _dot_q5_0(w, r, x[m], nb, _Q5_OFFSETS)


@numba.njit(cache=CACHE, parallel=True, fastmath=FASTMATH)
def _gemvm_q8_0(x, w, out):
    nb = x.shape[1] // 32
    for r in numba.prange(w.shape[0]):
        for m in range(x.shape[0]):
            out[m, r] = _dot_q8_0(w, r, x[m], nb, _NO_TABLE)


@numba.njit(cache=CACHE, parallel=True, fastmath=FASTMATH)
def _gemvm_q4_0(x, w, out):
    nb = x.shape[1] // 32
    for r in numba.prange(w.shape[0]):
        for m in range(x.shape[0]):
            out[m, r] = _dot_q4_0(w, r, x[m], nb, _NO_TABLE)


@numba.njit(cache=CACHE, fastmath=FASTMATH)
def _block_sums_rows(x, n):
    # x: (M, K) f32 -> (M, K // n) f32: _block_sums of each row
    out = np.empty((x.shape[0], x.shape[1] // n), np.float32)
    for m in range(x.shape[0]):
        out[m] = _block_sums(x[m], n)
    return out


@numba.njit(cache=CACHE, parallel=True, fastmath=FASTMATH)
def _gemvm_q4_k(x, w, out):
    nb = x.shape[1] // 256
    xs = _block_sums_rows(x, 32)
    for r in numba.prange(w.shape[0]):
        for m in range(x.shape[0]):
            out[m, r] = _dot_q4_k(w, r, x[m], nb, xs[m])


@numba.njit(cache=CACHE, parallel=True, fastmath=FASTMATH)
def _gemvm_q6_k(x, w, out):
    nb = x.shape[1] // 256
    for r in numba.prange(w.shape[0]):
        for m in range(x.shape[0]):
            out[m, r] = _dot_q6_k(w, r, x[m], nb, x[m])


@numba.njit(cache=CACHE, parallel=True, fastmath=FASTMATH)
def _gemvm_bf16(x, w, out):
    # w: (N, K) uint16 view
    k = x.shape[1]
    for r in numba.prange(w.shape[0]):
        for m in range(x.shape[0]):
            s = np.float32(0)
            for i in range(k):
                s += _bf16(w[r, i]) * x[m, i]
            out[m, r] = s
