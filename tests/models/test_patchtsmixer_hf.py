"""specs/patchtsmixer.yaml against transformers' PatchTSMixerForPrediction.

Three small seeded float32 forecasters, each saved with ``save_pretrained`` and loaded
through the spec (config.json gives every size):

* ``common``: common_channel mode, LayerNorm, gated attention, std scaler, overlapping
  patches (patch 8, stride 5 over a context of 35: the first 2 steps are dropped);
* ``mix``: mix_channel mode (the channel feature mixer), BatchNorm with random running
  statistics, the tiny self-attention (2 heads) with a learned position table, mean
  scaler and ``prediction_channel_indices`` [2, 0] (sorted by transformers);
* ``plain``: no scaling (``scaling: null``) and no gates;
* ``mean_fixed``: the mean scaler with config.json's ``default_scale`` and
  ``minimum_scale`` (attributes transformers reads only when present).

Each is compared on its prediction_outputs (the de-scaled forecast), the backbone's
last_hidden_state and the scaler's loc and scale, with observed_mask all ones and with
missing values.
"""

import numpy as np
import pytest

import maxdecl as md

from modelhelp import hf_params, named_outputs, randomize, rel_err, save_hf, spec_path

pytest.importorskip("torch")
pytest.importorskip("transformers")

TOL = 1e-5          # max|ours - ref| <= TOL * max|ref|
BATCH = 4

BASE = dict(context_length=35, patch_length=8, patch_stride=5, num_input_channels=3,
            d_model=16, expansion_factor=2, num_layers=2, prediction_length=12,
            dropout=0.0, head_dropout=0.0, norm_eps=1e-5)

CASES = {
    "common": dict(mode="common_channel", gated_attn=True, norm_mlp="LayerNorm",
                   scaling="std"),
    "mix": dict(mode="mix_channel", gated_attn=True, norm_mlp="BatchNorm", self_attn=True,
                self_attn_heads=2, use_positional_encoding=True,
                positional_encoding_type="random", scaling="mean",
                prediction_channel_indices=[2, 0]),
    "plain": dict(mode="common_channel", gated_attn=False, norm_mlp="LayerNorm",
                  scaling=None),
    # the mean scaler's config-only attributes: a fixed scale for unobserved series
    "mean_fixed": dict(mode="common_channel", gated_attn=True, norm_mlp="LayerNorm",
                       scaling="mean", default_scale=2.0, minimum_scale=1e-3),
}


def make_patchtsmixer(seed=0, **kw):
    """PatchTSMixerForPrediction with seeded weights; BatchNorm running statistics drawn
    too (mean 0.3 N(0, 1), var in [0.5, 1.5]) so that they matter."""
    import torch
    import transformers

    torch.manual_seed(seed)
    cfg = transformers.PatchTSMixerConfig(**{**BASE, **kw})
    model = randomize(transformers.PatchTSMixerForPrediction(cfg), seed)
    gen = torch.Generator().manual_seed(seed + 100)
    with torch.no_grad():
        for name, buf in model.named_buffers():
            if name.endswith("running_mean"):
                buf.copy_(0.3 * torch.randn(buf.shape, generator=gen))
            elif name.endswith("running_var"):
                buf.copy_(0.5 + torch.rand(buf.shape, generator=gen))
    return model.eval()


def series(seed: int, context: int, channels: int) -> np.ndarray:
    """[BATCH, context, channels]: sines plus noise, each channel its own level and size."""
    rng = np.random.default_rng(seed)
    t = np.arange(context)[None, :, None]
    level = rng.normal(0, 5, size=(BATCH, 1, channels))
    size = rng.uniform(0.5, 3.0, size=(BATCH, 1, channels))
    x = level + size * np.sin(0.3 * t + rng.uniform(0, 6, size=(BATCH, 1, channels)))
    return (x + 0.3 * rng.normal(size=x.shape)).astype(np.float32)


def missing_mask(seed: int, context: int, channels: int) -> np.ndarray:
    """Observed mask with about a fifth of the values missing, and series 0's channel 1
    missing throughout (the mean scaler then takes the batch's scale there)."""
    rng = np.random.default_rng(seed)
    m = (rng.uniform(size=(BATCH, context, channels)) > 0.2).astype(np.float32)
    m[0, :, 1] = 0.0
    return m


def hf_outputs(model, values, mask) -> dict:
    import torch

    with torch.no_grad():
        out = model(past_values=torch.from_numpy(values), observed_mask=torch.from_numpy(mask),
                    return_loss=False)
    return {k: getattr(out, k).float().numpy()
            for k in ("prediction_outputs", "last_hidden_state", "loc", "scale")}


@pytest.fixture(scope="module")
def cases(tmp_path_factory):
    """name -> (HF model, its save_pretrained folder, the spec model loaded from it)."""
    out = {}
    for k, (name, kw) in enumerate(CASES.items()):
        model = make_patchtsmixer(seed=k, **kw)
        path = save_hf(model, tmp_path_factory.mktemp(f"patchtsmixer_{name}"))
        ours = md.load_model(spec_path("patchtsmixer"), path, variant="tiny")
        out[name] = (model, path, ours)
    return out


