"""specs/patchtst.yaml against transformers' PatchTSTForPrediction and PatchTSTModel.

Seeded small float32 models saved with ``save_pretrained`` (safetensors + config.json);
every parameter random (LayerNorm / BatchNorm gains and biases, the BatchNorm running
statistics, the position table, the [CLS] patch), the sizes read from config.json, not
the variant. A batch of two series of three channels, each channel with its own offset
and spread so that the instance scaling matters; patches overlap (stride < length), and
the context does not divide into whole strides, so the first steps are dropped.

Cases (each a PatchTSTForPrediction):

* ``std``: transformers' defaults: std scaling, BatchNorm, pre-norm, one patch embedding
  and one head shared by the channels, mean pooling, sincos positions, channels
  independent (no channel attention);
* ``mean``: mean scaling, LayerNorm, post-norm, one patch embedding per channel, no
  pooling (every patch flattened into the head), random positions, ReLU, no
  feed-forward biases;
* ``cls_chan``: no scaling, a [CLS] patch (the head reads it), attention across the
  channels with the same weights, BatchNorm.

Plus a head per channel (``share_projection=False``, which transformers 5.24.0 cannot run:
its PatchTSTPredictionHead overwrites ``pooled_embedding`` inside the channel loop and
flattens a 2-D tensor from dim 2, so the reference is transformers' own encoder and
per-channel projections applied as the head means to), a headless PatchTSTModel
checkpoint, missing values (``past_observed_mask``, one
channel of one series wholly unobserved) and negative controls.
"""

import json

import numpy as np
import pytest

import maxdecl as md
from modelhelp import named_outputs, randomize, rel_err, save_hf, spec_path, with_hf_config

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

SPEC = spec_path("patchtst")
N_SERIES = 2
# max|ours - ref| <= TOL * max|ref|. float32 throughout; the unscaled case (cls_chan,
# hidden states up to ~75) differs by ~1e-5 because transformers' own float32 result is
# 1.0e-5 from a float64 run of it (ours: 3.6e-6), so TOL leaves 5x room over that.
TOL = 5e-5

BASE = dict(num_input_channels=3, context_length=32, patch_length=8, patch_stride=5,
            d_model=16, num_attention_heads=4, num_hidden_layers=2, ffn_dim=32,
            prediction_length=7)

CASES = {
    "std": dict(scaling="std", norm_type="batchnorm", pre_norm=True, share_embedding=True,
                share_projection=True, pooling_type="mean", channel_attention=False,
                positional_encoding_type="sincos"),
    "mean": dict(scaling="mean", norm_type="layernorm", pre_norm=False, share_embedding=False,
                 share_projection=True, pooling_type=None, channel_attention=False,
                 positional_encoding_type="random", activation_function="relu", bias=False,
                 norm_eps=1e-6),
    "cls_chan": dict(scaling=None, norm_type="batchnorm", pre_norm=True, use_cls_token=True,
                     pooling_type="max", channel_attention=True, num_attention_heads=2,
                     patch_stride=3),
}


def make_patchtst(config, seed=0, cls=None):
    torch.manual_seed(seed)
    cfg = transformers.PatchTSTConfig(**{**BASE, **config}, attn_implementation="eager")
    model = randomize((cls or transformers.PatchTSTForPrediction)(cfg), seed)
    gen = torch.Generator().manual_seed(seed + 100)
    with torch.no_grad():
        for name, b in model.named_buffers():
            if name.endswith("running_mean"):
                b.copy_(0.3 * torch.randn(b.shape, generator=gen))
            elif name.endswith("running_var"):
                b.copy_(0.5 + torch.rand(b.shape, generator=gen))
        for name, p in model.named_parameters():
            if name.endswith("input_embedding.weight") or ".input_embedding." in name:
                if p.ndim == 2:                         # N(0, 1 / fan_in), not N(0, 1)
                    p.copy_(p / p.shape[-1] ** 0.5)
    return model.eval()


def series(cfg, n=N_SERIES, seed=1) -> np.ndarray:
    rng = np.random.default_rng(seed)
    c, t = cfg.num_input_channels, cfg.context_length
    offset = rng.uniform(-5, 5, size=(n, 1, c))
    spread = rng.uniform(0.3, 4.0, size=(n, 1, c))
    trend = np.linspace(0, 1, t)[None, :, None] * rng.standard_normal((n, 1, c))
    return (offset + spread * (rng.standard_normal((n, t, c)) + trend)).astype(np.float32)


