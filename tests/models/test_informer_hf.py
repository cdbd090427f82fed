"""specs/informer.yaml against transformers' InformerForPrediction / InformerModel.

Small seeded float32 Informers, run once with teacher forcing (future_values given), in
eval mode: the scaler (mean with a series whose context is all unobserved, so the
batch-wide default scale is used; std; none), lagged inputs, static categorical and
real features, time features, ProbSparse self-attention in the encoder and (causal) in
the decoder, the distilling conv layers between encoder layers (circular Conv1d,
BatchNorm1d with non-trivial running statistics, ELU, strided max pool), full
cross-attention, and the distribution heads (Student-t, normal, negative binomial).

ProbSparse attention samples its keys with ``torch.randint`` (with replacement, one
sample per layer shared by every batch row and head). maxdecl has no random op, and a
spec could not reproduce torch's generator anyway, so the spec takes each layer's
sample as a graph input (``<layer>.self_attn.key_sample``). The test seeds torch before
transformers' forward, records the indices transformers draws (in call order: encoder
layers, then decoder layers), checks that the seed alone reproduces them, and feeds
them to maxdecl. The sampling factor and lengths are chosen so that ProbSparse really
is sparse (fewer kept queries than rows) in every layer.
"""

import contextlib

import numpy as np
import pytest

import maxdecl as md

from modelhelp import randomize, rel_err, save_hf, spec_path, with_hf_config

pytest.importorskip("torch")
pytest.importorskip("transformers")

TOL = 1e-4          # max|ours - ref| <= TOL * max|ref|
SAMPLE_SEED = 1234  # torch seed for ProbSparse's key sampling

# (config overrides, what they exercise)
CASES = {
    # ProbSparse everywhere (sampling factor 1: u = 3, 3, 2 of 15, 8, 4 encoder rows and
    # 2 of 6 decoder rows), odd context (15 -> 8 -> 4 through two distilling layers),
    # mean scaler, two categorical and one real static feature, Student-t head
    "prob": dict(prediction_length=6, context_length=15, lags_sequence=[1, 2, 5],
                 num_time_features=2, num_static_real_features=1,
                 num_static_categorical_features=2, cardinality=[3, 5],
                 embedding_dimension=[2, 3], d_model=16, encoder_attention_heads=2,
                 decoder_attention_heads=2, encoder_layers=3, decoder_layers=2,
                 encoder_ffn_dim=24, decoder_ffn_dim=20, sampling_factor=1),
    # two input channels, std scaler, sampling factor 2 (u = 6 of 12, 4 of 6; 4 of 5
    # decoder rows), a dynamic real feature, relu, 4 heads, normal head
    "multi": dict(prediction_length=5, context_length=12, lags_sequence=[1, 3], input_size=2,
                  scaling="std", num_time_features=2, num_dynamic_real_features=1,
                  d_model=24, encoder_attention_heads=4, decoder_attention_heads=4,
                  encoder_layers=2, decoder_layers=1, encoder_ffn_dim=16, decoder_ffn_dim=28,
                  sampling_factor=2, activation_function="relu", distribution_output="normal"),
    # full attention, no distilling, no scaling, negative binomial head
    "full": dict(prediction_length=4, context_length=8, lags_sequence=[1, 2, 5],
                 num_time_features=2, scaling=None, attention_type="full", distil=False,
                 d_model=16, encoder_attention_heads=2, decoder_attention_heads=1,
                 encoder_layers=2, decoder_layers=2, encoder_ffn_dim=24, decoder_ffn_dim=20,
                 distribution_output="negative_binomial"),
}

PARAM_NAMES = {"student_t": ("params_df", "params_loc", "params_scale"),
               "normal": ("params_loc", "params_scale"),
               "negative_binomial": ("params_total_count", "params_logits")}


def make_informer(seed=0, model_cls="InformerForPrediction", **kw):
    import torch
    import transformers

    torch.manual_seed(seed)
    config = transformers.InformerConfig(**kw)
    model = randomize(getattr(transformers, model_cls)(config), seed)
    gen = torch.Generator().manual_seed(seed + 100)
    with torch.no_grad():                     # BatchNorm statistics away from 0 / 1
        for name, buf in model.named_buffers():
            if name.endswith("running_mean"):
                buf.copy_(0.3 * torch.randn(buf.shape, generator=gen))
            elif name.endswith("running_var"):
                buf.copy_(0.5 + torch.rand(buf.shape, generator=gen))
        base = model.model if hasattr(model, "model") else model
        for part in (base.encoder, base.decoder):   # frozen sinusoid tables, as trained
            part.embed_positions.weight.copy_(part.embed_positions.create_weight())
    return model.eval()


