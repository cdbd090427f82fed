"""specs/deberta_v2.yaml against transformers' DebertaV2Model and DebertaV2ForMaskedLM.

Seeded small float32 models (eager attention) saved with ``save_pretrained``, loaded with
``md.load_model``; last hidden states and masked-LM logits compared on unpadded
sequences of 40 tokens (relative distances past every bucket range and past
max_relative_positions) and 7 tokens. Five configurations:

- ``v3``: DeBERTa-v3 style masked LM: share_att_key, log buckets (position_buckets 8,
  max_relative_positions 32), pos_att_type [p2c, c2p], LayerNorm on the relative
  embeddings, no absolute positions, no token types, the legacy head with a tied decoder;
- ``v2``: separate pos_key_proj / pos_query_proj, no buckets (max_relative_positions 6:
  the distances are clamped), no relative-embedding norm, absolute positions, two token
  types, embedding_size 32 != hidden_size 64 (embed_proj), the ConvLayer (kernel 3,
  2 groups, gelu), the legacy head with an untied decoder and its own bias;
- ``enc``: the headless DebertaV2Model, pos_att_type [p2c] only (scale sqrt(2 d)),
  position_buckets 6 with max_relative_positions from max_position_embeddings, 3 heads,
  gelu_new, a ConvLayer of kernel 5 with the default tanh;
- ``newhead``: the non-legacy MLM head (lm_predictions), pos_att_type [c2p] only;
- ``plain``: relative_attention false (a BERT with DeBERTa's scale: pos_att_type still
  counts in sqrt(d * (1 + 2))).

Negative controls: other pos_att_type or max_relative_positions through the spec's
hf.config, and perturbed weights (relative embeddings, their norm, the conv filter,
a position projection), each give a large error.
"""

import json
import shutil

import numpy as np
import pytest

import maxdecl as md
from modelhelp import TOL, randomize, rel_err, save_hf, spec_path, with_hf_config

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

SPEC = spec_path("deberta_v2")
TIGHT = 1e-5                # float32 throughout: far inside TOL
LENGTHS = (40, 7)

BASE = dict(vocab_size=96, max_position_embeddings=64, layer_norm_eps=1e-7,
            attn_implementation="eager")
CASES = {
    "v3": (transformers.DebertaV2ForMaskedLM,
           dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                num_attention_heads=4, relative_attention=True, position_buckets=8,
                max_relative_positions=32, pos_att_type=["p2c", "c2p"], share_att_key=True,
                norm_rel_ebd="layer_norm", position_biased_input=False, type_vocab_size=0)),
    "v2": (transformers.DebertaV2ForMaskedLM,
           dict(hidden_size=64, embedding_size=32, intermediate_size=64, num_hidden_layers=2,
                num_attention_heads=4, relative_attention=True, max_relative_positions=6,
                pos_att_type=["c2p", "p2c"], share_att_key=False, norm_rel_ebd="none",
                position_biased_input=True, type_vocab_size=2, conv_kernel_size=3,
                conv_groups=2, conv_act="gelu", tie_word_embeddings=False)),
    "enc": (transformers.DebertaV2Model,
            dict(hidden_size=48, intermediate_size=64, num_hidden_layers=2,
                 num_attention_heads=3, relative_attention=True, position_buckets=6,
                 pos_att_type=["p2c"], share_att_key=False, norm_rel_ebd="layer_norm",
                 hidden_act="gelu_new", position_biased_input=False, type_vocab_size=0,
                 conv_kernel_size=5)),
    "newhead": (transformers.DebertaV2ForMaskedLM,
                dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                     num_attention_heads=2, relative_attention=True, position_buckets=8,
                     pos_att_type=["c2p"], share_att_key=True, norm_rel_ebd="layer_norm",
                     position_biased_input=False, type_vocab_size=0, legacy=False)),
    "plain": (transformers.DebertaV2Model,
              dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                   num_attention_heads=4, relative_attention=False,
                   pos_att_type=["p2c", "c2p"], position_biased_input=True,
                   type_vocab_size=2)),
}


def make(name, seed=0):
    cls, kw = CASES[name]
    torch.manual_seed(seed)
    return randomize(cls(transformers.DebertaV2Config(**BASE, **kw)), seed)


