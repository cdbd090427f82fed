"""The int8-activation GEMV (``md.compile(..., activations="q8")``, kernels/gemv_q8.py).

Weights are GGML bytes (gguf-py's quantizer, or raw random blocks with every code and
scale pattern) and the references are float64 products with ``gguf.quants.dequantize``.
Two checks of the numbers: against x as given, the error stays inside the bound of
rounding x to a step ``d = max|x| / 127`` per 32 values (half a step per value, times
|W|); against x as the kernel rounded it, the result is that exact dot up to float32
rounding.
"""

import os
import zlib

import numpy as np
import pytest
from gguf import GGMLQuantizationType as GT
from gguf import quants as gq
from ophelp import packed_blocks, raw_blocks

import maxdecl as md

F32 = md.DType.float32
ENCODINGS = ["q8_0", "q4_0", "q5_0", "q4_k", "q6_k"]
TOL = 2e-6     # float32 rounding of a K-term dot, relative to |x| @ |W|.T (as test_qmatmul)


def _k(enc, rng):
    # an odd block count for the 32-value encodings: a last block on its own
    return 32 * (2 * int(rng.integers(1, 12)) + 1) if enc[-1] == "0" else 256 * int(rng.integers(1, 4))


def _graph(k, n, data, enc, m):
    g = md.Graph("t", input_types=[md.TensorType(F32, (m, k))])
    with g.layer("proj"):
        y = md.ops.qmatmul(g.inputs[0], g.constant(md.QuantizedTensor(data, (n, k), enc)))
    g.output(y)
    return g


