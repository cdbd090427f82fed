"""specs/hiera.yaml against transformers' HieraModel and HieraForImageClassification.

Small seeded float32 Hiera models:

- ``a``: 3 stages (depths 1, 2, 1), 32x32 images, a 3x3 stride-2 patch conv, query
  stride 2x2 pooled at both stage transitions (num_query_pool 2), 4x4 mask units with
  mask-unit attention in stage 0 only (so stage 1's first layer still uses it), gelu;
- ``b``: 4 stages (depths 1, 2, 1, 1), 64x32 images (not square), the default 7x7
  stride-4 patch conv, a 2x1 query stride pooled at two of three transitions
  (num_query_pool 2: the last stage changes width without pooling, and the output keeps
  part of the unrolled token order), 8x4 mask units in stages 0 and 1, mlp_ratio 3,
  gelu_new.

Each is compared as a HieraModel (last_hidden_state, pooler_output); ``a`` also as a
HieraForImageClassification (logits, and its encoder's outputs), on a batch of two
images.
"""

import numpy as np
import pytest

import maxdecl as md

from modelhelp import (hf_params, named_outputs, randomize, rel_err, save_hf, spec_path,
                       with_hf_config)

pytest.importorskip("torch")
pytest.importorskip("transformers")

TOL = 1e-4          # max|ours - ref| <= TOL * max|ref|
BATCH = 2

CONFIGS = {
    "a": dict(embed_dim=16, image_size=[32, 32], patch_size=[3, 3], patch_stride=[2, 2],
              patch_padding=[1, 1], mlp_ratio=4.0, depths=[1, 2, 1], num_heads=[1, 2, 4],
              embed_dim_multiplier=2.0, num_query_pool=2, query_stride=[2, 2],
              masked_unit_size=[4, 4], masked_unit_attention=[True, False, False],
              hidden_act="gelu", layer_norm_eps=1e-6),
    "b": dict(embed_dim=16, image_size=[64, 32], patch_size=[7, 7], patch_stride=[4, 4],
              patch_padding=[3, 3], mlp_ratio=3.0, depths=[1, 2, 1, 1], num_heads=[1, 2, 2, 4],
              embed_dim_multiplier=2.0, num_query_pool=2, query_stride=[2, 1],
              masked_unit_size=[8, 4], masked_unit_attention=[True, True, False, False],
              hidden_act="gelu_new", layer_norm_eps=1e-5),
}


def make_hiera(name, seed=0, classifier=False, num_labels=5):
    import torch
    import transformers

    torch.manual_seed(seed)
    cfg = transformers.HieraConfig(**CONFIGS[name], num_labels=num_labels)
    cls = transformers.HieraForImageClassification if classifier else transformers.HieraModel
    return randomize(cls(cfg), seed)


def pixels(cfg: dict, seed: int = 3) -> np.ndarray:
    h, w = cfg["image_size"]
    return np.random.default_rng(seed).standard_normal((BATCH, 3, h, w)).astype(np.float32)


def hf_run(model, x) -> dict:
    import torch

    with torch.no_grad():
        out = model(torch.from_numpy(x))
    return {k: v.float().numpy() for k, v in out.items() if hasattr(v, "numpy")}


def case(name, tmp_path_factory, classifier=False, seed=0):
    model = make_hiera(name, seed=seed, classifier=classifier)
    path = save_hf(model, tmp_path_factory.mktemp(f"hiera_{name}{'_cls' if classifier else ''}"))
    x = pixels(CONFIGS[name], seed=3 + seed)
    ref = hf_run(model, x)
    if classifier:       # the encoder's outputs, from the classifier's own HieraModel
        ref.update(hf_run(model.hiera, x))
    ours = md.load_model(spec_path("hiera"), path, variant="tiny")
    return model, path, x, ref, ours


@pytest.fixture(scope="module")
def hiera_a(tmp_path_factory):
    return case("a", tmp_path_factory, seed=0)


@pytest.fixture(scope="module")
def hiera_b(tmp_path_factory):
    return case("b", tmp_path_factory, seed=1)


@pytest.fixture(scope="module")
def hiera_cls(tmp_path_factory):
    return case("a", tmp_path_factory, classifier=True, seed=2)


def check(label, ours, x, ref, names):
    got = named_outputs(ours, x)
    for n in names:
        err = rel_err(got[n], ref[n])
        print(f"hiera {label} {n}: rel err {err:.2e} (max|ref| {np.abs(ref[n]).max():.2f})")
        assert err <= TOL, (n, err)


def test_hiera_config_from_hf(hiera_b):
    _, path, _, _, ours = hiera_b
    got = hf_params("hiera", path)[2]
    assert got["depths"] == [1, 2, 1, 1] and got["query_stride"] == [2, 1]
    assert got["masked_unit_size"] == [8, 4] and got["image_size"] == [64, 32]
    assert got["hidden_act"] == "gelu_new" and got["has_head"] is False
    p = ours.params
    assert p["stage_dims"] == [16, 32, 64, 128] and p["hidden_size"] == 128
    assert p["layer_qstride"] == [1, 2, 1, 2, 1]
    assert p["layer_mua"] == [True, True, True, True, False]
    assert ours.output_names[:2] == ["last_hidden_state", "pooler_output"]


@pytest.mark.parametrize("fixture", ["hiera_a", "hiera_b"])
def test_hiera_model_matches_hf(fixture, request):
    _, _, x, ref, ours = request.getfixturevalue(fixture)
    check(fixture, ours, x, ref, ["last_hidden_state", "pooler_output"])


def test_hiera_shapes(hiera_a, hiera_b):
    for label, (_, _, x, ref, ours) in (("a", hiera_a), ("b", hiera_b)):
        got = named_outputs(ours, x)
        assert got["last_hidden_state"].shape == ref["last_hidden_state"].shape
        assert got["pooler_output"].shape == ref["pooler_output"].shape


def test_hiera_classifier_matches_hf(hiera_cls):
    _, _, x, ref, ours = hiera_cls
    assert ours.output_names[0] == "logits"
    check("cls", ours, x, ref, ["logits", "last_hidden_state", "pooler_output"])


def test_hiera_token_order_matters(hiera_b):
    """Negative control: the same weights on images whose rows are flipped give other
    last hidden states (the unroll and mask units see the layout)."""
    _, _, x, ref, ours = hiera_b
    got = named_outputs(ours, np.ascontiguousarray(x[:, :, ::-1]))
    assert rel_err(got["last_hidden_state"], ref["last_hidden_state"]) > 100 * TOL


def test_hiera_mask_unit_attention_matters(hiera_b):
    """Negative control: read as global attention everywhere (masked_unit_attention all
    false), the same checkpoint loads but its pooled output is far off."""
    _, path, x, ref, _ = hiera_b
    spec = with_hf_config(md.load_spec(spec_path("hiera")),
                          masked_unit_attention="{[False, False, False, False]}")
    got = named_outputs(md.load_model(spec, path, variant="tiny"), x)
    assert rel_err(got["pooler_output"], ref["pooler_output"]) > 100 * TOL


def test_hiera_refuses_pretraining(hiera_a, tmp_path):
    """An MAE checkpoint (HieraForPreTraining) is refused with the spec's message."""
    import json
    import shutil

    _, path, _, _, _ = hiera_a
    dst = tmp_path / "mae"
    shutil.copytree(path, dst)
    cfg = json.loads((dst / "config.json").read_text())
    cfg["architectures"] = ["HieraForPreTraining"]
    (dst / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(md.WeightsError, match="HieraForPreTraining"):
        md.load_model(spec_path("hiera"), dst, variant="tiny")
