"""specs/wav2vec2.yaml against transformers' Wav2Vec2Model (last_hidden_state).

Seeded small float32 models saved with ``save_pretrained`` (safetensors + config.json):

- ``group_postln``: a bare Wav2Vec2Model, ``feat_extract_norm="group"`` (a GroupNorm after
  the first conv only), no conv biases, the post-LN encoder (wav2vec2-base's layout), an
  even positional-conv kernel (the extra last frame cut off);
- ``layer_stable``: a Wav2Vec2ForCTC (``wav2vec2.*`` names, ``lm_head`` dropped),
  ``feat_extract_norm="layer"`` (a LayerNorm after every conv), conv biases, the pre-LN
  "stable layer norm" encoder (wav2vec2-large-lv60's layout), an odd kernel and the
  tanh GELU in the MLP.

Both have sizes other than the spec's variants, so every size comes from config.json.
Every parameter is random (norm gains and biases, conv biases, weight_norm's g), so a
weight read wrongly or left out moves last_hidden_state.
"""

import json
import os
import shutil

import numpy as np
import pytest

import maxdecl as md
from modelhelp import TOL, randomize, rel_err, save_hf, spec_path

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

SPEC = spec_path("wav2vec2")

CASES = {
    "group_postln": ("Wav2Vec2Model", dict(
        hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64,
        conv_dim=(16, 16, 24), conv_kernel=(10, 3, 2), conv_stride=(5, 2, 2), conv_bias=False,
        feat_extract_norm="group", do_stable_layer_norm=False, num_conv_pos_embeddings=16,
        num_conv_pos_embedding_groups=4, hidden_act="gelu", layer_norm_eps=1e-5)),
    "layer_stable": ("Wav2Vec2ForCTC", dict(
        hidden_size=48, num_hidden_layers=3, num_attention_heads=3, intermediate_size=80,
        conv_dim=(16, 24, 24), conv_kernel=(10, 3, 3), conv_stride=(5, 2, 2), conv_bias=True,
        feat_extract_norm="layer", do_stable_layer_norm=True, num_conv_pos_embeddings=7,
        num_conv_pos_embedding_groups=3, hidden_act="gelu_new", layer_norm_eps=1e-6,
        vocab_size=20)),
}
LENGTHS = ((2, 1200), (1, 1037))          # (batch, samples): odd lengths floor in the convs


def base(model):
    return model if isinstance(model, transformers.Wav2Vec2Model) else model.wav2vec2


def make_wav2vec2(cls_name, config, seed=0):
    torch.manual_seed(seed)
    cfg = transformers.Wav2Vec2Config(**config, attn_implementation="eager")
    model = randomize(getattr(transformers, cls_name)(cfg), seed)
    gen = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        m = base(model)
        for layer in m.feature_extractor.conv_layers:     # N(0, 1 / (C * K)): features O(1)
            w = layer.conv.weight
            w.copy_(torch.randn(w.shape, generator=gen) / (w.shape[1] * w.shape[2]) ** 0.5)
        conv = m.encoder.pos_conv_embed.conv
        g = conv.parametrizations.weight.original0        # [1, 1, K]
        dim, k = cfg.hidden_size, cfg.num_conv_pos_embeddings
        # per-tap gains near sqrt(dim / K), each its own: the positional term is O(1)
        g.copy_((dim / k) ** 0.5 * (1 + 0.3 * torch.randn(g.shape, generator=gen)))
    return model.eval()


def waveforms(seed=1):
    rng = np.random.default_rng(seed)
    return [rng.standard_normal(shape).astype(np.float32) for shape in LENGTHS]


def hf_hidden(model, x):
    with torch.no_grad():
        return base(model)(torch.from_numpy(x)).last_hidden_state.numpy()


@pytest.fixture(scope="module", params=sorted(CASES))
def case(request, tmp_path_factory):
    cls_name, config = CASES[request.param]
    model = make_wav2vec2(cls_name, config)
    path = save_hf(model, tmp_path_factory.mktemp(f"wav2vec2_{request.param}"))
    inputs = waveforms()
    refs = [hf_hidden(model, x) for x in inputs]
    return request.param, model, path, inputs, refs


