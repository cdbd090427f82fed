"""specs/swinv2.yaml against transformers' Swinv2ForImageClassification / Swinv2Model.

Small seeded float32 models:

- ``cls``: a classifier, 32x32 images, patch 2 (a 16x16 grid), window 4, 4 stages of
  2 blocks: stages 0 and 1 run shifted windows (with the region mask), stage 2 fits
  one window (no shift), stage 3 shrinks the window to its 2x2 resolution. One
  block's logit_scale is above log(100), so the clamp of the cosine attention's
  temperature matters.
- ``pad``: a headless Swinv2Model on 30x30 images, patch 2, window 4, no q/v biases,
  pretrained window sizes set: the patch grid (15) and stage 1 (8 -> 4 per side
  after an odd merge) need padding to whole windows and an odd patch merge, and the
  relative coordinates are normalised by the pretrained windows.

Outputs are compared with the relative tolerance TOL (max|ours - ref| / max|ref|).
"""

import numpy as np
import pytest

import maxdecl as md

from modelhelp import hf_params, named_outputs, randomize, rel_err, save_hf, spec_path

pytest.importorskip("torch")
pytest.importorskip("transformers")

TOL = 1e-4
N_IMAGES = 2


def make_swinv2(seed=0, head=True, **kw):
    import torch
    import transformers

    torch.manual_seed(seed)
    cfg = dict(image_size=32, patch_size=2, num_channels=3, embed_dim=16,
               depths=[2, 2, 2, 2], num_heads=[2, 2, 4, 4], window_size=4, mlp_ratio=2.0,
               layer_norm_eps=1e-6, num_labels=5, drop_path_rate=0.1,
               attn_implementation="eager")
    cfg.update(kw)
    config = transformers.Swinv2Config(**cfg)
    cls = transformers.Swinv2ForImageClassification if head else transformers.Swinv2Model
    model = randomize(cls(config), seed)
    base = model.swinv2 if head else model
    with torch.no_grad():       # above log(100): the clamp matters
        base.encoder.layers[0].blocks[1].attention.self.logit_scale[0] = 5.5
    return model


def reference(model, pixels, head=True):
    import torch

    x = torch.from_numpy(pixels)
    with torch.no_grad():
        base = model.swinv2 if head else model
        out = base(x)
        ref = {"last_hidden_state": out.last_hidden_state.numpy(),
               "pooler_output": out.pooler_output.numpy()}
        if head:
            ref["logits"] = model(x).logits.numpy()
    return ref


def images(size, seed=3):
    return np.random.default_rng(seed).standard_normal((N_IMAGES, 3, size, size)).astype(np.float32)


@pytest.fixture(scope="module")
def cls_case(tmp_path_factory):
    model = make_swinv2(seed=0)
    path = save_hf(model, tmp_path_factory.mktemp("swinv2_cls"))
    pixels = images(32)
    ours = md.load_model(spec_path("swinv2"), path, variant="tiny")
    return model, path, pixels, reference(model, pixels), ours


@pytest.fixture(scope="module")
def pad_case(tmp_path_factory):
    model = make_swinv2(seed=1, head=False, image_size=30, depths=[2, 2, 1],
                        num_heads=[2, 4, 4], qkv_bias=False, pretrained_window_sizes=[6, 3, 2],
                        hidden_act="gelu_new")
    path = save_hf(model, tmp_path_factory.mktemp("swinv2_pad"))
    pixels = images(30, seed=4)
    ours = md.load_model(spec_path("swinv2"), path, variant="tiny")
    return model, path, pixels, reference(model, pixels, head=False), ours


def check(name, ours, ref):
    errs = {k: rel_err(ours[k], ref[k]) for k in ref}
    print(f"swinv2 {name} vs HF: " + ", ".join(f"{k} {e:.2e}" for k, e in errs.items()))
    for k, e in errs.items():
        assert e <= TOL, (k, e)


def test_swinv2_config_from_hf(cls_case, pad_case):
    got = hf_params("swinv2", cls_case[1])[2]
    assert (got["image_size"], got["patch_size"], got["embed_dim"], got["window_size"]) == (32, 2, 16, 4)
    assert list(got["depths"]) == [2, 2, 2, 2] and list(got["n_heads"]) == [2, 2, 4, 4]
    assert got["mlp_ratio"] == 2.0 and got["norm_eps"] == pytest.approx(1e-6)
    assert got["n_classes"] == 5 and got["is_classifier"] is True
    p = cls_case[4].params
    assert list(p["wins"]) == [4, 4, 4, 2] and list(p["shifts"]) == [2, 2, 0, 0]
    got = hf_params("swinv2", pad_case[1])[2]
    assert got["is_classifier"] is False and got["hidden_act"] == "gelu_new"
    p = pad_case[4].params
    assert list(p["res"]) == [15, 8, 4] and list(p["win_pads"]) == [1, 0, 2]
    assert list(p["wins"]) == [4, 4, 3] and list(p["shifts"]) == [2, 2, 0]


def test_swinv2_classifier_matches_hf(cls_case):
    model, path, pixels, ref, ours = cls_case
    out = named_outputs(ours, pixels)
    assert ours.output_names[0] == "logits"
    assert out["logits"].shape == (N_IMAGES, 5)
    check("classifier", out, ref)


def test_swinv2_padded_headless_matches_hf(pad_case):
    model, path, pixels, ref, ours = pad_case
    out = named_outputs(ours, pixels)
    assert "logits" not in out
    check("padded headless", out, ref)


def test_swinv2_base_model_checkpoint_loads(cls_case, tmp_path):
    """The classifier's Swinv2Model saved alone (names without swinv2.) gives the same
    hidden states, and no logits."""
    model, _, pixels, ref, _ = cls_case
    path = save_hf(model.swinv2, tmp_path / "base")
    ours = md.load_model(spec_path("swinv2"), path, variant="tiny")
    out = named_outputs(ours, pixels)
    assert "logits" not in out
    check("base model", out, {k: ref[k] for k in ("last_hidden_state", "pooler_output")})


def test_swinv2_shift_mask_matters(cls_case):
    """Negative control: the same weights through transformers with the shifted blocks'
    region mask switched off are far from ours."""
    import torch

    model, _, pixels, ref, ours = cls_case
    layer = model.swinv2.encoder.layers[0].blocks[1]
    orig = layer.get_attn_mask
    layer.get_attn_mask = lambda *a, **k: None
    try:
        with torch.no_grad():
            other = model(torch.from_numpy(pixels)).logits.numpy()
    finally:
        layer.get_attn_mask = orig
    assert rel_err(other, ref["logits"]) > 100 * TOL
    assert rel_err(named_outputs(ours, pixels)["logits"], other) > 100 * TOL


def test_swinv2_refuses_absolute_embeddings(cls_case):
    td = md.load_weights(cls_case[1])
    td.metadata["use_absolute_embeddings"] = True
    with pytest.raises(md.WeightsError, match="use_absolute_embeddings"):
        md.load_model(spec_path("swinv2"), td, variant="tiny")
