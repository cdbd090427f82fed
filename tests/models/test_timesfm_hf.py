"""specs/timesfm.yaml against transformers' TimesFmModelForPrediction.

Two small seeded float32 TimesFMs (patch 8, context 64, horizon 12, 2 layers, width 32,
head_dim 12 != 32 / 3 heads, quantiles 0.1 / 0.5 / 0.9), one with the shifted
sinusoidal position embedding (use_positional_embedding) and one without. transformers'
forward takes a list of series of any length and cuts or front-pads them to
context_length; the spec takes the padded batch (values, padding, frequency), so the
test pads the series as transformers' ``_preprocess`` does (and checks that it does).
The batch mixes a full series, series padded by whole and partial patches, one longer
than the context (cut), a short one whose statistics come from its last patch, one too
short for any patch to hold 3 values, and one holding ``pad_val`` in its middle.
"""

import numpy as np
import pytest

import maxdecl as md

from modelhelp import hf_params, named_outputs, randomize, rel_err, save_hf, spec_path

pytest.importorskip("torch")
pytest.importorskip("transformers")

TOL = 1e-5                      # max|ours - ref| <= TOL * max|ref|
CONTEXT = 64
HORIZON = 12
PATCH = 8
LENGTHS = [64, 37, 20, 90, 5, 2, 48]
FREQ = [0, 1, 2, 1, 0, 2, 1]
PAD_VAL = 1123581321.0
CASES = {"pos_emb": True, "no_pos_emb": False}


def make_timesfm(seed=0, **kw):
    """TimesFmModelForPrediction: patch 8, context 64, horizon 12, 3 frequencies,
    2 layers, hidden 32, intermediate 48, 3 heads of 12, 3 quantiles."""
    import torch
    import transformers

    torch.manual_seed(seed)
    cfg = dict(patch_length=PATCH, context_length=CONTEXT, horizon_length=HORIZON,
               freq_size=3, num_hidden_layers=2, hidden_size=32, intermediate_size=48,
               head_dim=12, num_attention_heads=3, quantiles=[0.1, 0.5, 0.9],
               rms_norm_eps=1e-6, use_positional_embedding=True)
    cfg.update(kw)
    model = randomize(transformers.TimesFmModelForPrediction(transformers.TimesFmConfig(**cfg)),
                      seed)
    with torch.no_grad():           # frequency rows as large as the patch embeddings
        model.decoder.freq_emb.weight.mul_(4.0)
    return model


def make_series():
    """Seeded series of LENGTHS: noise plus a sine, each with its own offset and scale;
    the last holds pad_val at one position (transformers treats it as padding)."""
    rng = np.random.default_rng(3)
    out = []
    for k, n in enumerate(LENGTHS):
        t = np.arange(n)
        out.append(((k + 1) * (rng.normal(size=n) + 3 * np.sin(t / 4)) + 10 * k)
                   .astype(np.float32))
    out[-1][30] = PAD_VAL
    return out


def pad_batch(series, context=CONTEXT):
    """(values [B, context], padding [B, context]): each series cut to its last `context`
    values or front-padded with 0.0, padding 1.0 there (transformers' ``_preprocess``)."""
    b = len(series)
    values = np.zeros((b, context), np.float32)
    padding = np.zeros((b, context), np.float32)
    for i, s in enumerate(series):
        s = s[-context:]
        values[i, context - len(s):] = s
        padding[i, :context - len(s)] = 1.0
    return values, padding


def hf_forecast(model, series, freq) -> dict:
    """transformers' outputs (and the decoder's loc and scale) for a list of series."""
    import torch

    with torch.no_grad():
        out = model(past_values=[torch.tensor(s) for s in series], freq=list(freq),
                    return_dict=True)
        values, padding = pad_batch(series)
        dec = model.decoder(past_values=torch.tensor(values),
                            past_values_padding=torch.tensor(padding),
                            freq=torch.tensor(freq, dtype=torch.long).reshape(-1, 1))
    return {"last_hidden_state": out.last_hidden_state.numpy(),
            "mean_predictions": out.mean_predictions.numpy(),
            "full_predictions": out.full_predictions.numpy(),
            "loc": dec.loc.numpy(), "scale": dec.scale.numpy()}


def ours_forecast(ours, series, freq, padding=None) -> dict:
    values, pads = pad_batch(series)
    return named_outputs(ours, values, pads if padding is None else padding,
                         np.asarray(freq, np.int64))


@pytest.fixture(scope="module")
def timesfm(tmp_path_factory):
    """case -> (HF model, its folder, series, HF outputs)."""
    series = make_series()
    out = {}
    for k, (name, pos) in enumerate(CASES.items()):
        model = make_timesfm(seed=k, use_positional_embedding=pos)
        path = save_hf(model, tmp_path_factory.mktemp(f"timesfm_{name}"))
        out[name] = (model, path, series, hf_forecast(model, series, FREQ))
    return out


@pytest.fixture(scope="module")
def ours(timesfm):
    return {name: md.load_model(spec_path("timesfm"), case[1], variant="tiny")
            for name, case in timesfm.items()}


