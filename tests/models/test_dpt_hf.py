"""specs/dpt.yaml against transformers' DPTForDepthEstimation (plain ViT backbone).

Seeded small float32 models saved with ``save_pretrained`` (safetensors + config.json);
every parameter random (LayerNorm gains and biases, conv biases, [CLS] token, position
table, readout projections, and, in the batch-norm case, the fusion batch norms' running
statistics), conv filters scaled to N(0, 1 / fan_in) so activations stay O(1) through the
neck. Two configurations, built once per module:

- ``project``: readout_type 'project', 5 ViT layers of which layers 0, 2, 3, 4 feed the
  neck, 32x32 images, patch 8 (a 4x4 grid: every fusion residual already at its size);
- ``ignore``: readout_type 'ignore', no q/k/v biases, batch norms in the fusion residual
  units (so no conv biases there), 24x24 images, patch 8: a 3x3 grid, so the coarsest
  stage is 2x2 and each finer residual is resized bilinearly before it is added.

The sizes come from config.json, not the variant. Compared: the depth map
(``predicted_depth``) and the backbone's ``last_hidden_state`` (DPTModel's output, after
the final LayerNorm), within ``1e-5`` of max|ref| (float32 throughout; TOL is 1e-3).
"""

import json

import numpy as np
import pytest

import maxdecl as md
from modelhelp import named_outputs, randomize, rel_err, save_hf, spec_path

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

SPEC = spec_path("dpt")
N_IMAGES = 2
STRICT = 1e-5      # max|ours - ref| / max|ref|; the brief asks for 1e-4 or tighter

CASES = {
    "project": dict(hidden_size=32, num_hidden_layers=5, num_attention_heads=4,
                    intermediate_size=48, image_size=32, patch_size=8,
                    backbone_out_indices=[0, 2, 3, 4], readout_type="project",
                    neck_hidden_sizes=[8, 16, 24, 32], fusion_hidden_size=16,
                    layer_norm_eps=1e-12),
    "ignore": dict(hidden_size=24, num_hidden_layers=4, num_attention_heads=2,
                   intermediate_size=40, image_size=24, patch_size=8, num_channels=3,
                   backbone_out_indices=[0, 1, 2, 3], readout_type="ignore",
                   neck_hidden_sizes=[12, 8, 16, 24], fusion_hidden_size=16,
                   qkv_bias=False, use_batch_norm_in_fusion_residual=True,
                   layer_norm_eps=1e-6, hidden_act="gelu_new"),
}


def make_dpt(config, seed=0):
    torch.manual_seed(seed)
    cfg = transformers.DPTConfig(**config, attn_implementation="eager")
    model = randomize(transformers.DPTForDepthEstimation(cfg), seed)
    gen = torch.Generator().manual_seed(seed + 100)
    with torch.no_grad():
        for name, p in sorted(model.named_parameters()):
            if p.ndim == 4:                       # conv filters: N(0, 1 / fan_in)
                if name.endswith("resize.weight") and "reassemble" in name \
                        and isinstance(_module(model, name), torch.nn.ConvTranspose2d):
                    fan_in = p.shape[0]           # [C_in, C_out, k, k], stride k: C_in taps
                else:
                    fan_in = int(np.prod(p.shape[1:]))
                p.copy_(torch.randn(p.shape, generator=gen) / fan_in ** 0.5)
        for name, b in sorted(model.named_buffers()):
            if name.endswith("running_mean"):
                b.copy_(0.2 * torch.randn(b.shape, generator=gen))
            elif name.endswith("running_var"):
                b.copy_(0.5 + torch.rand(b.shape, generator=gen))
    return model.eval()


def _module(model, param_name):
    return model.get_submodule(param_name.rsplit(".", 1)[0])


def images(cfg, n=N_IMAGES, size=None, seed=1) -> np.ndarray:
    s = size or cfg.image_size
    return np.random.default_rng(seed).standard_normal((n, cfg.num_channels, s, s)).astype(np.float32)


def hf_outputs(model, x) -> dict:
    with torch.no_grad():
        px = torch.from_numpy(x)
        depth = model(pixel_values=px).predicted_depth
        last = model.dpt(pixel_values=px).last_hidden_state
    return {"predicted_depth": depth.numpy(), "last_hidden_state": last.numpy()}


@pytest.fixture(scope="module", params=sorted(CASES))
def case(request, tmp_path_factory):
    model = make_dpt(CASES[request.param], seed=len(request.param))
    path = save_hf(model, tmp_path_factory.mktemp(f"dpt_{request.param}"))
    x = images(model.config)
    loaded = md.load_model(SPEC, str(path))
    return request.param, model, path, loaded, x, hf_outputs(model, x)


def _check(name, got, ref, tol=STRICT):
    errs = {k: rel_err(got[k], ref[k]) for k in ref}
    abs_errs = {k: float(np.max(np.abs(got[k] - ref[k]))) for k in ref}
    print(f"dpt {name} vs HF: " + ", ".join(
        f"{k} rel {errs[k]:.2e} abs {abs_errs[k]:.2e} (max|ref| {np.abs(ref[k]).max():.2f})"
        for k in ref))
    for k in ref:
        assert errs[k] <= tol, (k, errs[k])


