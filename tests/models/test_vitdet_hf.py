"""specs/vitdet.yaml against transformers' VitDetModel and VitDetBackbone.

A small seeded float32 ViTDet: a 4x4 patch conv, absolute positions pretrained on a
6x6 grid and resized (bicubic) to the image's grid, windowed attention (window 3, the
10x10 grid zero-padded to 12x12) in layers 0 and 2 and global attention in 1 and 3,
decomposed relative positions in every layer (resized linearly in the global layers
when the image is not config.image_size), a residual bottleneck block after layer 1.
The outputs are NCHW maps: last_hidden_state and the backbone's feature maps.
"""

import numpy as np
import pytest

import maxdecl as md

from modelhelp import hf_params, named_outputs, randomize, rel_err, save_hf, spec_path

pytest.importorskip("torch")
pytest.importorskip("transformers")

TOL = 1e-4          # max|ours - ref| <= TOL * max|ref|

CFG = dict(hidden_size=32, num_hidden_layers=4, num_attention_heads=2, mlp_ratio=4,
           image_size=40, pretrain_image_size=24, patch_size=4, num_channels=3,
           window_block_indices=[0, 2], residual_block_indices=[1], window_size=3,
           use_absolute_position_embeddings=True, use_relative_position_embeddings=True,
           qkv_bias=True, layer_norm_eps=1e-6, hidden_act="gelu",
           out_features=["stem", "stage2", "stage4"])

# no relative positions, no qkv bias, no resize of the absolute table, tanh GELU,
# a window (4) that divides the 8x8 grid
CFG_PLAIN = dict(hidden_size=48, num_hidden_layers=3, num_attention_heads=3, mlp_ratio=2,
                 image_size=32, pretrain_image_size=32, patch_size=4, num_channels=3,
                 window_block_indices=[1], residual_block_indices=[2], window_size=4,
                 use_absolute_position_embeddings=True,
                 use_relative_position_embeddings=False, qkv_bias=False,
                 layer_norm_eps=1e-5, hidden_act="gelu_new", out_features=["stage1"])


def make_vitdet(seed=0, cls="VitDetModel", **cfg):
    import torch
    import transformers

    torch.manual_seed(seed)
    model = getattr(transformers, cls)(transformers.VitDetConfig(**cfg))
    return randomize(model, seed)


def pixels(batch, height, width, seed=3):
    return np.random.default_rng(seed).standard_normal((batch, 3, height, width)).astype(np.float32)


def hf_run(model, x):
    """(last_hidden_state, hidden_states) of a VitDetModel on NCHW pixels."""
    import torch

    with torch.no_grad():
        out = model(torch.from_numpy(x), output_hidden_states=True)
    return out.last_hidden_state.numpy(), [h.numpy() for h in out.hidden_states]


@pytest.fixture(scope="module")
def vitdet(tmp_path_factory):
    model = make_vitdet(**CFG)
    path = save_hf(model, tmp_path_factory.mktemp("vitdet_hf"))
    return model, path


@pytest.fixture(scope="module")
def ours(vitdet):
    return md.load_model(spec_path("vitdet"), vitdet[1], variant="tiny")


def test_vitdet_config_from_hf(vitdet):
    got = hf_params("vitdet", vitdet[1])[2]
    assert (got["dim"], got["n_layers"], got["n_heads"], got["mlp_ratio"]) == (32, 4, 2, 4)
    assert (got["image_size"], got["pretrain_image_size"], got["patch_size"]) == (40, 24, 4)
    assert got["window_block_indices"] == [0, 2] and got["window_size"] == 3
    assert got["residual_block_indices"] == [1]
    assert got["use_rel_pos"] is True and got["use_abs_pos"] is True
    assert got["out_indices"] == [0, 2, 4]


def test_vitdet_loaded_params(ours):
    p = ours.params
    assert (p["grid_h"], p["grid_w"], p["pos_grid"], p["head_dim"]) == (10, 10, 6, 16)
    assert p["windowed"] == [True, False, True, False]
    assert ours.output_names[0] == "last_hidden_state"
    assert list(ours.output_names[1:]) == ["embeddings.feature_map",
                                            "encoder.layer.1.feature_map",
                                            "encoder.layer.3.feature_map"]