def make_inputs(cfg, batch=3, seed=1) -> dict:
    """Seeded inputs, every series value [batch, time, input_size]; about a fifth of the
    past values unobserved, and the last series' whole context unobserved (the mean
    scaler then takes the batch's default scale)."""
    r = np.random.default_rng(seed)
    past = cfg.context_length + max(cfg.lags_sequence)
    pred, size = cfg.prediction_length, cfg.input_size
    n_time = cfg.num_time_features + cfg.num_dynamic_real_features
    mask = (r.random((batch, past, size)) > 0.2).astype(np.float64)
    mask[-1, -cfg.context_length:] = 0.0
    d = {"past_values": 3.0 + r.standard_normal((batch, past, size)),
         "past_time_features": r.standard_normal((batch, past, n_time)),
         "past_observed_mask": mask,
         "future_values": 3.0 + r.standard_normal((batch, pred, size)),
         "future_time_features": r.standard_normal((batch, pred, n_time))}
    if cfg.distribution_output == "negative_binomial":   # counts: its loss wants integers
        d["past_values"] = np.round(2.0 * d["past_values"])
        d["future_values"] = np.round(2.0 * d["future_values"])
    d = {k: v.astype(np.float32) for k, v in d.items()}
    if cfg.num_static_real_features:
        d["static_real_features"] = r.standard_normal(
            (batch, cfg.num_static_real_features)).astype(np.float32)
    if cfg.num_static_categorical_features:
        d["static_categorical_features"] = np.stack(
            [r.integers(0, c, batch) for c in cfg.cardinality], axis=1).astype(np.int64)
    return d


@contextlib.contextmanager
def recorded_randint():
    """torch.randint as it is, each result also appended to the yielded list."""
    import torch

    drawn, orig = [], torch.randint

    def rec(*a, **kw):
        out = orig(*a, **kw)
        drawn.append(out.numpy().astype(np.int64).copy())
        return out

    torch.randint = rec
    try:
        yield drawn
    finally:
        torch.randint = orig


def sample_names(cfg) -> list[str]:
    """The spec's key_sample inputs, in the order transformers draws them."""
    if cfg.attention_type != "prob":
        return []
    return ([f"encoder.layers.{i}.self_attn.key_sample" for i in range(cfg.encoder_layers)]
            + [f"decoder.layers.{i}.self_attn.key_sample" for i in range(cfg.decoder_layers)])


def hf_run(model, d, seed=SAMPLE_SEED):
    """(transformers' outputs named as the spec's, each with a trailing input_size axis
    where transformers drops it, {key_sample input: the indices transformers drew})."""
    import torch

    cfg = model.config
    t = {k: torch.from_numpy(v) for k, v in d.items()}
    one = cfg.input_size == 1
    if one:                                  # transformers takes [batch, time] then
        for k in ("past_values", "past_observed_mask", "future_values"):
            t[k] = t[k][..., 0]
    base = model.model if hasattr(model, "model") else model
    dec = {}
    hook = base.decoder.register_forward_hook(
        lambda mod, args, out: dec.__setitem__("h", out.last_hidden_state))
    torch.manual_seed(seed)
    try:
        with torch.no_grad(), recorded_randint() as drawn:
            out = model(**t)
    finally:
        hook.remove()
    names = sample_names(cfg)
    assert len(drawn) == len(names)
    ref = {"last_hidden_state": dec["h"], "encoder_last_hidden_state": out.encoder_last_hidden_state,
           "loc": out.loc, "scale": out.scale, "static_features": out.static_features}
    if hasattr(model, "model"):
        for name, p in zip(PARAM_NAMES[cfg.distribution_output], out.params):
            ref[name] = p[..., None] if one else p
    ref = {k: v.float().numpy() for k, v in ref.items()}
    if one:
        ref["loc"], ref["scale"] = ref["loc"][..., None], ref["scale"][..., None]
    return ref, dict(zip(names, drawn))


def ours_outputs(model, d, samples) -> dict:
    feed = {**d, **samples}
    return dict(zip(model.output_names, model(*[feed[n] for n in model.input_names])))


err = rel_err      # an all-zero reference compares absolutely, NaN is inf


def assert_all_match(name, got, ref, names=None):
    names = names or list(ref)
    errs = {k: err(got[k], ref[k]) for k in names}
    print(f"informer {name} vs HF: " + ", ".join(f"{k} {e:.2e}" for k, e in errs.items()))
    assert all(e <= TOL for e in errs.values()), errs


def case(name, tmp_path_factory, model_cls="InformerForPrediction"):
    model = make_informer(model_cls=model_cls, **CASES[name])
    path = save_hf(model, tmp_path_factory.mktemp(f"informer_{name}_{model_cls}"))
    d = make_inputs(model.config)
    ref, samples = hf_run(model, d)
    return model, path, d, ref, samples


@pytest.fixture(scope="module")
def prob(tmp_path_factory):
    return case("prob", tmp_path_factory)


@pytest.fixture(scope="module")
def ours_prob(prob):
    return md.load_model(spec_path("informer"), prob[1])


