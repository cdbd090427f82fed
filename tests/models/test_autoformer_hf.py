"""specs/autoformer.yaml against transformers' AutoformerForPrediction / AutoformerModel.

Small seeded float32 Autoformers, run once with teacher forcing (future_values given),
in eval mode: the scaler (mean, std), lagged inputs, static categorical and real
features, time features, the auto-correlation attention (circular cross-correlation
of queries and keys by rfft / irfft, the top-k delays, the values rolled by each
delay), the moving-average series decomposition in every block, the decoder's trend
accumulation (circular Conv1d) and the Student-t head (transformers' `params`: df,
loc, scale).

Two configurations cover both resize paths of the decoder's cross-correlation: a
decoder shorter than the context (keys and values cut) and a longer one (keys and
values zero-filled, queries cut), and a batch of two, where transformers pairs value
row b * heads + h with the delays of batch entry (b * heads + h) mod batch. A longer
case (context 48, prediction 24) runs the FFT auto-correlation over 48 and 37 rows.
"""

import numpy as np
import pytest

import maxdecl as md

from modelhelp import randomize, rel_err, save_hf, spec_path, with_hf_config

pytest.importorskip("torch")
pytest.importorskip("transformers")

TOL = 1e-4          # max|ours - ref| <= TOL * max|ref|
BATCH = 2

# (config overrides, what they exercise)
CASES = {
    # decoder (label 3 + prediction 4 = 7 rows) shorter than the context (8): keys and
    # values cut to 7 rows; mean scaler; two categorical and one real static feature
    "short": dict(prediction_length=4, context_length=8, label_length=3, lags_sequence=[1, 2, 5],
                  num_time_features=2, num_static_real_features=1,
                  num_static_categorical_features=2, cardinality=[3, 5],
                  embedding_dimension=[2, 3], d_model=16, encoder_attention_heads=2,
                  decoder_attention_heads=2, encoder_layers=2, decoder_layers=1,
                  encoder_ffn_dim=24, decoder_ffn_dim=20, moving_average=3,
                  autocorrelation_factor=2),
    # decoder (4 + 5 = 9 rows) longer than the context (6): keys and values zero-filled;
    # std scaler, two input channels, 4 heads, no static features, relu, 2 decoder layers
    "long": dict(prediction_length=5, context_length=6, label_length=4, lags_sequence=[1, 3],
                 input_size=2, num_time_features=3, scaling="std", d_model=24,
                 encoder_attention_heads=4, decoder_attention_heads=4, encoder_layers=1,
                 decoder_layers=2, encoder_ffn_dim=16, decoder_ffn_dim=28, moving_average=5,
                 autocorrelation_factor=3, activation_function="relu"),
    # no scaling (transformers' NOP scaler), 4 encoder heads and 1 decoder head; run on a
    # batch of three, so rows of every head read other series' delays
    "nop": dict(prediction_length=4, context_length=8, label_length=3, lags_sequence=[1, 2, 5],
                num_time_features=2, scaling=False, d_model=16, encoder_attention_heads=4,
                decoder_attention_heads=1, encoder_layers=1, decoder_layers=1,
                encoder_ffn_dim=24, decoder_ffn_dim=20, moving_average=3,
                autocorrelation_factor=2),
    # a longer context (48) and horizon (24): decoder 13 + 24 = 37 rows, an odd FFT
    # length, cut from the context's 48 keys and values; 7 delays of 48 and of 37
    "ctx48": dict(prediction_length=24, context_length=48, label_length=13,
                  lags_sequence=[1, 7, 24], num_time_features=2, num_static_real_features=1,
                  num_static_categorical_features=1, cardinality=[4], embedding_dimension=[2],
                  d_model=16, encoder_attention_heads=2, decoder_attention_heads=2,
                  encoder_layers=2, decoder_layers=1, encoder_ffn_dim=24, decoder_ffn_dim=20,
                  moving_average=25, autocorrelation_factor=2),
}


def make_autoformer(seed=0, **kw):
    import torch
    import transformers

    torch.manual_seed(seed)
    config = transformers.AutoformerConfig(**kw)
    return randomize(transformers.AutoformerForPrediction(config), seed)


