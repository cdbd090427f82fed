"""specs/mimi.yaml against transformers' MimiModel.

Seeded small float32 models saved with ``save_pretrained`` (safetensors + config.json),
run on a batch of 2 waveforms of one length:

- ``causal`` (kyutai/mimi's layout): mono, causal convolutions with zero padding, one
  residual block per stage, ratios ``[2, 3]``, a 2-layer encoder and decoder
  transformer (GQA: 2 query heads, 1 key/value head; sliding window 5, shorter than the
  17 frames it sees), the frame rate halved by a strided conv with replicate padding and
  doubled again by a grouped (depthwise) transposed conv, a split RVQ of 1 semantic and
  3 acoustic codebooks in a projected space (8 != hidden size 16);
- ``alt``: stereo, symmetric (non-causal) replicate padding, two residual blocks per
  stage (dilations 1 and 2) with conv shortcuts, attention biases, a transposed conv of
  4 groups of 4 channels, no RVQ projections (its space is the hidden size). (Without
  resampling, config.json's ``frame_rate`` equal to the SEANet's, transformers' encoder
  fails: it calls the ``downsample`` it set to None; the spec's 0/1 groups for it are
  checked by ``maxdecl validate`` only.)

The input length (100 samples) is no multiple of the hop, so every strided conv pads on
the right. Compared: the encoder's latents (``last_hidden_state``), the codes
(``audio_codes``, exactly), the decoded audio of the whole forward pass (encode, then
decode, cut to the input's length: ``audio_values``) and the audio that ``decode`` gives
for codes drawn at random (``decoded_values``, a length of its own).
"""

import numpy as np
import pytest

import maxdecl as md
from modelhelp import randomize, rel_err, save_hf, spec_path, with_hf_config

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

SPEC = spec_path("mimi")
TOL = 1e-4              # max|ours - ref| <= TOL * max|ref|
BATCH, SAMPLES = 2, 100
DEC_FRAMES = 7          # frames of the codes given to decode

COMMON = dict(sampling_rate=600, hidden_size=16, num_filters=4, upsampling_ratios=[2, 3],
              kernel_size=5, last_kernel_size=3, residual_kernel_size=3, codebook_size=16,
              num_quantizers=4, num_semantic_quantizers=1, num_hidden_layers=2,
              intermediate_size=32, num_attention_heads=2, head_dim=8, sliding_window=5,
              attn_implementation="eager")
CASES = {
    "causal": dict(COMMON, audio_channels=1, use_causal_conv=True, pad_mode="constant",
                   num_residual_layers=1, use_conv_shortcut=False, num_key_value_heads=1,
                   codebook_dim=8, vector_quantization_hidden_dimension=8, upsample_groups=16),
    "alt": dict(COMMON, audio_channels=2, use_causal_conv=False, pad_mode="replicate",
                num_residual_layers=2, use_conv_shortcut=True, num_key_value_heads=2,
                attention_bias=True, codebook_dim=16, vector_quantization_hidden_dimension=16,
                upsample_groups=4),
}


def make_mimi(config, x, seed=0):
    """A seeded MimiModel whose codebooks (buffers, zeros at init) are drawn at the scale
    of the encoder's latents, each half the last, with cluster usages that differ from 1
    (the centroids are ``embed_sum / cluster_usage``)."""
    torch.manual_seed(seed)
    model = randomize(transformers.MimiModel(transformers.MimiConfig(**config)), seed)
    gen = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        std = float(model.encoder(torch.from_numpy(x)).latents.std())
        for rvq in (model.quantizer.semantic_residual_vector_quantizer,
                    model.quantizer.acoustic_residual_vector_quantizer):
            for q, layer in enumerate(rvq.layers):
                cb = layer.codebook
                usage = 0.5 + 1.5 * torch.rand(cb.cluster_usage.shape, generator=gen)
                e = std * 0.5 ** q * torch.randn(cb.embed_sum.shape, generator=gen)
                cb.cluster_usage.copy_(usage)
                cb.embed_sum.copy_(e * usage[:, None])
                cb._embed = None                      # drop the cached centroids
    return model.eval()


def waveforms(channels, n, seed=3):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((BATCH, channels, n)).astype(np.float32)
    return x * (np.float32(0.5) + np.arange(BATCH, dtype=np.float32)[:, None, None])


@pytest.fixture(scope="module", params=sorted(CASES))
def case(request, tmp_path_factory):
    config = CASES[request.param]
    x = waveforms(config["audio_channels"], SAMPLES)
    model = make_mimi(config, x)
    path = save_hf(model, tmp_path_factory.mktemp(f"mimi_{request.param}"))
    codes = np.random.default_rng(5).integers(
        0, config["codebook_size"], (BATCH, config["num_quantizers"], DEC_FRAMES))
    with torch.no_grad():
        out = model(torch.from_numpy(x))
        ref = {"last_hidden_state": model.encoder(torch.from_numpy(x)).latents.numpy(),
               "audio_codes": out.audio_codes.numpy(),
               "audio_values": out.audio_values.numpy(),
               "decoded_values": model.decode(torch.from_numpy(codes)).audio_values.numpy()}
    return request.param, model, str(path), x, codes, ref


