"""specs/modernbert.yaml against transformers' ModernBertModel and ModernBertForMaskedLM.

Seeded small float32 models (eager attention) saved with ``save_pretrained`` (config.json
with transformers 5's ``layer_types`` and per-kind ``rope_parameters``; the decoder of a
tied masked-LM model is not stored). Three configurations:

- ``mlm``: masked-LM head, global / local / global layers (global_attn_every_n_layers 2),
  window 6 (3 keys either side) on sequences of 13, no biases anywhere (norm_bias false),
  tied decoder with its bias, GELU;
- ``mlm_biased``: every bias on (norm_bias, attention_bias, mlp_bias, classifier_bias),
  global / local / local (every 3rd layer global), window 4, an untied decoder without
  bias, GELU-tanh in the MLP and SiLU in the head, 3 heads;
- ``encoder``: the headless ModernBertModel (no ``model.`` prefix, no logits).

Inputs are a batch of two sequences, the second padded; last hidden states and logits
are compared at every position without a mask and at the tokens (not the padding)
with transformers' attention_mask.
"""

import json
import shutil

import numpy as np
import pytest

import maxdecl as md
from modelhelp import TOL, randomize, rel_err, save_hf, spec_path, with_hf_config

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

SPEC = spec_path("modernbert")
TIGHT = 1e-5                # float32 throughout: far inside TOL
SEQ, REAL = 13, 9           # sequence length; tokens of the padded second sequence
PAD = 0

BASE = dict(vocab_size=96, pad_token_id=PAD, bos_token_id=1, eos_token_id=2, cls_token_id=1,
            sep_token_id=2, max_position_embeddings=64, norm_eps=1e-5,
            attn_implementation="eager")
CASES = {
    "mlm": (transformers.ModernBertForMaskedLM,
            dict(hidden_size=64, intermediate_size=96, num_hidden_layers=3,
                 num_attention_heads=4, local_attention=6, global_attn_every_n_layers=2,
                 global_rope_theta=80000.0, local_rope_theta=500.0)),
    "mlm_biased": (transformers.ModernBertForMaskedLM,
                   dict(hidden_size=48, intermediate_size=80, num_hidden_layers=3,
                        num_attention_heads=3, local_attention=4,
                        global_attn_every_n_layers=3, global_rope_theta=20000.0,
                        local_rope_theta=300.0, norm_bias=True, attention_bias=True,
                        mlp_bias=True, classifier_bias=True, decoder_bias=False,
                        tie_word_embeddings=False, hidden_activation="gelu_new",
                        classifier_activation="silu")),
    "encoder": (transformers.ModernBertModel,
                dict(hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                     num_attention_heads=2, local_attention=8, global_attn_every_n_layers=2,
                     global_rope_theta=160000.0, local_rope_theta=10000.0)),
}


def make(name, seed=0):
    cls, kw = CASES[name]
    torch.manual_seed(seed)
    return randomize(cls(transformers.ModernBertConfig(**BASE, **kw)), seed)


def batch():
    """(ids [2, SEQ], padded mask [2, SEQ]): the second sequence has REAL tokens."""
    ids = np.random.default_rng(1).integers(3, 96, (2, SEQ)).astype(np.int64)
    ids[1, REAL:] = PAD
    mask = np.ones_like(ids)
    mask[1, REAL:] = 0
    return ids, mask


def hf_outputs(model, ids, mask=None) -> dict:
    with torch.no_grad():
        kw = {} if mask is None else {"attention_mask": torch.tensor(mask)}
        out = model(torch.tensor(ids), output_hidden_states=True, **kw)
    got = {"last_hidden_state": out.hidden_states[-1].numpy()}
    if hasattr(out, "logits"):
        got["logits"] = out.logits.numpy()
    return got


def ours(model, ids, mask) -> dict:
    pos = np.arange(ids.shape[1], dtype=np.int64)
    return dict(zip(model.output_names, model(ids, mask, pos)))


