"""specs/encodec.yaml against transformers' EncodecModel.

Seeded small float32 models saved with ``save_pretrained`` (safetensors + config.json),
run on a batch of 2 waveforms:

- ``causal_wn`` (encodec_24khz's layout): mono, weight-normed causal convolutions,
  reflect padding, two residual layers per stage (dilations 1 and 2), unequal ratios
  ``[2, 3]`` (the encoder downsamples by 3 then 2), ``trim_right_ratio`` 0.5 (the
  transposed convs trim both sides), a 2-layer LSTM in the encoder and the decoder;
- ``sym_tgn`` (encodec_48khz's layout without chunking): stereo, ``normalize``,
  ``time_group_norm`` (a GroupNorm after every conv), symmetric (non-causal) padding
  with zeros, no conv shortcut, a 3-layer LSTM.

The waveform's length is a symbolic dim: one loaded model runs any length. The main
input length (100 samples) is no multiple of the hop (6), so every strided conv pads on
the right; ``test_any_input_length`` runs other lengths, multiples of the hop and not,
on the same model. Compared: the encoder's output before quantization
(``last_hidden_state``), the residual-VQ codes at a bandwidth that uses 3 of the 4
codebooks (exactly), and the decoded audio (``audio_values`` of transformers' forward,
decoded from those codes and cut to the input's length).
"""

import json
import shutil

import numpy as np
import pytest

import maxdecl as md
from modelhelp import randomize, rel_err, save_hf, spec_path

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

SPEC = spec_path("encodec")
TOL = 1e-4              # max|ours - ref| <= TOL * max|ref|
BATCH, SAMPLES = 2, 100
BANDWIDTH = 1.2         # 1200 / (log2(16) * 100 frames/s) = 3 codebooks of 4

COMMON = dict(num_filters=4, hidden_size=16, upsampling_ratios=[2, 3], codebook_size=16,
              sampling_rate=600, target_bandwidths=[0.4, 1.2, 1.6], kernel_size=5,
              last_kernel_size=3, residual_kernel_size=3, compress=2)
CASES = {
    "causal_wn": dict(COMMON, audio_channels=1, norm_type="weight_norm", use_causal_conv=True,
                      pad_mode="reflect", num_residual_layers=2, num_lstm_layers=2,
                      trim_right_ratio=0.5, use_conv_shortcut=True, normalize=False),
    "sym_tgn": dict(COMMON, audio_channels=2, norm_type="time_group_norm",
                    use_causal_conv=False, pad_mode="constant", num_residual_layers=1,
                    num_lstm_layers=3, trim_right_ratio=1.0, use_conv_shortcut=False,
                    normalize=True),
}


def make_encodec(config, inputs, seed=0):
    """A seeded EncodecModel whose codebooks (buffers, zeros at init) are drawn at the
    scale of the encoder's output, each half the last (the residual shrinks)."""
    torch.manual_seed(seed)
    model = randomize(transformers.EncodecModel(transformers.EncodecConfig(**config)), seed)
    gen = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        emb = hf_embeddings(model, inputs)
        std = float(emb.std())
        for q, layer in enumerate(model.quantizer.layers):
            e = layer.codebook.embed
            e.copy_(std * 0.5 ** q * torch.randn(e.shape, generator=gen))
    return model.eval()


def hf_embeddings(model, x):
    """The encoder's output [batch, hidden, frames] inside ``encode`` (normalised input)."""
    got = []
    hook = model.encoder.register_forward_hook(lambda m, i, o: got.append(o.detach()))
    try:
        with torch.no_grad():
            model.encode(torch.from_numpy(x), bandwidth=model.config.target_bandwidths[0])
    finally:
        hook.remove()
    return got[0].numpy()


@pytest.fixture(scope="module", params=sorted(CASES))
def case(request, tmp_path_factory):
    config = CASES[request.param]
    rng = np.random.default_rng(3)
    x = rng.standard_normal((BATCH, config["audio_channels"], SAMPLES)).astype(np.float32)
    x *= np.float32(0.5) + np.arange(BATCH, dtype=np.float32)[:, None, None]   # rows differ in level
    model = make_encodec(config, x)
    path = save_hf(model, tmp_path_factory.mktemp(f"encodec_{request.param}"))
    with torch.no_grad():
        out = model(torch.from_numpy(x), bandwidth=BANDWIDTH)
    ref = {"last_hidden_state": hf_embeddings(model, x),
           "audio_codes": out.audio_codes.numpy(),
           "audio_values": out.audio_values.numpy()}
    return request.param, model, str(path), x, ref