def _steps(x):
    """Each 32-value block's rounding step, per value."""
    k = x.shape[1]
    amax = np.abs(x.reshape(x.shape[0], k // 32, 32)).max(-1).astype(np.float32)
    return np.repeat(amax / np.float32(127), 32, axis=1).astype(np.float64)


@pytest.mark.parametrize("blocks", [packed_blocks, raw_blocks])
@pytest.mark.parametrize("m", [1, 3, 8, 13])
@pytest.mark.parametrize("enc", ENCODINGS)
def test_q8_error_stays_inside_the_rounding_bound(enc, m, blocks):
    rng = np.random.default_rng(zlib.crc32(f"q8/{enc}/{m}/{blocks.__name__}".encode()))
    k, n = _k(enc, rng), int(rng.integers(1, 70))
    data = blocks(enc, n, k, rng)
    x = (rng.standard_normal((m, k)) * rng.uniform(0.01, 30, (m, 1))).astype(np.float32)
    out = md.compile(_graph(k, n, data, enc, m), activations="q8")(x)[0]
    w = gq.dequantize(data, getattr(GT, enc.upper())).astype(np.float64)
    ref = x.astype(np.float64) @ w.T
    bound = (_steps(x) / 2) @ np.abs(w).T + TOL * (np.abs(x.astype(np.float64)) @ np.abs(w).T)
    assert out.shape == (m, n) and out.dtype == np.float32
    assert (np.abs(out - ref) <= bound).all(), (enc, m, np.abs(out - ref).max())
    exact = md.compile(_graph(k, n, data, enc, m))(x)[0]          # the default: f32
    assert (np.abs(exact - ref) <= TOL * (np.abs(x.astype(np.float64)) @ np.abs(w).T)).all()


@pytest.mark.parametrize("enc", ENCODINGS)
def test_q8_is_the_exact_dot_with_rounded_x(enc):
    """The integer sums are exact: the output is ``W . (d * codes)`` up to float32
    rounding, ``codes`` and ``d`` as ``quantize_x`` made them (|x - d codes| <= d / 2)."""
    from maxdecl.kernels import gemv, gemv_q8

    rng = np.random.default_rng(zlib.crc32(f"q8exact/{enc}".encode()))
    k, n = _k(enc, rng), 41
    data = raw_blocks(enc, n, k, rng)
    x = rng.standard_normal((5, k)).astype(np.float32)
    xq, xl, xc, xs, xd = gemv_q8.quantize_x(x, gemv_q8.LAYOUT8[enc].off)
    d = np.repeat(xl[:, :k // 4:8].astype(np.float64), 32, axis=1)
    xr = d * xq[:, :k]
    assert (np.abs(xr - x) <= d / 2 * (1 + 1e-6)).all()
    assert (xq[:, k:] == 0).all() and (np.abs(xq) <= 127).all()
    assert xd[:, :k // 32].tobytes() == xl[:, :k // 4:8].tobytes()    # d, once a block
    out = np.empty((5, n), np.float32)
    gemv_q8.GROUP8[enc](xq, xl, xc, xs, xd, (data,), gemv.offsets((n,)), out)
    w = gq.dequantize(data, getattr(GT, enc.upper())).astype(np.float64)
    ref, scale = xr @ w.T, np.abs(xr) @ np.abs(w).T
    assert (np.abs(out - ref) <= TOL * np.maximum(scale, 1e-30)).all()


def _kernel(enc, vnni, wrows=1):
    """A one-off (uncached) kernel over ``row8_intrinsic(enc, vnni, wrows)``: the weight
    rows taken ``wrows`` at a time in lockstep (rows past the last repeat the last)."""
    import numba

    from maxdecl.kernels import gemv_q8

    row = gemv_q8.row8_intrinsic(enc, vnni, wrows)

    @numba.njit
    def run(xq, xl, xc, xs, xd, w, out):
        n = w.shape[0]
        for r in range(0, n, wrows):
            if wrows == 1:
                row((w,), (r,), xq, xl, xc, xs, xd, out, (r,))
            elif wrows == 2:
                r1 = min(r + 1, n - 1)
                row((w, w), (r, r1), xq, xl, xc, xs, xd, out, (r, r1))
            else:
                r1, r2, r3 = min(r + 1, n - 1), min(r + 2, n - 1), min(r + 3, n - 1)
                row((w, w, w, w), (r, r1, r2, r3), xq, xl, xc, xs, xd, out, (r, r1, r2, r3))
    return run


@pytest.mark.parametrize("enc", ENCODINGS)
def test_q8_rows_alone_equal_rows_in_a_batch_and_both_integer_paths_agree(enc):
    """Every row of x gets the same bits alone or with up to 12 others (one to eight per
    decode of a weight unit), whether 1, 2 or 4 weight rows are read in lockstep, and
    the portable integer sums (plain vector IR) give the same bits as VNNI's
    ``vpdpbusd``."""
    from maxdecl.kernels import gemv_q8

    rng = np.random.default_rng(zlib.crc32(f"q8rows/{enc}".encode()))
    k, n = _k(enc, rng), 23
    data = raw_blocks(enc, n, k, rng)
    x = rng.standard_normal((13, k)).astype(np.float32)
    parts = gemv_q8.quantize_x(x, gemv_q8.LAYOUT8[enc].off)
    kernels = [_kernel(enc, False)] + ([_kernel(enc, True)] if gemv_q8.has_vnni() else [])
    kernels += [_kernel(enc, None, 2), _kernel(enc, None, 4)]
    outs = []
    for run in kernels:
        out = np.empty((13, n), np.float32)
        run(*parts, data, out)
        outs.append(out)
        for i in range(13):
            one = np.empty((1, n), np.float32)
            run(*(np.ascontiguousarray(p[i:i + 1]) for p in parts), data, one)
            assert one.tobytes() == out[i:i + 1].tobytes(), (enc, i)
    assert all(o.tobytes() == outs[0].tobytes() for o in outs)


@pytest.mark.parametrize("enc", ENCODINGS)
def test_q8_group_in_interleaved_streams_equals_each_weight_alone(enc):
    """The int8 group kernels walk a large group's rows in interleaved runs as the float
    ones do, read 4 or 2 at a time in lockstep with up to 4 rows of x (a run's last row
    may fall past the group's end); each weight's columns stay those of the weight alone
    (one run), bit for bit."""
    from maxdecl.kernels import gemv, gemv_q8

    rng = np.random.default_rng(zlib.crc32(f"q8streams/{enc}".encode()))
    k = 256
    sizes = (gemv.STREAMS * gemv.STREAM_MIN_ROWS - 3, 5, 3)     # 261: runs of 66, the last short
    assert gemv.stream_stride(sum(sizes), 1) < sum(sizes)
    assert gemv.stream_stride(sizes[0], 1) == sizes[0]
    ws = [raw_blocks(enc, n, k, rng) for n in sizes]
    for m in (1, 2, 3, 5):             # 4 and 2 runs in lockstep, and one at a time
        parts = gemv_q8.quantize_x(rng.standard_normal((m, k)).astype(np.float32),
                                   gemv_q8.LAYOUT8[enc].off)
        offs = gemv.offsets(sizes)
        got = np.full((m, int(offs[-1])), np.nan, np.float32)
        gemv_q8.GROUP8[enc](*parts, tuple(ws), offs, got)
        for w, a, b in zip(ws, offs[:-1], offs[1:]):
            alone = np.empty((m, w.shape[0]), np.float32)
            gemv_q8.GROUP8[enc](*parts, (w,), gemv.offsets((w.shape[0],)), alone)
            assert got[:, a:b].tobytes() == alone.tobytes(), (enc, m)


def test_q8_non_finite_x_stays_in_its_row():
    """inf and NaN in one row of x make that row's outputs non-finite (no code is
    made from them) and leave the other rows as they are alone."""
    rng = np.random.default_rng(7)
    k, n = 640, 9
    data = packed_blocks("q4_0", n, k, rng)
    x = rng.standard_normal((3, k)).astype(np.float32)
    run = md.compile(_graph(k, n, data, "q4_0", 3), activations="q8")
    clean = run(x)[0]
    for bad in ([(1, 5, np.inf), (1, 300, np.nan)], [(1, 300, np.nan)], [(1, 7, -np.inf)]):
        y = x.copy()
        for i, j, v in bad:
            y[i, j] = v
        out = run(y)[0]
        assert not np.isfinite(out[1]).any(), bad
        assert out[[0, 2]].tobytes() == clean[[0, 2]].tobytes()


def test_activations_mode_is_checked_and_follows_the_environment(monkeypatch):
    rng = np.random.default_rng(3)
    k, n = 256, 16
    data = packed_blocks("q4_k", n, k, rng)
    g = _graph(k, n, data, "q4_k", 2)
    with pytest.raises(md.GraphError, match="activations must be one of 'f32', 'q8'"):
        md.compile(g, activations="int8")
    monkeypatch.setenv("MAXDECL_ACTIVATIONS", "q8")
    env = md.compile(g)
    monkeypatch.setenv("MAXDECL_ACTIVATIONS", "bf16")
    with pytest.raises(md.GraphError, match="MAXDECL_ACTIVATIONS must be one of"):
        md.compile(g)
    monkeypatch.delenv("MAXDECL_ACTIVATIONS")
    q8, f32 = md.compile(g, activations="q8"), md.compile(g)
    assert (env.activations, q8.activations, f32.activations) == ("q8", "q8", "f32")
    x = rng.standard_normal((2, k)).astype(np.float32)
    assert env(x)[0].tobytes() == q8(x)[0].tobytes() != f32(x)[0].tobytes()
    # the mode is the compiled graph's own: running one leaves the other's as it was
    assert f32(x)[0].tobytes() == md.compile(g, activations="f32")(x)[0].tobytes()
    assert os.environ.get("MAXDECL_ACTIVATIONS") is None
