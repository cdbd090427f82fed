"""specs/vitpose.yaml against transformers' VitPoseForPoseEstimation.

Seeded small float32 models saved with ``save_pretrained`` (safetensors + config.json,
the backbone's sizes under ``backbone_config``); every parameter random (LayerNorm gains
and biases, the padded patch conv, the position table whose row 0 is added to every
patch, the BatchNorm running statistics of the classic head). Each case runs a batch of
two person crops at the config's image size and compares the heatmaps and every hidden
state the head depends on. The sizes come from config.json, not the variant:

- ``simple``: the simple decoder (ReLU, bilinear x4, 3x3 conv), the last stage read;
- ``classic``: the classic decoder (two deconv + BatchNorm + ReLU, 1x1 conv), no q/k/v
  biases, non-square patches, three heads of 16, ``gelu_new``, and ``out_indices``
  pointing at stage 2 of 3 (the third layer feeds nothing and is not loaded);
- ``moe``: ViTPose+'s mixture-of-experts MLP (3 dataset experts of 8 channels each,
  ``dataset_index`` picking one per crop) with the simple decoder upsampling x2.
"""

import json

import numpy as np
import pytest

import maxdecl as md
from modelhelp import named_outputs, randomize, rel_err, save_hf, spec_path

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

SPEC = spec_path("vitpose")
N_CROPS = 2
TOL = 1e-5          # float32 throughout: max|ours - ref| <= TOL * max|ref|

CASES = {
    "simple": dict(
        backbone=dict(image_size=[32, 24], patch_size=[8, 8], hidden_size=32,
                      num_hidden_layers=3, num_attention_heads=4, mlp_ratio=2,
                      layer_norm_eps=1e-6, out_indices=[3]),
        head=dict(use_simple_decoder=True, scale_factor=4, num_labels=5)),
    "classic": dict(
        backbone=dict(image_size=[32, 24], patch_size=[8, 6], hidden_size=48,
                      num_hidden_layers=3, num_attention_heads=3, mlp_ratio=3,
                      hidden_act="gelu_new", qkv_bias=False, layer_norm_eps=1e-5,
                      out_indices=[2]),
        head=dict(use_simple_decoder=False, num_labels=4)),
    "moe": dict(
        backbone=dict(image_size=[24, 16], patch_size=[8, 8], hidden_size=32,
                      num_hidden_layers=2, num_attention_heads=2, mlp_ratio=2,
                      num_experts=3, part_features=8, out_indices=[-1]),
        head=dict(use_simple_decoder=True, scale_factor=2, num_labels=3)),
}
DATASET_INDEX = np.array([2, 0], np.int64)


def make_vitpose(case, seed=0):
    torch.manual_seed(seed)
    bb = transformers.VitPoseBackboneConfig(**case["backbone"])
    cfg = transformers.VitPoseConfig(backbone_config=bb, **case["head"])
    cfg._attn_implementation = "eager"
    model = transformers.VitPoseForPoseEstimation(cfg)
    return randomize(model, seed, running_stats=True, conv_fan_in=True)


def crops(cfg, n=N_CROPS, seed=1) -> np.ndarray:
    bb = cfg.backbone_config
    h, w = bb.image_size
    return np.random.default_rng(seed).standard_normal((n, bb.num_channels, h, w)).astype(np.float32)


def hf_outputs(model, x, dataset_index=None) -> dict:
    kw = {}
    if dataset_index is not None:
        kw["dataset_index"] = torch.from_numpy(dataset_index)
    with torch.no_grad():
        out = model(pixel_values=torch.from_numpy(x), output_hidden_states=True, **kw)
    ref = {"heatmaps": out.heatmaps.numpy()}
    # hidden_states[0] is the embeddings' output, [i + 1] layer i's
    for i, h in enumerate(out.hidden_states[1:]):
        ref[f"blk.{i}.hidden_state"] = h.numpy()
    return ref


def inputs_of(name, x):
    return (x, DATASET_INDEX) if name == "moe" else (x,)


