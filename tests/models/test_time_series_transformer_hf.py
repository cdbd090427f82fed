"""specs/time_series_transformer.yaml against transformers' TimeSeriesTransformerForPrediction.

Small seeded float32 models, run teacher-forced (past and future values given, as in
training): the scaler's loc and scale, the static features, the encoder's and the
decoder's last hidden states, the distribution head's parameters and the loss (weighted
by a future_observed_mask with zeros), for three configurations:

* ``student_t``: univariate, mean scaler (with a series that has no observation in its
  context window, so the batch's default scale is used), two static categorical
  features, a static real feature, time and dynamic real features, lags [1, 2, 4, 7];
* ``std_normal``: two variates, std scaler, no static features, relu, normal head;
* ``nop_negbin``: no scaling, one categorical feature, negative binomial head.

Every size differs from the spec's tiny variant, so config.json drives them.
"""

import copy

import numpy as np
import pytest

import maxdecl as md

from modelhelp import hf_params, randomize, rel_err, save_hf, spec_path, with_hf_config

pytest.importorskip("torch")
pytest.importorskip("transformers")

TOL = 1e-5          # max|ours - ref| <= TOL * max|ref|
BATCH = 3

CASES = {
    "student_t": dict(
        prediction_length=5, context_length=10, input_size=1, lags_sequence=[1, 2, 4, 7],
        scaling="mean", distribution_output="student_t", num_time_features=2,
        num_dynamic_real_features=1, num_static_categorical_features=2, cardinality=[6, 4],
        embedding_dimension=[3, 2], num_static_real_features=1, d_model=24,
        encoder_layers=2, decoder_layers=3, encoder_attention_heads=4,
        decoder_attention_heads=2, encoder_ffn_dim=40, decoder_ffn_dim=48,
        activation_function="gelu"),
    "std_normal": dict(
        prediction_length=4, context_length=6, input_size=2, lags_sequence=[1, 3],
        scaling="std", distribution_output="normal", num_time_features=1, d_model=16,
        encoder_layers=1, decoder_layers=2, encoder_attention_heads=2,
        decoder_attention_heads=4, encoder_ffn_dim=24, decoder_ffn_dim=20,
        activation_function="relu"),
    "nop_negbin": dict(
        prediction_length=3, context_length=7, input_size=1, lags_sequence=[2, 5],
        scaling=None, distribution_output="negative_binomial", num_time_features=2,
        num_static_categorical_features=1, cardinality=[5], embedding_dimension=[3],
        d_model=20, encoder_layers=2, decoder_layers=1, encoder_attention_heads=2,
        decoder_attention_heads=2, encoder_ffn_dim=16, decoder_ffn_dim=24,
        activation_function="gelu"),
}

PARAM_NAMES = {"student_t": ["df", "loc", "scale"], "normal": ["loc", "scale"],
               "negative_binomial": ["total_count", "logits"]}


def make_tst(seed=0, **kw):
    import torch
    import transformers

    torch.manual_seed(seed)
    cfg = transformers.TimeSeriesTransformerConfig(**kw, attn_implementation="eager")
    return randomize(transformers.TimeSeriesTransformerForPrediction(cfg), seed)


def make_inputs(cfg, seed):
    """HF keyword inputs (univariate values as [batch, time], as transformers documents)."""
    import torch

    rng = np.random.default_rng(seed)
    past_len = cfg.context_length + max(cfg.lags_sequence)
    c = cfg.input_size
    vshape = (BATCH, past_len) if c == 1 else (BATCH, past_len, c)
    fshape = (BATCH, cfg.prediction_length) if c == 1 else (BATCH, cfg.prediction_length, c)
    if cfg.distribution_output == "negative_binomial":     # counts: in the support
        past = rng.poisson(4.0, vshape).astype(np.float32)
        future = rng.poisson(4.0, fshape).astype(np.float32)
    else:
        past = (3.0 + 2.0 * rng.standard_normal(vshape)).astype(np.float32)
        future = (3.0 + 2.0 * rng.standard_normal(fshape)).astype(np.float32)
    mask = (rng.random(vshape) > 0.2).astype(np.float32)
    mask[0, -cfg.context_length:] = 0.0       # no observation in the context: default scale
    past = past * mask                        # missing values are zeros
    future_mask = (rng.random(fshape) > 0.25).astype(np.float32)   # loss weights
    n_tf = cfg.num_time_features + cfg.num_dynamic_real_features
    kw = dict(
        past_values=past, past_observed_mask=mask, future_values=future,
        future_observed_mask=future_mask,
        past_time_features=rng.standard_normal((BATCH, past_len, n_tf)).astype(np.float32),
        future_time_features=rng.standard_normal(
            (BATCH, cfg.prediction_length, n_tf)).astype(np.float32))
    if cfg.num_static_real_features:
        kw["static_real_features"] = rng.standard_normal(
            (BATCH, cfg.num_static_real_features)).astype(np.float32)
    if cfg.num_static_categorical_features:
        kw["static_categorical_features"] = np.stack(
            [rng.integers(0, n, BATCH) for n in cfg.cardinality], axis=1).astype(np.int64)
    return {k: torch.from_numpy(v) for k, v in kw.items()}


def hf_reference(model, inputs) -> dict:
    """The outputs the spec names, from transformers (teacher-forced)."""
    import torch

    with torch.no_grad():
        base = model.model(**{k: v for k, v in inputs.items() if k != "future_observed_mask"},
                           use_cache=False)
        pred = model(**inputs, use_cache=False)
    names = PARAM_NAMES[model.config.distribution_output]
    ref = {"last_hidden_state": base.last_hidden_state,
           "encoder_last_hidden_state": base.encoder_last_hidden_state,
           "loc": base.loc, "scale": base.scale, "static_features": base.static_features,
           "loss": pred.loss}
    ref.update({f"params_{n}": p for n, p in zip(names, pred.params)})
    return {k: v.float().numpy() for k, v in ref.items()}


