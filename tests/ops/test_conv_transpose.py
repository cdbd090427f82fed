"""conv_transpose against torch's conv_transpose2d/3d (NCHW and NHWC layouts, groups,
dilation, stride, output_padding, asymmetric padding), its type rule's failures, and a
spec that uses it."""

from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import maxdecl as md
from ophelp import close, run_op

CASES = Path(__file__).parents[1] / "spec" / "cases"


def torch_ref(x, w, bias, stride, dilation, pads, extra, groups):
    """NC... reference with (before, after) padding per dim: torch's full result (no
    padding), zero-extended at the end, then sliced; bias added last."""
    nd = x.ndim - 2
    fn = F.conv_transpose2d if nd == 2 else F.conv_transpose3d
    full = fn(torch.from_numpy(x), torch.from_numpy(w), stride=stride, dilation=dilation,
              groups=groups).numpy()
    sizes = [(x.shape[2 + i] - 1) * stride[i] - pads[2 * i] - pads[2 * i + 1]
             + dilation[i] * (w.shape[2 + i] - 1) + 1 + extra[i] for i in range(nd)]
    grow = [(0, 0), (0, 0)] + [(0, max(0, pads[2 * i] + sizes[i] - full.shape[2 + i]))
                               for i in range(nd)]
    full = np.pad(full, grow)
    out = full[(slice(None), slice(None))
               + tuple(slice(pads[2 * i], pads[2 * i] + sizes[i]) for i in range(nd))]
    if bias is not None:
        out = out + bias.reshape(1, -1, *[1] * nd)
    return out


def random_case(rng, nd):
    groups = int(rng.choice([1, 1, 2, 3]))
    cg, fg = int(rng.integers(1, 4)), int(rng.integers(1, 4))
    k = [int(v) for v in rng.integers(1, 4, nd)]
    stride = [int(v) for v in rng.integers(1, 4, nd)]
    dil = [int(v) for v in rng.integers(1, 3, nd)]
    extra = [int(rng.integers(0, max(s, d))) for s, d in zip(stride, dil)]
    size = [int(v) for v in rng.integers(1, 6 if nd == 2 else 4, nd)]
    pads = []
    for i in range(nd):      # keep the output at least 1 long
        room = (size[i] - 1) * stride[i] + dil[i] * (k[i] - 1) + extra[i]
        b = int(rng.integers(0, min(room, 3) + 1))
        pads += [b, int(rng.integers(0, min(room - b, 3) + 1))]
    x = rng.standard_normal((int(rng.integers(1, 3)), cg * groups, *size)).astype(np.float32)
    w = rng.standard_normal((cg * groups, fg, *k)).astype(np.float32)
    bias = rng.standard_normal(fg * groups).astype(np.float32) if rng.random() < 0.5 else None
    return x, w, bias, stride, dil, pads, extra, groups


def channels_last(a):
    return np.ascontiguousarray(np.moveaxis(a, 1, -1))


def filter_channels_last(w):
    """torch [C_in, C_out/groups, k...] -> [k..., C_out/groups, C_in]."""
    return np.ascontiguousarray(np.moveaxis(np.moveaxis(w, 0, -1), 0, -2))


@pytest.mark.parametrize("nd", [2, 3])
@pytest.mark.parametrize("seed", range(10))
def test_conv_transpose_random_matches_torch(seed, nd):
    x, w, bias, stride, dil, pads, extra, groups = random_case(np.random.default_rng(seed), nd)
    ref = torch_ref(x, w, bias, stride, dil, pads, extra, groups)
    kw = dict(stride=stride, dilation=dil, padding=pads, output_padding=extra, groups=groups)
    first = "NCHW" if nd == 2 else "NCDHW"
    out = run_op(lambda a, f, b: md.ops.conv_transpose(a, f, bias=b, input_layout=first, **kw),
                 x, w, bias)
    close(out, ref, atol=1e-4, label=f"{first} seed {seed}")
    out = run_op(lambda a, f, b: md.ops.conv_transpose(a, f, bias=b, **kw),
                 channels_last(x), filter_channels_last(w), bias)
    close(np.moveaxis(out, -1, 1), ref, atol=1e-4, label=f"channels-last seed {seed}")
    # layouts mixed: channels-last values with torch's filter, and the other way round
    torch_filter = "CFRS" if nd == 2 else "CFQRS"
    out = run_op(lambda a, f, b: md.ops.conv_transpose(a, f, bias=b, filter_layout=torch_filter,
                                                       **kw), channels_last(x), w, bias)
    close(np.moveaxis(out, -1, 1), ref, atol=1e-4, label=f"NHWC + torch filter seed {seed}")
    last_filter = "RSFC" if nd == 2 else "QRSFC"
    out = run_op(lambda a, f, b: md.ops.conv_transpose(a, f, bias=b, input_layout=first,
                                                       filter_layout=last_filter, **kw),
                 x, filter_channels_last(w), bias)
    close(out, ref, atol=1e-4, label=f"{first} + channels-last filter seed {seed}")


