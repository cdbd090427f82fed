"""specs/wav2vec2_conformer.yaml against transformers' Wav2Vec2ConformerModel / ForCTC.

Seeded small float32 models saved with ``save_pretrained`` (safetensors + config.json),
one per kind of position embedding transformers 5 supports, each with sizes of its own
(none the spec's variants), so every size comes from config.json:

- ``relative``: Wav2Vec2ConformerForCTC, Transformer-XL relative positions (``linear_pos``,
  ``pos_bias_u`` / ``pos_bias_v``), ``feat_extract_norm="group"``, no conv biases;
- ``rotary``: Wav2Vec2ConformerForCTC, rotary embeddings (base 5000, not the default) on
  the attention input, ``feat_extract_norm="layer"``, conv biases, swish, eps 1e-3 (the
  encoder and feature-projection norms only: the Conformer blocks keep 1e-5);
- ``none``: a bare Wav2Vec2ConformerModel, ``position_embeddings_type=None``, tanh GELU;
- ``adapter``: Wav2Vec2ConformerForCTC, relative positions and the convolutional adapter
  (``add_adapter``, a projection to ``output_hidden_size``), the CTC head on its output.

Every parameter is random (norm gains and biases, conv biases, BatchNorm running
statistics), so a weight read wrongly or left out moves the outputs. Two waveform
batches of different lengths (odd lengths floor in the strided convs).
"""

import copy

import numpy as np
import pytest

import maxdecl as md
from modelhelp import randomize, rel_err, save_hf, spec_path

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

SPEC = spec_path("wav2vec2_conformer")
TOL = 1e-4          # max|ours - ref| <= TOL * max|ref|

CASES = {
    "relative": ("Wav2Vec2ConformerForCTC", dict(
        hidden_size=48, num_hidden_layers=2, num_attention_heads=4, intermediate_size=80,
        conv_dim=(16, 16, 24), conv_kernel=(10, 3, 2), conv_stride=(5, 2, 2), conv_bias=False,
        feat_extract_norm="group", hidden_act="gelu", conv_depthwise_kernel_size=5,
        position_embeddings_type="relative", layer_norm_eps=1e-5, vocab_size=30)),
    "rotary": ("Wav2Vec2ConformerForCTC", dict(
        hidden_size=32, num_hidden_layers=3, num_attention_heads=2, intermediate_size=64,
        conv_dim=(16, 24, 24), conv_kernel=(10, 3, 3), conv_stride=(5, 2, 2), conv_bias=True,
        feat_extract_norm="layer", hidden_act="swish", conv_depthwise_kernel_size=7,
        position_embeddings_type="rotary", rotary_embedding_base=5000, layer_norm_eps=1e-3,
        vocab_size=20)),
    "none": ("Wav2Vec2ConformerModel", dict(
        hidden_size=40, num_hidden_layers=2, num_attention_heads=5, intermediate_size=72,
        conv_dim=(16, 16, 16), conv_kernel=(10, 3, 3), conv_stride=(5, 2, 2), conv_bias=False,
        feat_extract_norm="group", hidden_act="gelu_new", conv_depthwise_kernel_size=3,
        position_embeddings_type=None, layer_norm_eps=1e-5)),
    "adapter": ("Wav2Vec2ConformerForCTC", dict(
        hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=48,
        conv_dim=(16, 16, 16), conv_kernel=(10, 3, 3), conv_stride=(5, 2, 2), conv_bias=True,
        feat_extract_norm="layer", hidden_act="gelu", conv_depthwise_kernel_size=5,
        position_embeddings_type="relative", layer_norm_eps=1e-5, add_adapter=True,
        output_hidden_size=24, num_adapter_layers=2, adapter_kernel_size=3, adapter_stride=2,
        vocab_size=16)),
}
LENGTHS = ((2, 1200), (1, 1037))          # (batch, samples)


def base(model):
    return (model if isinstance(model, transformers.Wav2Vec2ConformerModel)
            else model.wav2vec2_conformer)


def make_conformer(cls_name, config, seed=0):
    torch.manual_seed(seed)
    # the positional conv is built (and saved) but unused by the Conformer encoder
    cfg = transformers.Wav2Vec2ConformerConfig(**config, num_conv_pos_embeddings=16,
                                               num_conv_pos_embedding_groups=4,
                                               attn_implementation="eager")
    model = randomize(getattr(transformers, cls_name)(cfg), seed)
    gen = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        m = base(model)
        for layer in m.feature_extractor.conv_layers:     # N(0, 1 / (C * K)): features O(1)
            w = layer.conv.weight
            w.copy_(torch.randn(w.shape, generator=gen) / (w.shape[1] * w.shape[2]) ** 0.5)
        for layer in m.encoder.layers:                    # BatchNorm running statistics
            bn = layer.conv_module.batch_norm
            bn.running_mean.copy_(0.2 * torch.randn(bn.running_mean.shape, generator=gen))
            bn.running_var.copy_(0.5 + torch.rand(bn.running_var.shape, generator=gen))
    return model.eval()


def waveforms(seed=1):
    rng = np.random.default_rng(seed)
    return [rng.standard_normal(shape).astype(np.float32) for shape in LENGTHS]