def assert_outputs_match(got: dict, ref: dict, label: str) -> None:
    errs = {k: rel_err(got[k], v) for k, v in ref.items()}
    print(f"timesfm {label} vs HF: " + ", ".join(f"{k} {e:.2e}" for k, e in errs.items()))
    assert all(e <= TOL for e in errs.values()), errs


def test_timesfm_config_from_hf(timesfm):
    for name, (_, path, _, _) in timesfm.items():
        got = hf_params("timesfm", path)[2]
        assert (got["patch_len"], got["context_len"], got["horizon"], got["n_freq"]) == \
            (PATCH, CONTEXT, HORIZON, 3)
        assert (got["n_layers"], got["dim"], got["ffn_dim"], got["head_dim"],
                got["n_heads"]) == (2, 32, 48, 12, 3)
        assert got["quantiles"] == pytest.approx([0.1, 0.5, 0.9])
        assert got["use_pos_emb"] is CASES[name]
        assert got["pad_val"] == pytest.approx(PAD_VAL)


def test_timesfm_test_padding_is_transformers(timesfm):
    """The batch the spec gets is what transformers' _preprocess builds."""
    import torch

    model, _, series, _ = timesfm["pos_emb"]
    inputs = [torch.tensor(s[-CONTEXT:]) for s in series]
    ts, pads, freq = model._preprocess(inputs, FREQ)
    values, padding = pad_batch(series)
    np.testing.assert_array_equal(ts.numpy(), values)
    np.testing.assert_array_equal(pads.numpy()[:, :CONTEXT], padding)
    np.testing.assert_array_equal(freq.numpy()[:, 0], FREQ)


@pytest.mark.parametrize("case", list(CASES))
def test_timesfm_forecast_matches_hf(timesfm, ours, case):
    """Mean and quantile forecasts, the hidden states of every patch (padded ones
    included) and the normalisation statistics, for the whole padded batch."""
    _, _, series, ref = timesfm[case]
    got = ours_forecast(ours[case], series, FREQ)
    assert got["full_predictions"].shape == (len(LENGTHS), HORIZON, 4)
    assert got["mean_predictions"].shape == (len(LENGTHS), HORIZON)
    assert got["last_hidden_state"].shape == (len(LENGTHS), CONTEXT // PATCH, 32)
    assert_outputs_match(got, ref, case)


@pytest.mark.parametrize("case", list(CASES))
def test_timesfm_frequency_input_matches_hf(timesfm, ours, case):
    """Other frequency indices: ours follows transformers, and the forecast moves."""
    model, _, series, ref = timesfm[case]
    freq = [(f + 1) % 3 for f in FREQ]
    ref2 = hf_forecast(model, series, freq)
    got = ours_forecast(ours[case], series, freq)
    assert_outputs_match(got, ref2, f"{case} freq+1")
    assert rel_err(ref2["mean_predictions"], ref["mean_predictions"]) > 100 * TOL


def test_timesfm_series_alone_matches_batch(timesfm, ours):
    """A series forecast on its own gives what it gives in the batch."""
    _, _, series, ref = timesfm["pos_emb"]
    for i in (1, 4):
        got = ours_forecast(ours["pos_emb"], [series[i]], [FREQ[i]])
        assert rel_err(got["full_predictions"], ref["full_predictions"][i:i + 1]) <= TOL


def test_timesfm_padding_input_matters(timesfm, ours):
    """Negative control: the same values with no padding marked forecast otherwise."""
    _, _, series, ref = timesfm["pos_emb"]
    values, _ = pad_batch(series)
    got = ours_forecast(ours["pos_emb"], series, FREQ, padding=np.zeros_like(values))
    assert rel_err(got["mean_predictions"][1:3], ref["mean_predictions"][1:3]) > 100 * TOL


def test_timesfm_position_table_without_buffer(timesfm):
    """A checkpoint without the inv_timescales buffer (it is computed, not trained)
    takes the spec's fill, computed as transformers does."""
    _, path, series, ref = timesfm["pos_emb"]
    td = md.load_weights(path)
    name = "decoder.position_emb.inv_timescales"
    stored = np.asarray(td[name])
    del td[name]
    ours = md.load_model(spec_path("timesfm"), td, variant="tiny")
    assert not any("inv_timescales" in k for k in ours.weights.keys())
    got = ours_forecast(ours, series, FREQ)
    assert_outputs_match(got, ref, "computed inv_timescales")
    fill = np.asarray(ours.params["min_timescale"] * np.exp(
        -np.log(1e4) / 15 * np.arange(16)), np.float32)
    np.testing.assert_allclose(fill, stored, rtol=1e-6)


def test_timesfm_refuses_odd_width_with_positions(timesfm, tmp_path):
    """transformers pads the wrong axis of an odd-width position table: refused."""
    import json
    import shutil

    _, path, _, _ = timesfm["pos_emb"]
    dst = tmp_path / "odd"
    shutil.copytree(path, dst)
    cfg = json.loads((dst / "config.json").read_text())
    cfg["hidden_size"] = 33
    (dst / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(md.WeightsError, match="odd hidden_size"):
        md.load_model(spec_path("timesfm"), str(dst), variant="tiny")