@pytest.mark.parametrize("nd", [2, 3])
def test_symmetric_padding_is_torchs_own(rng, nd):
    """The slicing reference agrees with torch's padding / output_padding arguments."""
    x = rng.standard_normal((2, 4, *[4] * nd)).astype(np.float32)
    w = rng.standard_normal((4, 3, *[3] * nd)).astype(np.float32)
    b = rng.standard_normal(6).astype(np.float32)
    fn = F.conv_transpose2d if nd == 2 else F.conv_transpose3d
    ref = fn(torch.from_numpy(x), torch.from_numpy(w), torch.from_numpy(b), stride=2, padding=1,
             output_padding=1, groups=2, dilation=2).numpy()
    sliced = torch_ref(x, w, b, [2] * nd, [2] * nd, [1] * (2 * nd), [1] * nd, 2)
    close(sliced, ref, atol=1e-4)
    out = run_op(lambda a, f, c: md.ops.conv_transpose(
        a, f, bias=c, stride=2, padding=1, output_padding=1, groups=2, dilation=2,
        input_layout="NCHW" if nd == 2 else "NCDHW"), x, w, b)
    close(out, ref, atol=1e-4)


def test_float16_keeps_dtype_and_rank5_reads_nhwc_as_ndhwc(rng):
    x = rng.standard_normal((1, 2, 3, 3, 4)).astype(np.float16)
    w = rng.standard_normal((2, 2, 2, 5, 4)).astype(np.float16)
    out = run_op(lambda a, f: md.ops.conv_transpose(a, f, stride=2), x, w)
    same = run_op(lambda a, f: md.ops.conv_transpose(a, f, stride=2, input_layout="NDHWC"), x, w)
    assert out.dtype == np.float16 and out.shape == (1, 4, 6, 6, 5)
    ref = F.conv_transpose3d(torch.from_numpy(np.moveaxis(x, -1, 1).astype(np.float32)),
                             torch.from_numpy(np.moveaxis(w, (3, 4), (1, 0)).astype(np.float32)
                                              .copy()), stride=2).numpy()
    close(np.moveaxis(out, -1, 1), ref, atol=2e-2, rtol=2e-2)
    assert np.array_equal(out, same)


def test_symbolic_input_dim_gives_a_polynomial():
    g = md.Graph("t", [md.TensorType("float32", (1, "h", 5, 4)),
                       md.TensorType("float32", (3, 3, 2, 4))])
    y = md.ops.conv_transpose(*g.inputs, stride=2, padding=(1, 0, 1, 1), output_padding=1)
    assert y.shape == (1, "2*h+1", 10, 2)
    g.output(y)
    (out,) = g.execute(np.ones((1, 3, 5, 4), np.float32), np.ones((3, 3, 2, 4), np.float32))
    assert out.shape == (1, 7, 10, 2)


def test_attribute_forms():
    g = md.Graph("t", [md.TensorType("float32", (1, 4, 4, 2)),
                       md.TensorType("float32", (3, 3, 1, 2))])
    from maxdecl.ops._registry import apply
    a = md.ops.conv_transpose(*g.inputs, stride=[2, 2], padding=[1, 1], input_layout="nhwc")
    b = apply("conv_transpose", list(g.inputs), stride=(2, 2), padding=(1, 1, 1, 1))[0]
    assert a.node.attrs == b.node.attrs and a.node.attrs["input_layout"] == "NHWC"
    assert a.shape == (1, 7, 7, 1)


