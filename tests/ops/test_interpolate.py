"""``interpolate`` against torch.nn.functional.interpolate: every mode, 1-3 spatial dims,
sizes and scale factors (up and down, fractional), align_corners, both layouts."""

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import maxdecl as md
from ophelp import close, run_op

TORCH_MODE = {"nearest": "nearest", "nearest-exact": "nearest-exact",
              "cubic": "bicubic"}
LINEAR = {1: "linear", 2: "bilinear", 3: "trilinear"}


def _torch(x_cf, mode, **kw):
    nd = x_cf.ndim - 2
    tmode = LINEAR[nd] if mode == "linear" else TORCH_MODE[mode]
    return F.interpolate(torch.from_numpy(x_cf), mode=tmode, **kw).numpy()


def _ours(x_cf, mode, channels_last=True, **kw):
    nd = x_cf.ndim - 2
    x = np.ascontiguousarray(np.moveaxis(x_cf, 1, -1)) if channels_last else x_cf
    out = run_op(lambda v: md.ops.interpolate(v, mode=mode, channels_last=channels_last, **kw),
                 x)
    return np.moveaxis(out, -1, 1) if channels_last else out


CASES = [  # (spatial shape, kwargs)
    ((7, 5), dict(size=(13, 4))),
    ((7, 5), dict(size=(3, 11))),
    ((6, 9), dict(scale_factor=2)),
    ((6, 9), dict(scale_factor=(0.5, 1.7))),
    ((8, 8), dict(scale_factor=0.3)),
    ((5, 6), dict(size=(5, 6))),
]


@pytest.mark.parametrize("mode", ["nearest", "nearest-exact", "linear", "cubic"])
@pytest.mark.parametrize("spatial, kw", CASES)
@pytest.mark.parametrize("channels_last", [True, False])
def test_2d_matches_torch(rng, mode, spatial, kw, channels_last):
    x = rng.standard_normal((2, 3, *spatial)).astype(np.float32)
    tkw = {k: (tuple(v) if isinstance(v, tuple) else v) for k, v in kw.items()}
    ref = _torch(x, mode, **tkw)
    out = _ours(x, mode, channels_last, **kw)
    assert out.shape == ref.shape
    close(out, ref, atol=2e-5, rtol=2e-5)


@pytest.mark.parametrize("mode", ["linear", "cubic"])
@pytest.mark.parametrize("kw", [dict(size=(9, 4)), dict(scale_factor=1.5), dict(size=(1, 3))])
def test_align_corners_matches_torch(rng, mode, kw):
    x = rng.standard_normal((1, 4, 5, 6)).astype(np.float32)
    ref = _torch(x, mode, align_corners=True, **kw)
    close(_ours(x, mode, align_corners=True, **kw), ref, atol=2e-5, rtol=2e-5)


@pytest.mark.parametrize("mode", ["nearest", "nearest-exact", "linear"])
@pytest.mark.parametrize("spatial, kw", [((11,), dict(size=4)), ((5,), dict(scale_factor=2.5)),
                                         ((3, 4, 5), dict(size=(6, 2, 7))),
                                         ((4, 3, 2), dict(scale_factor=(0.5, 2, 1.5)))])
def test_1d_and_3d_match_torch(rng, mode, spatial, kw):
    x = rng.standard_normal((2, 3, *spatial)).astype(np.float32)
    close(_ours(x, mode, **kw), _torch(x, mode, **kw), atol=2e-5, rtol=2e-5)


def test_symbolic_input_size():
    g = md.Graph("t", [md.TensorType("float32", (1, "h", "w", 3))])
    with g.layer("up"):
        y = md.ops.interpolate(g.inputs[0], scale_factor=(2, 1.5), mode="linear")
    assert y.type.shape[1] == "2*h" and y.type.shape[2].startswith("interp(")
    g.output(y)
    x = np.random.default_rng(0).standard_normal((1, 6, 4, 3)).astype(np.float32)
    out = g.execute(x)[0]
    ref = _torch(np.moveaxis(x, -1, 1), "linear", scale_factor=(2, 1.5))
    close(np.moveaxis(out, -1, 1), ref, atol=2e-5, rtol=2e-5)