def hf_outputs(model, x, mask=None) -> dict:
    kw = {} if mask is None else {"past_observed_mask": torch.from_numpy(mask)}
    with torch.no_grad():
        xt = torch.from_numpy(x)
        if isinstance(model, transformers.PatchTSTForPrediction):
            out = model(past_values=xt, **kw)
            enc = model.model(past_values=xt, **kw)
            return {"prediction_outputs": out.prediction_outputs.numpy(),
                    "last_hidden_state": enc.last_hidden_state.numpy(),
                    "loc": out.loc.numpy(), "scale": out.scale.numpy()}
        enc = model(past_values=xt, **kw)
        return {"last_hidden_state": enc.last_hidden_state.numpy(),
                "loc": enc.loc.numpy(), "scale": enc.scale.numpy()}


def ones_like(x):
    return np.ones_like(x, dtype=np.float32)


def err(ours, ref) -> float:
    """rel_err, or max|ours| where the reference is all zeros (loc without a shift)."""
    if not np.any(ref):
        assert np.shape(ours) == np.shape(ref)
        return float(np.max(np.abs(ours)))
    return rel_err(ours, ref)


def errors(got, ref) -> dict:
    return {k: err(got[k], ref[k]) for k in ref}


@pytest.fixture(scope="module", params=sorted(CASES))
def case(request, tmp_path_factory):
    model = make_patchtst(CASES[request.param])
    path = save_hf(model, tmp_path_factory.mktemp(f"patchtst_{request.param}"))
    x = series(model.config)
    return request.param, model, str(path), x, hf_outputs(model, x)


@pytest.fixture(scope="module")
def loaded(case):
    return md.load_model(SPEC, case[2])


def test_outputs_match_transformers(case, loaded):
    name, hf, path, x, ref = case
    m, cfg = loaded, hf.config
    want = {"n_channels": cfg.num_input_channels, "context_length": cfg.context_length,
            "patch_length": cfg.patch_length, "patch_stride": cfg.patch_stride,
            "d_model": cfg.d_model, "n_heads": cfg.num_attention_heads,
            "n_layers": cfg.num_hidden_layers, "ffn_dim": cfg.ffn_dim,
            "prediction_length": cfg.prediction_length, "norm_type": cfg.norm_type,
            "pre_norm": cfg.pre_norm, "channel_attention": cfg.channel_attention,
            "share_embedding": cfg.share_embedding, "share_projection": cfg.share_projection,
            "use_cls_token": cfg.use_cls_token, "has_head": True,
            "num_patches": hf.model.patchifier.num_patches,
            "seq_start": hf.model.patchifier.sequence_start}
    assert {k: m.params[k] for k in want} == want
    assert m.params["scaling"] == (cfg.scaling or "none")
    assert m.params["pooling"] == (cfg.pooling_type or "none")
    assert m.input_names == ["past_values", "past_observed_mask"]
    got = named_outputs(m, x, ones_like(x))
    assert list(got) == ["last_hidden_state", "loc", "scale", "prediction_outputs"]
    n_pos = hf.model.patchifier.num_patches + int(cfg.use_cls_token)
    assert got["prediction_outputs"].shape == (N_SERIES, cfg.prediction_length,
                                               cfg.num_input_channels)
    assert got["last_hidden_state"].shape == (N_SERIES, cfg.num_input_channels, n_pos,
                                              cfg.d_model)
    errs = errors(got, ref)
    abs_errs = {k: float(np.max(np.abs(got[k] - ref[k]))) for k in ref}
    print(f"patchtst {name} vs HF: " + ", ".join(
        f"{k} rel {errs[k]:.2e} abs {abs_errs[k]:.2e}" for k in ref))
    assert all(e <= TOL for e in errs.values()), errs
    # the series are independent: one alone gives its row of the batch
    one = named_outputs(m, x[1:2], ones_like(x[1:2]))
    for k in ref:
        assert err(one[k], ref[k][1:2]) <= TOL, k


def test_missing_values_match_transformers(case, loaded):
    """``past_observed_mask`` with gaps, one channel of one series never observed (the
    mean scaler then takes the batch's scale for it)."""
    name, hf, path, x, _ = case
    rng = np.random.default_rng(3)
    mask = (rng.uniform(size=x.shape) > 0.3).astype(np.float32)
    mask[0, :, 1] = 0.0
    xm = np.where(mask > 0, x, 0.0).astype(np.float32)   # missing values given as zeros
    ref = hf_outputs(hf, xm, mask)
    got = named_outputs(loaded, xm, mask)
    errs = errors(got, ref)
    print(f"patchtst {name} (missing values) vs HF: " + ", ".join(
        f"{k} {e:.2e}" for k, e in errs.items()))
    assert all(e <= TOL for e in errs.values()), errs