@pytest.mark.parametrize("x,w,kw,match", [
    ((1, 4, 4, 3), (3, 3, 2, 4), {}, r"C=3 channels but filter\[3, 3, 2, 4\] takes C_in=4"),
    ((1, 4, 4, 3), (3, 3, 2, 3), {"groups": 2}, r"C_in=3 is not divisible by groups=2"),
    ((1, 4, 4, 4), (3, 3, 2, 4), {"stride": 2, "output_padding": 2},
     r"output_padding 2 of spatial dim 0 must be smaller than its stride 2 or dilation 1"),
    ((1, 4, 4, 4), (3, 3, 2, 4), {"output_padding": (0, 1)},
     r"output_padding 1 of spatial dim 1 must be smaller than its stride 1 or dilation 1"),
    ((1, 1, 4, 4), (1, 3, 2, 4), {"padding": (1, 0, 0, 0)},
     r"output size 0 of spatial dim 0 is not positive"),
    ((1, 4, 4, 4), (3, 3, 3, 2, 4), {}, r"filter\[3, 3, 3, 2, 4\] must be rank 4 like x"),
    ((1, 4, 4, 4), (3, 3, 2, 4), {"input_layout": "NDHWC"},
     r"x NDHWC\[1, 4, 4, 4\] must be rank 5"),
    ((1, 4, 4, 4), (3, 3, 2, 4), {"stride": (1, 1, 1)},
     r"stride \(1, 1, 1\) has 3 values for 2 spatial dims"),
    ((1, 4, 4, 4), (3, 3, 2, 4), {"input_layout": "HWNC"}, r"input_layout must be one of"),
    ((1, 4, 4, 4), (3, 3, 2, 4), {"output_padding": -1}, r"output_padding must be a non-neg"),
])
def test_type_rule_failures(x, w, kw, match):
    g = md.Graph("t", [md.TensorType("float32", x), md.TensorType("float32", w)])
    with g.layer("up"):
        with pytest.raises(md.GraphError, match=r"up: conv_transpose: .*" + match):
            md.ops.conv_transpose(*g.inputs, **kw)


def test_bias_and_dtype_failures():
    g = md.Graph("t", [md.TensorType("float32", (1, 4, 4, 4)),
                       md.TensorType("float32", (3, 3, 2, 4)),
                       md.TensorType("float32", (3,)), md.TensorType("float16", (3, 3, 2, 4))])
    x, w, b, w16 = g.inputs
    with pytest.raises(md.GraphError, match=r"bias\[3\] must be \[2\]"):
        md.ops.conv_transpose(x, w, bias=b)
    with pytest.raises(md.GraphError, match="dtypes differ"):
        md.ops.conv_transpose(x, w16)


def test_spec_with_conv_transpose_and_pools_runs(rng):
    spec = md.load_spec(CASES / "valid" / "vision_ops.yaml")
    w_up = rng.standard_normal((3, 3, 3, 4)).astype(np.float32)
    b_up = rng.standard_normal(6).astype(np.float32)
    w_up3 = rng.standard_normal((2, 2, 2, 2, 4)).astype(np.float32)
    td = md.TensorDict()
    td["up.weight"], td["up.bias"], td["up3.weight"] = w_up, b_up, w_up3
    g = md.build(spec, weights=td)
    img = rng.standard_normal((1, 3, 8, 4)).astype(np.float32)
    vol = rng.standard_normal((1, 4, 6, 6, 4)).astype(np.float32)
    pooled, where, v = g.execute(img, vol, weights=td)
    y = torch_ref(np.moveaxis(img, -1, 1).copy(), np.moveaxis(w_up, (3, 2), (0, 1)).copy(),
                  b_up, [2, 2], [1, 1], [1, 0, 1, 1], [1, 1], 2)
    ref, ref_idx = F.max_pool2d(torch.from_numpy(y), 2, 2, return_indices=True)
    close(np.moveaxis(pooled, -1, 1), ref.numpy(), atol=1e-4)
    assert where.dtype == np.int64 and np.array_equal(np.moveaxis(where, -1, 1), ref_idx.numpy())
    assert v.shape == (1, 3, 6, 6, 2)


def test_filter_layout_must_fit_the_rank():
    g = md.Graph("t", [md.TensorType("float32", (1, 4, 4, 2)),
                       md.TensorType("float32", (2, 3, 3, 3))])
    with pytest.raises(md.GraphError, match="filter_layout CFQRS is for rank 5"):
        md.ops.conv_transpose(*g.inputs, filter_layout="CFQRS")
    with pytest.raises(md.GraphError, match="filter_layout must be one of"):
        md.ops.conv_transpose(*g.inputs, filter_layout="FCRS")
    assert md.ops.conv_transpose(*g.inputs, filter_layout="cfrs").shape == (1, 6, 6, 3)
