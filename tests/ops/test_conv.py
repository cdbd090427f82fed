import numpy as np
import pytest
import torch
import torch.nn.functional as F

import maxdecl as md
from ophelp import close, run_op


def torch_conv(x_nchw, w_fcrs, bias, stride, dilation, padding, groups):
    """torch reference with explicit (asymmetric) padding: pad first, then conv."""
    hb, ha, wb, wa = padding
    xp = F.pad(torch.from_numpy(x_nchw), (wb, wa, hb, ha))
    b = None if bias is None else torch.from_numpy(bias)
    return F.conv2d(xp, torch.from_numpy(w_fcrs), b, stride=stride, dilation=dilation,
                    groups=groups).numpy()


def random_case(rng):
    groups = int(rng.choice([1, 1, 2, 3]))
    cg, fg = int(rng.integers(1, 4)), int(rng.integers(1, 4))
    c, f = cg * groups, fg * groups
    k = tuple(int(v) for v in rng.integers(1, 4, 2))
    stride = tuple(int(v) for v in rng.integers(1, 4, 2))
    dil = tuple(int(v) for v in rng.integers(1, 3, 2))
    pad = tuple(int(v) for v in rng.integers(0, 3, 4))
    h, w = (int(v) for v in rng.integers(max(k) * max(dil), 10, 2))
    n = int(rng.integers(1, 3))
    x = rng.standard_normal((n, c, h, w)).astype(np.float32)
    wt = rng.standard_normal((f, cg, *k)).astype(np.float32)
    bias = rng.standard_normal(f).astype(np.float32) if rng.random() < 0.5 else None
    return x, wt, bias, stride, dil, pad, groups


@pytest.mark.parametrize("seed", range(12))
@pytest.mark.parametrize("layout", ["NHWC", "NCHW"])
def test_conv2d_random_matches_torch(seed, layout):
    x, w, bias, stride, dil, pad, groups = random_case(np.random.default_rng(seed))
    ref = torch_conv(x, w, bias, stride, dil, pad, groups)
    kw = dict(stride=stride, dilation=dil, padding=pad, groups=groups)
    if layout == "NCHW":
        out = run_op(lambda a, b, c: md.ops.conv2d(a, b, bias=c, input_layout="NCHW",
                                                   filter_layout="FCRS", **kw), x, w, bias)
    else:
        out = run_op(lambda a, b, c: md.ops.conv2d(a, b, bias=c, **kw),
                     x.transpose(0, 2, 3, 1).copy(), w.transpose(2, 3, 1, 0).copy(), bias)
        out = out.transpose(0, 3, 1, 2)
    close(out, ref, atol=1e-4, label=f"seed {seed}")


