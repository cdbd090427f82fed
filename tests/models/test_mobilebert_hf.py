"""specs/mobilebert.yaml against transformers' MobileBERT (MobileBertForMaskedLM,
MobileBertModel, MobileBertForPreTraining).

Small seeded float32 models (hidden 64, 2 layers, 4 heads, a 32-wide bottleneck, 16-wide
word table, 3 FFNs a block): the trigram input embedding, the key/query-shared
bottleneck, the extra FFN stack, "no_norm" (x * w + b) and LayerNorm normalisation, and
the MLM head whose output matrix joins the tied word table with a dense extension. Each
is compared on a padded batch with and without an attention mask.

The reference is the transformers model run in float64 (a deep copy, ``.double()``):
"no_norm" blocks never renormalise, so the hidden state grows to a few hundred and
float32 rounding reaches ~1e-4 of the output's magnitude in transformers' own float32
forward (measured: 8e-5 of max|logits| for the pretraining case), as large as maxdecl's
error. Against float64, maxdecl's float32 error stays below transformers' float32 one
in every case.
"""

import numpy as np
import pytest

import maxdecl as md

from modelhelp import hf_params, named_outputs, randomize, rel_err, save_hf, spec_path

pytest.importorskip("torch")
pytest.importorskip("transformers")

TOL = 1e-4            # max|ours - ref| <= TOL * max|ref|, ref: transformers in float64
VOCAB = 96
BATCH, SEQ = 2, 11
N_PAD = 4             # padding at the end of the second sequence

BASE = dict(vocab_size=VOCAB, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
            intermediate_size=48, embedding_size=16, intra_bottleneck_size=32,
            num_feedforward_networks=3, trigram_input=True, use_bottleneck=True,
            use_bottleneck_attention=False, key_query_shared_bottleneck=True,
            max_position_embeddings=64, type_vocab_size=2, layer_norm_eps=1e-12,
            hidden_act="relu", attn_implementation="eager")

# name -> (transformers class, config overrides)
CASES = {
    "no_norm": ("MobileBertForMaskedLM", dict(normalization_type="no_norm")),
    # layer_norm_eps 1e-3: transformers gives two of the LayerNorms (embeddings, output)
    # no eps (torch's 1e-5), the others layer_norm_eps; a large one tells them apart
    "layer_norm": ("MobileBertForMaskedLM", dict(normalization_type="layer_norm",
                                                 hidden_act="gelu", num_feedforward_networks=2,
                                                 layer_norm_eps=1e-3)),
    # the other branches of the spec: no bottleneck, no trigram, pooler
    "base_plain": ("MobileBertModel", dict(normalization_type="layer_norm", trigram_input=False,
                                           use_bottleneck=False, num_feedforward_networks=1)),
    # use_bottleneck_attention (q, k and v from the input bottleneck), NSP pooler without tanh
    "pretraining": ("MobileBertForPreTraining", dict(normalization_type="no_norm",
                                                     use_bottleneck_attention=True,
                                                     classifier_activation=False)),
    # an untied head: decoder.weight and decoder.bias saved beside predictions.bias
    "untied": ("MobileBertForMaskedLM", dict(normalization_type="layer_norm",
                                             tie_word_embeddings=False)),
    # no trigram and embedding_size == hidden_size: transformers saves
    # embedding_transformation but never applies it
    "emb_eq_dim": ("MobileBertModel", dict(normalization_type="no_norm", trigram_input=False,
                                           embedding_size=64)),
}


def make_mobilebert(cls: str, seed: int = 0, **kw):
    import torch
    import transformers

    torch.manual_seed(seed)
    cfg = {**BASE, **kw}
    model = getattr(transformers, cls)(transformers.MobileBertConfig(**cfg))
    return randomize(model, seed)


def inputs(seed: int = 7):
    rng = np.random.default_rng(seed)
    tokens = rng.integers(0, VOCAB, size=(BATCH, SEQ)).astype(np.int64)
    types = rng.integers(0, 2, size=(BATCH, SEQ)).astype(np.int64)
    mask = np.ones((BATCH, SEQ), np.int64)
    mask[1, SEQ - N_PAD:] = 0
    return tokens, types, mask


def hf_outputs(model, tokens, types, mask) -> dict:
    """logits / last_hidden_state / pooler_output of a transformers MobileBERT; ``mask``
    None: transformers' own no-mask path."""
    import torch

    kw = dict(input_ids=torch.from_numpy(tokens), token_type_ids=torch.from_numpy(types),
              attention_mask=None if mask is None else torch.from_numpy(mask))
    base = getattr(model, "mobilebert", model)
    out = {}
    with torch.no_grad():
        b = base(**kw)
        out["last_hidden_state"] = b.last_hidden_state.numpy()
        if b.pooler_output is not None:
            out["pooler_output"] = b.pooler_output.numpy()
        if base is not model:
            full = model(**kw)
            logits = full.logits if hasattr(full, "logits") else full.prediction_logits
            out["logits"] = logits.numpy()
    return out


@pytest.fixture(scope="module")
def cases(tmp_path_factory):
    """name -> (HF model, saved folder, loaded maxdecl model), each built once."""
    out = {}
    for k, (name, (cls, kw)) in enumerate(CASES.items()):
        model = make_mobilebert(cls, seed=k, **kw)
        path = save_hf(model, tmp_path_factory.mktemp(f"mobilebert_{name}"))
        ours = md.load_model(spec_path("mobilebert"), path, variant="tiny")
        out[name] = (model, path, ours)
    return out


