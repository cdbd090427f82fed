"""specs/audio_spectrogram_transformer.yaml against transformers' ASTForAudioClassification
and ASTModel.

Seeded small float32 models (eager attention) saved with ``save_pretrained``
(safetensors + config.json; transformers 5 writes the legacy tensor names,
``encoder.layer.N.attention.attention.query``). Every parameter is random, the [CLS]
and distillation tokens and the position table included (transformers initialises them
to zeros, which would hide a wrong token order). Strides differ along frequency and
time (in ``cls`` and ``base`` neither divides its span evenly, so the conv drops the
last mel bins and frames), and the mel bins differ from the frames,
so a transposed spectrogram or a time-major patch order cannot pass. A batch of two
random log-mel spectrograms ``[2, max_length, num_mel_bins]``. Sizes and switches come
from config.json, not the variant:

- ``cls``: ASTForAudioClassification, 5 labels, gelu, q/k/v biases;
- ``base``: a headless ASTModel, no q/k/v biases (``qkv_bias: false``), gelu_new,
  3 heads, 3 layers, eps 1e-6, another patch size and strides;
- ``nolabels``: ASTForAudioClassification with ``num_labels=0`` (the head's dense is
  ``nn.Identity``: the logits are the head's LayerNorm of the pooled output).
"""

import numpy as np
import pytest

import maxdecl as md
from modelhelp import named_outputs, randomize, rel_err, save_hf, spec_path

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

SPEC = spec_path("audio_spectrogram_transformer")
N_AUDIO = 2
TOL = 1e-5          # max|ours - ref| <= TOL * max|ref| (float32 throughout)

CASES = {
    "cls": dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                intermediate_size=64, patch_size=8, frequency_stride=5, time_stride=6,
                num_mel_bins=24, max_length=40, num_labels=5),
    "base": dict(hidden_size=48, num_hidden_layers=3, num_attention_heads=3,
                 intermediate_size=80, patch_size=6, frequency_stride=4, time_stride=3,
                 num_mel_bins=17, max_length=22, qkv_bias=False, hidden_act="gelu_new",
                 layer_norm_eps=1e-6),
    "nolabels": dict(hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                     intermediate_size=48, patch_size=4, frequency_stride=4, time_stride=2,
                     num_mel_bins=12, max_length=15, num_labels=0),
}
CLASSES = {"cls": "ASTForAudioClassification", "base": "ASTModel",
           "nolabels": "ASTForAudioClassification"}


def make_ast(config, cls, seed=0):
    torch.manual_seed(seed)
    cfg = transformers.ASTConfig(**config, attn_implementation="eager")
    model = randomize(getattr(transformers, cls)(cfg), seed)
    gen = torch.Generator().manual_seed(seed + 100)
    with torch.no_grad():
        for name, p in sorted(model.named_parameters()):
            if name.endswith(("cls_token", "distillation_token", "position_embeddings")):
                p.copy_(torch.randn(p.shape, generator=gen))
    return model


def hf_outputs(model, x) -> dict:
    base = getattr(model, "audio_spectrogram_transformer", model)
    with torch.no_grad():
        xv = torch.from_numpy(x)
        out = base(input_values=xv)
        ref = {"last_hidden_state": out.last_hidden_state.numpy(),
               "pooler_output": out.pooler_output.numpy()}
        if base is not model:
            ref = {"logits": model(input_values=xv).logits.numpy(), **ref}
    return ref


def spectrograms(cfg, n=N_AUDIO, seed=1) -> np.ndarray:
    shape = (n, cfg.max_length, cfg.num_mel_bins)
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


_BUILT = {}


def built(name, tmp_path_factory):
    """(name, HF model, saved folder, spectrograms, HF outputs), built once per module."""
    if name not in _BUILT:
        model = make_ast(CASES[name], CLASSES[name])
        path = save_hf(model, tmp_path_factory.mktemp(f"ast_{name}"))
        x = spectrograms(model.config)
        _BUILT[name] = (name, model, path, x, hf_outputs(model, x))
    return _BUILT[name]


