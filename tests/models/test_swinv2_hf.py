"""specs/swinv2.yaml against transformers' Swinv2ForImageClassification / Swinv2Model.

Small seeded float32 models:

- ``cls``: a classifier configured for 32x32 images, patch 2 (a 16x16 grid), window 4,
  4 stages of 2 blocks: stages 0 and 1 run shifted windows (with the region mask),
  stage 2 fits one window (no shift), stage 3 shrinks the window to its 2x2
  resolution. One block's logit_scale is above log(100), so the clamp of the cosine
  attention's temperature matters. ONE loaded graph runs every size of ``SIZES``:
  Swin V2 fixes windows and shifts from config.json's image_size (unlike V1) and pads
  the map to whole windows at run time, so a map smaller than its window (12x12: 3x3
  in a shifted stage of window 4; 3x5: an image smaller than two patches) is padded up
  to one window and still shifted.
- ``pad``: a headless Swinv2Model for 30x30 images, patch 2, window 4, no q/v biases,
  pretrained window sizes set: the patch grid (15) and stage 1 (8 -> 4 per side
  after an odd merge) need padding to whole windows and an odd patch merge, stage 2
  has a window of 3, and the relative coordinates are normalised by the pretrained
  windows; also run at other sizes.
- ``rect``: a classifier with a list image_size [24, 40] and patch_size [2, 4]: the
  patch conv is 2x4, and windows and shifts follow the height's grid only (12: stage 2
  has a window of 3, where the width's grid of 10 would give 2), as transformers.

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

# (height, width) of the images the cls graph runs, all through one loaded model
SIZES = [(32, 32), (36, 44), (28, 20), (12, 12), (3, 5), (64, 48)]
PAD_SIZES = [(17, 23), (6, 10), (40, 26)]
RECT_SIZES = [(24, 40), (30, 18), (9, 7)]


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
    h, w = (size, size) if isinstance(size, int) else size
    return np.random.default_rng(seed).standard_normal((N_IMAGES, 3, h, w)).astype(np.float32)


def size_refs(model, sizes, head=True, seed=10):
    """{(h, w): (pixels, transformers' outputs)} for each size."""
    out = {}
    for k, hw in enumerate(sizes):
        pixels = images(hw, seed=seed + k)
        out[hw] = (pixels, reference(model, pixels, head=head))
    return out


@pytest.fixture(scope="module")
def cls_case(tmp_path_factory):
    model = make_swinv2(seed=0)
    path = save_hf(model, tmp_path_factory.mktemp("swinv2_cls"))
    pixels = images(32)
    ours = md.load_model(spec_path("swinv2"), path, variant="tiny")
    return model, path, pixels, reference(model, pixels), ours


@pytest.fixture(scope="module")
def cls_sizes(cls_case):
    return size_refs(cls_case[0], SIZES)


@pytest.fixture(scope="module")
def pad_case(tmp_path_factory):
    model = make_swinv2(seed=1, head=False, image_size=30, depths=[2, 2, 1],
                        num_heads=[2, 4, 4], qkv_bias=False, pretrained_window_sizes=[6, 3, 2],
                        hidden_act="gelu_new")
    path = save_hf(model, tmp_path_factory.mktemp("swinv2_pad"))
    pixels = images(30, seed=4)
    ours = md.load_model(spec_path("swinv2"), path, variant="tiny")
    return model, path, pixels, reference(model, pixels, head=False), ours


@pytest.fixture(scope="module")
def pad_sizes(pad_case):
    return size_refs(pad_case[0], PAD_SIZES, head=False, seed=20)


@pytest.fixture(scope="module")
def rect_case(tmp_path_factory):
    model = make_swinv2(seed=2, image_size=[24, 40], patch_size=[2, 4], depths=[2, 2, 2],
                        num_heads=[2, 2, 4])
    path = save_hf(model, tmp_path_factory.mktemp("swinv2_rect"))
    ours = md.load_model(spec_path("swinv2"), path, variant="tiny")
    return model, path, size_refs(model, RECT_SIZES, seed=30), ours


def check(name, ours, ref):
    errs = {k: rel_err(ours[k], ref[k]) for k in ref}
    print(f"swinv2 {name} vs HF: " + ", ".join(f"{k} {e:.2e}" for k, e in errs.items()))
    for k, e in errs.items():
        assert e <= TOL, (k, e)


def test_swinv2_config_from_hf(cls_case, pad_case, rect_case):
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
    assert p["grid"] == 15
    assert list(p["wins"]) == [4, 4, 3] and list(p["shifts"]) == [2, 2, 0]
    got = hf_params("swinv2", rect_case[1])[2]
    assert (got["image_size"], got["image_size_w"]) == (24, 40)
    assert (got["patch_size"], got["patch_size_w"]) == (2, 4)
    p = rect_case[3].params
    assert p["grid"] == 12 and list(p["wins"]) == [4, 4, 3] and list(p["shifts"]) == [2, 2, 0]


def test_swinv2_input_takes_any_size(cls_case):
    """The pixels input is [batch, channels, h, w] with symbolic h and w."""
    ours = cls_case[4]
    assert ours.input_names == ["pixel_values"]
    shape = [str(d) for d in ours.graph.inputs[0].type.shape]
    assert shape == ["batch", "3", "h", "w"], shape


def test_swinv2_classifier_matches_hf(cls_case):
    model, path, pixels, ref, ours = cls_case
    out = named_outputs(ours, pixels)
    assert ours.output_names[0] == "logits"
    assert out["logits"].shape == (N_IMAGES, 5)
    check("classifier", out, ref)


@pytest.mark.parametrize("size", SIZES, ids=[f"{h}x{w}" for h, w in SIZES])
def test_swinv2_classifier_any_size_matches_hf(cls_case, cls_sizes, size):
    """One loaded graph (cls_case's) at every size: logits, last_hidden_state and
    pooler_output as transformers, the token count that of the padded, merged map."""
    ours = cls_case[4]
    pixels, ref = cls_sizes[size]
    out = named_outputs(ours, pixels)
    res = [(-(-size[0] // 2)), (-(-size[1] // 2))]          # patch grid, padded to whole patches
    for _ in range(3):
        res = [(r + 1) // 2 for r in res]                   # three merges, odd maps padded
    assert out["last_hidden_state"].shape == (N_IMAGES, res[0] * res[1], 128)
    check(f"classifier {size[0]}x{size[1]}", out, ref)


def test_swinv2_one_graph_all_sizes(cls_case, cls_sizes):
    """The same compiled model runs the sizes in turn and back without rebuilding."""
    ours = cls_case[4]
    graph = ours.graph
    for size in list(SIZES) + list(reversed(SIZES)):
        pixels, ref = cls_sizes[size]
        out = named_outputs(ours, pixels)
        assert rel_err(out["logits"], ref["logits"]) <= TOL, size
    assert ours.graph is graph


def test_swinv2_padded_headless_matches_hf(pad_case):
    model, path, pixels, ref, ours = pad_case
    out = named_outputs(ours, pixels)
    assert "logits" not in out
    check("padded headless", out, ref)


@pytest.mark.parametrize("size", PAD_SIZES, ids=[f"{h}x{w}" for h, w in PAD_SIZES])
def test_swinv2_padded_headless_any_size_matches_hf(pad_case, pad_sizes, size):
    ours = pad_case[4]
    pixels, ref = pad_sizes[size]
    out = named_outputs(ours, pixels)
    assert "logits" not in out
    check(f"padded headless {size[0]}x{size[1]}", out, ref)


@pytest.mark.parametrize("size", RECT_SIZES, ids=[f"{h}x{w}" for h, w in RECT_SIZES])
def test_swinv2_rectangular_config_matches_hf(rect_case, size):
    """A list image_size and patch_size (formerly refused) as transformers."""
    model, path, refs, ours = rect_case
    pixels, ref = refs[size]
    check(f"rect config {size[0]}x{size[1]}", named_outputs(ours, pixels), ref)


def test_swinv2_base_model_checkpoint_loads(cls_case, tmp_path):
    """The classifier's Swinv2Model saved alone (names without swinv2.) gives the same
    hidden states, and no logits."""
    model, _, pixels, ref, _ = cls_case
    path = save_hf(model.swinv2, tmp_path / "base")
    ours = md.load_model(spec_path("swinv2"), path, variant="tiny")
    out = named_outputs(ours, pixels)
    assert "logits" not in out
    check("base model", out, {k: ref[k] for k in ("last_hidden_state", "pooler_output")})


@pytest.mark.parametrize("size", [(32, 32), (28, 20), (12, 12)], ids=["32x32", "28x20", "12x12"])
def test_swinv2_shift_mask_matters(cls_case, cls_sizes, size):
    """Negative control: the same weights through transformers with the shifted blocks'
    region mask switched off are far from ours, at the config's size and at sizes whose
    maps are padded to whole windows (the mask comes from the padded map)."""
    import torch

    model, _, _, _, ours = cls_case
    pixels, ref = cls_sizes[size]
    layers = [model.swinv2.encoder.layers[s].blocks[1] for s in (0, 1)]
    origs = [layer.get_attn_mask for layer in layers]
    for layer in layers:
        layer.get_attn_mask = lambda *a, **k: None
    try:
        with torch.no_grad():
            other = model(torch.from_numpy(pixels)).logits.numpy()
    finally:
        for layer, orig in zip(layers, origs):
            layer.get_attn_mask = orig
    assert rel_err(other, ref["logits"]) > 100 * TOL
    assert rel_err(named_outputs(ours, pixels)["logits"], other) > 100 * TOL


def test_swinv2_refuses_absolute_embeddings(cls_case):
    td = md.load_weights(cls_case[1])
    td.metadata["use_absolute_embeddings"] = True
    with pytest.raises(md.WeightsError, match="use_absolute_embeddings"):
        md.load_model(spec_path("swinv2"), td, variant="tiny")
