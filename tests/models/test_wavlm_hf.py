"""specs/wavlm.yaml against transformers' WavLMModel.

Two small seeded float32 WavLMs, each built, saved with save_pretrained and run once:

* ``group``: wavlm-base's layout: GroupNorm on the first conv of the feature encoder
  only, bias-free convs, post-norm encoder layers (do_stable_layer_norm false), an even
  positional-conv kernel (HF drops the last frame of its output);
* ``layer``: wavlm-large's layout: LayerNorm after every conv, conv biases, pre-norm
  encoder layers with the final LayerNorm after them (do_stable_layer_norm true), an
  odd positional-conv kernel.

Both use 16 relative-position buckets over a distance of 20 and ~44 frames, so the
bucketing takes its exact, its log-spaced and its capped branches, and every layer
gates layer 0's bias table with its own projection of the attention input.
"""

import numpy as np
import pytest

import maxdecl as md

from modelhelp import hf_params, named_outputs, randomize, rel_err, save_hf, spec_path

pytest.importorskip("torch")
pytest.importorskip("transformers")

TOL = 1e-4                     # max|ours - ref| <= TOL * max|ref|
N_SAMPLES = 900                # -> (900-10)//5+1 = 179 -> 89 -> 44 frames

TINY = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64,
            conv_dim=(16, 16, 16), conv_kernel=(10, 3, 3), conv_stride=(5, 2, 2),
            num_conv_pos_embeddings=16, num_conv_pos_embedding_groups=4, num_buckets=16,
            max_bucket_distance=20, layer_norm_eps=1e-5, hidden_act="gelu",
            feat_extract_activation="gelu")

CASES = {
    "group": dict(feat_extract_norm="group", do_stable_layer_norm=False, conv_bias=False),
    "layer": dict(feat_extract_norm="layer", do_stable_layer_norm=True, conv_bias=True,
                  num_conv_pos_embeddings=15, num_conv_pos_embedding_groups=2,
                  layer_norm_eps=1e-6),
}


def make_wavlm(seed=0, **kw):
    """WavLMModel with TINY's sizes (and ``kw``), every parameter seeded by randomize."""
    import torch
    import transformers

    torch.manual_seed(seed)
    cfg = dict(TINY)
    cfg.update(kw)
    return randomize(transformers.WavLMModel(transformers.WavLMConfig(**cfg)), seed)


def waveforms(batch: int, n: int, seed: int) -> np.ndarray:
    """A seeded batch of raw audio [batch, n]: a few tones plus noise, zero mean, unit
    variance per waveform (as Wav2Vec2FeatureExtractor normalises it)."""
    rng = np.random.default_rng(seed)
    t = np.arange(n) / 16000.0
    x = np.stack([sum(np.sin(2 * np.pi * f * t + rng.uniform(0, 6)) for f in
                      rng.uniform(80, 4000, size=4)) + 0.3 * rng.standard_normal(n)
                  for _ in range(batch)])
    x = (x - x.mean(-1, keepdims=True)) / x.std(-1, keepdims=True)
    return x.astype(np.float32)


def hf_outputs(model, x, mask=None) -> dict:
    import torch

    with torch.no_grad():
        out = model(torch.from_numpy(x),
                    attention_mask=None if mask is None else torch.from_numpy(mask))
    return {"last_hidden_state": out.last_hidden_state.numpy(),
            "extract_features": out.extract_features.numpy()}


@pytest.fixture(scope="module", params=list(CASES))
def case(request, tmp_path_factory):
    """(name, HF model, its folder, a [2, N_SAMPLES] batch, HF outputs, our model)."""
    name = request.param
    k = list(CASES).index(name)
    model = make_wavlm(seed=k, **CASES[name])
    path = save_hf(model, tmp_path_factory.mktemp(f"wavlm_{name}"))
    x = waveforms(2, N_SAMPLES, seed=11 + k)
    ours = md.load_model(spec_path("wavlm"), path, variant="tiny")
    return name, model, path, x, hf_outputs(model, x), ours