@pytest.fixture(scope="module", params=sorted(CASES))
def case(request, tmp_path_factory):
    return built(request.param, tmp_path_factory)


@pytest.fixture(scope="module")
def loaded(case):
    return md.load_model(SPEC, str(case[2]))


def test_params_from_config(case, loaded):
    name, hf, _, _, _ = case
    cfg = hf.config
    keys = ("dim", "n_layers", "n_heads", "ffn_dim", "hidden_act", "norm_eps", "patch",
            "f_stride", "t_stride", "max_length", "n_mels", "qkv_bias", "has_head",
            "n_classes", "n_tokens")
    f_out = (cfg.num_mel_bins - cfg.patch_size) // cfg.frequency_stride + 1
    t_out = (cfg.max_length - cfg.patch_size) // cfg.time_stride + 1
    head = CLASSES[name] != "ASTModel"
    assert loaded.input_names == ["input_values"]
    assert {k: loaded.params[k] for k in keys} == {
        "dim": cfg.hidden_size, "n_layers": cfg.num_hidden_layers,
        "n_heads": cfg.num_attention_heads, "ffn_dim": cfg.intermediate_size,
        "hidden_act": cfg.hidden_act, "norm_eps": cfg.layer_norm_eps,
        "patch": cfg.patch_size, "f_stride": cfg.frequency_stride,
        "t_stride": cfg.time_stride, "max_length": cfg.max_length,
        "n_mels": cfg.num_mel_bins, "qkv_bias": cfg.qkv_bias, "has_head": head,
        "n_classes": cfg.num_labels, "n_tokens": f_out * t_out + 2}


def test_outputs_match_transformers(case, loaded):
    name, hf, _, x, ref = case
    cfg = hf.config
    got = named_outputs(loaded, x)
    assert list(got) == list(ref)
    if "logits" in ref:
        assert got["logits"].shape == (N_AUDIO, cfg.num_labels or cfg.hidden_size)
    n_tokens = ref["last_hidden_state"].shape[1]
    assert got["last_hidden_state"].shape == (N_AUDIO, n_tokens, cfg.hidden_size)
    assert got["pooler_output"].shape == (N_AUDIO, cfg.hidden_size)
    errs = {k: rel_err(got[k], ref[k]) for k in ref}
    print(f"ast {name} vs HF: " + ", ".join(f"{k} {e:.2e}" for k, e in errs.items()))
    assert all(e <= TOL for e in errs.values()), errs


def test_each_spectrogram_alone(case, loaded):
    """A batch of one gives that spectrogram's rows of the batched reference."""
    _, _, _, x, ref = case
    one = named_outputs(loaded, x[1:2])
    for k in ref:
        assert rel_err(one[k], ref[k][1:2]) <= TOL, k


def test_state_dict_file_with_tiny_variant(tmp_path_factory, tmp_path):
    """A torch ``state_dict`` saved as one ``.safetensors`` (transformers 5's in-memory
    names, ``layers.N.attention.q_proj``; no config.json) loads with the ``tiny``
    variant's sizes, which are the ``cls`` case's."""
    _, hf, _, x, ref = built("cls", tmp_path_factory)
    from safetensors.torch import save_file

    sd = {k: v.contiguous() for k, v in hf.state_dict().items()}
    assert any(".layers.0.attention.q_proj." in k for k in sd)
    f = tmp_path / "ast_state_dict.safetensors"
    save_file(sd, str(f))
    m = md.load_model(SPEC, str(f), variant="tiny")
    got = named_outputs(m, x)
    errs = {k: rel_err(got[k], ref[k]) for k in ref}
    print(f"ast state_dict (tiny variant) vs HF: "
          + ", ".join(f"{k} {e:.2e}" for k, e in errs.items()))
    assert all(e <= TOL for e in errs.values()), errs