@pytest.fixture(scope="module")
def ours(case):
    _, _, path, x, codes, _ = case
    m = md.load_model(SPEC, path)
    return m, dict(zip(m.output_names, m(x, codes)))


def test_params_from_config(case, ours):
    name, hf, _, _, _, _ = case
    m, _ = ours
    cfg = hf.config
    got = {k: m.params[k] for k in ("audio_channels", "dim", "n_filters", "n_res", "ratios",
                                    "causal", "pad_mode", "use_conv_shortcut", "n_q_total",
                                    "n_sem", "vq_dim", "n_layers", "n_heads", "n_kv_heads",
                                    "head_dim", "sliding_window", "latent_stride", "resample",
                                    "has_proj")}
    assert got == {"audio_channels": cfg.audio_channels, "dim": cfg.hidden_size,
                   "n_filters": cfg.num_filters, "n_res": cfg.num_residual_layers,
                   "ratios": list(cfg.upsampling_ratios), "causal": cfg.use_causal_conv,
                   "pad_mode": cfg.pad_mode, "use_conv_shortcut": cfg.use_conv_shortcut,
                   "n_q_total": cfg.num_quantizers, "n_sem": cfg.num_semantic_quantizers,
                   "vq_dim": cfg.vector_quantization_hidden_dimension,
                   "n_layers": cfg.num_hidden_layers, "n_heads": cfg.num_attention_heads,
                   "n_kv_heads": cfg.num_key_value_heads, "head_dim": cfg.head_dim,
                   "sliding_window": cfg.sliding_window,
                   "latent_stride": cfg.latent_stride,
                   "resample": hf.encoder.downsample is not None,
                   "has_proj": hf.quantizer.semantic_residual_vector_quantizer.input_proj
                   is not None}
    assert got["resample"] and got["latent_stride"] == 2
    assert got["has_proj"] == (name == "causal")
    assert "samples" not in m.params and "frames" not in m.params     # dims, not params
    assert m.output_names == ["last_hidden_state", "audio_codes", "audio_values",
                              "decoded_values"]


def check(name, what, got, want):
    assert got.shape == want.shape, (got.shape, want.shape)
    err = rel_err(got, want)
    print(f"mimi {name}: {what} {err:.2e} of max|ref| {np.abs(want).max():.3g}")
    assert err <= TOL


def test_latents_match(case, ours):
    name, _, _, _, _, ref = case
    _, got = ours
    check(name, "latents (last_hidden_state)", got["last_hidden_state"], ref["last_hidden_state"])


def test_codes_match(case, ours):
    name, hf, _, _, _, ref = case
    _, got = ours
    want = ref["audio_codes"]
    frames = -(-SAMPLES // 12)                          # hop 6, then stride 2
    assert got["audio_codes"].dtype == np.int64
    assert got["audio_codes"].shape == want.shape == (BATCH, hf.config.num_quantizers, frames)
    assert np.array_equal(got["audio_codes"], want)
    assert len(np.unique(want)) > 4                     # the codes are not all one
    assert len(np.unique(want[:, 1:])) > 4              # nor the acoustic ones


def test_roundtrip_audio_matches(case, ours):
    name, _, _, x, _, ref = case
    _, got = ours
    assert ref["audio_values"].shape == x.shape
    check(name, "forward audio_values", got["audio_values"], ref["audio_values"])


def test_decode_matches(case, ours):
    name, _, _, _, _, ref = case
    _, got = ours
    assert ref["decoded_values"].shape[-1] == DEC_FRAMES * 12
    check(name, "decode(codes)", got["decoded_values"], ref["decoded_values"])


@pytest.mark.parametrize("n", (1, 37, 144))
def test_any_input_length(case, ours, n):
    """One loaded model encodes and decodes another length (a multiple of the frame
    size and not, and one sample) as transformers does."""
    name, hf, _, _, codes, ref = case
    m, _ = ours
    xn = waveforms(hf.config.audio_channels, n, seed=100 + n)
    with torch.no_grad():
        out = hf(torch.from_numpy(xn))
        lat = hf.encoder(torch.from_numpy(xn)).latents.numpy()
    got = dict(zip(m.output_names, m(xn, codes)))
    assert np.array_equal(got["audio_codes"], out.audio_codes.numpy())
    check(f"{name} at {n} samples", "latents", got["last_hidden_state"], lat)
    check(f"{name} at {n} samples", "audio_values", got["audio_values"], out.audio_values.numpy())


def test_sliding_window_matters(case):
    """Negative control: without the window (0: off) the latents move past TOL (the
    transformer's share of the latents is smaller in ``alt``, whose conv shortcuts carry
    more of the signal)."""
    name, _, path, x, codes, ref = case
    spec = with_hf_config(md.load_spec(SPEC), sliding_window="{0}")
    m = md.load_model(spec, path)
    got = dict(zip(m.output_names, m(x, codes)))
    assert m.params["sliding_window"] == 0
    err = rel_err(got["last_hidden_state"], ref["last_hidden_state"])
    print(f"mimi {name}: latents without the sliding window {err:.2e}")
    assert err > 3 * TOL
