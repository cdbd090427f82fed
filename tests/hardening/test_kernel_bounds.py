"""Kernel wrappers refuse inputs their loops would read past (a ValueError before the
njit kernel runs), and a graph run reports it as a GraphError at the node."""

import numpy as np
import pytest

import maxdecl as md
from maxdecl.kernels import attention as katt
from maxdecl.kernels import block_rows, conv, pool, qmatmul, rope

F = np.float32


def rnd(*shape, seed=0):
    return np.random.default_rng(seed).standard_normal(shape).astype(F)


@pytest.mark.parametrize("x_shape, pos, dim, factors, match", [
    ((4, 2, 8), np.arange(2), 8, None, "positions"),              # positions shorter than seq
    ((4, 2, 8), np.arange(9), 8, None, "positions"),
    ((4, 2, 8), np.arange(4).reshape(2, 2), 8, None, "positions"),
    ((4, 2, 8), np.arange(4), 10, None, "rotated dims"),          # rotates past head_dim
    ((4, 2, 8), np.arange(4), 8, np.ones(3, F), "freq_factors"),  # one factor short
    ((8,), np.arange(8), 8, None, "x must be"),
])
def test_rope_refuses(x_shape, pos, dim, factors, match):
    with pytest.raises(ValueError, match=match):
        rope.rope(rnd(*x_shape), pos, 10000.0, False, 1.0, dim, factors)


def test_rope_accepts_matching_inputs():
    out = rope.rope(rnd(1, 4, 2, 8), np.arange(4), 10000.0, True, 1.0, 8, np.ones(4, F))
    assert out.shape == (1, 4, 2, 8) and np.isfinite(out).all()


@pytest.mark.parametrize("rows", [1, 7])          # both kernels: few rows and transposed
@pytest.mark.parametrize("k_shape, v_shape, slopes, match", [
    ((1, 6, 2, 8), (1, 3, 2, 8), None, "same length"),      # v shorter than k
    ((1, 6, 2, 8), (1, 6, 1, 8), None, "heads"),            # v has fewer heads
    ((1, 6, 2, 4), (1, 6, 2, 8), None, "head_dim"),         # k head_dim != q head_dim
    ((1, 6, 3, 8), (1, 6, 3, 8), None, "multiple"),         # 4 query heads over 3 kv heads
    ((2, 6, 2, 8), (2, 6, 2, 8), None, "batch"),
    ((1, 6, 2, 8), (1, 6, 2, 8), [0.5, 0.25], "slopes"),    # 2 slopes for 4 heads
    ((6, 2, 8), (6, 2, 8), None, "must be"),
])
def test_attention_refuses(rows, k_shape, v_shape, slopes, match):
    q = rnd(1, rows, 4, 8)
    with pytest.raises(ValueError, match=match):
        katt.attention(q, rnd(*k_shape, seed=1), rnd(*v_shape, seed=2), 0.3, True, 0, slopes,
                       0.0, 6 - rows)


@pytest.mark.parametrize("rows", [1, 7])
def test_attention_accepts_matching_inputs(rows):
    out = katt.attention(rnd(1, rows, 4, 8), rnd(1, 9, 2, 8), rnd(1, 9, 2, 5), 0.3, True, 0,
                         None, 0.0, 9 - rows)
    assert out.shape == (1, rows, 4, 5) and np.isfinite(out).all()


