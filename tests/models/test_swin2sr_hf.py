"""specs/swin2sr.yaml against transformers' Swin2SRForImageSuperResolution / Swin2SRModel.

Small seeded float32 models, each built, saved and loaded once (module fixtures):

- ``ps``: the ``pixelshuffle`` upsampler, x2, config image 16, window 4 (the odd layers
  shift by 2, with the region mask), 1conv stages; one block's logit_scale above
  log(100), so the clamp of the cosine attention's temperature matters.
- ``direct``: ``pixelshuffledirect`` x3, one channel (transformers' mean is then 0),
  img_range 2, no q/v biases, gelu_new; config image 6 with window 8, so the layers'
  window is 6 and never shifts, while the input is padded to multiples of 8: the map is
  padded again, with zeros, to whole windows of 6 inside every layer.
- ``nearest``: ``nearest+conv`` x4 with 3conv stages.
- ``aux``: ``pixelshuffle_aux`` x3 (a bicubic branch of the raw input; Upsample's one
  3x pixel shuffle, where ``ps`` and ``nearest`` take the 2x ones).
- ``denoise``: no upsampler (``upsampler: ""``, x1): the input plus a conv.
- ``headless``: a Swin2SRModel checkpoint: last_hidden_state only.
- and transformers' default Swin2SRConfig (embed 180, 6 stages of 6 layers, 6 heads,
  window 8 from image 64: caidas/swin2SR-classical-sr-x2-64's sizes), random weights.

Sizes. transformers reflect-pads the image to whole windows and crops the reconstruction
to ``upscale`` times the input, but then reshapes the padded map to the *unpadded* size,
which fails for any input that is not a whole number of windows (``test_hf_fails_...``
shows it). The spec runs such sizes as the padding and cropping intend; their reference
is transformers run on the image reflect-padded by hand (which it accepts), its outputs
cropped to the input's size times upscale: for every upsampler but ``pixelshuffle_aux``
that is exactly what transformers' own padding would give (aux's bicubic branch reads
the unpadded input, so aux is compared at whole-window sizes only).

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

BASE = dict(image_size=16, patch_size=1, num_channels=3, embed_dim=16, depths=[2, 2],
            num_heads=[2, 4], window_size=4, mlp_ratio=2.0, layer_norm_eps=1e-5,
            upscale=2, upsampler="pixelshuffle", drop_path_rate=0.1)

CASES = {
    "ps": dict(),
    "direct": dict(upsampler="pixelshuffledirect", upscale=3, num_channels=1, img_range=2.0,
                   qkv_bias=False, hidden_act="gelu_new", image_size=6, window_size=8),
    "nearest": dict(upsampler="nearest+conv", upscale=4, resi_connection="3conv"),
    "aux": dict(upsampler="pixelshuffle_aux", upscale=3),
    "denoise": dict(upsampler="", upscale=1),
    "headless": dict(),
}

# (height, width) per case: whole windows first, then sizes that are not
SIZES = {
    "ps": [(16, 16), (12, 20), (13, 18), (7, 5)],
    "direct": [(16, 8), (10, 13)],
    "nearest": [(8, 12), (9, 6)],
    "aux": [(16, 16), (12, 8)],
    "denoise": [(12, 16), (11, 14)],
    "headless": [(16, 12), (14, 15)],
}


def make_swin2sr(seed=0, head=True, **kw):
    import torch
    import transformers

    torch.manual_seed(seed)
    cfg = {**BASE, **kw}
    config = transformers.Swin2SRConfig(**cfg)
    cls = transformers.Swin2SRForImageSuperResolution if head else transformers.Swin2SRModel
    model = randomize(cls(config), seed)
    base = model.swin2sr if head else model
    with torch.no_grad():       # above log(100): the clamp matters
        base.encoder.stages[0].layers[1].attention.self.logit_scale[0] = 5.5
    return model


def whole(hw, ws):
    return hw[0] % ws == 0 and hw[1] % ws == 0


def reflect_padded(pixels, ws):
    """The image reflect-padded at the end to whole windows, as transformers' own
    pad_and_normalize does."""
    import torch

    x = torch.from_numpy(pixels)
    h, w = x.shape[2:]
    return torch.nn.functional.pad(x, (0, (ws - w % ws) % ws, 0, (ws - h % ws) % ws), "reflect")


def reference(model, pixels, head=True):
    """transformers' outputs for ``pixels``, through the hand-padded image where the size
    is not a whole number of windows (cropped to the input's size times upscale)."""
    import torch

    cfg = model.config
    h, w = pixels.shape[2:]
    x = reflect_padded(pixels, cfg.window_size)
    with torch.no_grad():
        base = model.swin2sr if head else model
        ref = {"last_hidden_state": base(x).last_hidden_state.numpy()}
        if head:
            rec = model(x).reconstruction.numpy()
            ref["reconstruction"] = rec[:, :, : h * cfg.upscale, : w * cfg.upscale]
    return ref


def images(hw, channels, seed):
    return np.random.default_rng(seed).random((N_IMAGES, channels, *hw)).astype(np.float32)


@pytest.fixture(scope="module")
def cases(tmp_path_factory):
    """name -> (HF model, its folder, the loaded spec, {(h, w): (pixels, reference)})."""
    out = {}
    for k, (name, kw) in enumerate(CASES.items()):
        head = name != "headless"
        model = make_swin2sr(seed=k, head=head, **kw)
        path = save_hf(model, tmp_path_factory.mktemp(f"swin2sr_{name}"))
        ours = md.load_model(spec_path("swin2sr"), path, variant="tiny")
        refs = {}
        for j, hw in enumerate(SIZES[name]):
            pixels = images(hw, model.config.num_channels, seed=10 * k + j)
            refs[hw] = (pixels, reference(model, pixels, head=head))
        out[name] = (model, path, ours, refs)
    return out


def check(name, ours, ref):
    errs = {k: rel_err(ours[k], ref[k]) for k in ref}
    print(f"swin2sr {name} vs HF: " + ", ".join(f"{k} {e:.2e}" for k, e in errs.items()))
    for k, e in errs.items():
        assert e <= TOL, (k, e)


PARAMS = [(name, hw) for name in CASES for hw in SIZES[name]]


@pytest.mark.parametrize("name,hw", PARAMS, ids=[f"{n}-{h}x{w}" for n, (h, w) in PARAMS])
def test_swin2sr_matches_hf(cases, name, hw):
    """The reconstruction (and the body's last_hidden_state) as transformers, at a size
    of whole windows and at one that is not (see the module doc)."""
    model, _, ours, refs = cases[name]
    pixels, ref = refs[hw]
    out = named_outputs(ours, pixels)
    assert ours.output_names[0] == "last_hidden_state"
    if name == "headless":
        assert "reconstruction" not in out
    else:
        up = model.config.upscale
        assert out["reconstruction"].shape == (N_IMAGES, model.config.num_channels_out,
                                               hw[0] * up, hw[1] * up)
    check(f"{name} {hw[0]}x{hw[1]}", out, ref)


def test_swin2sr_hf_fails_off_whole_windows(cases):
    """transformers itself raises on an image that is not a whole number of windows (it
    pads it, then reshapes the map to the unpadded size): why the spec is compared with
    the hand-padded image there."""
    import torch

    model, _, _, refs = cases["ps"]
    pixels, _ = refs[(13, 18)]
    with pytest.raises(RuntimeError, match="invalid for input of size"):
        with torch.no_grad():
            model(torch.from_numpy(pixels))


def test_swin2sr_config_from_hf(cases):
    got = hf_params("swin2sr", cases["ps"][1])[2]
    assert (got["image_size"], got["window_size"], got["embed_dim"], got["upscale"]) == (16, 4, 16, 2)
    assert list(got["depths"]) == [2, 2] and list(got["num_heads"]) == [2, 4]
    assert got["upsampler"] == "pixelshuffle" and got["headless"] is False
    p = cases["ps"][2].params
    assert (p["win"], p["shift"], p["head"], p["n_up2"]) == (4, 2, "pixelshuffle", 1)
    p = cases["direct"][2].params
    assert (p["win"], p["shift"], p["num_channels"], p["num_channels_out"]) == (6, 0, 1, 1)
    assert p["img_range"] == 2.0 and p["qkv_bias"] is False and p["hidden_act"] == "gelu_new"
    assert cases["nearest"][2].params["resi_connection"] == "3conv"
    assert cases["denoise"][2].params["head"] == "conv"
    assert cases["headless"][2].params["head"] == "none"


def test_swin2sr_input_takes_any_size(cases):
    ours = cases["ps"][2]
    assert ours.input_names == ["pixel_values"]
    shape = [str(d) for d in ours.graph.inputs[0].type.shape]
    assert shape == ["batch", "3", "h", "w"], shape
    assert ours.output_names == ["last_hidden_state", "reconstruction"]


def test_swin2sr_shift_mask_matters(cases):
    """Negative control: transformers with the shifted layers' region mask switched off is
    far from ours."""
    import torch

    model, _, ours, refs = cases["ps"]
    pixels, ref = refs[(16, 16)]
    layers = [stage.layers[1] for stage in model.swin2sr.encoder.stages]
    origs = [layer.get_attn_mask for layer in layers]
    for layer in layers:
        layer.get_attn_mask = lambda *a, **k: None
    try:
        with torch.no_grad():
            other = model(torch.from_numpy(pixels)).reconstruction.numpy()
    finally:
        for layer, orig in zip(layers, origs):
            layer.get_attn_mask = orig
    assert rel_err(other, ref["reconstruction"]) > 100 * TOL
    assert rel_err(named_outputs(ours, pixels)["reconstruction"], other) > 100 * TOL


def test_swin2sr_refuses_patch_size(cases):
    td = md.load_weights(cases["ps"][1])
    td.metadata["patch_size"] = 2
    with pytest.raises(md.WeightsError, match="patch_size"):
        md.load_model(spec_path("swin2sr"), td, variant="tiny")


def test_swin2sr_default_config_matches_hf(tmp_path):
    """transformers' default Swin2SRConfig (the classical x2 checkpoint's sizes): every
    size comes from config.json (window 8, shift 4, 180 channels, 36 layers)."""
    import torch
    import transformers

    torch.manual_seed(0)
    model = randomize(transformers.Swin2SRForImageSuperResolution(transformers.Swin2SRConfig()), 0)
    path = save_hf(model, tmp_path / "default")
    ours = md.load_model(spec_path("swin2sr"), path)
    p = ours.params
    assert (p["dim"], p["n_stages"], p["win"], p["shift"], p["n_up2"]) == (180, 6, 8, 4, 1)
    pixels = images((24, 32), 3, seed=99)[:1]
    with torch.no_grad():
        ref = model(torch.from_numpy(pixels)).reconstruction.numpy()
    out = named_outputs(ours, pixels)
    check("default config 24x32", out, {"reconstruction": ref})
