"""specs/swin.yaml against transformers' SwinForImageClassification.

Seeded small float32 models saved with ``save_pretrained`` (safetensors + config.json);
every parameter random (``modelhelp.randomize``: LayerNorm gains and biases, conv and
linear weights and biases, the relative position bias tables, the absolute position
embeddings), so a weight read wrongly or left out changes the logits. The sizes come
from config.json, not the variant. Every image size is a multiple of patch_size *
window_size * 2 ** (stages - 1), so transformers pads nothing (the spec refuses
checkpoints that would need padding). Each case has shifted-window blocks (the odd
blocks of a stage whose map is larger than the window) and a stage without shift
(its map no larger than the window).
"""

import numpy as np
import pytest

import maxdecl as md
from modelhelp import TOL, randomize, rel_err, spec_path

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

SPEC = spec_path("swin")

CASES = {
    # the spec's tiny variant's sizes: 8x8 patches, window 4 (stage 0 shifted by 2),
    # stage 1 4x4 (= the window: no shift)
    "window4": dict(config=dict(image_size=32, patch_size=4, embed_dim=16, depths=[2, 2],
                                num_heads=[2, 4], window_size=4, num_labels=5),
                    images=(2, 3, 32, 32)),
    # window 2 (shift 1) on a rectangular image, 3 stages (16x8 -> 8x4 -> 4x2, the last
    # unshifted), no q/k/v bias, absolute position embeddings, another eps and MLP ratio
    "window2_rect": dict(config=dict(image_size=[32, 16], patch_size=2, embed_dim=12,
                                     depths=[2, 3, 2], num_heads=[2, 3, 4], window_size=2,
                                     mlp_ratio=2.0, qkv_bias=False,
                                     use_absolute_embeddings=True, layer_norm_eps=1e-6,
                                     num_labels=3),
                         images=(2, 3, 32, 16)),
}


def make_swin(config, seed=0):
    torch.manual_seed(seed)
    cfg = transformers.SwinConfig(**config)
    return randomize(transformers.SwinForImageClassification(cfg), seed)


@pytest.fixture(scope="module", params=sorted(CASES))
def case(request, tmp_path_factory):
    c = CASES[request.param]
    model = make_swin(c["config"])
    path = tmp_path_factory.mktemp(f"swin_{request.param}")
    model.save_pretrained(str(path))
    x = np.random.default_rng(1).standard_normal(c["images"]).astype(np.float32)
    with torch.no_grad():
        ref = model(pixel_values=torch.from_numpy(x)).logits.numpy()
    return request.param, model, path, x, ref


def test_logits_match_transformers(case):
    name, model, path, x, ref = case
    m = md.load_model(SPEC, str(path))
    cfg = model.config
    assert m.params["depths"] == list(cfg.depths)
    assert m.params["n_heads"] == list(cfg.num_heads)
    assert m.params["window"] == cfg.window_size
    assert [m.params["img_h"], m.params["img_w"]] == list(x.shape[2:])
    assert m.params["n_classes"] == cfg.num_labels
    assert m.params["norm_eps"] == cfg.layer_norm_eps
    assert any(s > 0 for s in m.params["shifts"]) and m.params["shifts"][-1] == 0
    (logits,) = m(x)
    assert logits.shape == ref.shape == (x.shape[0], cfg.num_labels)
    err = rel_err(logits, ref)
    print(f"swin {name} vs HF: {err:.2e} of max|ref| ({np.abs(ref).max():.2f}), "
          f"max abs {np.abs(logits - ref).max():.2e}")
    assert err <= TOL
    assert err < 1e-5                           # float32 throughout: much tighter than TOL


def test_shift_and_bias_matter(case):
    """Negative controls: the reference moves when transformers' blocks do not shift
    (so the match above covers the roll and the shift mask), and ours moves when the
    relative position bias tables are zeroed (so they are read)."""
    name, model, path, x, ref = case
    saved = {}
    for mod_name, mod in model.named_modules():
        if isinstance(mod, transformers.models.swin.modeling_swin.SwinLayer) and mod.shift_size:
            saved[mod_name] = mod.shift_size
            mod.shift_size = 0
    assert saved
    try:
        with torch.no_grad():
            unshifted = model(pixel_values=torch.from_numpy(x)).logits.numpy()
    finally:
        for mod_name, mod in model.named_modules():
            if mod_name in saved:
                mod.shift_size = saved[mod_name]
    assert rel_err(unshifted, ref) > 1e-2

    td = md.load_weights(str(path), spec=SPEC)
    tables = [k for k in td.keys() if k.endswith(".attn_rel_b.weight")]
    assert len(tables) == sum(model.config.depths)
    for k in tables:
        td[k] = np.zeros_like(np.asarray(td[k]))
    (logits,) = md.load_model(SPEC, td)(x)
    assert rel_err(logits, ref) > 1e-2


@pytest.mark.parametrize("config, why", [
    (dict(image_size=36, patch_size=4, window_size=4), "not a multiple of window_size"),
    (dict(image_size=30, patch_size=4, window_size=2), "not a multiple of patch_size"),
])
def test_refuses_padding(tmp_path, config, why):
    model = make_swin(dict(embed_dim=8, depths=[1, 1], num_heads=[1, 2], num_labels=2, **config))
    model.save_pretrained(str(tmp_path))
    with pytest.raises(md.WeightsError, match=why):
        md.load_weights(str(tmp_path), spec=SPEC)
