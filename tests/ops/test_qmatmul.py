"""qmatmul (API.md section 3): ``x @ dequantize(w_q).T`` on packed GGML blocks.

References are float64 ``x @ gguf.quants.dequantize(bytes).T``. The error bound is
float32 rounding of a K-term dot product, taken relative to ``|x| @ |W|.T``.
"""

import zlib

import numpy as np
import pytest
from gguf import GGMLQuantizationType as GT
from gguf import quants as gq

import maxdecl as md
from ophelp import packed_blocks, raw_blocks

F32 = md.DType.float32
FAST = ["q4_0", "q5_0", "q8_0", "q4_k", "q6_k", "bf16", "q5_k", "q4_1", "q5_1", "q3_k", "q2_k",
        "iq4_nl", "iq4_xs", "tq2_0", "tq1_0"]
GEMV_ENCODINGS = [e for e in FAST if e != "bf16"]       # the vector-IR kernels
BLOCK = {"q4_0": (32, 18), "q5_0": (32, 22), "q8_0": (32, 34),
         "q4_k": (256, 144), "q6_k": (256, 210), "bf16": (1, 2),
         "q4_1": (32, 20), "q5_1": (32, 24), "q2_k": (256, 84), "q3_k": (256, 110),
         "q5_k": (256, 176), "iq4_nl": (32, 18), "iq4_xs": (256, 136), "tq1_0": (256, 54),
         "tq2_0": (256, 66)}
TOL = 2e-6  # |out - ref| <= TOL * (|x| @ |W|.T): float32 rounding, far below one quant step


def _reference(x, data, enc):
    w = gq.dequantize(data, getattr(GT, enc.upper())).astype(np.float64)
    x64 = x.astype(np.float64)
    return x64 @ w.T, np.abs(x64) @ np.abs(w).T


def _run(x, qt):
    g = md.Graph("t", input_types=[md.TensorType(F32, x.shape)])
    with g.layer("proj"):
        y = md.ops.qmatmul(g.inputs[0], g.constant(qt))
    g.output(y)
    return g.execute(x)[0]


@pytest.mark.parametrize("m", [1, 3, 17])
@pytest.mark.parametrize("enc", FAST)
def test_matches_gguf_reference(enc, m):
    rng = np.random.default_rng(zlib.crc32(f"{enc}/{m}".encode()))
    be = BLOCK[enc][0]
    k = be * int(rng.integers(2, 5)) if be > 1 else int(rng.integers(40, 300))
    n = int(rng.integers(1, 70))
    data = packed_blocks(enc, n, k, rng)
    x = rng.standard_normal((m, k)).astype(np.float32)
    out = _run(x, md.QuantizedTensor(data, (n, k), enc))
    ref, scale = _reference(x, data, enc)
    assert out.shape == (m, n) and out.dtype == np.float32
    rel = np.abs(out - ref).max() / np.abs(ref).max()
    bound = (np.abs(out - ref) / scale).max()
    print(f"{enc} M={m} K={k} N={n}: max relative error {rel:.2e} (vs |x||W|: {bound:.2e})")
    assert bound <= TOL, f"{enc} M={m}: error {bound:.2e} of |x||W| (max rel {rel:.2e})"


@pytest.mark.parametrize("enc", FAST)
def test_many_tiles_and_leading_dims(enc, monkeypatch):
    from maxdecl.kernels import qmatmul as kq

    monkeypatch.setattr(kq, "TILE_BYTES", 1)           # 8 rows per tile: many tiles, a ragged end
    rng = np.random.default_rng(7)
    be = BLOCK[enc][0]
    k, n = (512 if be > 1 else 96), 29
    data = packed_blocks(enc, n, k, rng)
    x = rng.standard_normal((2, 3, k)).astype(np.float32)
    out = _run(x, md.QuantizedTensor(data, (n, k), enc))
    ref, scale = _reference(x.reshape(-1, k), data, enc)
    assert out.shape == (2, 3, n)
    assert (np.abs(out.reshape(-1, n) - ref) / scale).max() <= TOL


@pytest.mark.parametrize("enc", FAST)
def test_tile_decoder_is_bit_exact(enc):
    from maxdecl.kernels import qmatmul as kq

    rng = np.random.default_rng(3)
    k = 512 if BLOCK[enc][0] > 1 else 64
    data = packed_blocks(enc, 12, k, rng)
    want = gq.dequantize(data, getattr(GT, enc.upper()))
    got = kq.dequantize_rows(data, enc, k, 2, 11)
    np.testing.assert_array_equal(got.view(np.uint32), want[2:11].view(np.uint32))