@pytest.fixture(scope="module", params=sorted(CASES))
def case(request, tmp_path_factory):
    name = request.param
    model = make_vitpose(CASES[name], seed=len(name))
    path = save_hf(model, tmp_path_factory.mktemp(f"vitpose_{name}"))
    x = crops(model.config)
    ref = hf_outputs(model, x, DATASET_INDEX if name == "moe" else None)
    return name, model, path, x, ref


def test_heatmaps_match_transformers(case):
    name, hf, path, x, ref = case
    m = md.load_model(SPEC, str(path))
    bb, cfg = hf.config.backbone_config, hf.config
    got_params = {k: m.params[k] for k in ("dim", "n_layers", "n_heads", "mlp_ratio", "n_experts",
                                           "image_h", "image_w", "patch_h", "patch_w",
                                           "qkv_bias", "hidden_act", "norm_eps", "n_labels",
                                           "simple", "scale_factor")}
    assert got_params == {
        "dim": bb.hidden_size, "n_layers": bb.num_hidden_layers,
        "n_heads": bb.num_attention_heads, "mlp_ratio": bb.mlp_ratio,
        "n_experts": bb.num_experts, "image_h": bb.image_size[0], "image_w": bb.image_size[1],
        "patch_h": bb.patch_size[0], "patch_w": bb.patch_size[1], "qkv_bias": bb.qkv_bias,
        "hidden_act": bb.hidden_act, "norm_eps": bb.layer_norm_eps,
        "n_labels": cfg.num_labels, "simple": cfg.use_simple_decoder,
        "scale_factor": cfg.scale_factor}
    n_run = max(k if k >= 0 else bb.num_hidden_layers + 1 + k for k in bb.out_indices)
    assert m.params["n_run"] == n_run
    assert m.input_names == (["pixel_values", "dataset_index"] if name == "moe"
                             else ["pixel_values"])
    got = named_outputs(m, *inputs_of(name, x))
    assert list(got)[0] == "heatmaps"
    assert got["heatmaps"].shape == ref["heatmaps"].shape
    keys = ["heatmaps"] + [f"blk.{i}.hidden_state" for i in range(n_run)]
    assert sorted(got) == sorted(keys)
    errs = {k: rel_err(got[k], ref[k]) for k in keys}
    abs_err = float(np.max(np.abs(got["heatmaps"] - ref["heatmaps"])))
    print(f"vitpose {name} vs HF: heatmaps rel {errs['heatmaps']:.2e} abs {abs_err:.2e} "
          f"(max|ref| {np.abs(ref['heatmaps']).max():.2e}); hidden states rel "
          + ", ".join(f"{errs[k]:.2e}" for k in keys[1:]))
    assert all(e <= TOL for e in errs.values()), errs
    # crops are independent: one alone gives its row of the batch
    one = named_outputs(m, *(a[1:2] for a in inputs_of(name, x)))
    assert rel_err(one["heatmaps"], ref["heatmaps"][1:2]) <= TOL


def test_position_row_zero_and_experts_matter(case):
    """Negative controls: without row 0 of the position table added to every patch the
    heatmaps move far past TOL; with MoE, the other crop's expert gives transformers'
    heatmaps for that dataset index, not the first one's."""
    name, hf, path, x, ref = case
    td = md.load_weights(str(path), spec=SPEC)
    pos = np.asarray(td["pos_embd.weight"]).copy()
    pos[:, 0] = 0.0
    td["pos_embd.weight"] = pos
    got = named_outputs(md.load_model(SPEC, td), *inputs_of(name, x))
    assert rel_err(got["heatmaps"], ref["heatmaps"]) > 100 * TOL
    if name != "moe":
        return
    m = md.load_model(SPEC, str(path))
    other = DATASET_INDEX[::-1].copy()
    got = named_outputs(m, x, other)["heatmaps"]
    want = hf_outputs(hf, x, other)["heatmaps"]
    assert rel_err(got, want) <= TOL
    assert rel_err(got, ref["heatmaps"]) > 100 * TOL


def test_non_vitpose_backbone_refused(tmp_path):
    model = make_vitpose(CASES["simple"], seed=3)
    path = save_hf(model, tmp_path)
    cfg = json.loads((tmp_path / "config.json").read_text())
    cfg["backbone_config"]["model_type"] = "dinov2"
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(md.WeightsError, match="not modelled"):
        md.load_model(SPEC, str(path))