def hf_outputs(model, x):
    """(last_hidden_state, CTC logits or None) of the HF model on waveforms x."""
    with torch.no_grad():
        hidden = base(model)(torch.from_numpy(x)).last_hidden_state.numpy()
        logits = (None if model is base(model)
                  else model(torch.from_numpy(x)).logits.numpy())
    return hidden, logits


@pytest.fixture(scope="module", params=sorted(CASES))
def case(request, tmp_path_factory):
    cls_name, config = CASES[request.param]
    model = make_conformer(cls_name, config)
    path = save_hf(model, tmp_path_factory.mktemp(f"w2v2_conformer_{request.param}"))
    inputs = waveforms()
    refs = [hf_outputs(model, x) for x in inputs]
    ours = md.load_model(SPEC, str(path))
    return request.param, model, path, inputs, refs, ours


def test_params_come_from_config(case):
    _, hf, _, _, _, m = case
    cfg = hf.config
    keys = ("dim", "n_layers", "n_heads", "ffn_dim", "hidden_act", "norm_eps",
            "feat_extract_norm", "feat_act", "conv_dim", "conv_kernel", "conv_stride",
            "conv_bias", "pos_type", "rotary_base", "dw_kernel", "add_adapter", "out_dim",
            "has_ctc")
    got = {k: m.params[k] for k in keys}
    has_ctc = not isinstance(hf, transformers.Wav2Vec2ConformerModel)
    assert got == {
        "dim": cfg.hidden_size, "n_layers": cfg.num_hidden_layers,
        "n_heads": cfg.num_attention_heads, "ffn_dim": cfg.intermediate_size,
        "hidden_act": cfg.hidden_act, "norm_eps": cfg.layer_norm_eps,
        "feat_extract_norm": cfg.feat_extract_norm, "feat_act": cfg.feat_extract_activation,
        "conv_dim": list(cfg.conv_dim), "conv_kernel": list(cfg.conv_kernel),
        "conv_stride": list(cfg.conv_stride), "conv_bias": cfg.conv_bias,
        "pos_type": cfg.position_embeddings_type or "none",
        "rotary_base": cfg.rotary_embedding_base,
        "dw_kernel": cfg.conv_depthwise_kernel_size, "add_adapter": cfg.add_adapter,
        "out_dim": cfg.output_hidden_size if cfg.add_adapter else cfg.hidden_size,
        "has_ctc": has_ctc}
    if has_ctc:
        assert m.params["vocab"] == cfg.vocab_size
        assert list(m.output_names) == ["logits", "last_hidden_state"]
    else:
        assert list(m.output_names) == ["last_hidden_state"]


def test_last_hidden_state_matches_transformers(case):
    name, _, _, inputs, refs, m = case
    errs = []
    for x, (ref, _) in zip(inputs, refs):
        out = dict(zip(m.output_names, m(x)))["last_hidden_state"]
        assert out.shape == ref.shape
        errs.append(rel_err(out, ref))
    print(f"wav2vec2-conformer {name}: last_hidden_state rel err "
          + ", ".join(f"{e:.2e}" for e in errs))
    assert all(e <= TOL for e in errs)


def test_ctc_logits_match_transformers(case):
    name, hf, _, inputs, refs, m = case
    if isinstance(hf, transformers.Wav2Vec2ConformerModel):
        pytest.skip("a bare Wav2Vec2ConformerModel has no CTC head")
    errs = []
    for x, (_, ref) in zip(inputs, refs):
        out = dict(zip(m.output_names, m(x)))["logits"]
        assert out.shape == ref.shape
        errs.append(rel_err(out, ref))
    print(f"wav2vec2-conformer {name}: CTC logits rel err " + ", ".join(f"{e:.2e}" for e in errs))
    assert all(e <= TOL for e in errs)


def test_position_embeddings_matter(case):
    """Negative control: transformers' own output without its position term differs from
    the reference far beyond TOL, so the comparison above checks the position code."""
    name, hf, _, inputs, refs, _ = case
    if hf.config.position_embeddings_type is None:
        pytest.skip("no position embeddings")
    plain = copy.deepcopy(hf)
    enc = base(plain).encoder
    enc.embed_positions = None
    for layer in enc.layers:
        layer.self_attn.position_embeddings_type = None
    hidden, _ = hf_outputs(plain, inputs[0])
    assert rel_err(hidden, refs[0][0]) > 100 * TOL


def test_mapped_weights(case):
    """Every parameter and BatchNorm statistic the model uses is mapped; the unused
    positional conv, masked_spec_embed and num_batches_tracked are dropped."""
    _, hf, path, _, _, _ = case
    td = md.load_weights(str(path), spec=SPEC)
    names = set(td.keys())
    assert not any(k.startswith(("wav2vec2_conformer.", "encoder.pos_conv_embed",
                                 "masked_spec_embed")) for k in names)
    assert not any(k.endswith("num_batches_tracked") for k in names)
    used = {k.removeprefix("wav2vec2_conformer.") for k in hf.state_dict()
            if not k.endswith("num_batches_tracked") and "pos_conv_embed" not in k
            and "embed_positions" not in k and k != "wav2vec2_conformer.masked_spec_embed"
            and k != "masked_spec_embed"}
    assert names == used
