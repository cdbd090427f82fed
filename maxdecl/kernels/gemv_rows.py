"""GEMV for a few rows of x at once (batched decode, prompt-lookup verify steps).

Each weight block is decoded once and dotted with ``ROWS`` rows of x: the intrinsics
below emit the one-row kernels' own block code once per x row, each row with its own
accumulators; LLVM merges the identical block decoding (pure loads and conversions of
the same bytes) so it runs once, while every row's arithmetic stays the one-row
kernel's, in the same order: each output equals that row's GEMV output bit for bit
(tested). Rows beyond a multiple of ``ROWS`` take the one-row intrinsics.

x: (M, K) f32 C order, w: (N, K // be * bb) u8 -> out: (M, N) f32.
"""

from __future__ import annotations

import numba
from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic

from .config import CACHE, FASTMATH
from .gemv import (_IR_F32, _IR_I8, _IR_I64, _NO_TABLE, _Q5_OFFSETS, _V8F, _V8I,
                   _dot_q5_0, _dot_q8_0, _ir_const, _ir_hsum, _ir_q5_0_block, _ir_q8_0_block)

ROWS = 4   # x rows per weight-block decode


def _matrix_ok(a, dtype) -> bool:
    return isinstance(a, types.Array) and a.ndim == 2 and a.layout == "C" and a.dtype == dtype


def _row_base(context, builder, arr_type, arr, index, elem):
    """Pointer to row ``index`` of a C-order 2-D array, as ``elem*``."""
    a = context.make_array(arr_type)(context, builder, arr)
    stride = cgutils.unpack_tuple(builder, a.strides)[0]
    base = builder.bitcast(a.data, _IR_I8.as_pointer())
    return builder.bitcast(builder.gep(base, [builder.mul(index, stride)]), elem.as_pointer())


def _rows_intrinsic(block_bytes, block_values, emit, naccs, finish, rows=ROWS):
    """An intrinsic ``(w, r, x, m0, nb, aux) -> UniTuple(float32, ROWS)``: row r of ``w``
    dotted with rows m0..m0+ROWS-1 of ``x`` over ``nb`` blocks. ``emit(builder, bp, xb,
    ab, accs, tp)`` is one row's block step (the one-row kernel's code); ``aux`` is a
    2-D int32 table (shared) or a 2-D float32 per-row auxiliary (row m0+j for row j)."""

    def typer(typingctx, w, r, x, m0, nb, aux):
        ok = (_matrix_ok(w, types.uint8) and _matrix_ok(x, types.float32)
              and isinstance(r, types.Integer) and isinstance(m0, types.Integer)
              and isinstance(nb, types.Integer) and isinstance(aux, types.Array)
              and aux.ndim == 2 and aux.layout == "C"
              and aux.dtype in (types.int32, types.float32))
        if not ok:
            return None
        per_row_aux = aux.dtype == types.float32

        def codegen(context, builder, sig, args):
            w_, r_, x_, m0_, nb_, aux_ = args
            r64 = context.cast(builder, r_, sig.args[1], types.intp)
            m64 = context.cast(builder, m0_, sig.args[3], types.intp)
            nb64 = context.cast(builder, nb_, sig.args[4], types.intp)
            row = _row_base(context, builder, sig.args[0], w_, r64, _IR_I8)
            xs = [_row_base(context, builder, sig.args[2], x_, builder.add(
                m64, _ir_const(_IR_I64, j)), _IR_F32) for j in range(rows)]
            if per_row_aux:
                auxs = [_row_base(context, builder, sig.args[5], aux_, builder.add(
                    m64, _ir_const(_IR_I64, j)), _IR_F32) for j in range(rows)]
            else:
                table = _row_base(context, builder, sig.args[5], aux_,
                                  _ir_const(_IR_I64, 0), _V8I)
                auxs = [table] * rows
            accs = [[cgutils.alloca_once_value(builder, ir.Constant(_V8F, None))
                     for _ in range(naccs)] for _ in range(rows)]
            with cgutils.for_range(builder, nb64) as loop:
                b = loop.index
                bp = builder.gep(row, [builder.mul(b, _ir_const(_IR_I64, block_bytes))])
                for j in range(rows):
                    xb = builder.gep(xs[j], [builder.mul(b, _ir_const(_IR_I64, block_values))])
                    new = emit(builder, bp, xb, b, auxs[j], [builder.load(a) for a in accs[j]])
                    for a, v in zip(accs[j], new):
                        builder.store(v, a)
            outs = [finish(builder, [builder.load(a) for a in accs[j]]) for j in range(rows)]
            return context.make_tuple(builder, sig.return_type, outs)

        return types.UniTuple(types.float32, rows)(w, r, x, m0, nb, aux), codegen

    return intrinsic(typer)


def _small_block(block):
    """A 32-value block step (q4_0/q5_0/q8_0) in the form ``_rows_intrinsic`` takes."""
    def emit(builder, bp, xb, b, tp, accs):
        xv = [builder.load(builder.bitcast(builder.gep(xb, [_ir_const(_IR_I64, 8 * k)]),
                                           _V8F.as_pointer()), align=4) for k in range(4)]
        return [block(builder, bp, xv, accs[0], tp)]
    return emit


def _plain_sum(builder, accs):
    return _ir_hsum(builder, accs[0])


# Only where the merged code keeps each row bit-identical to the one-row GEMV (checked
# for every M in the tests). Built the same way for q4_0, q4_k and q6_k (the K-quants
# with a per-row float auxiliary), LLVM reassociated the accumulation differently once
# several rows shared a block (a 1e-5 relative difference), so those keep the plain row
# loop (gemv._gemvm_*): exact, but decoding every block once per row.
_rows_q5_0 = _rows_intrinsic(22, 32, _small_block(_ir_q5_0_block), 1, _plain_sum)
_rows_q8_0 = _rows_intrinsic(34, 32, _small_block(_ir_q8_0_block), 1, _plain_sum)


# -- kernels: ROWS rows at a time, the rest one by one --------------------------------
@numba.njit(cache=CACHE, parallel=True, fastmath=FASTMATH)
def _gemvm_q5_0(x, w, out):
    nb = x.shape[1] // 32
    full = x.shape[0] // ROWS * ROWS
    for r in numba.prange(w.shape[0]):
        for m in range(0, full, ROWS):
            vals = _rows_q5_0(w, r, x, m, nb, _Q5_OFFSETS)
            for j in range(ROWS):
                out[m + j, r] = vals[j]
        for m in range(full, x.shape[0]):
            out[m, r] = _dot_q5_0(w, r, x[m], nb, _Q5_OFFSETS)


@numba.njit(cache=CACHE, parallel=True, fastmath=FASTMATH)
def _gemvm_q8_0(x, w, out):
    nb = x.shape[1] // 32
    full = x.shape[0] // ROWS * ROWS
    for r in numba.prange(w.shape[0]):
        for m in range(0, full, ROWS):
            vals = _rows_q8_0(w, r, x, m, nb, _NO_TABLE)
            for j in range(ROWS):
                out[m + j, r] = vals[j]
        for m in range(full, x.shape[0]):
            out[m, r] = _dot_q8_0(w, r, x[m], nb, _NO_TABLE)


GEMV_ROWS = {"q5_0": _gemvm_q5_0, "q8_0": _gemvm_q8_0}
