"""specs/univnet.yaml against transformers' UnivNetModel (the UnivNet vocoder).

Two seeded float32 checkpoints, saved with ``save_pretrained`` and loaded through the
spec's ``formats.hf`` (config.json drives every size):

* ``small``: sizes unlike the spec's ``tiny`` variant: three LVC blocks with strides
  [2, 3, 2] (the odd stride exercises the transposed conv's ``output_padding``), LVC
  kernel sizes [3, 5, 3], dilations of different counts per block ([[1, 3], [1, 2, 4],
  [2]]), a kernel predictor of 2 residual blocks with kernel size 5, leaky slope 0.15;
* ``default``: ``UnivNetConfig()`` as it is (dg845/univnet-dev's Tortoise TTS sizes:
  strides [8, 8, 4], dilations up to 27, hop 256), on a few frames.

A batch of two different spectrograms with a fixed noise input gives the waveform
(``waveforms``) and the residual network's output before the final leaky ReLU and
``conv_post`` (``last_hidden_state``, read from transformers with a forward hook on the
last LVC block).
"""

import numpy as np
import pytest

import maxdecl as md

from modelhelp import hf_params, named_outputs, rel_err, spec_path

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

TOL = 1e-5          # max|ours - ref| <= TOL * max|ref| (float32 throughout)
# The default sizes stack 12 LVC layers (sums over 32 channels x 3 taps, dilations up to
# 27): transformers' own float32 output is 2e-5 to 3e-5 (of max) off its float64 one, so
# that case is held to 1e-4, against the float32 and the float64 reference alike.
TOL_DEEP = 1e-4
BATCH = 2

CASES = {
    "small": dict(
        cfg=dict(model_in_channels=6, model_hidden_channels=5, num_mel_bins=7,
                 resblock_kernel_sizes=[3, 5, 3], resblock_stride_sizes=[2, 3, 2],
                 resblock_dilation_sizes=[[1, 3], [1, 2, 4], [2]],
                 kernel_predictor_num_blocks=2, kernel_predictor_hidden_channels=6,
                 kernel_predictor_conv_size=5, leaky_relu_slope=0.15),
        frames=9, tol=TOL),
    "default": dict(cfg={}, frames=4, tol=TOL_DEEP),
}


def make_univnet(cfg, seed):
    """UnivNetModel with every parameter drawn: conv filters N(0, 1 / fan_in) (fan_in:
    every axis but the first; for the transposed convs the input channels times the
    kernel over the stride; ``conv_post`` a quarter of that), biases 0.1 N(0, 1)."""
    torch.manual_seed(seed)
    model = transformers.UnivNetModel(transformers.UnivNetConfig(**cfg)).eval()
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, m in sorted(model.named_modules()):
            if isinstance(m, torch.nn.ConvTranspose1d):
                fan_in = m.weight.shape[0] * m.weight.shape[2] / m.stride[0]
            elif isinstance(m, torch.nn.Conv1d):
                fan_in = m.weight.shape[1] * m.weight.shape[2]
            else:
                continue
            m.weight.copy_(torch.randn(m.weight.shape, generator=gen) / fan_in ** 0.5)
            m.bias.copy_(0.1 * torch.randn(m.bias.shape, generator=gen))
        model.conv_post.weight.mul_(0.25)     # keep the final tanh out of saturation
    return model


def inputs(cfg, frames, seed):
    """(spectrograms [BATCH, frames, mels], noise [BATCH, frames, in_ch]), seeded."""
    c = transformers.UnivNetConfig(**cfg)
    gen = torch.Generator().manual_seed(seed)
    mel = torch.randn((BATCH, frames, c.num_mel_bins), generator=gen)
    noise = torch.randn((BATCH, frames, c.model_in_channels), generator=gen)
    return mel, noise


def reference(model, mel, noise):
    """{waveforms, last_hidden_state ([batch, samples, hidden], channels last)}."""
    got = {}
    hook = model.resblocks[-1].register_forward_hook(
        lambda mod, args, out: got.__setitem__("h", out.detach().clone()))
    try:
        with torch.no_grad():
            wave = model(input_features=mel, noise_sequence=noise).waveforms
    finally:
        hook.remove()
    return {"waveforms": wave.numpy(), "last_hidden_state": got["h"].transpose(1, 2).numpy()}


@pytest.fixture(scope="module")
def univnet(tmp_path_factory):
    """name -> (HF model, checkpoint dir, (mel, noise) as numpy, reference outputs,
    the same model's outputs in float64)."""
    import copy

    out = {}
    for k, (name, case) in enumerate(CASES.items()):
        model = make_univnet(case["cfg"], seed=k)
        path = str(tmp_path_factory.mktemp(f"univnet_{name}"))
        model.save_pretrained(path)
        mel, noise = inputs(case["cfg"], case["frames"], seed=11 + k)
        ref64 = reference(copy.deepcopy(model).double(), mel.double(), noise.double())
        out[name] = (model, path, (mel.numpy(), noise.numpy()), reference(model, mel, noise),
                     ref64)
    return out