def test_like_gives_the_spatial_sizes(rng):
    # a segmentation head: every feature map resized to the first one's (symbolic) size
    g = md.Graph("t", [md.TensorType("float32", (1, "h", "w", 3)),
                       md.TensorType("float32", (1, "a", "b", 5))])
    with g.layer("up"):
        y = md.ops.interpolate(g.inputs[0], g.inputs[1], mode="linear")
    assert y.type.shape == (1, "a", "b", 3)
    g.output(y)
    x = rng.standard_normal((1, 3, 4, 3)).astype(np.float32)
    like = np.zeros((1, 7, 9, 5), np.float32)
    out = g.execute(x, like)[0]
    ref = _torch(np.moveaxis(x, -1, 1), "linear", size=(7, 9))
    close(np.moveaxis(out, -1, 1), ref, atol=2e-5, rtol=2e-5)
    g2 = md.Graph("t", [md.TensorType("float32", (1, 4, 4, 3)),
                        md.TensorType("float32", (4, 4))])
    with pytest.raises(md.GraphError, match="must have x's rank"):
        md.ops.interpolate(g2.inputs[0], g2.inputs[1])
    with pytest.raises(md.GraphError, match="exactly one of"):
        md.ops.interpolate(g2.inputs[0], g2.inputs[0], size=3)


@pytest.mark.parametrize("mode, tmode", [("linear", "bilinear"), ("cubic", "bicubic")])
@pytest.mark.parametrize("hw, kw", [
    ((16, 16), dict(size=(7, 5))), ((9, 9), dict(size=(2, 3))), ((16, 16), dict(size=(1, 1))),
    ((4, 4), dict(size=(3, 7))), ((5, 8), dict(size=(11, 3))), ((10, 13), dict(size=(10, 13))),
    ((12, 15), dict(scale_factor=0.4)), ((6, 7), dict(scale_factor=(2.5, 0.5))),
])
def test_antialias_matches_torch(rng, mode, tmode, hw, kw):
    """antialias=True where an axis shrinks (the filter stretched by the scale, weights
    normalised), grows or keeps its size, by size and by scale_factor."""
    x = rng.standard_normal((2, 3, *hw)).astype(np.float32)
    out = run_op(lambda v: md.ops.interpolate(v, mode=mode, antialias=True,
                                              channels_last=False, **kw), x)
    ref = F.interpolate(torch.from_numpy(x), mode=tmode, antialias=True, align_corners=False,
                        **kw).numpy()
    close(out, ref, atol=2e-6, rtol=1e-5, label=f"{mode} {hw} {kw}")
    if kw.get("size") and kw["size"][0] < hw[0]:          # shrinking: not plain resampling
        plain = F.interpolate(torch.from_numpy(x), mode=tmode, align_corners=False,
                              **kw).numpy()
        assert np.abs(plain - ref).max() > 1e-3


@pytest.mark.parametrize("kw, message", [
    (dict(), "exactly one of size, scale_factor and the input like"),
    (dict(size=4, scale_factor=2), "exactly one of size, scale_factor and the input like"),
    (dict(size=(4, 4, 4)), "one entry per spatial dim"),
    (dict(size=0), "positive"),
    (dict(scale_factor=-1.0), "positive"),
    (dict(scale_factor=float("nan")), "positive"),
    (dict(size=4, mode="bilinear"), "mode must be one of"),
    (dict(size=4, align_corners=True), "align_corners applies to modes linear and cubic"),
    (dict(scale_factor=1e9), "is over"),
    (dict(scale_factor=0.01), "leaves no output"),
    (dict(size=4, antialias=True), "antialias applies to modes linear and cubic"),
    (dict(size=4, mode="linear", align_corners=True, antialias=True), "without align_corners"),
])
def test_bad_attributes_name_the_layer(kw, message):
    g = md.Graph("t", [md.TensorType("float32", (1, 8, 8, 3))])
    with pytest.raises(md.GraphError, match=message) as e:
        with g.layer("up"):
            md.ops.interpolate(g.inputs[0], **kw)
    assert "up" in str(e.value)


def test_rank_and_dtype_checked():
    g = md.Graph("t", [md.TensorType("float32", (8, 3)), md.TensorType("int32", (1, 4, 3))])
    with pytest.raises(md.GraphError, match="rank 3, 4 or 5"):
        md.ops.interpolate(g.inputs[0], size=2)
    with pytest.raises(md.GraphError, match="float"):
        md.ops.interpolate(g.inputs[1], size=2)
