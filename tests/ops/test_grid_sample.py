"""``grid_sample`` against ``torch.nn.functional.grid_sample`` (4-D input)."""

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import maxdecl as md
from ophelp import run_op


@pytest.mark.parametrize("mode", ["bilinear", "nearest"])
@pytest.mark.parametrize("padding", ["zeros", "border", "reflection"])
@pytest.mark.parametrize("align_corners", [False, True])
@pytest.mark.parametrize("channels_last", [True, False])
def test_grid_sample_matches_torch(mode, padding, align_corners, channels_last):
    rng = np.random.default_rng(7)
    x = rng.standard_normal((2, 3, 5, 7)).astype(np.float32)          # NCHW
    # points inside, on the edges and well outside (reflection folds several times)
    grid = rng.uniform(-2.6, 2.6, (2, 4, 6, 2)).astype(np.float32)
    grid[0, 0, :4] = [[-1, -1], [1, 1], [0, 0], [1, -1]]
    if mode == "nearest":             # no point exactly halfway between two pixels
        grid = np.round(grid * 64) / 64 + np.float32(1e-3)
    ref = F.grid_sample(torch.from_numpy(x), torch.from_numpy(grid), mode=mode,
                        padding_mode=padding, align_corners=align_corners).numpy()
    xin = np.ascontiguousarray(x.transpose(0, 2, 3, 1)) if channels_last else x
    out = run_op(lambda a, b: md.ops.grid_sample(a, b, mode=mode, padding_mode=padding,
                                                 align_corners=align_corners,
                                                 channels_last=channels_last), xin, grid)
    if channels_last:
        out = out.transpose(0, 3, 1, 2)
    np.testing.assert_allclose(out, ref, rtol=1e-5, atol=2e-6)


def test_deformable_style_sampling_of_a_symbolic_batch():
    """Deformable attention's use: [B*heads, H, W, d] values sampled at [B*heads, Lq,
    points, 2] locations, the batch symbolic."""
    g = md.Graph("t", [md.TensorType("float32", ("bh", 6, 8, 4)),
                       md.TensorType("float32", ("bh", "q", 3, 2))])
    out = md.ops.grid_sample(*g.inputs)
    assert out.type.shape == ("bh", "q", 3, 4)
    g.output(out)
    rng = np.random.default_rng(2)
    v = rng.standard_normal((5, 6, 8, 4)).astype(np.float32)
    loc = rng.uniform(-1, 1, (5, 9, 3, 2)).astype(np.float32)
    (got,) = g.execute(v, loc)
    ref = F.grid_sample(torch.from_numpy(v).permute(0, 3, 1, 2), torch.from_numpy(loc),
                        align_corners=False).permute(0, 2, 3, 1).numpy()
    np.testing.assert_allclose(got, ref, rtol=1e-5, atol=2e-6)


def test_grid_sample_refuses_bad_inputs():
    g = md.Graph("t", [md.TensorType("float32", (2, 5, 7, 3)),
                       md.TensorType("float32", (2, 4, 6, 3)),
                       md.TensorType("float32", (3, 4, 6, 2)),
                       md.TensorType("float32", (2, 4, 6, 2))])
    x, bad_last, bad_batch, grid = g.inputs
    with pytest.raises(md.GraphError, match=r"grid \[N, H_out, W_out, 2\]"):
        md.ops.grid_sample(x, bad_last)
    with pytest.raises(md.GraphError, match="one batch size"):
        md.ops.grid_sample(x, bad_batch)
    with pytest.raises(md.GraphError, match="mode must be one of bilinear, nearest"):
        md.ops.grid_sample(x, grid, mode="bicubic")
    with pytest.raises(md.GraphError, match="padding_mode must be one of"):
        md.ops.grid_sample(x, grid, padding_mode="wrap")