@pytest.mark.parametrize("batch,height,width", [(2, 40, 40), (1, 32, 48)],
                         ids=["config_size", "other_size"])
def test_vitdet_matches_hf(vitdet, ours, batch, height, width):
    """last_hidden_state and the stem / stage2 / stage4 maps. At 40x40 the global
    layers' relative tables fit as stored and the 10x10 grid is padded to 12x12 windows;
    at 32x48 (an 8x12 grid) the absolute table is resized to a non-square grid and the
    global layers' tables (19 rows) are resized to 15 and 23 rows."""
    model, _ = vitdet
    x = pixels(batch, height, width)
    ref, hidden = hf_run(model, x)
    got = named_outputs(ours, x)
    assert got["last_hidden_state"].shape == (batch, 32, height // 4, width // 4)
    errs = {"last_hidden_state": rel_err(got["last_hidden_state"], ref),
            "stem": rel_err(got["embeddings.feature_map"], hidden[0]),
            "stage2": rel_err(got["encoder.layer.1.feature_map"], hidden[2]),
            "stage4": rel_err(got["encoder.layer.3.feature_map"], hidden[4])}
    print(f"vitdet {height}x{width} vs HF: " + ", ".join(f"{k} {v:.2e}" for k, v in errs.items()))
    assert all(v <= TOL for v in errs.values()), errs


def test_vitdet_backbone_feature_maps_match_hf(vitdet, tmp_path):
    """A VitDetBackbone checkpoint (same tensor names) gives its feature_maps."""
    import torch

    model, _ = vitdet
    bb = make_vitdet(cls="VitDetBackbone", **CFG)
    bb.load_state_dict(model.state_dict())
    path = save_hf(bb, tmp_path / "backbone")
    ours = md.load_model(spec_path("vitdet"), path, variant="tiny")
    x = pixels(1, 40, 44, seed=5)
    with torch.no_grad():
        maps = [m.numpy() for m in bb(torch.from_numpy(x)).feature_maps]
    got = named_outputs(ours, x)
    names = ["embeddings.feature_map", "encoder.layer.1.feature_map",
             "encoder.layer.3.feature_map"]
    errs = [rel_err(got[n], m) for n, m in zip(names, maps, strict=True)]
    print("vitdet backbone vs HF:", ", ".join(f"{e:.2e}" for e in errs))
    assert max(errs) <= TOL


def test_vitdet_relative_positions_matter(vitdet, ours):
    """Negative control: with the relative tables zeroed the output moves far off."""
    model, path = vitdet
    td = md.load_weights(path)
    for k in list(td.keys()):
        if "rel_pos" in k:
            td[k] = np.zeros_like(np.asarray(td[k]))
    zeroed = md.load_model(spec_path("vitdet"), td, variant="tiny")
    x = pixels(1, 40, 40)
    ref, _ = hf_run(model, x)
    assert rel_err(named_outputs(zeroed, x)["last_hidden_state"], ref) > 100 * TOL


def test_vitdet_plain_config_matches_hf(tmp_path):
    """No relative positions, no qkv bias, tanh GELU, an un-resized absolute table."""
    model = make_vitdet(seed=1, **CFG_PLAIN)
    path = save_hf(model, tmp_path / "plain")
    ours = md.load_model(spec_path("vitdet"), path, variant="tiny")
    assert not any("rel_pos" in k or k.endswith("qkv.bias") for k in ours.weights.keys())
    x = pixels(2, 32, 32, seed=9)
    ref, hidden = hf_run(model, x)
    got = named_outputs(ours, x)
    e0 = rel_err(got["last_hidden_state"], ref)
    e1 = rel_err(got["encoder.layer.0.feature_map"], hidden[1])
    print(f"vitdet plain vs HF: last {e0:.2e}, stage1 {e1:.2e}")
    assert e0 <= TOL and e1 <= TOL
