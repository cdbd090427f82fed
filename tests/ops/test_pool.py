import numpy as np
import pytest
import torch
import torch.nn.functional as F

import maxdecl as md
from maxdecl.ops.pool import window
from ophelp import close, run_op


def nhwc(a):
    return np.ascontiguousarray(a.transpose(0, 2, 3, 1))


def nchw(a):
    return np.ascontiguousarray(a.transpose(0, 3, 1, 2))


def naive_pool(x, k, s, d, pad, ceil_mode, mode, count_boundary=True):
    """Obviously-correct NumPy reference on NHWC input (the op's definition)."""
    from maxdecl.ops.conv import window_out_size
    n, h, w, c = x.shape
    oh = window_out_size(h, k[0], s[0], d[0], pad[0], pad[1], ceil_mode)
    ow = window_out_size(w, k[1], s[1], d[1], pad[2], pad[3], ceil_mode)
    out = np.zeros((n, oh, ow, c), np.float64)
    for i in range(oh):
        for j in range(ow):
            hs = [i * s[0] - pad[0] + r * d[0] for r in range(k[0])]
            ws = [j * s[1] - pad[2] + t * d[1] for t in range(k[1])]
            hin = [y for y in hs if 0 <= y < h]
            win = [z for z in ws if 0 <= z < w]
            taps = x[:, hin][:, :, win].reshape(n, -1, c)
            if mode == "max":
                out[:, i, j] = taps.max(1) if taps.shape[1] else -np.inf
            else:
                if count_boundary:
                    cnt = (sum(-pad[0] <= y < h + pad[1] for y in hs)
                           * sum(-pad[2] <= z < w + pad[3] for z in ws))
                else:
                    cnt = len(hin) * len(win)
                out[:, i, j] = taps.sum(1) / cnt if cnt else 0
    return out