def errors(got, ref, mask=None) -> dict:
    """rel_err of every output; with a mask, at the tokens only (a padding query of a
    local layer may see no key: zeros here, transformers averages the masked keys)."""
    keep = slice(None) if mask is None else mask.astype(bool)
    return {k: rel_err(got[k][keep], ref[k][keep]) for k in ref}


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """name -> (name, HF model, its directory, md.Model, ids, mask, refs without / with
    mask), each built once per module."""
    cache = {}

    def get(name):
        if name not in cache:
            hf = make(name)
            path = save_hf(hf, tmp_path_factory.mktemp(f"modernbert_{name}"))
            ids, mask = batch()
            cache[name] = (name, hf, path, md.load_model(SPEC, str(path)), ids, mask,
                           hf_outputs(hf, ids), hf_outputs(hf, ids, mask))
        return cache[name]

    return get


@pytest.fixture(params=sorted(CASES))
def case(request, built):
    return built(request.param)


def test_params_from_config(case):
    name, hf, path, m, *_ = case
    cfg = hf.config
    n = cfg.num_hidden_layers
    every = CASES[name][1]["global_attn_every_n_layers"]
    assert m.params["is_global"] == [i % every == 0 for i in range(n)]
    assert m.params["layer_types"] == cfg.layer_types
    assert m.params["half_window"] == cfg.local_attention // 2 == cfg.sliding_window
    assert m.params["global_theta"] == cfg.rope_parameters["full_attention"]["rope_theta"]
    assert m.params["local_theta"] == cfg.rope_parameters["sliding_attention"]["rope_theta"]
    for k in ("norm_bias", "attention_bias", "mlp_bias", "classifier_bias", "decoder_bias"):
        assert m.params[k] == getattr(cfg, k), k
    assert (m.params["dim"], m.params["n_layers"], m.params["n_heads"], m.params["ffn_dim"],
            m.params["vocab"]) == (cfg.hidden_size, n, cfg.num_attention_heads,
                                   cfg.intermediate_size, cfg.vocab_size)
    mlm = name != "encoder"
    assert m.output_names == (["last_hidden_state", "logits"] if mlm else ["last_hidden_state"])
    # biases exist exactly where the config says; layer 0 has no attention norm
    w = set(m.weights.keys())
    assert "blk.0.attn_norm.weight" not in w and "blk.1.attn_norm.weight" in w
    assert ("output_norm.bias" in w) == cfg.norm_bias
    assert ("blk.0.attn_qkv.bias" in w) == cfg.attention_bias
    assert ("blk.0.ffn_up.bias" in w) == cfg.mlp_bias
    if mlm:
        assert ("head_dense.bias" in w) == cfg.classifier_bias
        assert ("output.bias" in w) == cfg.decoder_bias
        assert ("output.weight" in w) == (not cfg.tie_word_embeddings)   # else the embedding


def test_outputs_match_transformers_without_mask(case):
    name, _, _, m, ids, mask, ref, _ = case
    errs = errors(ours(m, ids, np.ones_like(mask)), ref)
    print(f"modernbert {name} vs HF, no mask: " + ", ".join(f"{k} {e:.2e}" for k, e in errs.items()))
    assert all(e <= TOL for e in errs.values())
    assert all(e <= TIGHT for e in errs.values())


def test_outputs_match_transformers_with_padding_mask(case):
    name, hf, _, m, ids, mask, _, ref = case
    got = ours(m, ids, mask)
    errs = errors(got, ref, mask)
    print(f"modernbert {name} vs HF, padded: " + ", ".join(f"{k} {e:.2e}" for k, e in errs.items()))
    assert all(e <= TIGHT for e in errs.values())
    # the padded sequence gives what it gives alone, unpadded
    alone = hf_outputs(hf, ids[1:, :REAL])
    for k in alone:
        assert rel_err(got[k][1:, :REAL], alone[k]) <= TIGHT, k


