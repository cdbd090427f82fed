"""specs/depth_anything.yaml against transformers' DepthAnythingForDepthEstimation.

Two small seeded float32 models, saved with ``save_pretrained`` and loaded through the
spec's ``formats.hf`` (every size from config.json):

* ``relative``: a 4-layer DINOv2 backbone (GELU MLP, q/k/v biases) tapped after layers
  1-4, the ReLU head;
* ``metric``: SwiGLU FFN (saved fused as ``mlp.weights_in``), no q/k/v biases, the
  embeddings themselves as the first tap (out_indices [0, 2, 3, 4]), the sigmoid head
  times ``max_depth`` 20.

Each runs at the pre-training size (32 x 32: transformers' position table as is) and at
a non-square size whose width is no multiple of the patch (44 x 26, batch 2: the table
resized bicubically to 11 x 6 patches, the downsampled stage at an odd size, the head's
output cut to whole patches). The predicted depth covers the tapped layers, the four
reassemble stages (transposed conv up, identity, strided conv down), the fusion stage
and the head; the backbone's last hidden state is compared as well.
"""

import math

import numpy as np
import pytest

import maxdecl as md

from modelhelp import hf_params, named_outputs, rel_err, save_hf, spec_path

pytest.importorskip("torch")
pytest.importorskip("transformers")

TOL = 1e-4                          # max|ours - ref| <= TOL * max|ref|
SIZES = {"square": (1, 32, 32), "odd": (2, 44, 26)}     # (batch, height, width)

CASES = {
    "relative": dict(backbone=dict(out_indices=[1, 2, 3, 4])),
    "metric": dict(backbone=dict(out_indices=[0, 2, 3, 4], use_swiglu_ffn=True, qkv_bias=False),
                   depth_estimation_type="metric", max_depth=20),
}


def make_depth_anything(seed=0, backbone=None, **kw):
    """DepthAnythingForDepthEstimation: DINOv2 dim 32, 4 layers, 2 heads, patch 4 on a
    32 x 32 pre-training grid; neck sizes [8, 16, 24, 32], factors [4, 2, 1, 0.5],
    fusion 16, head 8.

    Seeded weights: 1-D gains (norms, layer scale) 1 + 0.2 N(0, 1), biases 0.1 N(0, 1),
    the CLS token and the position table N(0, 1), matrices and conv filters
    N(0, 1 / fan_in), so every stage passes on values of order one; the head's last bias
    is raised by 0.5 so that most relative-depth pixels are positive, not clipped."""
    import torch
    import transformers

    torch.manual_seed(seed)
    bc = dict(hidden_size=32, num_hidden_layers=4, num_attention_heads=2, mlp_ratio=4,
              image_size=32, patch_size=4, layer_norm_eps=1e-6, reshape_hidden_states=False)
    bc.update(backbone or {})
    cfg = dict(backbone_config=transformers.Dinov2Config(**bc), patch_size=4,
               reassemble_hidden_size=32, neck_hidden_sizes=[8, 16, 24, 32],
               reassemble_factors=[4, 2, 1, 0.5], fusion_hidden_size=16, head_hidden_size=8)
    cfg.update(kw)
    model = transformers.DepthAnythingForDepthEstimation(transformers.DepthAnythingConfig(**cfg))
    transposed = {f"{n}.weight" for n, m in model.named_modules()
                  if isinstance(m, torch.nn.ConvTranspose2d)}
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in sorted(model.named_parameters()):
            if name.endswith(".bias"):
                p.copy_(0.1 * torch.randn(p.shape, generator=gen))
            elif p.ndim == 1:
                p.copy_(1.0 + 0.2 * torch.randn(p.shape, generator=gen))
            elif "cls_token" in name or "position_embeddings" in name or "mask_token" in name:
                p.copy_(torch.randn(p.shape, generator=gen))
            elif name in transposed:
                # ConvTranspose2d [C_in, C_out, k, k] with stride k: each output pixel
                # sees one tap of each input channel
                p.copy_(torch.randn(p.shape, generator=gen) / p.shape[0] ** 0.5)
            else:
                p.copy_(torch.randn(p.shape, generator=gen) / math.prod(p.shape[1:]) ** 0.5)
        model.head.conv3.bias.add_(0.5)     # most pixels past the final ReLU (not clipped to 0)
    return model.eval()