def feed(model, inputs):
    """Inputs in ``model.input_names`` order; values always [batch, time, input_size]."""
    arrays = {k: v.numpy() for k, v in inputs.items()}
    for k in ("past_values", "past_observed_mask", "future_values", "future_observed_mask"):
        if arrays[k].ndim == 2:
            arrays[k] = arrays[k][..., None]
    return [arrays[n] for n in model.input_names]


def errors(model, inputs, ref) -> dict:
    got = dict(zip(model.output_names, model(*feed(model, inputs))))
    assert set(got) == set(ref), (sorted(got), sorted(ref))
    return {k: rel_err(np.asarray(got[k]).reshape(ref[k].shape), ref[k]) for k in ref}


@pytest.fixture(scope="module")
def cases(tmp_path_factory):
    out = {}
    for k, (name, kw) in enumerate(CASES.items()):
        model = make_tst(seed=k, **kw)
        path = save_hf(model, tmp_path_factory.mktemp(f"tst_{name}"))
        inputs = make_inputs(model.config, seed=10 + k)
        out[name] = (model, path, inputs, hf_reference(model, inputs))
    return out


@pytest.fixture(scope="module")
def loaded(cases):
    return {name: md.load_model(spec_path("time_series_transformer"), c[1])
            for name, c in cases.items()}


def test_tst_config_from_hf(cases):
    model, path, _, _ = cases["student_t"]
    got = hf_params("time_series_transformer", path)[2]
    assert (got["d_model"], got["enc_layers"], got["dec_layers"]) == (24, 2, 3)
    assert (got["enc_heads"], got["dec_heads"], got["enc_ffn"], got["dec_ffn"]) == (4, 2, 40, 48)
    assert (got["context_length"], got["prediction_length"], got["lags"]) == (10, 5, [1, 2, 4, 7])
    assert (got["n_time_feat"], got["n_cat"], got["n_real"]) == (3, 2, 1)
    assert (got["cardinality"], got["emb_dims"]) == ([6, 4], [3, 2])
    assert got["scaling"] == "mean" and got["distribution"] == "student_t"
    assert got["feature_size_cfg"] == model.config.feature_size


def test_tst_scaler_from_config(cases, loaded):
    assert loaded["nop_negbin"].params["scaler"] == "none"
    assert loaded["std_normal"].params["scaler"] == "std"
    assert loaded["student_t"].params["scaler"] == "mean"
    assert loaded["student_t"].params["feature_size"] == cases["student_t"][0].config.feature_size


def test_tst_output_names(loaded):
    assert loaded["student_t"].output_names[:6] == [
        "last_hidden_state", "encoder_last_hidden_state", "loc", "scale", "static_features",
        "loss"]
    assert loaded["student_t"].output_names[6:] == ["params_df", "params_loc", "params_scale"]
    assert loaded["nop_negbin"].output_names[6:] == ["params_total_count", "params_logits"]


@pytest.mark.parametrize("name", list(CASES))
def test_tst_teacher_forced_matches_hf(cases, loaded, name):
    model, path, inputs, ref = cases[name]
    errs = errors(loaded[name], inputs, ref)
    print(f"{name}: " + ", ".join(f"{k} {v:.2e}" for k, v in errs.items()))
    assert all(v <= TOL for v in errs.values()), errs


def test_tst_default_scale_is_used(cases):
    """The first series has no observation in its context: the mean scaler gives it the
    batch's mean scale, which differs from the other series' own scales."""
    ref = cases["student_t"][3]
    s = ref["scale"].reshape(BATCH)
    assert not np.isclose(s[0], s[1]) and not np.isclose(s[0], s[2])


def test_tst_sinusoidal_table_when_absent(cases, tmp_path):
    """A checkpoint without embed_positions tables: the spec's stand-in is transformers'
    create_weight() table, exactly."""
    import torch

    model, path, inputs, _ = cases["student_t"]
    hf = copy.deepcopy(model)
    with torch.no_grad():
        for emb in (hf.model.encoder.embed_positions, hf.model.decoder.embed_positions):
            emb.weight.copy_(emb.create_weight())
    ref = hf_reference(hf, inputs)
    td = md.load_weights(save_hf(hf, tmp_path / "sin"))
    table = np.asarray(td["model.encoder.embed_positions.weight"])
    for k in [k for k in td.keys() if "embed_positions" in k]:
        del td[k]
    ours = md.load_model(spec_path("time_series_transformer"), td)
    assert "model.encoder.embed_positions.weight" not in ours.weights
    errs = errors(ours, inputs, ref)
    assert all(v <= TOL for v in errs.values()), errs
    fill = np.asarray(ours.params["pos_table"], np.float32).reshape(table.shape)
    assert np.array_equal(fill, table)


def test_tst_lags_matter(cases, loaded):
    """Negative control: the lag index follows lags_sequence; a checkpoint's lag list
    read as another list of the same length changes every output of the decoder."""
    model, path, inputs, ref = cases["student_t"]
    spec = md.load_spec(spec_path("time_series_transformer"))
    other = with_hf_config(spec, lags="{[1, 3, 4, 7]}")
    ours = md.load_model(other, path)
    errs = errors(ours, inputs, ref)
    assert errs["last_hidden_state"] > 100 * TOL
    assert errs["loc"] <= TOL                   # the scaler does not read the lags