def sequences(type_vocab):
    """(ids, token types) pairs; two segments where the model has token types."""
    rng = np.random.default_rng(1)
    out = []
    for n in LENGTHS:
        ids = rng.integers(1, 96, n).astype(np.int64)
        types = (np.arange(n) >= n // 2).astype(np.int64) if type_vocab else np.zeros(n, np.int64)
        out.append((ids, types))
    return out


def hf_outputs(model, ids, types) -> dict:
    with torch.no_grad():
        out = model(torch.tensor(ids[None]), token_type_ids=torch.tensor(types[None]),
                    output_hidden_states=True)
    got = {"last_hidden_state": out.hidden_states[-1][0].numpy()}
    if hasattr(out, "logits"):
        got["logits"] = out.logits[0].numpy()
    return got


def ours(model, ids, types) -> dict:
    return dict(zip(model.output_names, model(ids, np.arange(len(ids), dtype=np.int64), types)))


def errors(got, ref) -> dict:
    return {k: rel_err(got[k], ref[k]) for k in ref}


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """name -> (HF model, its directory, md.Model, [(ids, types, HF outputs)]), each
    built once per module."""
    cache = {}

    def get(name):
        if name not in cache:
            hf = make(name)
            path = save_hf(hf, tmp_path_factory.mktemp(f"deberta_v2_{name}"))
            seqs = [(ids, types, hf_outputs(hf, ids, types))
                    for ids, types in sequences(hf.config.type_vocab_size)]
            cache[name] = (hf, path, md.load_model(SPEC, str(path)), seqs)
        return cache[name]

    return get


@pytest.mark.parametrize("name", sorted(CASES))
def test_matches_hf(built, name):
    _, _, model, seqs = built(name)
    want = ["last_hidden_state", "logits"] if "ForMaskedLM" in CASES[name][0].__name__ \
        else ["last_hidden_state"]
    assert list(model.output_names) == want
    for ids, types, ref in seqs:
        errs = errors(ours(model, ids, types), ref)
        print(f"deberta_v2 {name} vs HF (n={len(ids)}): {errs}")
        assert set(errs) == set(want)
        assert all(e <= TIGHT for e in errs.values()), errs


def test_params_from_config(built):
    p = built("v3")[2].params
    assert (p["dim"], p["n_heads"], p["head_dim"], p["span"], p["mid"]) == (32, 4, 8, 8, 4)
    assert p["share_att_key"] and p["rel_norm"] and p["use_c2p"] and p["use_p2c"]
    assert p["scale_factor"] == 3 and p["mlm_head"] and p["legacy"]
    assert not p["position_biased_input"] and p["type_vocab"] == 0
    p = built("v2")[2].params
    assert (p["dim"], p["emb_dim"], p["span"], p["conv_kernel_size"], p["conv_groups"]) == \
        (64, 32, 6, 3, 2)
    assert p["conv_act"] == "gelu" and not p["share_att_key"] and not p["rel_norm"]
    p = built("enc")[2].params
    assert (p["span"], p["mid"], p["max_rel_eff"]) == (6, 3, 64) and p["scale_factor"] == 2
    assert not p["mlm_head"] and p["conv_act"] == "tanh" and p["hidden_act"] == "gelu_new"
    p = built("plain")[2].params
    assert not p["relative_attention"] and p["scale_factor"] == 3


def test_weights_bound(built):
    """What each checkpoint binds: tied decoders are left to the embedding table, an
    untied legacy decoder keeps its own bias (cls.predictions.bias unused there)."""
    w = built("v3")[2].weights
    assert "output.weight" not in w and "output.bias" not in w and "output_bias.weight" in w
    assert w["rel_embd.weight"].shape == (16, 32)
    w = built("v2")[2].weights
    assert w["output.weight"].shape == (96, 32) and "output.bias" in w
    assert w["conv.weight"].shape == (64, 32, 1, 3)              # FCRS from torch [F, C/g, K]
    assert w["rel_embd.weight"].shape == (12, 64) and "blk.1.attn_pos_q.weight" in w
    w = built("plain")[2].weights
    assert not any(k.startswith("rel_embd") for k in w)


def test_pos_att_type_as_string(built, tmp_path):
    """Older config.json files (microsoft/deberta-v2-xlarge) give pos_att_type as "p2c|c2p"."""
    _, path, _, seqs = built("v3")
    dst = tmp_path / "string"
    shutil.copytree(path, dst)
    cfg = json.loads((dst / "config.json").read_text())
    cfg["pos_att_type"] = "p2c|c2p"
    (dst / "config.json").write_text(json.dumps(cfg))
    model = md.load_model(SPEC, str(dst))
    assert model.params["use_c2p"] and model.params["use_p2c"]
    for ids, types, ref in seqs:
        assert all(e <= TIGHT for e in errors(ours(model, ids, types), ref).values())


@pytest.mark.parametrize("override", [
    {"pos_att_type": "{['c2p']}"},          # p2c term dropped (and the scale changed)
    {"pos_att_type": "{['p2c']}"},          # c2p term dropped
    {"max_rel": 128},                       # other log buckets for the far distances
])
def test_negative_config_controls(built, override):
    """Negative controls: the same weights under another reading of config.json."""
    _, path, _, seqs = built("v3")
    model = md.load_model(with_hf_config(md.load_spec(SPEC), **override), str(path))
    ids, types, ref = seqs[0]
    errs = errors(ours(model, ids, types), ref)
    print(f"deberta_v2 v3 with {override}: {errs}")
    assert errs["last_hidden_state"] > 100 * TOL and errs["logits"] > 100 * TOL


@pytest.mark.parametrize("name, key", [
    ("v3", "rel_embd.weight"),
    ("v3", "rel_embd_norm.weight"),
    ("v2", "conv.weight"),
    ("v2", "blk.1.attn_pos_q.weight"),
])
def test_perturbed_weight_fails(built, name, key):
    """Negative control: noise of a weight's own scale gives a large error."""
    _, path, _, seqs = built(name)
    td = md.load_weights(str(path), spec=SPEC)
    w = np.asarray(td[key], dtype=np.float32)
    td[key] = (w + np.random.default_rng(5).standard_normal(w.shape) * w.std()).astype(np.float32)
    model = md.load_model(SPEC, td)
    ids, types, ref = seqs[0]
    errs = errors(ours(model, ids, types), ref)
    print(f"deberta_v2 {name} with {key} perturbed: {errs}")
    assert errs["last_hidden_state"] > 10 * TOL


def test_refuses_task_head(built, tmp_path):
    _, path, _, _ = built("enc")
    dst = tmp_path / "cls"
    shutil.copytree(path, dst)
    cfg = json.loads((dst / "config.json").read_text())
    cfg["architectures"] = ["DebertaV2ForSequenceClassification"]
    (dst / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(md.errors.WeightsError, match="DebertaV2ForSequenceClassification is not"):
        md.load_weights(str(dst), spec=SPEC)
