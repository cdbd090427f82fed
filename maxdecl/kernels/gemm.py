"""Tiled GEMM for ``x @ dequantize(W).T`` on packed GGML blocks, M > 16 rows (prefill).

Compute-bound. In one parallel region (one fork/join per call), each thread decodes
``RB`` weight rows at a time into a small float32 buffer (exact: ``block_rows._decode_row``,
equal to gguf-py's ``dequantize`` bit for bit) and multiplies them against x, packed once
per call into transposed panels of ``2 * lanes`` rows, with an outer-product
micro-kernel written in LLVM vector IR: for every k, ``MR`` decoded weights are
broadcast against the two ``<lanes x float>`` vectors of the panel, into ``2 * MR``
register accumulators.

* ``lanes=16`` (AVX-512: 32 zmm registers, 2 x 512-bit FMA on Zen 5): an 8 x 32 tile,
  16 accumulators.
* ``lanes=8`` (AVX2: 16 ymm registers): a 4 x 16 tile, 8 accumulators.

K is walked in slices of ``_KC``: each slice's products are summed in registers on
their own and then added to the tile (rounding stays ~3e-7 relative), and inside one
decoded chunk the slice loop runs outside the tile loop, so a panel slice
(``_KC * 2 * lanes`` floats) and the chunk's weight slice stay in L1 while every tile
of the chunk uses them. x is packed and the tiles are written to ``out`` by
in-register ``lanes x lanes`` transposes (whole rows loaded and stored once).

Measured (Zen 5, 1 thread, CPU time, same run, Gemma 3 270M Q4_K_M's linear shapes at
M=128, ``bench/gemm.py``): 124.8 ms per prefill (206 GFLOP/s) against 264.5 ms (97
GFLOP/s) for the former 8-lane 4 x 16 kernel; the 8 x 32 micro-kernel alone, from L1,
~260 GFLOP/s. Results are bit for bit those of the former kernel (same per-slice sums).
"""

from __future__ import annotations

import types as pytypes

import numba
import numpy as np
from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic

from .block_rows import _decode_row
from .config import CACHE, FASTMATH
from .gemv import _target_has

_KC = 128   # K slice summed on its own and then added: rounding stays ~3e-7 relative
# The decoded rows' stride is K + _PAD floats: at K = 1024 or 2048 a stride of a multiple
# of 4 KiB puts every row's slice into the same L1 sets (measured 2.5x slower at K = 2048).
_PAD = 16
_FM = tuple(sorted(FASTMATH))
_I64 = ir.IntType(64)
_I32 = ir.IntType(32)
_F32 = ir.FloatType()

# lanes -> (MR weight rows per tile, RB weight rows decoded per chunk)
_SHAPES = {16: (8, 32), 8: (4, 16)}


def _f32_matrix(t) -> bool:
    return (isinstance(t, types.Array) and t.ndim == 2 and t.layout == "C"
            and t.dtype == types.float32)


def _const(v):
    return ir.Constant(_I64, v)


def _micro_intrinsic(lanes, mr, nvec):
    """An intrinsic ``(a, r, b, c, col, k0, k1)``: for i < mr and W = lanes * nvec,
    ``c[r + i, col:col + W] += sum over k0 <= k < k1 of a[r + i, k] * b[k, col:col + W]``;
    a, b, c 2-D C float32 (each product summed into register accumulators in order of
    k, then added to c once). Reads b[k, col:col + W] whole: callers pad b."""
    vt = ir.VectorType(_F32, lanes)
    mask = ir.Constant(ir.VectorType(_I32, lanes), [0] * lanes)

    def splat(builder, v):
        u = builder.insert_element(ir.Constant(vt, ir.Undefined), v, ir.Constant(_I32, 0))
        return builder.shuffle_vector(u, ir.Constant(vt, ir.Undefined), mask)

    def typer(typingctx, a, r, b, c, col, k0, k1):
        if not (_f32_matrix(a) and _f32_matrix(b) and _f32_matrix(c)
                and all(isinstance(t, types.Integer) for t in (r, col, k0, k1))):
            return None

        def codegen(context, builder, sig, args):
            aa, ba, ca = (context.make_array(sig.args[i])(context, builder, args[i])
                          for i in (0, 2, 3))
            r, col, k0, k1 = (context.cast(builder, args[i], sig.args[i], types.intp)
                              for i in (1, 4, 5, 6))
            lda = cgutils.unpack_tuple(builder, aa.shape)[1]
            ldb = cgutils.unpack_tuple(builder, ba.shape)[1]
            ldc = cgutils.unpack_tuple(builder, ca.shape)[1]
            rows = [builder.gep(aa.data, [builder.mul(builder.add(r, _const(i)), lda)])
                    for i in range(mr)]
            zero = ir.Constant(vt, None)
            accs = [[cgutils.alloca_once_value(builder, zero) for _ in range(nvec)]
                    for _ in range(mr)]
            with cgutils.for_range_slice(builder, k0, k1, _const(1)) as (k, _):
                bk = builder.gep(ba.data, [builder.add(builder.mul(k, ldb), col)])
                bv = [builder.load(builder.bitcast(builder.gep(bk, [_const(lanes * j)]),
                                                   vt.as_pointer()), align=4)
                      for j in range(nvec)]
                for i in range(mr):
                    av = splat(builder, builder.load(builder.gep(rows[i], [k]), align=4))
                    for j in range(nvec):
                        acc = accs[i][j]
                        prod = builder.fmul(av, bv[j], flags=_FM)
                        builder.store(builder.fadd(builder.load(acc), prod, flags=_FM), acc)
            for i in range(mr):
                ci = builder.gep(ca.data, [builder.add(builder.mul(builder.add(r, _const(i)), ldc),
                                                       col)])
                for j in range(nvec):
                    p = builder.bitcast(builder.gep(ci, [_const(lanes * j)]), vt.as_pointer())
                    builder.store(builder.fadd(builder.load(p, align=4), builder.load(accs[i][j]),
                                               flags=_FM), p, align=4)
            return context.get_dummy_value()

        return types.void(a, r, b, c, col, k0, k1), codegen

    return intrinsic(typer)


