"""specs/fastspeech2_conformer.yaml against transformers' FastSpeech2ConformerModel.

A small seeded float32 FastSpeech2-Conformer (hidden 32, 2 + 2 Conformer layers, a
vocab of 256) run in inference mode: encoder, duration / pitch / energy predictors, the
length regulator (each token repeated by its predicted duration, so the spectrogram's
length depends on the values), decoder and postnet.

No maxdecl op makes a value whose length is computed from values, so the graph takes
the regulated length as the input ``frame_positions`` (arange of it) and publishes the
length it needs as ``n_frames``: one call gives the durations (and n_frames), a second
with ``arange(n_frames)`` gives the spectrogram. The single call from token ids alone,
as transformers does it, is the xfail test.
"""

import numpy as np
import pytest

import maxdecl as md

from modelhelp import hf_params, randomize, rel_err, save_hf, spec_path

pytest.importorskip("torch")
pytest.importorskip("transformers")

TOL = 1e-4          # max|ours - ref| <= TOL * max|ref|
SEQ = 9
PAD = 3             # the second sequence of the batch is SEQ - PAD tokens, then padding

TINY = dict(hidden_size=32, vocab_size=256, num_mel_bins=12,
            encoder_num_attention_heads=2, encoder_layers=2, encoder_linear_units=48,
            encoder_kernel_size=3, decoder_num_attention_heads=2, decoder_layers=2,
            decoder_linear_units=48, decoder_kernel_size=5, positionwise_conv_kernel_size=3,
            duration_predictor_layers=2, duration_predictor_channels=16,
            duration_predictor_kernel_size=3, pitch_predictor_layers=2,
            pitch_predictor_channels=16, pitch_predictor_kernel_size=5,
            energy_predictor_layers=2, energy_predictor_channels=16,
            energy_predictor_kernel_size=3, speech_decoder_postnet_layers=2,
            speech_decoder_postnet_units=16, speech_decoder_postnet_kernel=5)