@pytest.fixture(scope="module")
def refs(cases):
    """name -> {"mask": HF outputs with padding, "nomask": HF outputs without a mask},
    transformers run in float64."""
    import copy

    tokens, types, mask = inputs()
    out = {}
    for name, (m, _, _) in cases.items():
        m64 = copy.deepcopy(m).double()
        out[name] = {"mask": hf_outputs(m64, tokens, types, mask),
                     "nomask": hf_outputs(m64, tokens, types, None)}
    return out


def check(cases, refs, name, masked: bool, want: tuple) -> None:
    tokens, types, mask = inputs()
    ours = cases[name][2]
    feed = mask if masked else np.ones_like(mask)
    got = named_outputs(ours, tokens, feed, types)
    ref = refs[name]["mask" if masked else "nomask"]
    assert set(want) <= set(ref) and set(want) <= set(got), (sorted(got), sorted(ref))
    errs = {k: rel_err(got[k], ref[k]) for k in want}
    print(f"mobilebert {name} {'masked' if masked else 'unmasked'}: "
          + ", ".join(f"{k} {e:.2e}" for k, e in errs.items()))
    assert all(e <= TOL for e in errs.values()), errs


def test_mobilebert_config_from_hf(cases):
    got = hf_params("mobilebert", cases["no_norm"][1])[2]
    assert (got["dim"], got["n_layers"], got["n_heads"], got["ffn_dim"]) == (64, 2, 4, 48)
    assert (got["vocab"], got["context"], got["emb"], got["bottleneck_dim"]) == (VOCAB, 64, 16, 32)
    assert (got["n_ffn"], got["trigram"], got["use_bottleneck"], got["norm_type"]) == \
        (3, True, True, "no_norm")
    assert cases["no_norm"][2].output_names == ["logits", "last_hidden_state"]
    assert cases["base_plain"][2].output_names == ["last_hidden_state", "pooler_output"]
    assert cases["pretraining"][2].output_names == ["logits", "last_hidden_state",
                                                    "pooler_output"]
    ln = cases["layer_norm"][2].params
    assert ln["norm_type"] == "layer_norm" and ln["hidden_act"] == "gelu" and ln["n_ffn"] == 2


@pytest.mark.parametrize("masked", [False, True], ids=["nomask", "mask"])
@pytest.mark.parametrize("name", ["no_norm", "layer_norm"])
def test_mobilebert_masked_lm_matches_hf(cases, refs, name, masked):
    check(cases, refs, name, masked, ("logits", "last_hidden_state"))


@pytest.mark.parametrize("masked", [False, True], ids=["nomask", "mask"])
def test_mobilebert_base_model_without_bottleneck_matches_hf(cases, refs, masked):
    check(cases, refs, "base_plain", masked, ("last_hidden_state", "pooler_output"))


@pytest.mark.parametrize("masked", [False, True], ids=["nomask", "mask"])
def test_mobilebert_pretraining_bottleneck_attention_matches_hf(cases, refs, masked):
    check(cases, refs, "pretraining", masked, ("logits", "last_hidden_state", "pooler_output"))


@pytest.mark.parametrize("name", ["untied", "emb_eq_dim"])
def test_mobilebert_other_checkpoints_match_hf(cases, refs, name):
    want = {"untied": ("logits", "last_hidden_state"),
            "emb_eq_dim": ("last_hidden_state", "pooler_output")}[name]
    check(cases, refs, name, True, want)


def test_mobilebert_mask_matters(refs):
    """Negative control: padding changes the unpadded rows of the padded sequence, so the
    masked comparisons do test the mask."""
    a = refs["no_norm"]["mask"]["last_hidden_state"][1, :SEQ - N_PAD]
    b = refs["no_norm"]["nomask"]["last_hidden_state"][1, :SEQ - N_PAD]
    assert rel_err(a, b) > 100 * TOL


def test_mobilebert_refuses_unmodelled_heads(cases, tmp_path):
    """A classifier checkpoint (its head is not in the spec) is refused with a message."""
    import json
    import shutil

    src = cases["base_plain"][1]
    dst = tmp_path / "cls"
    shutil.copytree(src, dst)
    cfg = json.loads((dst / "config.json").read_text())
    cfg["architectures"] = ["MobileBertForSequenceClassification"]
    (dst / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(md.WeightsError, match="only MobileBertModel"):
        md.load_model(spec_path("mobilebert"), str(dst), variant="tiny")


def test_mobilebert_layer_norm_eps_matters(cases, refs, tmp_path):
    """Negative control: with every LayerNorm at layer_norm_eps (transformers gives the
    embeddings' and each block's output LayerNorm torch's default 1e-5), the layer_norm
    case (layer_norm_eps 1e-3) is off by more than the tolerance."""
    text = open(spec_path("mobilebert")).read()
    assert text.count("with: {eps: 1.0e-5}") == 2
    wrong = tmp_path / "mobilebert_eps.yaml"
    wrong.write_text(text.replace("with: {eps: 1.0e-5}", 'with: {eps: "{norm_eps}"}'))
    ours = md.load_model(str(wrong), cases["layer_norm"][1], variant="tiny")
    tokens, types, mask = inputs()
    got = named_outputs(ours, tokens, mask, types)
    assert rel_err(got["logits"], refs["layer_norm"]["mask"]["logits"]) > 2 * TOL