def _transpose_intrinsic(lanes):
    """An intrinsic ``(src, sr, sc, dst, dr, dc)``: ``dst[dr + a, dc + b] = src[sr + b, sc + a]``
    for a, b < lanes; src, dst 2-D C float32. Rows are loaded and stored whole as
    ``<lanes x float>`` and transposed in registers by log2(lanes) rounds of interleaves
    (row i with row i + lanes/2), so each cache line is touched once: element-wise
    loops re-read lines that 4 KiB-strided rows (K = 1024, 2048) evict from L1 (measured
    ~2.3 cycles per element for a 128 x 2048 panel pack)."""
    vt = ir.VectorType(_F32, lanes)
    lo = ir.Constant(ir.VectorType(_I32, lanes), [v for i in range(lanes // 2) for v in (i, i + lanes)])
    hi = ir.Constant(ir.VectorType(_I32, lanes),
                     [v for i in range(lanes // 2, lanes) for v in (i, i + lanes)])

    def typer(typingctx, src, sr, sc, dst, dr, dc):
        if not (_f32_matrix(src) and _f32_matrix(dst)
                and all(isinstance(t, types.Integer) for t in (sr, sc, dr, dc))):
            return None

        def codegen(context, builder, sig, args):
            sa, da = (context.make_array(sig.args[i])(context, builder, args[i]) for i in (0, 3))
            sr, sc, dr, dc = (context.cast(builder, args[i], sig.args[i], types.intp)
                              for i in (1, 2, 4, 5))
            lds = cgutils.unpack_tuple(builder, sa.shape)[1]
            ldd = cgutils.unpack_tuple(builder, da.shape)[1]

            def ptr(arr, ld, r, c, i):
                off = builder.add(builder.mul(builder.add(r, _const(i)), ld), c)
                return builder.bitcast(builder.gep(arr.data, [off]), vt.as_pointer())

            rows = [builder.load(ptr(sa, lds, sr, sc, i), align=4) for i in range(lanes)]
            for _ in range(lanes.bit_length() - 1):
                half = lanes // 2
                nxt = []
                for i in range(half):
                    nxt += [builder.shuffle_vector(rows[i], rows[i + half], lo),
                            builder.shuffle_vector(rows[i], rows[i + half], hi)]
                rows = nxt
            for i in range(lanes):
                builder.store(rows[i], ptr(da, ldd, dr, dc, i), align=4)
            return context.get_dummy_value()

        return types.void(src, sr, sc, dst, dr, dc), codegen

    return intrinsic(typer)


def _u8_matrix(t) -> bool:
    return (isinstance(t, types.Array) and t.ndim == 2 and t.layout == "C"
            and t.dtype == types.uint8)


@intrinsic
def _dec_q5_0_row(typingctx, w, r, dst, i):
    """``dst[i, :K] = dequantize(w[r])`` for q5_0 rows (22 B per 32 values: d f16 @0 |
    qh u32 @2 | qs[16] @6), 16 values per vector: the same float32 operations as
    ``block_rows._dec_q5_0`` (``d * float(q - 16)``, d by the exact fp16 bit moves), so
    bit for bit equal. Reads only the row's own bytes. Measured in the GEMM (1 thread,
    CPU time, same run, M=128): 864 vs 918 us at 1024 x 640, 211 vs 230 us at 256 x 640
    against the scalar decoder."""
    if not (_u8_matrix(w) and _f32_matrix(dst) and isinstance(r, types.Integer)
            and isinstance(i, types.Integer)):
        return None
    i8, i16 = ir.IntType(8), ir.IntType(16)
    v16i, v16f = ir.VectorType(_I32, 16), ir.VectorType(_F32, 16)

    def vconst(vals):
        return ir.Constant(v16i, [ir.Constant(_I32, v) for v in vals])

    def codegen(context, builder, sig, args):
        wa, da = (context.make_array(sig.args[j])(context, builder, args[j]) for j in (0, 2))
        r, i = (context.cast(builder, args[j], sig.args[j], types.intp) for j in (1, 3))
        ldw = cgutils.unpack_tuple(builder, wa.shape)[1]
        ldd = cgutils.unpack_tuple(builder, da.shape)[1]
        row = builder.gep(wa.data, [builder.mul(r, ldw)])
        out = builder.gep(da.data, [builder.mul(i, ldd)])
        nb = builder.sdiv(ldw, _const(22))
        zeros16 = ir.Constant(v16i, [ir.Constant(_I32, 0)] * 16)

        def splat(v, vt):
            u = builder.insert_element(ir.Constant(vt, ir.Undefined), v, ir.Constant(_I32, 0))
            return builder.shuffle_vector(u, ir.Constant(vt, ir.Undefined), zeros16)

        def load(p, off, ty):
            q = builder.gep(p, [_const(off)]) if off else p
            return builder.load(builder.bitcast(q, ty.as_pointer()), align=1)

        with cgutils.for_range(builder, nb) as loop:
            b = loop.index
            bp = builder.gep(row, [builder.mul(b, _const(22))])
            h = builder.zext(load(bp, 0, i16), _I32)
            bits = builder.or_(builder.shl(builder.and_(h, ir.Constant(_I32, 0x8000)), ir.Constant(_I32, 16)),
                               builder.shl(builder.and_(h, ir.Constant(_I32, 0x7FFF)), ir.Constant(_I32, 13)))
            f = builder.fmul(builder.bitcast(bits, _F32), ir.Constant(_F32, 5.192296858534828e33))
            special = builder.icmp_unsigned("==", builder.and_(h, ir.Constant(_I32, 0x7C00)),
                                            ir.Constant(_I32, 0x7C00))
            d = builder.select(special, builder.bitcast(
                builder.or_(bits, ir.Constant(_I32, 0x7F800000)), _F32), f)
            qh = splat(load(bp, 2, _I32), v16i)
            qs = builder.zext(load(bp, 6, ir.VectorType(i8, 16)), v16i)
            one, four, sixteen = vconst([1] * 16), vconst([4] * 16), vconst([16] * 16)
            blo = builder.shl(builder.and_(builder.lshr(qh, vconst(range(16))), one), four)
            bhi = builder.shl(builder.and_(builder.lshr(qh, vconst(range(16, 32))), one), four)
            lo = builder.sub(builder.or_(builder.and_(qs, vconst([15] * 16)), blo), sixteen)
            hi = builder.sub(builder.or_(builder.lshr(qs, four), bhi), sixteen)
            dv = splat(d, v16f)
            o = builder.gep(out, [builder.mul(b, _const(32))])
            for off, q in ((0, lo), (16, hi)):
                p = builder.bitcast(builder.gep(o, [_const(off)]), v16f.as_pointer())
                builder.store(builder.fmul(dv, builder.sitofp(q, v16f)), p, align=4)
        return context.get_dummy_value()

    return types.void(w, r, dst, i), codegen


# Set per compiled kernel by gemm_kernel: chunk rows, decoded-row padding, tile rows,
# lanes, panel width, K slice, the micro-kernel and transpose intrinsics.
RB = PAD = MR = L = PW = KC = 0
MICRO_FULL = MICRO_HALF = TRANSPOSE = None


def _gemm_src(kind, x, w, out, threads):
    # x: (M, K) f32, w: (N, K//be*bb) u8 -> out: (M, N) f32
    m_rows, k = x.shape
    n = w.shape[0]
    # x packed into panels of PW rows, transposed: xp[p, k, j] = x[PW * p + j, k], zero past M
    n_panels = (m_rows + PW - 1) // PW
    xp = np.empty((n_panels, k, PW), np.float32)
    for p in range(n_panels):
        pp = xp[p]
        for j0 in range(0, PW, L):
            m0 = PW * p + j0
            if m0 + L <= m_rows:
                for k0 in range(0, k - L + 1, L):
                    TRANSPOSE(x, m0, k0, pp, k0, j0)
                k_done = k - k % L
            else:
                k_done = 0
            for kk in range(k_done, k):
                for j in range(L):
                    pp[kk, j0 + j] = x[m0 + j, kk] if m0 + j < m_rows else np.float32(0)
    chunks = (n + RB - 1) // RB
    groups = min(chunks, threads)
    for g in numba.prange(groups):                   # contiguous runs of chunks, +-1 apart
        buf = np.zeros((RB, k + PAD), np.float32)
        c = np.empty((RB, PW), np.float32)
        for ch in range(g * chunks // groups, (g + 1) * chunks // groups):
            r0 = ch * RB
            rows = min(RB, n - r0)
            for i in range(rows):
                if kind == 1:                        # q5_0
                    _dec_q5_0_row(w, r0 + i, buf, i)
                else:
                    _decode_row(kind, w, r0 + i, buf[i, :k])
            for i in range(rows, RB):                # rows past N read as zero
                buf[i, :] = 0
            tiles = (rows + MR - 1) // MR * MR
            for p in range(n_panels):
                m0 = PW * p
                span = min(PW, m_rows - m0)
                panel = xp[p]
                c[:, :] = 0
                for k0 in range(0, k, KC):
                    k1 = min(k, k0 + KC)
                    for q in range(0, tiles, MR):
                        if 2 * span > PW:
                            MICRO_FULL(buf, q, panel, c, 0, k0, k1)
                        else:
                            MICRO_HALF(buf, q, panel, c, 0, k0, k1)
                for j0 in range(0, span, L):             # out[m0 + j, r0 + i] = c[i, j]
                    for i0 in range(0, rows, L):
                        if j0 + L <= span and i0 + L <= rows:
                            TRANSPOSE(c, i0, j0, out, m0 + j0, r0 + i0)
                        else:
                            for j in range(j0, min(span, j0 + L)):
                                for i in range(i0, min(rows, i0 + L)):
                                    out[m0 + j, r0 + i] = c[i, j]


_KERNELS: dict = {}


def gemm_kernel(lanes: int, mr: int = 0, rb: int = 0):
    """The GEMM dispatcher for ``lanes`` (16 or 8) float32 lanes per vector, ``mr`` weight
    rows per tile and ``rb`` rows per decoded chunk (0: ``_SHAPES[lanes]``), made once
    (compiled lazily on the first call, cached on disk under its own name)."""
    mr, rb = mr or _SHAPES[lanes][0], rb or _SHAPES[lanes][1]
    key = (lanes, mr, rb)
    if key not in _KERNELS:
        if rb % mr:
            raise ValueError(f"gemm_kernel: rb={rb} is not a multiple of mr={mr}")
        name = f"_gemm_{lanes}_{mr}_{rb}"
        glb = dict(globals(), RB=rb, PAD=_PAD, MR=mr, L=lanes, PW=2 * lanes, KC=_KC,
                   TRANSPOSE=_transpose_intrinsic(lanes),
                   MICRO_FULL=_micro_intrinsic(lanes, mr, 2),
                   MICRO_HALF=_micro_intrinsic(lanes, mr, 1))
        fn = pytypes.FunctionType(_gemm_src.__code__, glb, name)
        fn.__qualname__ = name
        fn.__module__ = __name__
        _KERNELS[key] = numba.njit(cache=CACHE, parallel=True, fastmath=FASTMATH)(fn)
    return _KERNELS[key]


_LANES: list = []


def default_lanes() -> int:
    """16 where numba compiles for AVX-512 (avx512f), else 8."""
    if not _LANES:
        _LANES.append(16 if _target_has("avx512f") else 8)
    return _LANES[0]


def gemm(kind: int, x2: np.ndarray, w: np.ndarray, out: np.ndarray, lanes: int = 0,
         mr: int = 0, rb: int = 0) -> None:
    """out (M, N) f32 = x2 (M, K) f32 @ dequantize(w).T; w (N, K // be * bb) u8 blocks of
    ``block_rows.KINDS`` kind ``kind``. ``lanes``: 16 or 8 (0: ``default_lanes()``); ``mr``,
    ``rb``: see ``gemm_kernel``."""
    m, k = x2.shape
    if (out.shape != (m, w.shape[0]) or x2.dtype != np.float32 or out.dtype != np.float32
            or not (x2.flags.c_contiguous and w.flags.c_contiguous and out.flags.c_contiguous)):
        raise ValueError(f"gemm: x {x2.shape} {x2.dtype}, w {w.shape}, out {out.shape} "
                         f"{out.dtype}: need C-contiguous float32 x (M, K), out (M, N)")
    lanes = lanes or default_lanes()
    gemm_kernel(lanes, mr, rb)(kind, x2, w, out, numba.get_num_threads())