@pytest.mark.parametrize("enc", ["q5_0", "q8_0", "q4_0", "q4_1", "q5_1"])
@pytest.mark.parametrize("n", [1, 7, 300])
def test_gemv_raw_blocks_gemma_k(enc, n):
    """The vector-IR GEMV kernels on raw random blocks (every quant and 5th-bit pattern,
    fp16 scales of both signs down to subnormals) at Gemma's K=640 (20 blocks a row)."""
    from maxdecl.kernels import qmatmul as kq

    rng = np.random.default_rng(zlib.crc32(f"raw/{enc}/{n}".encode()))
    k = 640
    data = raw_blocks(enc, n, k, rng)
    x = rng.standard_normal((1, k)).astype(np.float32)
    out = kq.qmatmul_blocks(x, data, enc)
    ref, scale = _reference(x, data, enc)
    assert out.shape == (1, n) and out.dtype == np.float32
    assert (np.abs(out - ref) / np.maximum(scale, 1e-30)).max() <= TOL


@pytest.mark.parametrize("enc", ["q4_k", "q6_k", "q3_k", "q2_k"])
@pytest.mark.parametrize("n,k", [(1, 256), (7, 768), (300, 2560)])
def test_gemv_raw_blocks_k_quants(enc, n, k):
    """The vector-IR K-quant GEMV kernels on raw random super-blocks (every 6-bit
    scale / min and high-bit pattern, d and dmin of both signs down to subnormals)."""
    from maxdecl.kernels import qmatmul as kq

    rng = np.random.default_rng(zlib.crc32(f"rawk/{enc}/{n}/{k}".encode()))
    data = raw_blocks(enc, n, k, rng)
    x = rng.standard_normal((1, k)).astype(np.float32)
    out = kq.qmatmul_blocks(x, data, enc)
    ref, scale = _reference(x, data, enc)
    assert out.shape == (1, n) and out.dtype == np.float32
    assert (np.abs(out - ref) / np.maximum(scale, 1e-30)).max() <= TOL


@pytest.mark.parametrize("lanes", [8, 16])
@pytest.mark.parametrize("how", ["permvar", "permps", "select"])
def test_iq4_grid_lookup_every_way(how, lanes):
    """The iq4 decoders' lookup of GGML's grid by a 4-bit code (AVX-512 vpermps, AVX2
    vpermps and a blend, a select tree elsewhere) reads only the code's low 4 bits and
    gives the grid's values, for codes with junk in their upper bits."""
    import numba
    from llvmlite import ir
    from numba import types
    from numba.extending import intrinsic

    from maxdecl.kernels import gemv
    from maxdecl.kernels.block_rows import IQ4_GRID

    need = {"permvar": "avx512f", "permps": "avx2"}.get(how)
    if (need and not gemv._target_has(need)) or (how == "permvar" and lanes != 16):
        pytest.skip(f"{how} needs {need or 'AVX-512'} and 16 lanes")

    @intrinsic
    def look(typingctx, codes, out):
        def codegen(context, builder, sig, args):
            vi = ir.VectorType(ir.IntType(32), lanes)
            ca = context.make_array(sig.args[0])(context, builder, args[0])
            oa = context.make_array(sig.args[1])(context, builder, args[1])
            c = builder.load(builder.bitcast(ca.data, vi.as_pointer()), align=4)
            v = gemv._grid_lookup(builder, gemv._IQ4, c, lanes, how=how)
            builder.store(v, builder.bitcast(oa.data, v.type.as_pointer()), align=4)
            return context.get_dummy_value()
        return types.void(codes, out), codegen

    @numba.njit
    def run(codes, out):
        look(codes, out)

    rng = np.random.default_rng(lanes)
    for _ in range(8):
        codes = rng.integers(0, 1 << 16, lanes).astype(np.int32)
        out = np.empty(lanes, np.float32)
        run(codes, out)
        np.testing.assert_array_equal(out, IQ4_GRID[codes & 15])


