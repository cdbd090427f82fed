"""specs/whisper_encoder.yaml against transformers' Whisper encoder (model.get_encoder()).

Seeded small float32 models saved with ``save_pretrained`` (safetensors + config.json):
a WhisperForConditionalGeneration folder (``model.encoder.*``, decoder dropped) and a
WhisperModel folder (``encoder.*``), with sizes other than the spec's tiny variant and
each its own activation, so the sizes and the MLP activation must come from config.json.
Every parameter is random (LayerNorm gains and biases, conv biases, the position table),
so a weight read wrongly or left out changes last_hidden_state.
"""

import numpy as np
import pytest

import maxdecl as md
from modelhelp import TOL, randomize, rel_err, save_hf, spec_path, with_hf_config

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

SPEC = spec_path("whisper_encoder")

CASES = {
    "for_conditional_generation": ("WhisperForConditionalGeneration", dict(
        d_model=96, encoder_layers=2, encoder_attention_heads=4, encoder_ffn_dim=160,
        num_mel_bins=24, max_source_positions=40, activation_function="gelu")),
    "model": ("WhisperModel", dict(
        d_model=64, encoder_layers=2, encoder_attention_heads=2, encoder_ffn_dim=128,
        num_mel_bins=16, max_source_positions=32, activation_function="gelu_new")),
}
# a one-layer decoder: only there to be dropped when the folder loads
DECODER = dict(vocab_size=100, decoder_layers=1, decoder_attention_heads=2, decoder_ffn_dim=32,
               max_target_positions=16, pad_token_id=1, bos_token_id=2, eos_token_id=3,
               decoder_start_token_id=4)


def make_whisper(cls_name, config, seed=0):
    torch.manual_seed(seed)
    cfg = transformers.WhisperConfig(**config, **DECODER, attn_implementation="eager")
    model = randomize(getattr(transformers, cls_name)(cfg), seed)
    with torch.no_grad():                   # conv filters N(0, 1 / (C * K)): features O(1)
        enc = model.get_encoder()
        for conv in (enc.conv1, enc.conv2):
            conv.weight.copy_(conv.weight / conv.weight.shape[1] ** 0.5)
    return model


@pytest.fixture(scope="module", params=sorted(CASES))
def case(request, tmp_path_factory):
    cls_name, config = CASES[request.param]
    model = make_whisper(cls_name, config)
    path = save_hf(model, tmp_path_factory.mktemp(f"whisper_{request.param}"))
    frames = 2 * config["max_source_positions"]
    rng = np.random.default_rng(1)
    inputs = [rng.standard_normal((2, config["num_mel_bins"], frames)).astype(np.float32),
              rng.standard_normal((1, config["num_mel_bins"], frames)).astype(np.float32)]
    with torch.no_grad():
        refs = [model.get_encoder()(torch.from_numpy(x)).last_hidden_state.numpy()
                for x in inputs]
    return request.param, model, path, inputs, refs


def test_last_hidden_state_matches_transformers(case):
    name, hf, path, inputs, refs = case
    m = md.load_model(SPEC, str(path))
    cfg = hf.config
    got = {k: m.params[k] for k in ("dim", "n_layers", "n_heads", "ffn_dim", "n_mels", "n_ctx",
                                    "frames", "activation_function")}
    assert got == {"dim": cfg.d_model, "n_layers": cfg.encoder_layers,
                   "n_heads": cfg.encoder_attention_heads, "ffn_dim": cfg.encoder_ffn_dim,
                   "n_mels": cfg.num_mel_bins, "n_ctx": cfg.max_source_positions,
                   "frames": 2 * cfg.max_source_positions,
                   "activation_function": cfg.activation_function}
    assert m.graph.output_names[0] == "last_hidden_state"
    errs = []
    for x, ref in zip(inputs, refs):
        (out,) = m(x)
        assert out.shape == (x.shape[0], cfg.max_source_positions, cfg.d_model)
        errs.append(rel_err(out, ref))
    print(f"whisper_encoder {name} vs HF: last_hidden_state " +
          ", ".join(f"{e:.2e}" for e in errs))
    assert all(e <= TOL for e in errs)
    assert all(e < 1e-5 for e in errs)           # float32 throughout: much tighter than TOL
    # spectrograms are independent: one alone gives its row of the batch
    (one,) = m(inputs[0][1:2])
    assert rel_err(one, refs[0][1:2]) < 1e-5


def test_decoder_is_dropped(case):
    """The mapped weights hold the encoder only, under the spec's names."""
    _, hf, path, _, _ = case
    td = md.load_weights(str(path), spec=SPEC)
    names = set(td.keys())
    assert not any("decoder" in k or k.startswith(("model.", "encoder.")) for k in names)
    n_enc = sum(1 for k in hf.state_dict() if "encoder." in k)
    assert len(names) == n_enc


def test_weights_and_activation_matter(case):
    """Negative controls: zeroing the position table, a conv bias or the q bias moves the
    output past TOL, so each is read. The MLP activation comes from config.json: the
    other GELU form (erf against tanh) moves it by about 1e-4 of max|ref| (under TOL,
    over the 1e-5 that the match above holds to), quick_gelu past TOL."""
    name, hf, path, inputs, refs = case
    x, ref = inputs[0], refs[0]
    for key in ("position_embd.weight", "conv2.bias", "blk.1.attn_q.bias"):
        td = md.load_weights(str(path), spec=SPEC)
        td[key] = np.zeros_like(np.asarray(td[key]))
        (out,) = md.load_model(SPEC, td)(x)
        assert rel_err(out, ref) > 10 * TOL, key
    other = "gelu_new" if hf.config.activation_function == "gelu" else "gelu"
    for kind, floor in ((other, 3e-5), ("quick_gelu", TOL)):
        spec = with_hf_config(md.load_spec(SPEC), activation_function=f"{{'{kind}'}}")
        m = md.load_model(spec, md.load_weights(str(path)))
        assert m.params["activation_function"] == kind
        (out,) = m(x)
        assert rel_err(out, ref) > floor, kind


def test_wrong_number_of_frames_is_refused(case):
    """transformers requires exactly 2 * max_source_positions frames; so does the spec."""
    _, hf, path, inputs, _ = case
    m = md.load_model(SPEC, str(path))
    with pytest.raises(md.MaxdeclError, match="features"):
        m(inputs[0][..., :-2])