def make_fs2(seed=0, **kw):
    """FastSpeech2ConformerModel with seeded weights that make every part matter.

    ``randomize`` draws conv filters N(0, 1/K); they are scaled here to N(0, 1/(C K))
    (fan-in) so the convolutions keep their scale; BatchNorm running statistics are
    drawn too (not 0 / 1). The duration head is set so that round(exp(d) - 1) spreads
    over 0..5 frames per token (random weights would give thousands of frames or none).
    """
    import torch
    import transformers

    torch.manual_seed(seed)
    cfg = transformers.FastSpeech2ConformerConfig(**{**TINY, **kw})
    model = randomize(transformers.FastSpeech2ConformerModel(cfg), seed)
    gen = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for name, m in model.named_modules():
            if isinstance(m, torch.nn.Conv1d):
                m.weight.div_((m.in_channels // m.groups) ** 0.5)
            if isinstance(m, torch.nn.BatchNorm1d):
                m.running_mean.copy_(0.2 * torch.randn(m.running_mean.shape, generator=gen))
                m.running_var.copy_(0.5 + torch.rand(m.running_var.shape, generator=gen))
        lin = model.duration_predictor.linear
        lin.weight.copy_(torch.randn(lin.weight.shape, generator=gen) / lin.in_features ** 0.5)
        lin.bias.fill_(0.5)
    return model.eval()


def batch_inputs(batch: int, seed: int = 7):
    """(input_ids, attention_mask) [batch, SEQ] int64; the second row padded with 0."""
    rng = np.random.default_rng(seed)
    ids = rng.integers(1, 256, size=(batch, SEQ)).astype(np.int64)
    mask = np.ones((batch, SEQ), np.int64)
    if batch > 1:
        ids[1, SEQ - PAD:] = 0
        mask[1, SEQ - PAD:] = 0
    return ids, mask


def hf_outputs(model, ids, mask) -> dict:
    import torch

    with torch.no_grad():
        out = model(torch.from_numpy(ids), attention_mask=torch.from_numpy(mask),
                    return_dict=True)
    return {"spectrogram": out.spectrogram.numpy(),
            "duration_outputs": out.duration_outputs.numpy(),
            "pitch_outputs": out.pitch_outputs.numpy(),
            "energy_outputs": out.energy_outputs.numpy(),
            "encoder_last_hidden_state": out.encoder_last_hidden_state.numpy()}


def ours_outputs(model, ids, mask) -> dict:
    """Our outputs: a first call for the durations (any frame count), then one with the
    frame count the graph itself reports (``n_frames``)."""
    first = dict(zip(model.output_names, model(ids, mask, np.arange(1, dtype=np.int64))))
    n = int(first["n_frames"])
    out = dict(zip(model.output_names, model(ids, mask, np.arange(n, dtype=np.int64))))
    for k in ("duration_outputs", "pitch_outputs", "energy_outputs", "n_frames"):
        np.testing.assert_array_equal(out[k], first[k])      # independent of the frame count
    return out


def case(make_kw: dict, tmp_path_factory, name: str, variant: str):
    model = make_fs2(**make_kw)
    path = save_hf(model, tmp_path_factory.mktemp(name))
    ours = md.load_model(spec_path("fastspeech2_conformer"), path, variant=variant)
    refs = {b: hf_outputs(model, *batch_inputs(b)) for b in (1, 2)}
    got = {b: ours_outputs(ours, *batch_inputs(b)) for b in (1, 2)}
    return model, path, ours, refs, got


@pytest.fixture(scope="module")
def fs2(tmp_path_factory):
    return case({}, tmp_path_factory, "fs2_hf", "tiny")


@pytest.fixture(scope="module")
def fs2_prenorm(tmp_path_factory):
    """The other branches: pre-norm layers, concat_after, no macaron feed-forward, no
    conv-module biases, reduction factor 2, speaking speed 1.5."""
    kw = dict(seed=1, encoder_normalize_before=True, decoder_normalize_before=True,
              encoder_concat_after=True, decoder_concat_after=True,
              use_macaron_style_in_conformer=False, convolution_bias=False,
              reduction_factor=2, speaking_speed=1.5)
    return case(kw, tmp_path_factory, "fs2_prenorm_hf", "tiny-prenorm")


def report(name, got, ref) -> float:
    err = rel_err(got, ref)
    print(f"{name}: rel err {err:.2e} (max|ref| {np.abs(ref).max():.3g}, shape {ref.shape})")
    return err


def test_fastspeech2_config_from_hf(fs2):
    _, path, ours, _, _ = fs2
    got = hf_params("fastspeech2_conformer", path)[2]
    assert (got["dim"], got["vocab"], got["n_mels"]) == (32, 256, 12)
    assert (got["enc_layers"], got["dec_layers"], got["enc_kernel"], got["dec_kernel"]) == (2, 2, 3, 5)
    assert (got["pitch_kernel"], got["postnet_layers"], got["reduction"]) == (5, 2, 1)
    assert got["macaron"] is True and got["enc_pre"] is False
    assert ours.input_names == ["input_ids", "attention_mask", "frame_positions"]
    assert list(ours.output_names[:2]) == ["last_hidden_state", "spectrogram"]


@pytest.mark.parametrize("batch", [1, 2])
def test_fastspeech2_variance_outputs_match_hf(fs2, batch):
    """Encoder output, durations (exact), pitch and energy, with a padded row at batch 2."""
    _, _, _, refs, got = fs2
    ref, out = refs[batch], got[batch]
    np.testing.assert_array_equal(out["duration_outputs"], ref["duration_outputs"])
    for k in ("encoder_last_hidden_state", "pitch_outputs", "energy_outputs"):
        assert out[k].shape == ref[k].shape
        assert report(k, out[k], ref[k]) <= TOL
    d = ref["duration_outputs"]
    assert d.max() >= 2 and (d[:, :SEQ - PAD] == 0).any()   # repeats and drops both occur
    if batch == 2:
        assert (d[1, SEQ - PAD:] == 0).all() and (out["pitch_outputs"][1, SEQ - PAD:] == 0).all()


@pytest.mark.parametrize("batch", [1, 2])
def test_fastspeech2_spectrogram_matches_hf(fs2, batch):
    """The spectrogram through the length regulator: the frame count the graph reports is
    transformers' length, and every frame matches (at batch 2 the shorter row's frames
    past its own length are zeros that the decoder still attends to, as in transformers)."""
    _, _, _, refs, got = fs2
    ref, out = refs[batch], got[batch]
    assert int(out["n_frames"]) == ref["spectrogram"].shape[1]
    assert out["spectrogram"].shape == ref["spectrogram"].shape
    assert report("spectrogram", out["spectrogram"], ref["spectrogram"]) <= TOL
    if batch == 2:
        lens = ref["duration_outputs"].sum(axis=1)
        assert lens[0] != lens[1]                              # the padded frames occur


@pytest.mark.parametrize("batch", [1, 2])
def test_fastspeech2_prenorm_concat_reduction_speed_match_hf(fs2_prenorm, batch):
    _, path, ours, refs, got = fs2_prenorm
    assert ours.params["enc_pre"] is True and ours.params["reduction"] == 2
    assert ours.params["speaking_speed"] == pytest.approx(1.5)
    ref, out = refs[batch], got[batch]
    np.testing.assert_array_equal(out["duration_outputs"], ref["duration_outputs"])
    for k in ("encoder_last_hidden_state", "pitch_outputs", "energy_outputs"):
        assert report(k, out[k], ref[k]) <= TOL
    assert 2 * int(out["n_frames"]) == ref["spectrogram"].shape[1]     # reduction factor 2
    assert out["spectrogram"].shape == ref["spectrogram"].shape
    assert report("spectrogram", out["spectrogram"], ref["spectrogram"]) <= TOL


def test_fastspeech2_relative_positions_matter(fs2):
    """Negative control: with linear_pos zeroed in our weights only, the encoder output is
    far off (the relative-position term is really computed)."""
    _, path, _, refs, _ = fs2
    td = md.load_weights(path)
    for name in list(td.keys()):
        if name.endswith("self_attn.linear_pos.weight"):
            td[name] = np.zeros_like(np.asarray(td[name]))
    ours = md.load_model(spec_path("fastspeech2_conformer"), td, variant="tiny")
    ids, mask = batch_inputs(1)
    n = refs[1]["spectrogram"].shape[1]
    out = dict(zip(ours.output_names, ours(ids, mask, np.arange(n, dtype=np.int64))))
    assert rel_err(out["encoder_last_hidden_state"], refs[1]["encoder_last_hidden_state"]) > 100 * TOL


def test_fastspeech2_with_hifigan_checkpoint_loads(fs2, tmp_path):
    """FastSpeech2ConformerWithHifiGan keeps the model under ``model.`` and its config under
    ``model_config``: the spec reads both and drops the vocoder."""
    import transformers

    model = fs2[0]
    voc = transformers.FastSpeech2ConformerHifiGanConfig(
        model_in_dim=12, upsample_initial_channel=16, upsample_rates=[2, 2],
        upsample_kernel_sizes=[4, 4], resblock_kernel_sizes=[3],
        resblock_dilation_sizes=[[1]])
    full = transformers.FastSpeech2ConformerWithHifiGan(
        transformers.FastSpeech2ConformerWithHifiGanConfig(model_config=model.config.to_dict(),
                                                           vocoder_config=voc.to_dict()))
    full.model.load_state_dict(model.state_dict())
    path = save_hf(full.eval(), tmp_path / "with_hifigan")
    ours = md.load_model(spec_path("fastspeech2_conformer"), path, variant="base")
    assert ours.params["dim"] == 32 and ours.params["n_mels"] == 12
    ref = fs2[3][1]
    out = ours_outputs(ours, *batch_inputs(1))
    assert rel_err(out["spectrogram"], ref["spectrogram"]) <= TOL


def test_fastspeech2_all_zero_durations_match_hf(tmp_path):
    """A batch whose predicted durations are all 0: transformers gives every token 1 frame
    (padding tokens included), in place, so the returned durations are all 1 too."""
    import torch

    model = make_fs2(seed=2)
    with torch.no_grad():
        model.duration_predictor.linear.bias.fill_(-30.0)
    path = save_hf(model, tmp_path / "zero_durations")
    ours = md.load_model(spec_path("fastspeech2_conformer"), path, variant="tiny")
    ids, mask = batch_inputs(2)
    ref, out = hf_outputs(model, ids, mask), ours_outputs(ours, ids, mask)
    assert (ref["duration_outputs"] == 1).all()
    np.testing.assert_array_equal(out["duration_outputs"], ref["duration_outputs"])
    assert out["spectrogram"].shape == ref["spectrogram"].shape == (2, SEQ, 12)
    assert report("spectrogram", out["spectrogram"], ref["spectrogram"]) <= TOL


@pytest.mark.xfail(strict=True, reason=(
    "no op makes a value whose length is computed from values (repeat_interleave takes a "
    "static repeat count; slice bounds are numbers): the length regulator's frame count "
    "must come in as the frame_positions input"))
def test_fastspeech2_spectrogram_from_token_ids_alone(fs2):
    """What transformers does: one call from token ids (and mask) to the spectrogram."""
    _, _, ours, refs, _ = fs2
    ids, mask = batch_inputs(1)
    assert ours.input_names == ["input_ids", "attention_mask"]
    out = dict(zip(ours.output_names, ours(ids, mask)))
    assert rel_err(out["spectrogram"], refs[1]["spectrogram"]) <= TOL