def test_params_from_config(case):
    name, hf, path, m, x, ref = case
    cfg = hf.config
    assert {k: m.params[k] for k in ("dim", "n_layers", "n_heads", "ffn_dim", "image", "patch",
                                     "channels", "readout", "fusion_dim", "res_bn",
                                     "hidden_act", "norm_eps")} == {
        "dim": cfg.hidden_size, "n_layers": cfg.num_hidden_layers,
        "n_heads": cfg.num_attention_heads, "ffn_dim": cfg.intermediate_size,
        "image": cfg.image_size, "patch": cfg.patch_size, "channels": cfg.num_channels,
        "readout": cfg.readout_type, "fusion_dim": cfg.fusion_hidden_size,
        "res_bn": cfg.use_batch_norm_in_fusion_residual, "hidden_act": cfg.hidden_act,
        "norm_eps": cfg.layer_norm_eps}
    assert list(m.params["out_indices"]) == list(cfg.backbone_out_indices)
    assert list(m.params["neck_sizes"]) == list(cfg.neck_hidden_sizes)
    assert list(m.params["factors"]) == list(cfg.reassemble_factors)
    has_readout = any(k.endswith(".readout.weight") for k in m.weights.keys())
    assert has_readout == (cfg.readout_type == "project")


def test_outputs_match_transformers(case):
    name, hf, path, m, x, ref = case
    got = named_outputs(m, x)
    assert list(got) == ["last_hidden_state", "predicted_depth"]
    cfg = hf.config
    grid = cfg.image_size // cfg.patch_size
    side = 32 * -(-grid // 2)                 # 16 x the fused map, x2 in the head
    assert got["predicted_depth"].shape == (N_IMAGES, side, side)
    assert got["last_hidden_state"].shape == (N_IMAGES, grid * grid + 1, cfg.hidden_size)
    assert np.abs(ref["predicted_depth"]).max() > 0.1          # the final ReLU leaves signal
    _check(name, got, ref)
    # images are independent: one alone gives its row of the batch
    one = named_outputs(m, x[1:2])
    for k in ref:
        assert rel_err(one[k], ref[k][1:2]) <= STRICT, k


def test_other_image_size(case):
    """An image larger than the config's image_size: transformers resizes the position
    table bilinearly to the patch grid, and so does the spec."""
    name, hf, path, m, x, ref = case
    x2 = images(hf.config, n=1, size=hf.config.image_size + 2 * hf.config.patch_size, seed=3)
    _check(f"{name} (larger image)", named_outputs(m, x2), hf_outputs(hf, x2))


def test_parts_matter(case):
    """Negative controls, each moving the depth map far past the tolerance: 'project':
    another choice of backbone layers, and the readout projections' biases zeroed;
    'ignore': the fusion batch norms' running statistics reset to 0 and 1."""
    name, hf, path, m, x, ref = case

    def depth_error(td):
        got = named_outputs(md.load_model(SPEC, td), x)["predicted_depth"]
        return rel_err(got, ref["predicted_depth"])

    if name == "project":
        td = md.load_weights(str(path))
        assert list(td.metadata["backbone_out_indices"]) == [0, 2, 3, 4]
        td.metadata["backbone_out_indices"] = [1, 2, 3, 4]
        assert depth_error(td) > 100 * STRICT
    td = md.load_weights(str(path), spec=SPEC)
    changed = 0
    for k in list(td.keys()):
        if k.endswith((".readout.bias", ".running_mean")):
            td[k], changed = np.zeros_like(np.asarray(td[k])), changed + 1
        elif k.endswith(".running_var"):
            td[k], changed = np.ones_like(np.asarray(td[k])), changed + 1
    assert changed >= 4
    assert depth_error(td) > 100 * STRICT


def test_add_readout_and_head_projection(tmp_path):
    """readout_type 'add' and add_projection (transformers' extra 3x3 conv + ReLU, whose
    width it fixes at 256, so fusion_hidden_size is 256 here) on a 2x2 patch grid."""
    model = make_dpt(dict(hidden_size=16, num_hidden_layers=4, num_attention_heads=2,
                          intermediate_size=32, image_size=16, patch_size=8,
                          backbone_out_indices=[0, 1, 2, 3], readout_type="add",
                          neck_hidden_sizes=[4, 8, 8, 16], fusion_hidden_size=256,
                          add_projection=True), seed=5)
    path = save_hf(model, tmp_path / "add")
    x = images(model.config, seed=6)
    m = md.load_model(SPEC, str(path))
    assert m.params["add_projection"] is True and m.params["readout"] == "add"
    _check("add+projection", named_outputs(m, x), hf_outputs(model, x))


def test_unmodelled_configs_refused(tmp_path):
    model = make_dpt(CASES["project"], seed=7)
    path = save_hf(model, tmp_path)
    base = json.loads((tmp_path / "config.json").read_text())
    for change, why in [({"backbone_out_indices": [0, 2, 4]}, "only four neck stages"),
                        ({"backbone_out_indices": [0, 3, 2, 4]}, "must increase"),
                        ({"backbone_out_indices": [0, 2, 3, 5]}, "must increase"),
                        ({"head_in_index": 0}, "only the last fused map"),
                        ({"image_size": [32, 24]}, "only square"),
                        ({"is_hybrid": True}, "DPT-Hybrid"),
                        ({"backbone_config": {"model_type": "dinov2"}}, "external backbone")]:
        (tmp_path / "config.json").write_text(json.dumps({**base, **change}))
        with pytest.raises(md.WeightsError, match=why):
            md.load_model(SPEC, str(path))