def test_negative_controls(case):
    """What the comparison catches: a perturbed weight, the GeGLU halves of the fused
    Wi swapped, no local window, the global RoPE base on the local layers, and the
    padding left unmasked all move the outputs past 10 x TOL."""
    name, hf, path, m, ids, mask, ref, ref_masked = case
    ones = np.ones_like(mask)
    key = "logits" if "logits" in ref else "last_hidden_state"

    td = md.load_weights(str(path), spec=SPEC)
    w = np.asarray(td["blk.1.attn_qkv.weight"])
    td["blk.1.attn_qkv.weight"] = (w + np.random.default_rng(5).standard_normal(w.shape)
                                   * w.std()).astype(np.float32)
    assert errors(ours(md.load_model(SPEC, td), ids, ones), ref)[key] > 10 * TOL

    td = md.load_weights(str(path), spec=SPEC)
    f = hf.config.intermediate_size
    for i in range(hf.config.num_hidden_layers):
        for kind in ("weight", "bias"):
            k = f"blk.{i}.ffn_up.{kind}"
            if k in td.keys():
                a = np.asarray(td[k])
                td[k] = np.concatenate([a[f:], a[:f]]).copy()
    assert errors(ours(md.load_model(SPEC, td), ids, ones), ref)[key] > 10 * TOL

    spec = md.load_spec(SPEC)
    no_window = with_hf_config(spec, local_attention="{1000}")
    assert errors(ours(md.load_model(no_window, str(path)), ids, ones), ref)[key] > 10 * TOL
    one_theta = with_hf_config(
        spec, local_theta="{rope_parameters['full_attention']['rope_theta']}")
    assert errors(ours(md.load_model(one_theta, str(path)), ids, ones), ref)[key] > 10 * TOL

    unmasked = ours(m, ids, ones)                      # padding tokens seen as tokens
    assert errors(unmasked, ref_masked, mask)[key] > 10 * TOL


def test_legacy_config_keys(built, tmp_path):
    """Hub configs written before transformers 5 (answerdotai/ModernBERT-base) have no
    layer_types or rope_parameters, only global_attn_every_n_layers and
    global_rope_theta / local_rope_theta: the same params, the same outputs."""
    _, hf, path, m, ids, mask, ref, _ = built("mlm_biased")      # every 3rd layer global
    legacy = tmp_path / "legacy"
    shutil.copytree(path, legacy)
    cfg = json.loads((legacy / "config.json").read_text())
    rope = cfg.pop("rope_parameters")
    cfg.pop("layer_types")
    cfg["global_rope_theta"] = rope["full_attention"]["rope_theta"]
    cfg["local_rope_theta"] = rope["sliding_attention"]["rope_theta"]
    (legacy / "config.json").write_text(json.dumps(cfg))
    old = md.load_model(SPEC, str(legacy))
    for k in ("is_global", "global_theta", "local_theta", "half_window"):
        assert old.params[k] == m.params[k], k
    assert old.params["is_global"] == [True, False, False]       # not the variant's pattern
    assert old.params["layer_types"] is None
    errs = errors(ours(old, ids, np.ones_like(mask)), ref)
    assert all(e <= TIGHT for e in errs.values())


def _edited(src, dst, edit) -> str:
    shutil.copytree(src, dst)
    cfg = json.loads((dst / "config.json").read_text())
    edit(cfg)
    (dst / "config.json").write_text(json.dumps(cfg))
    return str(dst)


def test_refuses_what_is_not_modelled(built, tmp_path):
    path = built("mlm")[2]

    def scaled(cfg):
        cfg["rope_parameters"]["sliding_attention"].update(rope_type="linear", factor=2.0)

    with pytest.raises(md.errors.WeightsError, match="RoPE scaling"):
        md.load_weights(_edited(path, tmp_path / "rope", scaled), spec=SPEC)

    def classifier(cfg):
        cfg["architectures"] = ["ModernBertForSequenceClassification"]

    with pytest.raises(md.errors.WeightsError,
                       match="ModernBertForSequenceClassification is not modelled"):
        md.load_weights(_edited(path, tmp_path / "cls", classifier), spec=SPEC)


def test_masked_lm_with_positions_input_name(built, tmp_path):
    """Inputs tokens, positions and an attention_mask (not a state) with an output
    logits: an encoder called with its inputs, not a language model."""
    path = built("mlm")[2]
    text = open(SPEC).read().replace("position_ids", "positions")
    (tmp_path / "modernbert_positions.yaml").write_text(text)
    model = md.load_model(str(tmp_path / "modernbert_positions.yaml"), str(path))
    assert model.session is None and "positions" in model.input_names