def make_inputs(cfg, batch=BATCH, seed=1) -> dict:
    """Seeded model inputs, every series value [batch, time, input_size]; about a fifth
    of the past values unobserved (the scaler skips them)."""
    r = np.random.default_rng(seed)
    past = cfg.context_length + max(cfg.lags_sequence)
    pred, size = cfg.prediction_length, cfg.input_size
    d = {"past_values": 3.0 + r.standard_normal((batch, past, size)),
         "past_time_features": r.standard_normal((batch, past, cfg.num_time_features)),
         "past_observed_mask": (r.random((batch, past, size)) > 0.2).astype(np.float64),
         "future_values": 3.0 + r.standard_normal((batch, pred, size)),
         "future_time_features": r.standard_normal((batch, pred, cfg.num_time_features))}
    d = {k: v.astype(np.float32) for k, v in d.items()}
    if cfg.num_static_real_features:
        d["static_real_features"] = r.standard_normal(
            (batch, cfg.num_static_real_features)).astype(np.float32)
    if cfg.num_static_categorical_features:
        d["static_categorical_features"] = np.stack(
            [r.integers(0, c, batch) for c in cfg.cardinality], axis=1).astype(np.int64)
    return d


def hf_outputs(model, d) -> dict:
    """transformers' outputs for the inputs ``d``, named as the spec's outputs, each
    with a trailing input_size axis where transformers drops it (input_size 1)."""
    import torch

    t = {k: torch.from_numpy(v) for k, v in d.items()}
    one = model.config.input_size == 1
    if one:                                  # transformers takes [batch, time] then
        for k in ("past_values", "past_observed_mask", "future_values"):
            t[k] = t[k][..., 0]
    with torch.no_grad():
        pred = model(**t)
        base = model.model(**t)              # AutoformerModel: decoder output and trend
    out = {"encoder_last_hidden_state": pred.encoder_last_hidden_state,
           "last_hidden_state": base.last_hidden_state, "trend": base.trend,
           "loc": pred.loc, "scale": pred.scale, "static_features": base.static_features}
    for name, p in zip(("params_df", "params_loc", "params_scale"), pred.params):
        out[name] = p[..., None] if one else p
    out = {k: v.float().numpy() for k, v in out.items()}
    if one:
        out["loc"], out["scale"] = out["loc"][..., None], out["scale"][..., None]
    return out


def ours_outputs(model, d) -> dict:
    return dict(zip(model.output_names, model(*[d[n] for n in model.input_names])))


err = rel_err      # an all-zero reference compares absolutely, NaN is inf


def case(name, tmp_path_factory, batch=BATCH):
    model = make_autoformer(**CASES[name])
    path = save_hf(model, tmp_path_factory.mktemp(f"autoformer_{name}"))
    d = make_inputs(model.config, batch)
    return model, path, d, hf_outputs(model, d)


@pytest.fixture(scope="module")
def short(tmp_path_factory):
    return case("short", tmp_path_factory)


@pytest.fixture(scope="module")
def long(tmp_path_factory):
    return case("long", tmp_path_factory)


@pytest.fixture(scope="module")
def ours_short(short):
    return md.load_model(spec_path("autoformer"), short[1])


def assert_all_match(name, got, ref, names=None):
    names = names or list(ref)
    errs = {k: err(got[k], ref[k]) for k in names}
    print(f"autoformer {name} vs HF: " + ", ".join(f"{k} {e:.2e}" for k, e in errs.items()))
    assert all(e <= TOL for e in errs.values()), errs


def test_autoformer_config_from_hf(short, long, ours_short):
    """Every size comes from config.json (the long case differs from the variant)."""
    p = ours_short.params
    assert (p["d_model"], p["context_length"], p["prediction_length"], p["label_length"]) == (16, 8, 4, 3)
    assert p["n_features"] == short[0].config.feature_size == 13
    assert (p["enc_top_k"], p["dec_top_k"], p["scaler"]) == (4, 3, "mean")
    q = md.load_model(spec_path("autoformer"), long[1]).params
    assert (q["d_model"], q["input_size"], q["lags_sequence"], q["decoder_layers"]) == (24, 2, [1, 3], 2)
    assert (q["n_features"], q["dec_length"], q["scaler"]) == (long[0].config.feature_size, 9, "std")
    assert q["activation_function"] == "relu"


