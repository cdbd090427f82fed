"""specs/dac.yaml against transformers' DacModel (Descript Audio Codec).

A small seeded float32 DAC: encoder width 4 with downsampling ratios [2, 3, 2] (the
odd stride 3 exercises the ceil(stride / 2) padding and a transposed conv whose output
is one sample short), decoder width 32, 4 codebooks of 32 codes of dimension 4. Every
convolution is weight-normalised (``apply_weight_norm``: transformers 5 saves g and v
as ``parametrizations.weight.original0`` / ``original1``), every Snake alpha differs.
Two mono waveforms of different lengths (not multiples of the hop) run one at a time;
each call gives the encoder's output, the codes and latents of ``n_quantizers``
codebooks, and the audio that ``DacModel.decode(audio_codes=...)`` makes of those codes.
"""

import json
import os

import numpy as np
import pytest

import maxdecl as md

from modelhelp import hf_params, named_outputs, rel_err, spec_path

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

TOL = 1e-5          # max|ours - ref| <= TOL * max|ref| (float32 throughout)
LENGTHS = (150, 211)
CFG = dict(encoder_hidden_size=4, downsampling_ratios=[2, 3, 2], decoder_hidden_size=32,
           n_codebooks=4, codebook_size=32, codebook_dim=4, sampling_rate=16000)
N_Q = (2, 4)        # n_quantizers: some codebooks, all of them


def make_dac(seed=1):
    """DacModel with weight norm applied and every parameter drawn: v N(0, 1), g in
    [0.5, 1) (0.1 for the last conv, so the output tanh is not saturated), Snake alphas in
    [0.5, 1.5), biases 0.1 N(0, 1), codebooks N(0, 1). Seed 1 gives 6 to 9 distinct codes
    per codebook over 12 frames."""
    torch.manual_seed(seed)
    model = transformers.DacModel(transformers.DacConfig(**CFG)).eval()
    model.apply_weight_norm()
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in sorted(model.named_parameters()):
            if name.endswith(".alpha"):
                p.copy_(0.5 + torch.rand(p.shape, generator=gen))
            elif name.endswith("original0"):
                p.copy_(0.5 + 0.5 * torch.rand(p.shape, generator=gen))
            elif name.endswith(".bias"):
                p.copy_(0.1 * torch.randn(p.shape, generator=gen))
            else:
                p.copy_(torch.randn(p.shape, generator=gen))
        model.decoder.conv2.parametrizations.weight.original0.fill_(0.1)
    return model


def waveform(n, seed):
    gen = torch.Generator().manual_seed(seed)
    t = torch.arange(n, dtype=torch.float32)
    x = 0.3 * torch.sin(0.21 * t) + 0.2 * torch.sin(0.05 * t + 1) + 0.1 * torch.randn(n, generator=gen)
    return x.reshape(1, 1, n)


def reference(model, x, n_q):
    with torch.no_grad():
        enc = model.encode(x, n_quantizers=n_q)
        return {
            "last_hidden_state": model.encoder(x).numpy(),
            "audio_codes": enc.audio_codes.numpy(),
            "quantized_representation": enc.quantized_representation.numpy(),
            "projected_latents": enc.projected_latents.numpy(),
            "decoded": model.decode(audio_codes=enc.audio_codes).audio_values.numpy(),
            "forward": model(x, n_quantizers=n_q).audio_values.numpy(),
        }


@pytest.fixture(scope="module")
def dac(tmp_path_factory):
    """(HF model, weight-normed checkpoint dir, {(length, n_q): (input, reference)})."""
    model = make_dac()
    path = str(tmp_path_factory.mktemp("dac_hf"))
    model.save_pretrained(path)
    refs = {}
    for k, n in enumerate(LENGTHS):
        x = waveform(n, seed=7 + k)
        for n_q in N_Q:
            refs[n, n_q] = (x.numpy(), reference(model, x, n_q))
    return model, path, refs


@pytest.fixture(scope="module")
def ours(dac):
    return md.load_model(spec_path("dac"), dac[1], variant="tiny")


def run(model, x, n_q):
    return named_outputs(model, x, np.array(n_q, np.int64))


def errors(got, ref, n_q):
    """Relative errors of every output against the reference (codes: mismatches)."""
    d = CFG["codebook_dim"]
    n = ref["forward"].shape[-1]
    return {
        "encoder": rel_err(got["last_hidden_state"], ref["last_hidden_state"]),
        "codes": int(np.sum(got["audio_codes"][:, :n_q] != ref["audio_codes"])),
        "quantized": rel_err(got["quantized_representation"], ref["quantized_representation"]),
        "latents": rel_err(got["projected_latents"][:, :n_q * d], ref["projected_latents"]),
        "decoded": rel_err(got["audio_values"], ref["decoded"]),
        "forward": rel_err(got["audio_values"][..., :n], ref["forward"]),
    }


def save_renamed(model_dir, out_dir, rename):
    """A copy of the checkpoint at ``model_dir`` with tensors renamed (``rename(name,
    array)`` gives a dict of new names to arrays: empty drops the tensor)."""
    from safetensors.numpy import load_file, save_file

    sd = load_file(os.path.join(model_dir, "model.safetensors"))
    new = {}
    for name, arr in sd.items():
        new.update(rename(name, arr))
    os.makedirs(out_dir, exist_ok=True)
    save_file(new, os.path.join(out_dir, "model.safetensors"))
    with open(os.path.join(model_dir, "config.json")) as f:
        cfg = json.load(f)
    with open(os.path.join(out_dir, "config.json"), "w") as f:
        json.dump(cfg, f)
    return out_dir