def errors(ours, x, ref, mask=None) -> dict:
    """rel_err of each output; no mask: all ones (transformers' attention_mask=None)."""
    got = named_outputs(ours, x, np.ones(x.shape, np.int64) if mask is None else mask)
    return {k: rel_err(got[k], ref[k]) for k in ref}


def test_wavlm_config_from_hf(case):
    name, model, path, _, _, ours = case
    got = hf_params("wavlm", path)[2]
    cfg = model.config
    assert (got["dim"], got["n_layers"], got["n_heads"], got["ffn_dim"]) == (32, 2, 4, 64)
    assert list(got["conv_dim"]) == [16, 16, 16]
    assert list(got["conv_kernel"]) == [10, 3, 3] and list(got["conv_stride"]) == [5, 2, 2]
    assert got["feat_norm"] == cfg.feat_extract_norm
    assert got["stable"] == cfg.do_stable_layer_norm
    assert got["pos_kernel"] == cfg.num_conv_pos_embeddings
    assert got["pos_groups"] == cfg.num_conv_pos_embedding_groups
    assert (got["num_buckets"], got["max_distance"]) == (16, 20)
    assert got["norm_eps"] == pytest.approx(cfg.layer_norm_eps)
    # conv biases are there exactly when conv_bias is set
    assert ("feature_extractor.conv_layers.1.conv.bias" in ours.weights) == cfg.conv_bias


def test_wavlm_last_hidden_state_matches_hf(case):
    """A batch of two raw waveforms: the conv feature encoder, the feature projection,
    the weight-normalised positional conv and the gated relative position bias."""
    name, _, _, x, ref, ours = case
    err = errors(ours, x, ref)
    print(f"wavlm[{name}] vs HF: " + ", ".join(f"{k} {v:.2e}" for k, v in err.items()))
    assert err["extract_features"] <= TOL
    assert err["last_hidden_state"] <= TOL


def test_wavlm_other_lengths_match_hf(case):
    """The same compiled model on other numbers of samples (frames 19, 34 and 79:
    the bias table and the conv lengths follow the input)."""
    name, model, _, _, _, ours = case
    for k, n in enumerate((400, 700, 1610)):
        x = waveforms(1, n, seed=30 + k)
        ref = hf_outputs(model, x)
        err = errors(ours, x, ref)
        print(f"wavlm[{name}] {n} samples: {err}")
        assert max(err.values()) <= TOL, (n, err)


def test_wavlm_padded_batch_matches_hf(case):
    """A batch of a long and two shorter waveforms, zero-padded, with transformers'
    attention_mask: padded frames are zeroed before the positional conv and hidden from
    every key (the outputs at every frame, padding included, match)."""
    name, model, _, _, _, ours = case
    lengths = [N_SAMPLES, 613, 347]
    x = waveforms(3, N_SAMPLES, seed=21)
    mask = (np.arange(N_SAMPLES)[None, :] < np.array(lengths)[:, None]).astype(np.int64)
    x = np.where(mask == 1, x, 0.0).astype(np.float32)
    ref = hf_outputs(model, x, mask)
    err = errors(ours, x, ref, mask)
    print(f"wavlm[{name}] padded batch: {err}")
    assert max(err.values()) <= TOL
    # negative control: without the mask the shorter waveforms' frames differ
    assert errors(ours, x, ref)["last_hidden_state"] > 100 * TOL


def test_wavlm_position_bias_matters(case):
    """Negative control: without the relative position bias (layer 0's table zeroed)
    the hidden states are far off, so the test above checks the bias."""
    name, _, path, x, ref, _ = case
    td = md.load_weights(path)
    key = "encoder.layers.0.attention.rel_attn_embed.weight"
    td[key] = np.zeros_like(np.asarray(td[key]))
    ours = md.load_model(spec_path("wavlm"), td, variant="tiny")
    assert errors(ours, x, ref)["last_hidden_state"] > 100 * TOL