def test_autoformer_matches_hf(short, ours_short):
    """Encoder and decoder last hidden states, the trend, the scaler's loc / scale, the
    static features and the Student-t parameters of a batch of two series."""
    _, _, d, ref = short
    got = ours_outputs(ours_short, d)
    assert set(ref) <= set(got)
    assert_all_match("short", got, ref)


def test_autoformer_long_decoder_std_scaler_matches_hf(long):
    """Cross-correlation with a decoder longer than the context (zero-filled keys and
    values), the std scaler, two input channels, no static features."""
    _, path, d, ref = long
    ours = md.load_model(spec_path("autoformer"), path)
    assert "static_categorical_features" not in ours.input_names
    assert "static_real_features" not in ours.input_names
    assert_all_match("long", ours_outputs(ours, d), ref)


def test_autoformer_no_scaling_batch_of_three_matches_hf(tmp_path_factory):
    _, path, d, ref = case("nop", tmp_path_factory, batch=3)
    ours = md.load_model(spec_path("autoformer"), path)
    assert ours.params["scaler"] == "none"
    assert_all_match("nop, batch 3", ours_outputs(ours, d), ref)


def test_autoformer_long_context_matches_hf(tmp_path_factory):
    """context_length 48, prediction_length 24: the auto-correlation's FFT over 48
    (encoder) and 37 (decoder, odd) rows, 7 delays each, a 25-step moving average."""
    model, path, d, ref = case("ctx48", tmp_path_factory)
    ours = md.load_model(spec_path("autoformer"), path)
    p = ours.params
    assert (p["context_length"], p["prediction_length"], p["dec_length"]) == (48, 24, 37)
    assert (p["enc_top_k"], p["dec_top_k"]) == (7, 7)
    assert_all_match("ctx48", ours_outputs(ours, d), ref)


def test_autoformer_batch_rows_follow_hf(short, ours_short):
    """transformers' delays for value row b * heads + h come from batch entry (b * heads
    + h) mod batch: a series alone gives other outputs than in the batch, and the spec
    follows transformers both ways."""
    model, _, d, ref = short
    alone = {k: v[1:2] for k, v in d.items()}
    ref_alone = hf_outputs(model, alone)
    assert err(ref_alone["params_loc"], ref["params_loc"][1:2]) > 100 * TOL   # the quirk shows
    assert_all_match("short, series 1 alone", ours_outputs(ours_short, alone), ref_alone)


def test_autoformer_base_model_checkpoint(short, tmp_path):
    """An AutoformerModel checkpoint (no model. prefix, no parameter_projection) loads
    without the head's outputs and gives the same hidden states."""
    model, _, d, ref = short
    path = save_hf(model.model, tmp_path / "base")
    ours = md.load_model(spec_path("autoformer"), path)
    assert not any(n.startswith("params_") for n in ours.output_names)
    assert_all_match("base model", ours_outputs(ours, d), ref,
                     ["encoder_last_hidden_state", "last_hidden_state", "trend", "scale",
                      "static_features"])


def test_autoformer_top_k_matters(short):
    """Negative control: one delay fewer (autocorrelation_factor read as 1) is far off."""
    _, path, d, ref = short
    spec = with_hf_config(md.load_spec(spec_path("autoformer")), autocorrelation_factor="{1}")
    got = ours_outputs(md.load_model(spec, path), d)
    assert err(got["encoder_last_hidden_state"], ref["encoder_last_hidden_state"]) > 100 * TOL


def test_autoformer_refuses_other_distributions(tmp_path):
    model = make_autoformer(**{**CASES["short"], "distribution_output": "normal"})
    path = save_hf(model, tmp_path / "normal")
    with pytest.raises(md.WeightsError, match="student_t only"):
        md.load_model(spec_path("autoformer"), path)