def load(path, bandwidth=BANDWIDTH):
    td = md.load_weights(path)
    td.metadata["bandwidth"] = bandwidth
    return md.load_model(SPEC, td)


@pytest.fixture(scope="module")
def ours(case):
    name, hf, path, x, ref = case
    m = load(path)
    return m, dict(zip(m.output_names, m(x)))


def test_params_from_config(case, ours):
    _, hf, _, _, _ = case
    m, _ = ours
    cfg = hf.config
    got = {k: m.params[k] for k in ("audio_channels", "dim", "n_filters", "n_res", "ratios",
                                    "norm_type", "causal", "n_lstm", "codebook_size",
                                    "n_q_total", "n_q", "hop", "normalize")}
    assert got == {"audio_channels": cfg.audio_channels, "dim": cfg.hidden_size,
                   "n_filters": cfg.num_filters, "n_res": cfg.num_residual_layers,
                   "ratios": list(cfg.upsampling_ratios), "norm_type": cfg.norm_type,
                   "causal": cfg.use_causal_conv, "n_lstm": cfg.num_lstm_layers,
                   "codebook_size": cfg.codebook_size, "n_q_total": cfg.num_quantizers,
                   "n_q": hf.quantizer.get_num_quantizers_for_bandwidth(BANDWIDTH),
                   "hop": cfg.hop_length,
                   "normalize": cfg.normalize}
    assert m.params["n_q"] == 3 and m.params["n_q_total"] == 4
    assert "samples" not in m.params and "frames" not in m.params    # a dim, not a param
    assert m.output_names == ["last_hidden_state", "audio_codes", "audio_values"]


def test_embeddings_match(case, ours):
    name, _, _, _, ref = case
    _, got = ours
    assert got["last_hidden_state"].shape == ref["last_hidden_state"].shape
    err = rel_err(got["last_hidden_state"], ref["last_hidden_state"])
    print(f"encodec {name}: embeddings (last_hidden_state) {err:.2e} of max|ref| "
          f"{np.abs(ref['last_hidden_state']).max():.2f}")
    assert err <= TOL


def test_codes_match(case, ours):
    name, _, _, _, ref = case
    _, got = ours
    want = ref["audio_codes"][0]                      # [1, batch, n_q, frames] -> one chunk
    assert got["audio_codes"].dtype == np.int64
    assert got["audio_codes"].shape == want.shape == (BATCH, 3, 17)
    assert np.array_equal(got["audio_codes"], want)
    assert len(np.unique(want)) > 4                   # the codes are not all one


def test_audio_matches(case, ours):
    name, _, _, x, ref = case
    _, got = ours
    assert got["audio_values"].shape == ref["audio_values"].shape == x.shape
    err = rel_err(got["audio_values"], ref["audio_values"])
    print(f"encodec {name}: audio_values {err:.2e} of max|ref| "
          f"{np.abs(ref['audio_values']).max():.2f}")
    assert err <= TOL


def test_each_waveform_alone(case, ours):
    """The rows are independent: the second waveform alone gives its row (normalize's
    scale is per waveform)."""
    name, _, _, x, ref = case
    m, _ = ours
    got = dict(zip(m.output_names, m(x[1:2])))
    assert np.array_equal(got["audio_codes"], ref["audio_codes"][0][1:2])
    assert rel_err(got["audio_values"], ref["audio_values"][1:2]) <= TOL


def test_lstm_matters(case):
    """Negative controls: zeroing the last recurrent matrix of the encoder's LSTM (or of
    the decoder's) moves the embeddings (or the audio) far past TOL: the recurrence is
    computed, not only the input projections."""
    _, hf, path, x, ref = case
    cfg = hf.config
    last = cfg.num_lstm_layers - 1
    k = 1 + len(cfg.upsampling_ratios) * (cfg.num_residual_layers + 2)
    for key, out in ((f"encoder.layers.{k}.lstm.weight_hh_l{last}", "last_hidden_state"),
                     (f"decoder.layers.1.lstm.weight_hh_l{last}", "audio_values")):
        td = md.load_weights(path)
        td.metadata.update(bandwidth=BANDWIDTH)
        td[key] = np.zeros_like(np.asarray(td[key]))
        m = md.load_model(SPEC, td)
        got = dict(zip(m.output_names, m(x)))
        assert rel_err(got[out], ref[out]) > 30 * TOL, key