@pytest.mark.parametrize("soft", [False, True])
def test_ir_f16_is_exact(soft):
    """The GEMV kernels' fp16 scale decode (F16C, and the bit-move fallback for targets
    without it) on all 65536 fp16 values, with junk in the upper 16 bits of the word."""
    import numba
    from numba import types
    from numba.core import cgutils
    from numba.extending import intrinsic

    from maxdecl.kernels import gemv as kq

    if not soft and not kq._target_has("f16c"):
        pytest.skip("target CPU has no F16C")

    @intrinsic
    def conv(typingctx, u):
        def codegen(context, builder, sig, args):
            return kq._ir_f16(builder, args[0], soft=soft)
        return types.float32(types.uint32), codegen

    @intrinsic
    def conv_pair(typingctx, u):                       # q4_k's (d, dmin) word
        def codegen(context, builder, sig, args):
            lo, hi = kq._ir_f16_pair(builder, args[0], soft=soft)
            return cgutils.make_anonymous_struct(builder, [lo, hi])
        return types.UniTuple(types.float32, 2)(types.uint32), codegen

    @numba.njit
    def run(a, out, lo, hi):
        for i in range(a.shape[0]):
            out[i] = conv(a[i])
            lo[i], hi[i] = conv_pair(a[i])

    h = np.arange(65536, dtype=np.uint32)
    junk = np.random.default_rng(0).integers(0, 65536, h.shape).astype(np.uint32)
    got, lo, hi = (np.empty(h.shape, np.float32) for _ in range(3))
    run(h | (junk << np.uint32(16)), got, lo, hi)
    want = h.astype(np.uint16).view(np.float16).astype(np.float32)
    want_hi = junk.astype(np.uint16).view(np.float16).astype(np.float32)
    for g, w in ((got, want), (lo, want), (hi, want_hi)):
        nan = np.isnan(w)
        assert np.array_equal(np.isnan(g), nan)
        np.testing.assert_array_equal(g[~nan].view(np.uint32), w[~nan].view(np.uint32))


def test_graph_quantize_then_qmatmul():
    rng = np.random.default_rng(0)
    w = rng.standard_normal((48, 256)).astype(np.float32)
    g = md.Graph("t", input_types=[md.TensorType(F32, ("seq", 256))])
    with g.layer("fc"):
        wq = g.quantize(w, "q4_0")
        assert wq.is_quantized and wq.encoding == "q4_0" and wq.logical_shape == (48, 256)
        y = md.ops.qmatmul(g.inputs[0], wq)
    assert y.shape == ("seq", 48) and y.dtype == F32
    g.output(y)
    for m in (1, 5):
        x = rng.standard_normal((m, 256)).astype(np.float32)
        (out,) = g.execute(x)
        data = gq.quantize(w, GT.Q4_0)
        ref, scale = _reference(x, data, "q4_0")
        assert (np.abs(out - ref) / scale).max() <= TOL
        # and close to the unquantized product, as q4_0 allows
        assert np.abs(out - x @ w.T).max() < 0.2 * np.abs(x @ w.T).max()


def test_weight_bound_at_execute():
    rng = np.random.default_rng(1)
    data = packed_blocks("q6_k", 16, 256, rng)
    g = md.Graph("t", input_types=[md.TensorType(F32, (1, 256))])
    with g.layer("blk.0.attn_q"):
        w = g.weight("blk.0.attn_q.weight", md.TensorType(F32, (16, 256)), encoding="q6_k")
        y = md.ops.qmatmul(g.inputs[0], w)
    g.output(y)
    x = rng.standard_normal((1, 256)).astype(np.float32)
    td = md.TensorDict({"blk.0.attn_q.weight": md.QuantizedTensor(data, (16, 256), "q6_k")})
    (out,) = g.execute(x, weights=td)
    ref, scale = _reference(x, data, "q6_k")
    assert (np.abs(out - ref) / scale).max() <= TOL


# -- build-time errors ----------------------------------------------------------------
def _graph_with(x_type, layer="blk.3.attn_q"):
    g = md.Graph("t", input_types=[x_type])
    return g, g.inputs[0], layer