def test_last_hidden_state_matches_transformers(case):
    name, hf, path, inputs, refs = case
    m = md.load_model(SPEC, str(path))
    cfg = hf.config
    got = {k: m.params[k] for k in ("dim", "n_layers", "n_heads", "ffn_dim", "conv_dim",
                                    "conv_kernel", "conv_stride", "conv_bias",
                                    "feat_extract_norm", "hidden_act", "pos_kernel",
                                    "pos_groups", "do_stable_layer_norm", "norm_eps")}
    assert got == {"dim": cfg.hidden_size, "n_layers": cfg.num_hidden_layers,
                   "n_heads": cfg.num_attention_heads, "ffn_dim": cfg.intermediate_size,
                   "conv_dim": list(cfg.conv_dim), "conv_kernel": list(cfg.conv_kernel),
                   "conv_stride": list(cfg.conv_stride), "conv_bias": cfg.conv_bias,
                   "feat_extract_norm": cfg.feat_extract_norm, "hidden_act": cfg.hidden_act,
                   "pos_kernel": cfg.num_conv_pos_embeddings,
                   "pos_groups": cfg.num_conv_pos_embedding_groups,
                   "do_stable_layer_norm": cfg.do_stable_layer_norm,
                   "norm_eps": cfg.layer_norm_eps}
    assert m.graph.output_names[0] == "last_hidden_state"
    errs = []
    for x, ref in zip(inputs, refs):
        (out,) = m(x)
        assert out.shape == ref.shape
        errs.append(rel_err(out, ref))
    print(f"wav2vec2 {name} vs HF: last_hidden_state " + ", ".join(f"{e:.2e}" for e in errs)
          + f" (max abs {max(float(np.abs(m(x)[0] - r).max()) for x, r in zip(inputs, refs)):.2e})")
    assert all(e <= TOL for e in errs)
    assert all(e < 1e-5 for e in errs)           # float32 throughout: much tighter than TOL
    # waveforms are independent: one alone gives its row of the batch
    (one,) = m(inputs[0][1:2])
    assert rel_err(one, refs[0][1:2]) < 1e-5


def test_only_the_encoder_is_mapped(case):
    """The mapped weights are the model's parameters under the spec's names: the CTC head
    and masked_spec_embed are dropped, weight_norm's g and v kept apart."""
    _, hf, path, _, _ = case
    td = md.load_weights(str(path), spec=SPEC)
    names = set(td.keys())
    assert not any(k.startswith(("wav2vec2.", "encoder.", "lm_head", "masked")) for k in names)
    assert {"pos_conv.weight_g", "pos_conv.weight_v"} <= names
    n_base = sum(1 for k in base(hf).state_dict() if k != "masked_spec_embed")
    assert len(names) == n_base


def test_old_weight_norm_names_load(case, tmp_path):
    """Checkpoints written before torch's parametrizations name the positional conv's
    weight_norm tensors ``weight_g`` / ``weight_v`` (facebook/wav2vec2-base): they load
    the same."""
    from safetensors.numpy import load_file, save_file

    _, hf, path, inputs, refs = case
    tensors = load_file(os.path.join(path, "model.safetensors"))
    renamed = {k.replace("parametrizations.weight.original0", "weight_g")
                .replace("parametrizations.weight.original1", "weight_v"): v
               for k, v in tensors.items()}
    assert renamed.keys() != tensors.keys()
    save_file(renamed, str(tmp_path / "model.safetensors"), metadata={"format": "pt"})
    shutil.copy(os.path.join(path, "config.json"), tmp_path / "config.json")
    (out,) = md.load_model(SPEC, str(tmp_path))(inputs[1])
    assert rel_err(out, refs[1]) < 1e-5


def test_weights_matter(case):
    """Negative controls: zeroing weight_norm's g (the positional conv's filter), its bias,
    the first conv's norm bias or the encoder norm's bias moves the output by over 10 TOL;
    the last layer's q bias (small, and seen only through the softmax) by over 3 TOL."""
    _, hf, path, inputs, refs = case
    x, ref = inputs[1], refs[1]
    n = hf.config.num_hidden_layers
    for key, floor in (("pos_conv.weight_g", 10 * TOL), ("pos_conv.bias", 10 * TOL),
                       ("conv.0.norm.bias", 10 * TOL), ("enc_norm.bias", 10 * TOL),
                       (f"blk.{n - 1}.attn_q.bias", 3 * TOL)):
        td = md.load_weights(str(path), spec=SPEC)
        td[key] = np.zeros_like(np.asarray(td[key]))
        (out,) = md.load_model(SPEC, td)(x)
        assert rel_err(out, ref) > floor, key


def test_unmodelled_configs_are_refused(case, tmp_path):
    _, _, path, _, _ = case
    for key, value, why in (("add_adapter", True, "adapter"),
                            ("feat_extract_norm", "batch", "feat_extract_norm")):
        d = tmp_path / key
        shutil.copytree(path, d)
        cfg = json.loads((d / "config.json").read_text())
        cfg[key] = value
        (d / "config.json").write_text(json.dumps(cfg))
        with pytest.raises(md.WeightsError, match=why):
            md.load_model(SPEC, str(d))