def test_old_weight_norm_names_load(case, tmp_path):
    """Checkpoints written before torch's parametrizations name weight norm's tensors
    ``weight_g`` / ``weight_v`` (facebook/encodec_24khz): they load the same."""
    from safetensors.numpy import load_file, save_file

    name, _, path, x, ref = case
    if name != "causal_wn":
        pytest.skip("no weight norm in this layout")
    tensors = load_file(f"{path}/model.safetensors")
    renamed = {k.replace("parametrizations.weight.original0", "weight_g")
                .replace("parametrizations.weight.original1", "weight_v"): v
               for k, v in tensors.items()}
    assert renamed.keys() != tensors.keys()
    save_file(renamed, str(tmp_path / "model.safetensors"), metadata={"format": "pt"})
    shutil.copy(f"{path}/config.json", tmp_path / "config.json")
    got = dict(zip(*(lambda m: (m.output_names, m(x)))(load(str(tmp_path)))))
    assert np.array_equal(got["audio_codes"], ref["audio_codes"][0])
    assert rel_err(got["audio_values"], ref["audio_values"]) <= TOL


def test_chunked_checkpoints_are_refused(case, tmp_path):
    _, _, path, _, _ = case
    d = tmp_path / "chunked"
    shutil.copytree(path, d)
    cfg = json.loads((d / "config.json").read_text())
    cfg.update(chunk_length_s=0.1, overlap=0.01)
    (d / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(md.WeightsError, match="chunk_length_s"):
        md.load_model(SPEC, str(d))


# multiples of the hop (6) and not, shorter and longer than the fixture's 100 samples;
# at 1, 7 and 13 some of causal_wn's reflect pads are as long as their input (transformers
# then appends zeros before it reflects)
LENGTHS = (1, 7, 13, 25, 37, 90, 143, 240)


def compare_length(name, hf, m, n, channels):
    """Our outputs against transformers' for a new waveform of `n` samples."""
    rng = np.random.default_rng(100 + n)
    xn = rng.standard_normal((BATCH, channels, n)).astype(np.float32)
    xn *= np.float32(0.5) + np.arange(BATCH, dtype=np.float32)[:, None, None]
    with torch.no_grad():
        out = hf(torch.from_numpy(xn), bandwidth=BANDWIDTH)
    emb = hf_embeddings(hf, xn)
    got = dict(zip(m.output_names, m(xn)))
    frames = -(-n // hf.config.hop_length)
    assert got["last_hidden_state"].shape == emb.shape == (BATCH, hf.config.hidden_size, frames)
    err_emb = rel_err(got["last_hidden_state"], emb)
    assert got["audio_codes"].shape == out.audio_codes.shape[1:] == (BATCH, 3, frames)
    assert np.array_equal(got["audio_codes"], out.audio_codes.numpy()[0])
    assert got["audio_values"].shape == out.audio_values.shape == xn.shape
    err_audio = rel_err(got["audio_values"], out.audio_values.numpy())
    print(f"encodec {name} at {n} samples: embeddings {err_emb:.2e}, audio_values {err_audio:.2e}")
    assert err_emb <= TOL
    assert err_audio <= TOL


@pytest.mark.parametrize("n", LENGTHS)
def test_any_input_length(case, ours, n):
    """What the full model does: one loaded model (the fixture's, which also ran 100
    samples) encodes and decodes a waveform of any length, as transformers does. Each
    length is a new draw, not a prefix of the fixture's input."""
    name, hf, _, x, _ = case
    m, _ = ours
    compare_length(name, hf, m, n, x.shape[1])


def test_any_input_length_symmetric_reflect(tmp_path):
    """encodec_48khz's own padding (symmetric and reflect): the right pad grows with
    `-L mod stride`, so which inputs are too short for a plain reflect depends on L."""
    config = dict(CASES["sym_tgn"], pad_mode="reflect")
    rng = np.random.default_rng(3)
    x = rng.standard_normal((BATCH, config["audio_channels"], SAMPLES)).astype(np.float32)
    hf = make_encodec(config, x)
    m = load(save_hf(hf, tmp_path))
    for n in (1, 2, 5, 8, 11, 17, 29, SAMPLES):
        compare_length("sym_reflect", hf, m, n, config["audio_channels"])