@pytest.mark.parametrize("enc", sorted(qmatmul.LAYOUTS))
@pytest.mark.parametrize("m", [1, 3])
def test_qmatmul_bytes_must_match_shape(enc, m):
    be, bb = qmatmul.LAYOUTS[enc]
    k = 256
    good = np.zeros((4, k // be * bb), np.uint8)
    x = rnd(m, k)
    for w in (good[:, :-1], np.zeros((4, k // be * bb + bb), np.uint8), good.reshape(-1)):
        with pytest.raises(ValueError, match="qmatmul"):
            qmatmul.qmatmul_blocks(x, np.ascontiguousarray(w), enc)
    with pytest.raises(ValueError, match="qmatmul"):
        qmatmul.qmatmul_blocks(rnd(m, k + be), good, enc)
    if enc != "bf16":      # all-zero bf16 bytes are zeros; others: zero scales give zeros
        assert np.all(qmatmul.qmatmul_blocks(x, good, enc) == 0)


def test_dequantize_rows_in_range():
    w = np.zeros((4, 18), np.uint8)
    assert block_rows.dequantize_rows(w, "q4_0", 32, 1, 3).shape == (2, 32)
    for r0, r1 in ((0, 5), (3, 2), (-1, 2)):
        with pytest.raises(ValueError, match="rows"):
            block_rows.dequantize_rows(w, "q4_0", 32, r0, r1)
    with pytest.raises(ValueError):
        block_rows.dequantize_rows(w, "q4_0", 64, 0, 1)


def test_max_pool_padding_over_half_kernel_is_an_error_as_in_torch():
    torch = pytest.importorskip("torch")
    x = rnd(1, 5, 5, 2)
    with pytest.raises(RuntimeError, match="pad should be at most half"):
        torch.nn.functional.max_pool2d(torch.from_numpy(x).permute(0, 3, 1, 2), 2, 1, 2)
    with pytest.raises(ValueError, match="padding only"):
        pool.max_pool_nhwc(x, (2, 2), (1, 1), (1, 1), (2, 2, 2, 2), (8, 8))
    with pytest.raises(ValueError, match="padding only"):     # dilation skips the image
        pool.max_pool_nhwc(x, (2, 2), (1, 1), (9, 9), (2, 0, 0, 0), (1, 5))
    # ONNX allows pads up to kernel - 1 (test_maxpool_2d_pads): every window still sees
    # the image, so it is no error and no cell is -inf
    out = pool.max_pool_nhwc(x, (3, 3), (1, 1), (1, 1), (2, 2, 2, 2), (7, 7))
    assert np.isfinite(out).all()
    # at the limit, torch and the kernel agree and no cell is -inf
    want = torch.nn.functional.max_pool2d(torch.from_numpy(x).permute(0, 3, 1, 2), 3, 1, 1)
    got = pool.max_pool_nhwc(x, (3, 3), (1, 1), (1, 1), (1, 1, 1, 1), (5, 5))
    np.testing.assert_array_equal(got, want.permute(0, 2, 3, 1).numpy())
    assert np.isfinite(got).all()


def test_max_pool_op_refuses_large_padding():
    x = md.Graph("p", input_types=[md.TensorType(md.DType.float32, (1, 5, 5, 2))])
    with pytest.raises(md.GraphError, match="padding"):    # the type rule refuses it
        with x:
            y = md.ops.max_pool(x.inputs[0], kernel_size=2, stride=1, padding=2)
            x.output(y)
            x.execute(rnd(1, 5, 5, 2))


@pytest.mark.parametrize("kw", [
    dict(kernel=(0, 2)), dict(stride=(1, 0)), dict(dilation=(0, 1)),
    dict(padding=(-1, 0, 0, 0)), dict(padding=(0, 0)), dict(outs=(-1, 2)),
])
def test_pool_window_parameters(kw):
    args = dict(kernel=(2, 2), stride=(1, 1), dilation=(1, 1), padding=(0, 0, 0, 0),
                outs=(4, 4))
    args.update(kw)
    for fn in (pool.max_pool_nhwc,
               lambda x, k, s, d, p, o: pool.avg_pool_nhwc(x, k, s, d, p, True, o)):
        with pytest.raises(ValueError):
            fn(rnd(1, 5, 5, 2), args["kernel"], args["stride"], args["dilation"],
               args["padding"], args["outs"])
    with pytest.raises(ValueError, match="x must be"):
        pool.max_pool_nhwc(rnd(5, 5, 2), (2, 2), (1, 1), (1, 1), (0, 0, 0, 0), (4, 4))


@pytest.mark.parametrize("w_shape, groups, bias", [
    ((1, 1, 1, 3, 4), 1, None),          # w takes 3 channels, x has 4
    ((1, 1, 1, 2, 3), 2, None),          # 3 filters over 2 groups
    ((1, 1, 1, 4, 4), 1, np.ones(3, F)),  # bias of the wrong size
    ((1, 1, 1, 1, 4), 0, None),
])
def test_conv_channels(w_shape, groups, bias):
    with pytest.raises(ValueError, match="conv"):
        conv.conv3d_ndhwc(rnd(1, 1, 3, 3, 4), rnd(*w_shape), (1, 1, 1), (1, 1, 1), (0,) * 6,
                          groups, (1, 3, 3), bias)


def test_runtime_out_of_bounds_is_a_graph_error_at_the_node():
    """Symbolic dims let a graph build; a run with inconsistent sizes must not read out of
    bounds but fail with a GraphError naming the node."""
    f32, i64 = md.DType.float32, md.DType.int64
    g = md.Graph("r", input_types=[md.TensorType(f32, ("seq", 2, 8)),
                                   md.TensorType(i64, ("n",))])
    with g:
        with g.layer("blk.0.rope"):
            y = md.ops.rope(g.inputs[0], g.inputs[1], theta=10000.0)
        g.output(y)
    ok = g.execute(rnd(4, 2, 8), np.arange(4))[0]
    assert ok.shape == (4, 2, 8)
    with pytest.raises(md.GraphError, match="blk.0.rope") as e:
        g.execute(rnd(400, 2, 8), np.arange(4))
    assert "positions" in str(e.value)


def test_embedding_ids_out_of_range():
    g = md.Graph("e", input_types=[md.TensorType(md.DType.int64, ("n",))])
    with g:
        table = g.constant(rnd(5, 3))
        g.output(md.ops.embedding(table, g.inputs[0]))
    assert g.execute(np.array([0, 4]))[0].shape == (2, 3)
    for ids in ([5], [-1], [2**40]):
        with pytest.raises(md.GraphError, match="out of range"):
            g.execute(np.array(ids))


@pytest.mark.parametrize("v_len, past", [(2, 5), (4, 5), (2, 0)])
def test_attention_v_shorter_than_k_at_run_time(v_len, past):
    """k and v lengths are separate symbolic dims, so the graph builds; a run where v is
    shorter or longer than k is a GraphError at the node, never an out-of-bounds read.
    (Head and cache mismatches are refused when the graph is built, and by the kernel
    wrapper: test_attention_refuses.)"""
    f32 = md.DType.float32
    g = md.Graph("a", input_types=[md.TensorType(f32, ("s", 4, 8)),
                                   md.TensorType(f32, ("s", 2, 8)),
                                   md.TensorType(f32, ("t", 2, 8)),
                                   md.TensorType(f32, (2, "p", 2, 8))])
    with g:
        with g.layer("blk.0.attn"):
            out, cache = md.ops.attention(*g.inputs[:3], kv_cache=g.inputs[3])
        g.output(out, cache)
    ok = g.execute(rnd(3, 4, 8), rnd(3, 2, 8), rnd(3, 2, 8), rnd(2, past, 2, 8))
    assert ok[0].shape == (3, 4, 8) and ok[1].shape == (2, past + 3, 2, 8)
    with pytest.raises(md.GraphError, match="blk.0.attn"):
        g.execute(rnd(3, 4, 8), rnd(3, 2, 8), rnd(v_len, 2, 8), rnd(2, past, 2, 8))


def test_kv_cache_append_refuses_v_of_another_length():
    """v of one row is not broadcast into a cache of k's rows (a wrong cache, silently)."""
    g = md.Graph("t", [md.TensorType("float32", ("s", 2, 8)), md.TensorType("float32", ("s", 2, 8)),
                       md.TensorType("float32", ("t", 2, 8)),
                       md.TensorType("float32", (2, "p", 2, 8))])
    out, cache = md.ops.attention(*g.inputs[:3], kv_cache=g.inputs[3])
    g.output(out, cache)
    with pytest.raises(md.GraphError, match="needs k and v of one shape"):
        g.execute(rnd(3, 2, 8), rnd(3, 2, 8), rnd(1, 2, 8), np.zeros((2, 0, 2, 8), np.float32))


@pytest.mark.parametrize("rows", [1, 20])         # the few-rows and the blocked kernel
def test_attention_sinks_of_another_head_count_are_refused(rows):
    q, k, v = rnd(1, rows, 4, 8), rnd(1, 20, 2, 8, seed=1), rnd(1, 20, 2, 8, seed=2)
    with pytest.raises(ValueError):
        katt.attention(q, k, v, 0.3, True, None, None, None, 0, np.zeros(3, F))
    from maxdecl.kernels import attention_rows as ar
    with pytest.raises(ValueError, match="sink logits for 4 query heads"):
        ar.attention_rows([q[0, :1]], [k[0]], [v[0]], 0.3, True, None, None, None,
                          np.zeros(5, F))


@pytest.mark.parametrize("a_shape, x_shape, state_shape", [
    ((5, 4), (5, 3), None), ((5, 4), (5, 4), (3,)), ((2, 5, 4), (2, 5, 4), (4,))])
def test_linear_scan_refuses_mismatched_shapes(a_shape, x_shape, state_shape):
    from maxdecl.kernels.ssm import RUN

    args = [rnd(*a_shape), rnd(*x_shape)] + ([rnd(*state_shape)] if state_shape else [])
    with pytest.raises(ValueError, match="linear_scan"):
        RUN["linear_scan"](args, {})
