"""3-D pools, max_pool's indices and torch's ceil_mode edge, against torch.nn.functional;
the max_pool padding rule and the window-length checks."""

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import maxdecl as md
from ophelp import close, run_op


def cl(a):
    """NC... -> channels last."""
    return np.ascontiguousarray(np.moveaxis(a, 1, -1))


def cf(a):
    """channels last -> NC..."""
    return np.ascontiguousarray(np.moveaxis(a, -1, 1))


def random_window(rng, nd, dilate=True):
    k = [int(v) for v in rng.integers(1, 4, nd)]
    s = [int(v) for v in rng.integers(1, 4, nd)]
    d = [int(v) for v in rng.integers(1, 3, nd)] if dilate else [1] * nd
    p = [int(rng.integers(0, kk // 2 + 1)) for kk in k]      # torch: pad <= k / 2
    return k, s, d, p


@pytest.mark.parametrize("seed", range(8))
def test_max_pool2d_indices_match_torch(seed):
    rng = np.random.default_rng(seed)
    k, s, d, p = random_window(rng, 2)
    ceil = bool(rng.integers(0, 2))
    x = rng.standard_normal((2, 3, 7, 6)).astype(np.float32)
    ref, ref_idx = F.max_pool2d(torch.from_numpy(x), k, s, p, d, ceil_mode=ceil,
                                return_indices=True)
    out, idx = run_op(lambda v: md.ops.max_pool(v, k, stride=s, padding=p, dilation=d,
                                                ceil_mode=ceil, return_indices=True), cl(x))
    label = f"k{k} s{s} p{p} d{d} ceil{ceil}"
    close(cf(out), ref.numpy(), label=label)
    assert idx.dtype == np.int64 and np.array_equal(cf(idx), ref_idx.numpy()), label


@pytest.mark.parametrize("seed", range(6))
def test_max_pool3d_indices_match_torch(seed):
    rng = np.random.default_rng(seed)
    k, s, d, p = random_window(rng, 3)
    ceil = bool(rng.integers(0, 2))
    x = rng.standard_normal((2, 2, 5, 6, 4)).astype(np.float32)
    ref, ref_idx = F.max_pool3d(torch.from_numpy(x), k, s, p, d, ceil_mode=ceil,
                                return_indices=True)
    out, idx = run_op(lambda v: md.ops.max_pool(v, k, stride=s, padding=p, dilation=d,
                                                ceil_mode=ceil, return_indices=True), cl(x))
    label = f"k{k} s{s} p{p} d{d} ceil{ceil}"
    close(cf(out), ref.numpy(), label=label)
    assert np.array_equal(cf(idx), ref_idx.numpy()), label
    plain = run_op(lambda v: md.ops.max_pool(v, k, stride=s, padding=p, dilation=d,
                                             ceil_mode=ceil), cl(x))
    assert np.array_equal(plain, out)


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("cip", [True, False])
def test_avg_pool3d_matches_torch(seed, cip):
    rng = np.random.default_rng(seed)
    k, s, _, p = random_window(rng, 3, dilate=False)
    ceil = bool(rng.integers(0, 2))
    x = rng.standard_normal((2, 3, 5, 4, 6)).astype(np.float32)
    ref = F.avg_pool3d(torch.from_numpy(x), k, s, p, ceil_mode=ceil, count_include_pad=cip)
    out = run_op(lambda v: md.ops.avg_pool(v, k, stride=s, padding=p, ceil_mode=ceil,
                                           count_boundary=cip), cl(x))
    close(cf(out), ref.numpy(), atol=1e-5, label=f"k{k} s{s} p{p} ceil{ceil} cip{cip}")


def test_ties_and_nan_pick_the_index_torch_picks():
    x = np.zeros((1, 1, 4, 4), np.float32)             # all tied: the first tap wins
    x[0, 0, 2, 3] = np.nan                              # a NaN takes the window it is in
    x[0, 0, 3, 3] = np.nan                              # the last NaN wins
    ref, ref_idx = F.max_pool2d(torch.from_numpy(x), 3, 1, 1, return_indices=True)
    out, idx = run_op(lambda v: md.ops.max_pool(v, 3, padding=1, return_indices=True), cl(x))
    assert np.array_equal(cf(idx), ref_idx.numpy())
    assert np.array_equal(np.isnan(cf(out)), np.isnan(ref.numpy()))


def test_integer_and_float16_indices():
    x = np.array([[5, 1, 7], [7, 0, 2], [3, 9, 9]], np.int32).reshape(1, 3, 3, 1)
    out, idx = run_op(lambda v: md.ops.max_pool(v, 2, return_indices=True), x)
    assert out.dtype == np.int32 and out[0, :, :, 0].tolist() == [[7, 7], [9, 9]]
    assert idx[0, :, :, 0].tolist() == [[3, 2], [7, 7]]
    h = x.astype(np.float16)
    out, idx16 = run_op(lambda v: md.ops.max_pool(v, 2, return_indices=True), h)
    assert out.dtype == np.float16 and np.array_equal(idx16, idx)


@pytest.mark.parametrize("pool", ["avg", "max"])
@pytest.mark.parametrize("nd", [2, 3])
def test_ceil_mode_kernel_larger_than_input_gives_one_window(pool, nd):
    """torch: a 3-wide kernel on a 2-wide input, stride 2, ceil_mode: one window (torch's
    avg_pool3d alone refuses a kernel larger than the input; ours is the 2-D rule)."""
    x = np.arange(2 ** nd, dtype=np.float32).reshape(1, 1, *[2] * nd)
    t = torch.from_numpy(x)
    fn = getattr(F, f"{pool}_pool{nd}d")
    if pool == "avg" and nd == 3:
        ref = np.full((1, 1, 1, 1, 1), x.mean(), np.float32)   # taps inside the input: 8
    else:
        ref = fn(t, 3, 2, 0, ceil_mode=True).numpy()
    op = md.ops.avg_pool if pool == "avg" else md.ops.max_pool
    out = run_op(lambda v: op(v, 3, stride=2, ceil_mode=True), cl(x))
    assert out.shape[1:-1] == (1,) * nd
    close(cf(out), ref)
    with pytest.raises(RuntimeError, match="too small|smaller than kernel"):   # stride 1
        fn(t, 3, 1, 0, ceil_mode=True)
    with pytest.raises(md.GraphError, match="does not fit input size 2"):
        run_op(lambda v: op(v, 3, stride=1, ceil_mode=True), cl(x))


def test_max_pool_padding_over_half_the_effective_kernel_is_an_error():
    g = md.Graph("t", [md.TensorType("float32", (1, 8, 8, 3))])
    with g.layer("pool"):
        with pytest.raises(md.GraphError, match=r"pool: max_pool: padding \(2, 2\) of spatial "
                                                r"dim 0 is over half the effective kernel 3"):
            md.ops.max_pool(g.inputs[0], 3, padding=2)
        with pytest.raises(md.GraphError, match=r"padding \(0, 3\) of spatial dim 1 .* at most 2"):
            md.ops.max_pool(g.inputs[0], 3, dilation=(1, 2), padding=(0, 0, 0, 3))
    y = md.ops.max_pool(g.inputs[0], 3, dilation=2, padding=2)     # effective 5: 2 allowed
    assert y.shape == (1, 8, 8, 3)
    assert md.ops.avg_pool(g.inputs[0], 3, padding=2).shape == (1, 10, 10, 3)


def test_window_lengths_must_match_the_rank():
    g = md.Graph("t", [md.TensorType("float32", (1, 4, 6, 6, 2))])
    vol = g.inputs[0]
    with pytest.raises(md.GraphError, match=r"kernel_size \(2, 2\) has 2 values for 3 spatial"):
        md.ops.avg_pool(vol, (2, 2))
    with pytest.raises(md.GraphError, match=r"padding \(1, 1, 1, 1\) has 4 values for 3 spatial"):
        md.ops.max_pool(vol, 3, padding=(1, 1))
    with pytest.raises(md.GraphError, match=r"kernel_size must be an int or 1 to 3 ints"):
        md.ops.max_pool(vol, (2, 2, 2, 2))
    y, idx = md.ops.max_pool(vol, (1, 2, 2), stride=(1, 2, 2), padding=(0, 1, 1),
                             return_indices=True)
    assert y.shape == idx.shape == (1, 4, 4, 4, 2) and idx.dtype == md.DType.int64