def test_parts_matter(case):
    """Negative controls: the wrong scaling, or the BatchNorm statistics / LayerNorm
    gains replaced by neutral ones, move the outputs far past TOL."""
    name, hf, path, x, ref = case
    other = {"std": "mean", "mean": "std", "cls_chan": "std"}[name]
    spec = with_hf_config(md.load_spec(SPEC), scaling=f"{{'{other}'}}")
    got = named_outputs(md.load_model(spec, path), x, ones_like(x))
    assert rel_err(got["prediction_outputs"], ref["prediction_outputs"]) > 100 * TOL

    td = md.load_weights(path, spec=SPEC)
    for k in list(td.keys()):
        if k.endswith(("running_mean", ".bias")) and ".norm" in k:
            td[k] = np.zeros_like(np.asarray(td[k]))
        elif k.endswith(("running_var", ".weight")) and ".norm" in k:
            td[k] = np.ones_like(np.asarray(td[k]))
    got = named_outputs(md.load_model(SPEC, td), x, ones_like(x))
    assert rel_err(got["last_hidden_state"], ref["last_hidden_state"]) > 100 * TOL


@pytest.mark.parametrize("pooling", ["mean", None])
def test_per_channel_head(tmp_path, pooling):
    """``share_projection=False``: channel c through its own ``head.projections.{c}``."""
    model = make_patchtst(dict(CASES["mean"], share_projection=False, pooling_type=pooling),
                          seed=6)
    with pytest.raises((IndexError, RuntimeError)):     # transformers' head fails as it is
        model(past_values=torch.zeros(1, BASE["context_length"], BASE["num_input_channels"]))
    path = save_hf(model, tmp_path)
    x = series(model.config, seed=6)
    with torch.no_grad():
        enc = model.model(past_values=torch.from_numpy(x))
        h = enc.last_hidden_state                         # [batch, C, patches, d_model]
        pooled = h.mean(dim=2) if pooling == "mean" else h.flatten(start_dim=2)
        y = torch.stack([model.head.projections[c](pooled[:, c])
                         for c in range(model.config.num_input_channels)], dim=1)
        ref = (y.transpose(2, 1) * enc.scale + enc.loc).numpy()
    m = md.load_model(SPEC, str(path))
    assert m.params["share_projection"] is False
    got = named_outputs(m, x, ones_like(x))
    e = err(got["prediction_outputs"], ref)
    print(f"patchtst per-channel head ({pooling}) vs HF modules: {e:.2e}")
    assert e <= TOL
    assert err(got["last_hidden_state"], enc.last_hidden_state.numpy()) <= TOL


def test_headless_model_checkpoint(tmp_path):
    """A PatchTSTModel checkpoint (no ``model.`` prefix, no head): the encoder's output,
    loc and scale, and no prediction_outputs."""
    model = make_patchtst(CASES["std"], seed=2, cls=transformers.PatchTSTModel)
    path = save_hf(model, tmp_path / "model")
    x = series(model.config, seed=5)
    ref = hf_outputs(model, x)
    m = md.load_model(SPEC, str(path))
    assert m.params["has_head"] is False
    got = named_outputs(m, x, ones_like(x))
    assert list(got) == ["last_hidden_state", "loc", "scale"]
    errs = errors(got, ref)
    print("patchtst headless vs HF: " + ", ".join(f"{k} {e:.2e}" for k, e in errs.items()))
    assert all(e <= TOL for e in errs.values()), errs


def test_distribution_head_refused(tmp_path):
    model = make_patchtst(dict(CASES["std"], loss="nll", distribution_output="normal"), seed=3)
    path = save_hf(model, tmp_path)
    with pytest.raises(md.WeightsError, match="distribution head"):
        md.load_model(SPEC, str(path))


def test_random_masking_refused(tmp_path):
    model = make_patchtst(CASES["std"], seed=4, cls=transformers.PatchTSTModel)
    path = save_hf(model, tmp_path)
    cfg = json.loads((tmp_path / "config.json").read_text())
    cfg["do_mask_input"] = True
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(md.WeightsError, match="at random"):
        md.load_model(SPEC, str(path))