def test_wavlm_positional_conv_matters(case):
    """Negative control: the positional conv's weight-norm gain doubled (a plain conv
    weight would not notice g at all) moves the hidden states far off."""
    name, _, path, x, ref, _ = case
    td = md.load_weights(path)
    key = "encoder.pos_conv_embed.conv.parametrizations.weight.original0"
    td[key] = 2.0 * np.asarray(td[key])
    ours = md.load_model(spec_path("wavlm"), td, variant="tiny")
    assert errors(ours, x, ref)["last_hidden_state"] > 100 * TOL


def test_wavlm_ctc_checkpoint_loads(case, tmp_path):
    """A WavLMForCTC checkpoint (names under wavlm., an lm_head) holding the same
    encoder gives the same hidden states."""
    import transformers

    name, model, _, x, ref, _ = case
    ctc = transformers.WavLMForCTC(model.config)
    ctc.wavlm.load_state_dict(model.state_dict())
    path = save_hf(ctc.eval(), tmp_path / "ctc")
    ours = md.load_model(spec_path("wavlm"), path, variant="tiny")
    assert max(errors(ours, x, ref).values()) <= TOL


def test_wavlm_refuses_adapter(case, tmp_path):
    """add_adapter stacks convs the spec does not model: such a checkpoint is refused."""
    import transformers

    name, model, _, _, _, _ = case
    cfg = transformers.WavLMConfig(**{**model.config.to_dict(), "add_adapter": True,
                                      "num_adapter_layers": 1})
    path = save_hf(transformers.WavLMModel(cfg), tmp_path / "adapter")
    with pytest.raises(md.WeightsError, match="adapter"):
        md.load_model(spec_path("wavlm"), path, variant="tiny")


def test_wavlm_legacy_weight_norm_names_load(case):
    """Checkpoints saved before torch's parametrizations (the Hub's microsoft/wavlm-*)
    hold the positional conv as weight_g / weight_v: they load to the same model."""
    name, _, path, x, ref, _ = case
    td = md.load_weights(path)
    prefix = "encoder.pos_conv_embed.conv."
    td[prefix + "weight_g"] = td.pop(prefix + "parametrizations.weight.original0")
    td[prefix + "weight_v"] = td.pop(prefix + "parametrizations.weight.original1")
    ours = md.load_model(spec_path("wavlm"), td, variant="tiny")
    assert max(errors(ours, x, ref).values()) <= TOL


@pytest.mark.parametrize("variant, kw", [
    ("base", {}),
    ("large", dict(hidden_size=1024, num_hidden_layers=24, num_attention_heads=16,
                   intermediate_size=4096, feat_extract_norm="layer",
                   do_stable_layer_norm=True, conv_bias=True)),
])
def test_wavlm_variants_are_the_hub_configs(variant, kw):
    """The base and large variants hold what the config of microsoft/wavlm-base(-plus)
    and microsoft/wavlm-large give (transformers' defaults, and the large sizes)."""
    import transformers
    from maxdecl.pipelines.model_loading import params_from_metadata

    spec = md.load_spec(spec_path("wavlm"))
    meta = {"maxdecl.format": "hf", **transformers.WavLMConfig(**kw).to_dict()}
    got = params_from_metadata(spec, meta)
    want = spec.variants[variant]
    assert {k: (list(v) if isinstance(v, (list, tuple)) else v) for k, v in got.items()
            if k in want} == {k: (list(v) if isinstance(v, (list, tuple)) else v)
                              for k, v in want.items() if k in got}
    assert set(want) <= set(got)


def test_wavlm_real_bucket_settings_long_input_match_hf(tmp_path):
    """wavlm-base's 320 buckets over a distance of 800 on ~1000 frames (20000 samples):
    offsets past max_bucket_distance, and every log-spaced bucket boundary up to it,
    give transformers' float32 buckets."""
    model = make_wavlm(seed=3, num_buckets=320, max_bucket_distance=800)
    path = save_hf(model, tmp_path / "long")
    ours = md.load_model(spec_path("wavlm"), path, variant="tiny")
    x = waveforms(1, 20000, seed=5)
    err = errors(ours, x, hf_outputs(model, x))
    print(f"wavlm 320 buckets, 999 frames: {err}")
    assert max(err.values()) <= TOL