def pixels(batch, height, width, seed=3):
    return np.random.default_rng(seed).standard_normal((batch, 3, height, width)).astype(np.float32)


def hf_outputs(model, px):
    import torch

    with torch.no_grad():
        out = model(torch.from_numpy(px), output_hidden_states=True)
    return {"predicted_depth": out.predicted_depth.numpy(),
            "last_hidden_state": out.hidden_states[-1].numpy()}


@pytest.fixture(scope="module")
def cases(tmp_path_factory):
    """name -> (HF model, saved folder, maxdecl model, {size: (pixels, HF outputs)})."""
    out = {}
    for k, (name, kw) in enumerate(CASES.items()):
        model = make_depth_anything(seed=k, **kw)
        path = save_hf(model, tmp_path_factory.mktemp(f"depth_anything_{name}"))
        ours = md.load_model(spec_path("depth_anything"), path)
        refs = {}
        for size, shape in SIZES.items():
            px = pixels(*shape, seed=3 + k)
            refs[size] = (px, hf_outputs(model, px))
        out[name] = (model, path, ours, refs)
    return out


def test_depth_anything_config_from_hf(cases):
    _, path, _, _ = cases["relative"]
    got = hf_params("depth_anything", path)[2]
    assert (got["dim"], got["n_layers"], got["n_heads"], got["image_size"],
            got["patch_size"]) == (32, 4, 2, 32, 4)
    assert got["out_indices"] == [1, 2, 3, 4]
    assert got["neck_sizes"] == [8, 16, 24, 32]
    assert got["reassemble_factors"] == [4, 2, 1, 0.5]
    assert (got["fusion_dim"], got["head_hidden"], got["depth_type"]) == (16, 8, "relative")
    _, mpath, ours, _ = cases["metric"]
    got = hf_params("depth_anything", mpath)[2]
    assert (got["swiglu"], got["qkv_bias"], got["depth_type"], got["max_depth"]) == (
        True, False, "metric", 20)
    assert got["out_indices"] == [0, 2, 3, 4]
    assert ours.params["swiglu_dim"] == 88            # (int(128 * 2 / 3) + 7) // 8 * 8


@pytest.mark.parametrize("size", list(SIZES))
@pytest.mark.parametrize("case", list(CASES))
def test_depth_anything_matches_hf(cases, case, size):
    _, _, ours, refs = cases[case]
    px, ref = refs[size]
    got = named_outputs(ours, px)
    assert list(got)[:2] == ["last_hidden_state", "predicted_depth"]
    b, h, w = SIZES[size]
    assert got["predicted_depth"].shape == (b, h // 4 * 4, w // 4 * 4)
    assert ref["predicted_depth"].std() > 1e-2 * np.abs(ref["predicted_depth"]).max()  # not flat
    assert (ref["predicted_depth"] > 0).mean() > 0.5       # mostly past the final ReLU
    errs = {k: rel_err(got[k], ref[k]) for k in ref}
    print(f"depth_anything {case} {size}: " +
          ", ".join(f"{k} {e:.2e}" for k, e in errs.items()) + " (of max|ref|)")
    assert errs["last_hidden_state"] <= TOL
    assert errs["predicted_depth"] <= TOL


def test_depth_anything_metric_depth_in_range(cases):
    """The metric head is a sigmoid times max_depth: every value in (0, 20)."""
    _, _, ours, refs = cases["metric"]
    d = named_outputs(ours, refs["odd"][0])["predicted_depth"]
    assert 0.0 < d.min() and d.max() < 20.0


def test_depth_anything_tap_order_matters(cases):
    """Negative control: the same weights read with other taps (out_indices) give other
    depth, so the comparison above does see which layers feed the neck."""
    from modelhelp import with_hf_config

    _, path, _, refs = cases["relative"]
    spec = with_hf_config(md.load_spec(spec_path("depth_anything")),
                          out_indices="{[0, 1, 2, 3]}")
    wrong = md.load_model(spec, path)
    px, ref = refs["square"]
    assert rel_err(named_outputs(wrong, px)["predicted_depth"], ref["predicted_depth"]) > 1e-2