def test_dac_checkpoint_is_weight_normed(dac):
    names = set(md.load_weights(dac[1]).keys())
    assert "encoder.conv1.parametrizations.weight.original0" in names
    assert "decoder.block.0.conv_t1.parametrizations.weight.original1" in names
    assert not any(n.endswith("conv1.weight") for n in names)


def test_dac_config_from_hf(dac, ours):
    got = hf_params("dac", dac[1])[2]
    assert got["enc_hidden"] == 4 and list(got["down_ratios"]) == [2, 3, 2]
    assert (got["dec_hidden"], got["n_codebooks"], got["codebook_size"], got["codebook_dim"]) == (
        32, 4, 32, 4)
    assert ours.params["hidden"] == dac[0].config.hidden_size == 32


@pytest.mark.parametrize("n_q", N_Q)
@pytest.mark.parametrize("length", LENGTHS)
def test_dac_matches_hf(dac, ours, length, n_q):
    """Encoder output, codes, latents, quantized representation and the audio decoded
    from the codes, for one waveform at a time."""
    x, ref = dac[2][length, n_q]
    got = run(ours, x, n_q)
    assert got["audio_codes"].shape == (1, CFG["n_codebooks"], ref["audio_codes"].shape[-1])
    assert got["audio_values"].shape == ref["decoded"].shape
    err = errors(got, ref, n_q)
    print(f"dac vs HF, {length} samples, {n_q} codebooks: {err}")
    assert err["codes"] == 0
    assert max(v for k, v in err.items() if k != "codes") <= TOL


def test_dac_all_codes_are_hf_codes(dac, ours):
    """Codebook i's code never depends on n_quantizers: every row ours gives is HF's
    with all codebooks, also when fewer are used."""
    x, ref = dac[2][LENGTHS[1], N_Q[-1]]
    got = run(ours, x, 1)
    np.testing.assert_array_equal(got["audio_codes"], ref["audio_codes"])
    assert len(np.unique(ref["audio_codes"][0, 0])) > 3        # the codes are not all alike


def test_dac_n_quantizers_matters(dac, ours):
    """Negative control: the audio of 2 codebooks is far from that of 4."""
    x, ref = dac[2][LENGTHS[0], 4]
    got = run(ours, x, 2)
    assert rel_err(got["audio_values"], ref["decoded"]) > 100 * TOL


def test_dac_folded_weights_match_hf(dac, tmp_path):
    """A checkpoint with the weight norm folded into plain ``weight`` tensors (what
    ``remove_parametrizations(..., leave_parametrized=True)`` saves, and checkpoints
    converted without weight norm hold) gives the same outputs."""
    from safetensors.numpy import save_file
    from torch.nn.utils import parametrize

    model = dac[0]      # read only: removing the parametrizations of a deepcopy would
    sd = {n: t.numpy() for n, t in model.state_dict().items()   # break the shared classes
          if ".parametrizations." not in n}
    with torch.no_grad():
        for name, m in model.named_modules():
            if parametrize.is_parametrized(m, "weight"):
                sd[f"{name}.weight"] = m.weight.numpy().copy()
    save_file(sd, str(tmp_path / "model.safetensors"))
    model.config.to_json_file(str(tmp_path / "config.json"))
    ours = md.load_model(spec_path("dac"), str(tmp_path), variant="tiny")
    for (length, n_q), (x, ref) in dac[2].items():
        err = errors(run(ours, x, n_q), ref, n_q)
        assert err["codes"] == 0 and max(v for k, v in err.items() if k != "codes") <= TOL, err


def test_dac_weight_g_weight_v_names_match_hf(dac, tmp_path):
    """torch's older weight_norm names (``weight_g``, ``weight_v``) load too."""
    def rename(name, arr):
        name = name.replace("parametrizations.weight.original0", "weight_g")
        return {name.replace("parametrizations.weight.original1", "weight_v"): arr}

    path = save_renamed(dac[1], str(tmp_path / "old"), rename)
    ours = md.load_model(spec_path("dac"), path, variant="tiny")
    x, ref = dac[2][LENGTHS[1], 2]
    err = errors(run(ours, x, 2), ref, 2)
    assert err["codes"] == 0 and max(v for k, v in err.items() if k != "codes") <= TOL, err


def test_dac_weight_norm_matters(dac, tmp_path):
    """Negative control: the same v without g (read as plain weights) is far off."""
    def drop_g(name, arr):
        return {} if name.endswith("original0") else {name: arr}

    path = save_renamed(dac[1], str(tmp_path / "no_g"), drop_g)
    ours = md.load_model(spec_path("dac"), path, variant="tiny")
    x, ref = dac[2][LENGTHS[0], 4]
    got = run(ours, x, 4)
    assert rel_err(got["last_hidden_state"], ref["last_hidden_state"]) > 100 * TOL


def test_dac_snake_alpha_matters(dac, tmp_path):
    """Negative control: Snake alphas of 1 instead of the trained ones are far off."""
    def ones(name, arr):
        return {name: np.ones_like(arr) if name.endswith(".alpha") else arr}

    path = save_renamed(dac[1], str(tmp_path / "alpha1"), ones)
    ours = md.load_model(spec_path("dac"), path, variant="tiny")
    x, ref = dac[2][LENGTHS[0], 4]
    got = run(ours, x, 4)
    assert rel_err(got["last_hidden_state"], ref["last_hidden_state"]) > 100 * TOL