def test_k_mismatch_names_layer_and_shapes():
    g, x, layer = _graph_with(md.TensorType(F32, ("seq", 4096)))
    wq = g.constant(md.QuantizedTensor(np.zeros((4, 4064 // 32 * 18), np.uint8), (4, 4064),
                                       "q4_0"))
    with g.layer("blk"), g.layer("3"), g.layer("attn_q"):
        with pytest.raises(md.GraphError) as e:
            md.ops.qmatmul(x, wq)
    msg = str(e.value)
    assert layer in msg and "qmatmul" in msg
    assert "x float32[seq, 4096] @ w[4, 4064].T: 4096 != 4064" in msg


def test_unquantized_w_is_rejected():
    g, x, _ = _graph_with(md.TensorType(F32, (2, 64)))
    w = g.constant(np.ones((8, 64), np.float32))
    with g.layer("fc"):
        with pytest.raises(md.GraphError, match=r"fc: qmatmul: .*w must be quantized"):
            md.ops.qmatmul(x, w)


@pytest.mark.parametrize("dtype", [md.DType.float16, md.DType.int32])
def test_non_float32_x_is_rejected(dtype):
    g, x, _ = _graph_with(md.TensorType(dtype, (2, 64)))
    wq = g.constant(md.QuantizedTensor(np.zeros((8, 2 * 34), np.uint8), (8, 64), "q8_0"))
    with g.layer("fc"):
        with pytest.raises(md.GraphError, match=r"fc: qmatmul: .*x must be float32"):
            md.ops.qmatmul(x, wq)


def test_3d_quantized_w_is_rejected():
    g, x, _ = _graph_with(md.TensorType(F32, (2, 32)))
    wq = g.constant(md.QuantizedTensor(np.zeros((2, 3, 18), np.uint8), (2, 3, 32), "q4_0"))
    with g.layer("fc"):
        with pytest.raises(md.GraphError, match=r"fc: qmatmul: .*must be 2-D"):
            md.ops.qmatmul(x, wq)


def test_symbolic_k_mismatch_caught_at_run_time():
    g = md.Graph("t", input_types=[md.TensorType(F32, (1, "k"))])
    wq = g.constant(md.QuantizedTensor(np.zeros((4, 2 * 18), np.uint8), (4, 64), "q4_0"))
    with g.layer("fc"):
        y = md.ops.qmatmul(g.inputs[0], wq)
    g.output(y)
    with pytest.raises(md.GraphError, match=r"fc: qmatmul: .*K must match"):
        g.execute(np.ones((1, 32), np.float32))


# -- a user encoding goes through the tiled fallback -----------------------------------
class _Int8Rows:
    """Test encoding: blocks of 4 values = float32 scale + 4 int8 (8 bytes)."""

    name, block_elements, block_bytes = "test_i8x4", 4, 8

    def __init__(self):
        self.calls = []

    def quantize(self, x):
        b = np.asarray(x, np.float32).reshape(*x.shape[:-1], -1, 4)
        d = np.abs(b).max(-1, keepdims=True) / 127
        q = np.round(b / np.where(d == 0, 1, d)).astype(np.int8)
        out = np.concatenate([d.astype(np.float32).view(np.uint8), q.view(np.uint8)], -1)
        return out.reshape(*x.shape[:-1], -1)

    def dequantize(self, data, shape):
        self.calls.append(tuple(shape))
        b = np.asarray(data, np.uint8).reshape(-1, 8)
        d = b[:, :4].copy().view(np.float32)
        q = b[:, 4:].view(np.int8).astype(np.float32)
        return (d * q).reshape(shape)


@pytest.fixture
def user_encoding():
    enc = _Int8Rows()
    md.codecs.register(enc)
    try:
        yield enc
    finally:
        md.codecs.unregister(enc.name)


@pytest.mark.parametrize("m", [1, 3])
def test_user_encoding_uses_tiled_fallback(user_encoding, monkeypatch, m):
    from maxdecl.kernels import qmatmul as kq

    monkeypatch.setattr(kq, "TILE_BYTES", 1)            # 8 rows per tile
    rng = np.random.default_rng(5)
    n, k = 21, 64
    w = rng.standard_normal((n, k)).astype(np.float32)
    g = md.Graph("t", input_types=[md.TensorType(F32, (m, k))])
    with g.layer("fc"):
        wq = g.quantize(w, user_encoding.name)
        y = md.ops.qmatmul(g.inputs[0], wq)
    g.output(y)
    x = rng.standard_normal((m, k)).astype(np.float32)
    (out,) = g.execute(x)
    tiles = list(user_encoding.calls)
    wd = user_encoding.dequantize(user_encoding.quantize(w), (n, k)).astype(np.float64)
    ref = x.astype(np.float64) @ wd.T
    scale = np.abs(x.astype(np.float64)) @ np.abs(wd).T
    assert (np.abs(out - ref) / scale).max() <= TOL
    assert tiles and max(c[0] for c in tiles) <= 8 and sum(c[0] for c in tiles) == n


@pytest.mark.parametrize("enc", ["q4_0", "q5_0", "q8_0", "q4_k", "q6_k", "bf16"])
def test_a_few_rows_equal_one_row_at_a_time_bit_for_bit(enc):
    """Batched decode relies on it: up to 16 rows of x (the multi-row GEMV kernels, any
    count up to 8 in one pass) give each row exactly what that row alone (the one-row
    GEMV) gives."""
    from maxdecl.kernels import linalg

    rng = np.random.default_rng(5)
    e = md.codecs.get(enc)
    for n, k in ((37, 512), (300, 768)):
        qt = md.QuantizedTensor(e.quantize(rng.standard_normal((n, k)).astype(np.float32)),
                                (n, k), e.name)
        for m in (2, 3, 4, 5, 6, 7, 8, 13, 15, 16):
            x = rng.standard_normal((m, k)).astype(np.float32)
            together = linalg.qmatmul(x, qt)
            alone = np.stack([linalg.qmatmul(x[i:i + 1], qt)[0] for i in range(m)])
            assert together.tobytes() == alone.tobytes(), (enc, n, k, m)


def _lanes_kernel(enc, lanes, table=None, wrows=1):
    """A one-off (uncached) GEMV kernel over ``gemv.row_intrinsic(enc, lanes, table,
    wrows)``; the table decoders (AVX-512 permutes) by default where the CPU runs them.
    With ``wrows`` > 1 the rows left over after whole groups run one at a time."""
    import numba

    from maxdecl.kernels import gemv

    if table is None:
        table = gemv.host_lanes() == 16
    row = gemv.row_intrinsic(enc, lanes, table)
    rows = gemv.row_intrinsic(enc, lanes, table, wrows)

    @numba.njit
    def run(x, w, out):
        whole = w.shape[0] - w.shape[0] % wrows
        for r in range(0, whole, wrows):
            rows(w, r, x, out, r)
        for r in range(whole, w.shape[0]):
            row(w, r, x, out, r)
    return run


@pytest.mark.parametrize("lanes", [8, 16])
@pytest.mark.parametrize("enc", GEMV_ENCODINGS)
def test_gemv_weight_rows_per_call_do_not_change_bits(enc, lanes):
    """An intrinsic call over 2 or 4 weight rows (sharing each load of x) gives every
    output bit for bit what a call per weight row gives, for 1 to 5 rows of x."""
    rng = np.random.default_rng(zlib.crc32(f"wrows/{enc}/{lanes}".encode()))
    be = BLOCK[enc][0]
    k = be * (5 if be == 32 else 3)
    data = raw_blocks(enc, 23, k, rng)
    one = _lanes_kernel(enc, lanes)
    for wrows in (2, 4):
        several = _lanes_kernel(enc, lanes, wrows=wrows)
        for m in (1, 2, 5):
            x = rng.standard_normal((m, k)).astype(np.float32)
            a, b = np.empty((m, 23), np.float32), np.empty((m, 23), np.float32)
            one(x, data, a)
            several(x, data, b)
            assert a.tobytes() == b.tobytes(), (enc, lanes, wrows, m)


@pytest.mark.parametrize("lanes", [8, 16])
@pytest.mark.parametrize("enc", GEMV_ENCODINGS)
def test_gemv_lane_widths_match_reference_and_rows(enc, lanes):
    """Both vector widths (16 lanes on AVX-512 CPUs, 8 elsewhere; LLVM lowers either
    anywhere), on raw random blocks with an odd block count: within tolerance of the
    float64 reference, and every row of a multi-row call bit-identical to that row alone."""
    rng = np.random.default_rng(zlib.crc32(f"lanes/{enc}/{lanes}".encode()))
    be = BLOCK[enc][0]
    k = be * (7 if be == 32 else 3)                 # odd: the 32-value tail unit
    data = raw_blocks(enc, 29, k, rng)
    run = _lanes_kernel(enc, lanes)
    x = rng.standard_normal((11, k)).astype(np.float32)
    out = np.empty((11, 29), np.float32)
    run(x, data, out)
    ref, scale = _reference(x, data, enc)
    finite = np.isfinite(ref)
    assert (np.abs(out - ref)[finite] / np.maximum(scale[finite], 1e-30)).max() <= TOL
    for i in range(11):
        one = np.empty((1, 29), np.float32)
        run(x[i:i + 1].copy(), data, one)
        assert one.tobytes() == out[i:i + 1].tobytes(), (enc, lanes, i)


@pytest.mark.parametrize("lanes", [8, 16])
@pytest.mark.parametrize("enc", GEMV_ENCODINGS)
def test_gemv_decoders_are_exact(enc, lanes):
    """Against one-hot rows of x each GEMV output is one dequantized weight (every other
    product is an exact zero), so the vector decoders must give gguf's ``dequantize``
    exactly, on raw blocks with every code, scale and high-bit pattern."""
    rng = np.random.default_rng(zlib.crc32(f"exact/{enc}/{lanes}".encode()))
    be = BLOCK[enc][0]
    k = be * (3 if be == 32 else 2)
    data = raw_blocks(enc, 5, k, rng)
    want = gq.dequantize(data, getattr(GT, enc.upper()))
    run = _lanes_kernel(enc, lanes)
    eye = np.eye(k, dtype=np.float32)
    got = np.empty((k, 5), np.float32)
    for i in range(0, k, 8):
        run(eye[i:i + 8].copy(), data, got[i:i + 8])
    np.testing.assert_array_equal(got.T, want)


@pytest.mark.parametrize("enc", ["q4_0", "q5_0", "q4_k", "iq4_nl", "iq4_xs", "q6_k"])
def test_gemv_table_decoders_equal_plain_decoders(enc):
    """The 16-lane table decoders (a code indexes a per-block table of dequantized values;
    q6_k: codes put together 64 bytes at a time) give bit for bit the plain decoders' outputs, on raw blocks with every code and
    high-bit pattern and fp16 scales of both signs down to subnormals, for 1 to 9 rows."""
    from maxdecl.kernels import gemv

    if gemv.host_lanes() != 16:
        pytest.skip("the table decoders need AVX-512")
    rng = np.random.default_rng(zlib.crc32(f"table/{enc}".encode()))
    be = BLOCK[enc][0]
    k = be * (9 if be == 32 else 3)
    data = raw_blocks(enc, 53, k, rng)
    plain, table = _lanes_kernel(enc, 16, table=False), _lanes_kernel(enc, 16, table=True)
    for m in (1, 2, 3, 5, 8, 9):
        x = rng.standard_normal((m, k)).astype(np.float32)
        a, b = np.empty((m, 53), np.float32), np.empty((m, 53), np.float32)
        plain(x, data, a)
        table(x, data, b)
        assert a.tobytes() == b.tobytes(), (enc, m)


@pytest.mark.parametrize("enc", GEMV_ENCODINGS)
def test_gemv_group_equals_each_weight_alone(enc):
    """``gemv_group`` (fused q/k/v, gate/up) gives each weight's columns bit for bit."""
    from maxdecl.kernels import gemv
    from maxdecl.kernels import qmatmul as kq

    rng = np.random.default_rng(zlib.crc32(f"group/{enc}".encode()))
    k = 512
    ws = [raw_blocks(enc, n, k, rng) for n in (41, 7, 8)]     # odd: pairs across weights
    for m in (1, 3, 16):
        x = rng.standard_normal((m, k)).astype(np.float32)
        got = gemv.gemv_group(x, ws, enc)
        want = np.concatenate([kq.qmatmul_blocks(x, w, enc) for w in ws], axis=1)
        assert got.tobytes() == want.tobytes(), (enc, m)


@pytest.mark.parametrize("enc", GEMV_ENCODINGS)
def test_gemv_group_in_interleaved_streams_equals_each_weight_alone(enc):
    """A group with enough rows for ``STREAMS`` interleaved runs a thread (its row count
    not a multiple of them, so the last run ends early, runs crossing weights; with one
    row of x the runs read in lockstep) gives each weight's columns as the weight alone
    in one run, bit for bit, for one row of x and several."""
    from maxdecl.kernels import gemv

    rng = np.random.default_rng(zlib.crc32(f"streams/{enc}".encode()))
    k = 256
    sizes = (gemv.STREAMS * gemv.STREAM_MIN_ROWS - 3, 5, 3)          # 261: runs of 66
    assert all(n < gemv.STREAMS * gemv.STREAM_MIN_ROWS for n in sizes)  # alone: one run
    assert gemv.stream_stride(sum(sizes), 1) < sum(sizes)                # together: runs
    ws = [raw_blocks(enc, n, k, rng) for n in sizes]
    for m in (1, 3):
        x = gemv.aligned_rows(rng.standard_normal((m, k)).astype(np.float32))
        offs = gemv.offsets(sizes)
        got = np.full((m, int(offs[-1])), np.nan, np.float32)
        gemv.GEMV_GROUP[enc](x, tuple(ws), offs, got)
        for w, a, b in zip(ws, offs[:-1], offs[1:]):
            alone = np.empty((m, w.shape[0]), np.float32)
            gemv.GEMV_GROUP[enc](x, (w,), gemv.offsets((w.shape[0],)), alone)
            assert got[:, a:b].tobytes() == alone.tobytes(), (enc, m)


@pytest.mark.parametrize("enc", ["q5_0", "q8_0", "q4_k"])
def test_gemv_tiled_equals_whole_rows_bit_for_bit(enc):
    """The tiled GEMV (pieces of K at a time over tiles of weight rows, for x rows too long
    for L1) gives bit for bit the whole-row kernel's outputs: pieces of one step and of
    several, an odd block count (its last block alone in the last piece), 1 to 16 rows
    of x, a group whose weights end inside a tile; and ``run_group`` picks it for long x."""
    from maxdecl.kernels import gemv

    rng = np.random.default_rng(zlib.crc32(f"tiled/{enc}".encode()))
    be = BLOCK[enc][0]
    k = be * (13 if be == 32 else 5)
    ws = tuple(raw_blocks(enc, n, k, rng) for n in (21, 3, 17))
    offs = gemv.offsets(tuple(w.shape[0] for w in ws))
    for m in (1, 2, 5, 8, 16):
        x = gemv.aligned_rows(rng.standard_normal((m, k)).astype(np.float32))
        whole = np.empty((m, int(offs[-1])), np.float32)
        gemv.GEMV_GROUP[enc](x, ws, offs, whole)
        for chunk in ((2, 4, 6) if be == 32 else (1, 2, 5)):
            tiled = np.full_like(whole, np.nan)
            gemv.GEMV_TILED[enc](x, ws, offs, tiled, chunk)
            assert tiled.tobytes() == whole.tobytes(), (enc, m, chunk)
    long_k = be * 256                               # 8 rows of x: 256 KiB
    w = raw_blocks(enc, 9, long_k, rng)
    x = rng.standard_normal((8, long_k)).astype(np.float32)
    calls = []
    real = gemv.GEMV_TILED[enc]
    try:
        gemv.GEMV_TILED[enc] = lambda *a: calls.append(a) or real(*a)
        got = gemv.gemv_group(x, [w], enc)
    finally:
        gemv.GEMV_TILED[enc] = real
    want = np.empty_like(got)
    gemv.GEMV_GROUP[enc](gemv.aligned_rows(x), (w,), gemv.offsets((9,)), want)
    assert calls and got.tobytes() == want.tobytes()


@pytest.mark.parametrize("cpu, locality", [("znver4", 0), ("znver3", 0),
                                           ("emeraldrapids", 2), ("skylake-avx512", 2),
                                           ("haswell", 2)])
def test_gemv_prefetch_locality_follows_the_cpu(monkeypatch, cpu, locality):
    """Non-temporal prefetch only on AMD Zen (on Intel it halved the GEMV's speed); the
    CPU numba compiles for decides (NUMBA_CPU_NAME when set)."""
    from numba.core import config

    from maxdecl.kernels import gemv

    monkeypatch.setattr(config, "CPU_NAME", cpu)
    assert gemv.prefetch_locality() == locality


def test_every_ggml_type_has_a_gemv_kernel():
    """Each encoding with a row decoder also has a vector-IR GEMV (bf16: its own loop),
    so decode never falls back to a row-at-a-time product."""
    from maxdecl.kernels import block_rows, gemv

    assert set(block_rows.LAYOUTS) == set(block_rows.ROW_LAYOUTS) == set(block_rows.KINDS)
    assert set(gemv.GEMV_GROUP) | {"bf16"} == set(block_rows.KINDS)
    assert set(FAST) == set(block_rows.KINDS)