def test_informer_config_from_hf(prob, ours_prob):
    """Every size comes from config.json (it differs from the tiny variant)."""
    p = ours_prob.params
    assert (p["d_model"], p["context_length"], p["prediction_length"]) == (16, 15, 6)
    assert p["feature_size"] == prob[0].config.feature_size == 13
    assert p["enc_lengths"] == [15, 8, 4]
    assert (p["enc_u"], p["enc_u_part"], p["dec_u"], p["dec_u_part"]) == ([3, 3, 2], [15, 8, 4], 2, 6)
    assert (p["scaler"], p["distribution_output"], p["has_head"]) == ("mean", "student_t", 1)
    # the inputs: one key sample per ProbSparse layer, as many as transformers draws
    samples = prob[4]
    assert [n for n in ours_prob.input_names if n.endswith("key_sample")] == list(samples)
    assert [len(s) for s in samples.values()] == [15, 8, 4, 6, 6]


def test_informer_sampling_is_seeded(prob):
    """The seed alone gives transformers' key samples (what 'seed both' relies on), and
    the sample matters to transformers' output."""
    model, _, d, ref, samples = prob
    again, samples2 = hf_run(model, d)
    assert all(np.array_equal(samples[k], samples2[k]) for k in samples)
    assert_all_match("prob, same seed", again, ref)
    other, _ = hf_run(model, d, seed=SAMPLE_SEED + 1)
    assert err(other["encoder_last_hidden_state"], ref["encoder_last_hidden_state"]) > 100 * TOL


def test_informer_prob_sparse_matches_hf(prob, ours_prob):
    """Encoder output (after two distilling layers), decoder output, loc / scale, static
    features and Student-t parameters of a batch of three series."""
    _, _, d, ref, samples = prob
    got = ours_outputs(ours_prob, d, samples)
    assert set(ref) <= set(got)
    assert got["encoder_last_hidden_state"].shape == (3, 4, 16)
    assert_all_match("prob", got, ref)


def test_informer_key_sample_matters(prob, ours_prob):
    """Negative control: another sample of keys (a sparser one, each key drawn from the
    first half) changes which queries attend, and the result."""
    _, _, d, ref, samples = prob
    other = {k: v // 2 for k, v in samples.items()}
    got = ours_outputs(ours_prob, d, other)
    assert err(got["encoder_last_hidden_state"], ref["encoder_last_hidden_state"]) > 100 * TOL


def test_informer_multivariate_std_normal_matches_hf(tmp_path_factory):
    """Two channels, std scaler, dynamic real features, sampling factor 2, normal head."""
    _, path, d, ref, samples = case("multi", tmp_path_factory)
    ours = md.load_model(spec_path("informer"), path)
    assert "static_real_features" not in ours.input_names
    assert "static_categorical_features" not in ours.input_names
    assert (ours.params["enc_u"], ours.params["dec_u"]) == ([6, 4], 4)
    assert_all_match("multi", ours_outputs(ours, d, samples), ref)


def test_informer_full_attention_no_distil_matches_hf(tmp_path_factory):
    """attention_type full (no key samples), no distilling, no scaling, negative
    binomial head."""
    _, path, d, ref, samples = case("full", tmp_path_factory)
    assert samples == {}
    ours = md.load_model(spec_path("informer"), path)
    assert not any(n.endswith("key_sample") for n in ours.input_names)
    assert not any(n.op == "conv2d" for n in ours.graph.nodes)
    assert ours.params["scaler"] == "none"
    assert_all_match("full", ours_outputs(ours, d, samples), ref)


def test_informer_base_model_checkpoint(tmp_path_factory):
    """An InformerModel checkpoint (no model. prefix, no parameter_projection) loads
    without the head's outputs and gives the same hidden states."""
    _, path, d, ref, samples = case("prob", tmp_path_factory, model_cls="InformerModel")
    ours = md.load_model(spec_path("informer"), path)
    assert not any(n.startswith("params_") for n in ours.output_names)
    assert_all_match("base model", ours_outputs(ours, d, samples), ref)


def test_informer_sampling_factor_matters(prob):
    """Negative control: sampling_factor read as 2 keeps more queries, far off."""
    _, path, d, ref, samples = prob
    spec = with_hf_config(md.load_spec(spec_path("informer")), sampling_factor="{2}")
    ours = md.load_model(spec, path)
    assert ours.params["enc_u"] == [6, 6, 4]
    got = ours_outputs(ours, d, samples)
    assert err(got["encoder_last_hidden_state"], ref["encoder_last_hidden_state"]) > 100 * TOL


def test_informer_position_table_from_params(prob, tmp_path):
    """A checkpoint without the sinusoidal tables (buffers transformers computes) gets
    the spec's own, which are transformers' to the bit."""
    from safetensors.numpy import load_file, save_file
    import shutil

    model, path, d, ref, samples = prob
    dst = tmp_path / "no_pos"
    shutil.copytree(path, dst)
    tensors = load_file(dst / "model.safetensors")
    table = tensors.pop("model.encoder.embed_positions.weight")
    tensors.pop("model.decoder.embed_positions.weight")
    save_file(tensors, dst / "model.safetensors", metadata={"format": "pt"})
    ours = md.load_model(spec_path("informer"), dst)
    assert "encoder.embed_positions.weight" not in ours.weights
    assert np.array_equal(table, model.model.encoder.embed_positions.create_weight().numpy())
    assert_all_match("no position tables", ours_outputs(ours, d, samples), ref)