err = rel_err      # an all-zero reference compares absolutely, NaN is inf


def errors(case, values, mask) -> dict:
    model, _, ours = case
    ref = hf_outputs(model, values, mask)
    got = named_outputs(ours, values, mask)
    return {k: err(got[k], ref[k]) for k in ref}


def test_patchtsmixer_outputs_in_order(cases):
    assert cases["common"][2].output_names[:4] == [
        "last_hidden_state", "prediction_outputs", "loc", "scale"]


def test_patchtsmixer_config_from_hf(cases):
    got = hf_params("patchtsmixer", cases["common"][1])[2]
    assert (got["context_length"], got["patch_length"], got["patch_stride"]) == (35, 8, 5)
    assert (got["n_channels"], got["d_model"], got["n_layers"]) == (3, 16, 2)
    assert (got["prediction_length"], got["scaler"], got["mode"]) == (12, "std", "common_channel")
    mix = hf_params("patchtsmixer", cases["mix"][1])[2]
    assert (mix["mode"], mix["norm_mlp"], mix["scaler"]) == ("mix_channel", "BatchNorm", "mean")
    assert mix["self_attn"] is True and mix["self_attn_heads"] == 2
    assert mix["prediction_channel_indices"] == [0, 2]      # sorted, as transformers does
    assert hf_params("patchtsmixer", cases["plain"][1])[2]["scaler"] == "none"
    fixed = cases["mean_fixed"][2].params
    assert (fixed["default_scale"], fixed["min_scale"]) == (2.0, 1e-3)
    assert cases["common"][2].params["min_scale"] == 1e-5
    assert cases["mix"][2].params["min_scale"] == 1e-10
    assert cases["common"][2].params["num_patches"] == 6
    assert cases["common"][2].params["seq_start"] == 2


@pytest.mark.parametrize("name", list(CASES))
@pytest.mark.parametrize("observed", ["all", "missing"])
def test_patchtsmixer_matches_hf(cases, name, observed):
    cfg = cases[name][0].config
    values = series(11, cfg.context_length, cfg.num_input_channels)
    mask = (np.ones_like(values) if observed == "all"
            else missing_mask(12, cfg.context_length, cfg.num_input_channels))
    values = values * mask              # missing values are zeros, as transformers expects
    err = errors(cases[name], values, mask)
    print(f"patchtsmixer {name} ({observed} observed) vs HF: "
          + ", ".join(f"{k} {v:.2e}" for k, v in err.items()))
    assert max(err.values()) <= TOL, err


def test_patchtsmixer_forecast_shapes(cases):
    values = series(3, 35, 3)
    mask = np.ones_like(values)
    got = named_outputs(cases["common"][2], values, mask)
    assert got["prediction_outputs"].shape == (BATCH, 12, 3)
    assert got["last_hidden_state"].shape == (BATCH, 3, 6, 16)
    assert got["loc"].shape == got["scale"].shape == (BATCH, 1, 3)
    mix = named_outputs(cases["mix"][2], values, mask)
    assert mix["prediction_outputs"].shape == (BATCH, 12, 2)        # channels 0 and 2
    assert mix["loc"].shape == (BATCH, 1, 2)


def test_patchtsmixer_batch_rows_are_independent_with_std_scaler(cases):
    """The std scaler and the mixers read each series alone: one series run alone gives
    its rows of the batched call."""
    values = series(5, 35, 3)
    mask = np.ones_like(values)
    ours = cases["common"][2]
    full = named_outputs(ours, values, mask)["prediction_outputs"]
    one = named_outputs(ours, values[2:3], mask[2:3])["prediction_outputs"]
    assert err(one, full[2:3]) <= TOL


def test_patchtsmixer_observed_mask_matters(cases):
    """Negative control: the missing values change the scaling (and so the forecast)."""
    model, _, ours = cases["common"]
    values = series(11, 35, 3)
    mask = missing_mask(12, 35, 3)
    ref = hf_outputs(model, values, mask)
    got = named_outputs(ours, values, np.ones_like(values))
    assert err(got["prediction_outputs"], ref["prediction_outputs"]) > 100 * TOL


def test_patchtsmixer_refuses_other_scaling_axes(tmp_path):
    """scaling_dim / keepdim (read by transformers' scalers only when config.json has
    them) other than the defaults are refused, not run wrong."""
    model = make_patchtsmixer(seed=6, keepdim=False)
    path = save_hf(model, tmp_path / "keepdim")
    with pytest.raises(md.WeightsError, match="keepdim"):
        md.load_model(spec_path("patchtsmixer"), path, variant="tiny")


def test_patchtsmixer_refuses_distribution_head(tmp_path):
    """loss "nll" gives a distribution head (a tuple of parameters): refused by name."""
    model = make_patchtsmixer(seed=5, loss="nll", distribution_output="normal")
    path = save_hf(model, tmp_path / "nll")
    with pytest.raises(md.WeightsError, match="distribution head"):
        md.load_model(spec_path("patchtsmixer"), path, variant="tiny")