@pytest.fixture(scope="module")
def ours(univnet):
    return {name: md.load_model(spec_path("univnet"), case[1], variant="tiny")
            for name, case in univnet.items()}


def test_univnet_config_from_hf(univnet, ours):
    got = hf_params("univnet", univnet["small"][1])[2]
    assert (got["in_ch"], got["hidden"], got["n_mels"]) == (6, 5, 7)
    assert list(got["strides"]) == [2, 3, 2] and list(got["kernel_sizes"]) == [3, 5, 3]
    assert [list(d) for d in got["dilations"]] == [[1, 3], [1, 2, 4], [2]]
    assert (got["kp_blocks"], got["kp_hidden"], got["kp_conv"]) == (2, 6, 5)
    assert got["slope"] == pytest.approx(0.15)
    p = ours["default"].params
    assert (p["in_ch"], p["hidden"], p["n_mels"], p["kp_hidden"]) == (64, 32, 100, 64)
    assert list(p["strides"]) == [8, 8, 4]


@pytest.mark.parametrize("name", list(CASES))
def test_univnet_matches_hf(univnet, ours, name):
    """The waveform of a batch of two spectrograms with a fixed noise input, and the
    residual network's output, within TOL of transformers' (and of transformers run in
    float64)."""
    _, _, (mel, noise), ref, ref64 = univnet[name]
    got = named_outputs(ours[name], mel, noise)
    hop = int(np.prod(transformers.UnivNetConfig(**CASES[name]["cfg"]).resblock_stride_sizes))
    assert ref["waveforms"].shape == (BATCH, CASES[name]["frames"] * hop)
    assert got["waveforms"].shape == ref["waveforms"].shape
    assert got["last_hidden_state"].shape == ref["last_hidden_state"].shape
    err = {k: rel_err(got[k], ref[k]) for k in ("waveforms", "last_hidden_state")}
    err64 = {k: rel_err(got[k], ref64[k]) for k in ("waveforms", "last_hidden_state")}
    hf64 = {k: rel_err(ref[k], ref64[k]) for k in ("waveforms", "last_hidden_state")}
    print(f"univnet {name} vs HF: {err}; vs HF float64: {err64} (HF float32 itself: {hf64}); "
          f"max|wave| {np.abs(ref['waveforms']).max():.3f}")
    assert max(err.values()) <= CASES[name]["tol"]
    assert max(err64.values()) <= CASES[name]["tol"]
    # the waveform is not saturated by the final tanh, nor the same for both spectrograms
    assert np.abs(ref["waveforms"]).max() < 0.99
    assert rel_err(ref["waveforms"][0], ref["waveforms"][1]) > 0.1


def test_univnet_one_spectrogram_of_another_length(univnet, ours):
    """The same loaded model on one spectrogram of 5 frames (batch and frames are
    symbolic): transformers' waveform of it alone."""
    model = univnet["small"][0]
    mel, noise = inputs(CASES["small"]["cfg"], 5, seed=3)
    mel, noise = mel[:1], noise[:1]
    ref = reference(model, mel, noise)
    got = named_outputs(ours["small"], mel.numpy(), noise.numpy())
    assert got["waveforms"].shape == ref["waveforms"].shape == (1, 5 * 12)
    assert rel_err(got["waveforms"], ref["waveforms"]) <= TOL


def test_univnet_spectrogram_drives_kernels(univnet, ours):
    """Negative control: the same noise with the two spectrograms swapped (so the
    kernel predictor's location-variable kernels differ) is far from the reference."""
    _, _, (mel, noise), ref, _ = univnet["small"]
    got = named_outputs(ours["small"], mel[::-1].copy(), noise)
    assert rel_err(got["waveforms"], ref["waveforms"]) > 1000 * TOL


def test_univnet_noise_matters(univnet, ours):
    """Negative control: another noise sequence gives another waveform."""
    _, _, (mel, noise), ref, _ = univnet["small"]
    got = named_outputs(ours["small"], mel, noise[::-1].copy())
    assert rel_err(got["waveforms"], ref["waveforms"]) > 1000 * TOL


def test_univnet_refuses_mismatched_kernel_predictor(univnet, tmp_path):
    """transformers builds the kernel predictor's residual blocks with
    ``model_in_channels`` channels: a config whose ``kernel_predictor_hidden_channels``
    differs cannot run there, and the spec refuses it by name."""
    import json
    import shutil

    src = univnet["small"][1]
    shutil.copytree(src, tmp_path / "bad")
    cfg_path = tmp_path / "bad" / "config.json"
    cfg = json.loads(cfg_path.read_text())
    cfg["kernel_predictor_hidden_channels"] = 12
    cfg_path.write_text(json.dumps(cfg))
    with pytest.raises(md.WeightsError, match="kernel_predictor_hidden_channels"):
        md.load_model(spec_path("univnet"), str(tmp_path / "bad"), variant="tiny")