@pytest.mark.parametrize("case", [
    dict(k=5, h=3, pad=(2, 2, 2, 2), stride=1),          # kernel larger than input, padded
    dict(k=2, h=9, pad=(0, 0, 0, 0), stride=3),          # stride > kernel
    dict(k=3, h=7, pad=(1, 1, 1, 1), stride=1, dw=True),  # depthwise (groups = channels)
    dict(k=3, h=8, pad=(0, 1, 2, 0), stride=2, dw=True),
])
def test_conv2d_edge_cases(rng, case):
    c = 4
    groups = c if case.get("dw") else 1
    x = rng.standard_normal((1, c, case["h"], case["h"] + 1)).astype(np.float32)
    w = rng.standard_normal((c * (2 if groups > 1 else 1), c // groups, case["k"], case["k"])
                            ).astype(np.float32)
    ref = torch_conv(x, w, None, case["stride"], 1, case["pad"], groups)
    out = run_op(lambda a, b: md.ops.conv2d(a, b, stride=case["stride"], padding=case["pad"],
                                            groups=groups, input_layout="NCHW",
                                            filter_layout="FCRS"), x, w)
    close(out, ref, atol=1e-4)


@pytest.mark.parametrize("layout", ["NDHWC", "NCDHW"])
def test_conv3d_matches_torch(rng, layout):
    x = rng.standard_normal((2, 4, 5, 6, 4)).astype(np.float32)       # NCDHW
    w = rng.standard_normal((6, 2, 2, 3, 2)).astype(np.float32)       # FCQRS, groups 2
    b = rng.standard_normal(6).astype(np.float32)
    pad = (1, 0, 0, 2, 1, 1)
    xp = F.pad(torch.from_numpy(x), (pad[4], pad[5], pad[2], pad[3], pad[0], pad[1]))
    ref = F.conv3d(xp, torch.from_numpy(w), torch.from_numpy(b), stride=(1, 2, 1),
                   dilation=(2, 1, 1), groups=2).numpy()
    kw = dict(stride=(1, 2, 1), dilation=(2, 1, 1), padding=pad, groups=2)
    if layout == "NCDHW":
        out = run_op(lambda a, f, c: md.ops.conv3d(a, f, bias=c, input_layout="NCDHW",
                                                   filter_layout="FCQRS", **kw), x, w, b)
    else:
        out = run_op(lambda a, f, c: md.ops.conv3d(a, f, bias=c, **kw),
                     x.transpose(0, 2, 3, 4, 1).copy(), w.transpose(2, 3, 4, 1, 0).copy(), b)
        out = out.transpose(0, 4, 1, 2, 3)
    close(out, ref, atol=1e-4)


def test_conv_attribute_forms_give_identical_nodes():
    g = md.Graph("t", [md.TensorType("float32", (1, 8, 8, 4)),
                       md.TensorType("float32", (3, 3, 4, 2))])
    a = md.ops.conv2d(*g.inputs, stride=2, padding=1, dilation=1)
    from maxdecl.ops._registry import apply
    b = apply("conv2d", list(g.inputs), stride=[2, 2], padding=[1, 1], input_layout="nhwc")[0]
    c = md.ops.conv2d(*g.inputs, stride=(2, 2), padding=(1, 1, 1, 1))
    assert a.node.attrs == b.node.attrs == c.node.attrs
    assert a.node.attrs["padding"] == (1, 1, 1, 1) and a.shape == (1, 4, 4, 2)


def test_conv_channel_mismatch_message():
    g = md.Graph("t", [md.TensorType("float32", (1, 8, 8, 5)),
                       md.TensorType("float32", (3, 3, 4, 2))])
    with g.layer("stem"):
        with pytest.raises(md.GraphError, match=r"stem: conv2d: .*C=5 channels.*C/groups=4"):
            md.ops.conv2d(*g.inputs)
    with pytest.raises(md.GraphError, match="does not fit input size 8"):
        md.ops.conv2d(*g.inputs[:1], np.zeros((11, 3, 5, 2), np.float32))


@pytest.mark.parametrize("op", ["conv2d", "max_pool", "avg_pool"])
def test_window_that_does_not_fit_symbolic_dims_is_reported_at_run(op):
    """H and W symbolic: a window too large for the input the graph gets is an error when
    it runs (torch raises too), never an empty output."""
    g = md.Graph("t", [md.TensorType("float32", (1, "h", "w", 4))])
    with g.layer("down"):
        if op == "conv2d":
            y = md.ops.conv2d(g.inputs[0], np.ones((2, 2, 4, 4), np.float32), stride=(2, 2))
        else:
            y = getattr(md.ops, op)(g.inputs[0], kernel_size=(3, 3), stride=(2, 2))
    g.output(y)
    assert g.execute(np.ones((1, 5, 4, 4), np.float32))[0].shape[:3] == (1, 2, 2 if op ==
                                                                               "conv2d" else 1)
    with pytest.raises(md.GraphError, match=r"down: .*does not fit input size 1"):
        g.execute(np.ones((1, 1, 6, 4), np.float32))


def test_conv2d_float16_keeps_dtype(rng):
    x = rng.standard_normal((1, 5, 5, 3)).astype(np.float16)
    w = rng.standard_normal((3, 3, 3, 2)).astype(np.float16)
    out = run_op(lambda a, b: md.ops.conv2d(a, b, padding=1), x, w)
    assert out.dtype == np.float16 and out.shape == (1, 5, 5, 2)
    ref = torch_conv(x.astype(np.float32).transpose(0, 3, 1, 2).copy(),
                     w.astype(np.float32).transpose(3, 2, 0, 1).copy(), None, 1, 1, (1,) * 4, 1)
    close(out.transpose(0, 3, 1, 2), ref, atol=2e-2, rtol=2e-2)


def _tf_same_pads(n, k, s, d=1):
    """TF's SAME: the output ceil(n / s), the odd pixel of padding after."""
    total = max((-(-n // s) - 1) * s + d * (k - 1) + 1 - n, 0)
    return total // 2, total - total // 2


@pytest.mark.parametrize("h, w, k, s, d", [(7, 8, 3, 2, 1), (9, 6, 4, 2, 1), (5, 5, 3, 1, 2),
                                           (10, 11, 5, 3, 1), (4, 4, 1, 2, 1)])
def test_conv2d_same_padding_matches_tf_rule_over_symbolic_sizes(h, w, k, s, d):
    """padding: same over symbolic H, W (sized when the node runs): torch's conv2d on the
    input padded by TF's rule; at stride 1 it is torch's own padding='same'."""
    rng = np.random.default_rng(h * w + k)
    x = rng.standard_normal((1, 3, h, w)).astype(np.float32)
    wt = rng.standard_normal((4, 3, k, k)).astype(np.float32)
    g = md.Graph("t", [md.TensorType("float32", (1, 3, "h", "w")),
                       md.TensorType("float32", wt.shape)])
    y = md.ops.conv2d(g.inputs[0], g.inputs[1], stride=s, dilation=d, padding="same",
                      input_layout="NCHW", filter_layout="FCRS")
    assert y.type.shape[2] == ("h" if s == 1 else f"same(h,{s})")
    g.output(y)
    (ph0, ph1), (pw0, pw1) = _tf_same_pads(h, k, s, d), _tf_same_pads(w, k, s, d)
    xt, wtt = torch.from_numpy(x), torch.from_numpy(wt)
    ref = F.conv2d(F.pad(xt, (pw0, pw1, ph0, ph1)), wtt, stride=s, dilation=d)
    if s == 1:
        torch.testing.assert_close(F.conv2d(xt, wtt, padding="same", dilation=d), ref)
    close(g.execute(x, wt)[0], ref.numpy(), atol=1e-5)