@pytest.mark.parametrize("seed", range(10))
def test_pools_match_torch(seed):
    rng = np.random.default_rng(seed)
    k = int(rng.integers(1, 5))
    s = int(rng.integers(1, 4))
    p = int(rng.integers(0, k // 2 + 1))       # torch allows pad <= k/2
    ceil = bool(rng.integers(0, 2))
    cip = bool(rng.integers(0, 2))
    h, w = (int(v) for v in rng.integers(k, 11, 2))
    x = rng.standard_normal((2, 3, h, w)).astype(np.float32)
    t = torch.from_numpy(x)
    ref = F.avg_pool2d(t, k, s, p, ceil_mode=ceil, count_include_pad=cip).numpy()
    out = run_op(lambda v: md.ops.avg_pool(v, k, stride=s, padding=p, ceil_mode=ceil,
                                           count_boundary=cip), nhwc(x))
    close(nchw(out), ref, atol=1e-5, label=f"avg k{k} s{s} p{p} ceil{ceil} cip{cip}")
    d = int(rng.integers(1, 3))
    if (k - 1) * d + 1 <= min(h, w) + 2 * p:
        ref = F.max_pool2d(t, k, s, p, dilation=d, ceil_mode=ceil).numpy()
        out = run_op(lambda v: md.ops.max_pool(v, k, stride=s, padding=p, dilation=d,
                                               ceil_mode=ceil), nhwc(x))
        close(nchw(out), ref, label=f"max k{k} s{s} p{p} d{d} ceil{ceil}")


def test_ceil_mode_drops_window_starting_in_padding(rng):
    # torch: 5 + 1 padding, k=2, s=2, ceil: the 4th window would start at 6 = in padding
    x = rng.standard_normal((1, 1, 5, 5)).astype(np.float32)
    ref = F.avg_pool2d(torch.from_numpy(x), 2, 2, 1, ceil_mode=True).numpy()
    out = run_op(lambda v: md.ops.avg_pool(v, 2, stride=2, padding=1, ceil_mode=True), nhwc(x))
    assert out.shape == (1, 3, 3, 1) == nhwc(ref).shape
    close(nchw(out), ref, atol=1e-6)


@pytest.mark.parametrize("cb", [True, False])
def test_asymmetric_padding_and_dilation_match_reference(rng, cb):
    x = rng.standard_normal((2, 7, 6, 3)).astype(np.float32)
    kw = dict(kernel_size=(3, 2), stride=(2, 1), dilation=(2, 1), padding=(0, 2, 1, 0),
              ceil_mode=True)
    out = run_op(lambda v: md.ops.avg_pool(v, count_boundary=cb, **kw), x)
    ref = naive_pool(x, (3, 2), (2, 1), (2, 1), (0, 2, 1, 0), True, "avg", cb)
    close(out, ref, atol=1e-5)
    out = run_op(lambda v: md.ops.max_pool(v, **kw), x)
    close(out, naive_pool(x, (3, 2), (2, 1), (2, 1), (0, 2, 1, 0), True, "max"))


def test_max_pool_integers_and_nan():
    x = np.arange(16, dtype=np.uint8).reshape(1, 4, 4, 1)
    out = run_op(lambda v: md.ops.max_pool(v, 2, stride=2), x)
    assert out.dtype == np.uint8 and out[0, :, :, 0].tolist() == [[5, 7], [13, 15]]
    y = np.zeros((1, 2, 2, 1), np.float32)
    y[0, 0, 1, 0] = np.nan
    assert np.isnan(run_op(lambda v: md.ops.max_pool(v, 2), y)).all()


def test_pool_attribute_forms():
    g = md.Graph("t", [md.TensorType("float32", (1, 9, 9, 2))])
    a = md.ops.avg_pool(g.inputs[0], 3, stride=2, padding=1)
    b = md.ops.avg_pool(g.inputs[0], (3, 3), stride=(2, 2), padding=(1, 1, 1, 1))
    c = md.ops.avg_pool(g.inputs[0], [3, 3], stride=[2, 2], padding=[1, 1])
    assert b.node.attrs == c.node.attrs and b.node.attrs["padding"] == (1, 1, 1, 1)
    assert window(a.node.attrs, 2) == window(b.node.attrs, 2) == ((3, 3), (2, 2), (1, 1),
                                                                 (1, 1, 1, 1))
    assert a.shape == b.shape == (1, 5, 5, 2)
    with pytest.raises(md.GraphError, match=r"NLC \(rank 3\), NHWC \(rank 4\) or NDHWC"):
        md.ops.max_pool(md.ops.reshape(g.inputs[0], (81, 2)), 2)


@pytest.mark.parametrize("h, w, k, s", [(7, 8, 3, 2), (9, 6, 4, 2), (5, 5, 3, 1), (4, 7, 2, 3)])
def test_pools_same_padding_match_tf_rule(h, w, k, s):
    """padding: same: max pool over -inf padding, average pool counting only real pixels
    (TF's, count_boundary false), each padded by TF's rule (odd pixel after)."""
    def pads(n):
        total = max((-(-n // s) - 1) * s + k - n, 0)
        return total // 2, total - total // 2
    x = np.random.default_rng(h + w).standard_normal((2, h, w, 3)).astype(np.float32)
    (ph0, ph1), (pw0, pw1) = pads(h), pads(w)
    xt = torch.from_numpy(x).permute(0, 3, 1, 2)
    ref_max = F.max_pool2d(F.pad(xt, (pw0, pw1, ph0, ph1), value=-np.inf), k, s)
    ones = F.pad(torch.ones_like(xt), (pw0, pw1, ph0, ph1))
    ref_avg = (F.avg_pool2d(F.pad(xt, (pw0, pw1, ph0, ph1)), k, s)
               / F.avg_pool2d(ones, k, s))
    got_max = run_op(lambda v: md.ops.max_pool(v, k, stride=s, padding="same"), x)
    got_avg = run_op(lambda v: md.ops.avg_pool(v, k, stride=s, padding="same",
                                               count_boundary=False), x)
    close(got_max, ref_max.permute(0, 2, 3, 1).numpy())
    close(got_avg, ref_avg.permute(0, 2, 3, 1).numpy(), atol=1e-5)


_ADAPTIVE = {1: (F.adaptive_avg_pool1d, F.adaptive_max_pool1d),
             2: (F.adaptive_avg_pool2d, F.adaptive_max_pool2d),
             3: (F.adaptive_avg_pool3d, F.adaptive_max_pool3d)}


@pytest.mark.parametrize("shape, size", [
    ((2, 10, 7, 3), 7),              # PVTv2's pool to 7 x 7: windows overlap along W
    ((2, 5, 3), 4),                  # 1-D (NLC)
    ((1, 4, 9, 6, 2), (2, None, 4)),  # 3-D, one dim kept
    ((2, 13, 13, 4), (3, 5)),
    ((2, 3, 3, 2), 1),               # global pooling
    ((1, 2, 3, 5), (6, 1)),          # more cells than inputs: windows repeat
])
@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_adaptive_pools_match_torch(shape, size, dtype, rng):
    x = rng.standard_normal(shape).astype(dtype)
    avg, mx = run_op(lambda v: (md.ops.adaptive_avg_pool(v, output_size=size),
                                md.ops.adaptive_max_pool(v, output_size=size)), x)
    t = torch.from_numpy(np.ascontiguousarray(np.moveaxis(x.astype(np.float32), -1, 1)))
    f_avg, f_max = _ADAPTIVE[len(shape) - 2]
    want_avg = np.moveaxis(f_avg(t, size).numpy(), 1, -1)
    want_max = np.moveaxis(f_max(t, size).numpy(), 1, -1)
    assert avg.dtype == mx.dtype == dtype
    tol = 1e-6 if dtype == np.float32 else 1e-3
    close(avg, want_avg, atol=tol, rtol=tol, label=f"adaptive_avg_pool {shape} {size}")
    close(mx, want_max, atol=0, rtol=0, label=f"adaptive_max_pool {shape} {size}")


def test_adaptive_pools_keep_ints_and_symbolic_dims():
    x = np.arange(2 * 6 * 1, dtype=np.int64).reshape(2, 6, 1)
    np.testing.assert_array_equal(run_op(lambda v: md.ops.adaptive_max_pool(v, output_size=2),
                                         x)[:, :, 0], [[2, 5], [8, 11]])
    g = md.Graph("t", [md.TensorType("float32", ("n", "h", "w", 4))])
    y = md.ops.adaptive_avg_pool(g.inputs[0], output_size=(None, 3))
    assert y.shape == ("n", "h", 3, 4)


@pytest.mark.parametrize("shape, dtype, attrs, fragment", [
    ((2, 4), "float32", {"output_size": 1}, r"NLC \(rank 3\), NHWC \(rank 4\) or NDHWC"),
    ((1, 4, 4, 2), "int64", {"output_size": 2}, "float"),
    ((1, 4, 4, 2), "bool", {"output_size": 2}, None),
    ((1, 4, 4, 2), "float32", {"output_size": (2, 2, 2)}, "3 values for 2 spatial dims"),
    ((1, 4, 4, 2), "float32", {"output_size": 0}, "positive int"),
    ((1, 0, 4, 2), "float32", {"output_size": 1}, "empty spatial dim"),
])
def test_adaptive_pools_refuse_what_torch_refuses(shape, dtype, attrs, fragment):
    g = md.Graph("t", [md.TensorType(dtype, shape)])
    op = md.ops.adaptive_max_pool if dtype == "bool" else md.ops.adaptive_avg_pool
    with pytest.raises(md.GraphError, match=fragment or "bool"):
        op(g.inputs[0], **attrs)


@pytest.mark.parametrize("k, s, p, ceil", [(3, 2, 1, False), (4, 1, 2, True), (2, 2, 0, False),
                                           (5, 3, 2, True)])
def test_one_d_pools_match_torch(k, s, p, ceil, rng):
    """NLC input: torch's avg_pool1d / max_pool1d (with indices), window attributes as
    ints or one-element lists."""
    x = rng.standard_normal((2, 11, 3)).astype(np.float32)
    avg, mx, idx = run_op(lambda v: (
        md.ops.avg_pool(v, k, stride=[s], padding=[p], ceil_mode=ceil),
        *md.ops.max_pool(v, k, stride=s, padding=p, ceil_mode=ceil, return_indices=True)), x)
    t = torch.from_numpy(np.ascontiguousarray(np.moveaxis(x, -1, 1)))
    want_max, want_idx = F.max_pool1d(t, k, s, p, ceil_mode=ceil, return_indices=True)
    close(avg, np.moveaxis(F.avg_pool1d(t, k, s, p, ceil_mode=ceil).numpy(), 1, -1),
          atol=1e-6)
    close(mx, np.moveaxis(want_max.numpy(), 1, -1), atol=0, rtol=0)
    np.testing.assert_array_equal(idx, np.moveaxis(want_idx.numpy(), 1, -1))
