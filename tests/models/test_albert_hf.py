"""specs/albert.yaml against transformers' AlbertForMaskedLM and AlbertModel.

Small seeded float32 ALBERTs: a factorized embedding (embedding_size 16, projected to
hidden_size 32), cross-layer sharing with num_hidden_groups 2 over 3 layers (layer i
runs group int(i / 1.5): 0, 0, 1) and inner_group_num 2 (two AlbertLayers per group),
post-norm blocks, gelu_new, token types, and a padded batch through attention_mask.
The masked-LM decoder is tied to the word embeddings (transformers 5 saves neither the
decoder weight nor its bias, only ``predictions.bias``); an untied case saves both.
"""

import numpy as np
import pytest

import maxdecl as md

from modelhelp import named_outputs, randomize, rel_err, save_hf, spec_path

pytest.importorskip("torch")
pytest.importorskip("transformers")

TOL = 1e-4          # max|ours - ref| <= TOL * max|ref|
BATCH, SEQ = 3, 11
VOCAB = 96
TINY = dict(vocab_size=VOCAB, embedding_size=16, hidden_size=32, num_hidden_layers=3,
            num_hidden_groups=2, inner_group_num=2, num_attention_heads=4,
            intermediate_size=64, max_position_embeddings=40, type_vocab_size=2,
            layer_norm_eps=1e-12, hidden_act="gelu_new", attn_implementation="eager")


def make_albert(cls_name="AlbertForMaskedLM", seed=0, **kw):
    import torch
    import transformers

    torch.manual_seed(seed)
    cfg = dict(TINY)
    cfg.update(kw)
    cls = getattr(transformers, cls_name)
    return randomize(cls(transformers.AlbertConfig(**cfg)), seed)


def batch_inputs(seed=11, padded=True):
    """(ids, token types, attention mask), each int64 [BATCH, SEQ]: random ids, a
    second segment of type 1 from position 5 on, and (padded) rows 1 and 2 cut to 7
    and 4 real tokens (padding id 0, mask 0)."""
    rng = np.random.default_rng(seed)
    ids = rng.integers(1, VOCAB, size=(BATCH, SEQ)).astype(np.int64)
    types = np.zeros((BATCH, SEQ), np.int64)
    types[:, 5:] = 1
    mask = np.ones((BATCH, SEQ), np.int64)
    if padded:
        for row, n in ((1, 7), (2, 4)):
            mask[row, n:] = 0
            ids[row, n:] = 0
            types[row, n:] = 0
    return ids, types, mask


def hf_outputs(model, ids, types, mask) -> dict:
    """transformers' last hidden state, and the MLM logits or pooler output the model has."""
    import torch

    t = {"input_ids": torch.from_numpy(ids), "token_type_ids": torch.from_numpy(types),
         "attention_mask": torch.from_numpy(mask)}
    out = {}
    with torch.no_grad():
        if hasattr(model, "predictions"):
            base = model.albert(**t)
            out["logits"] = model(**t).logits.numpy()
        else:
            base = model(**t)
            out["pooler_output"] = base.pooler_output.numpy()
        out["last_hidden_state"] = base.last_hidden_state.numpy()
    return out


def check(name, ours, ref, keys, mask=None):
    """Each output within TOL of max|ref| (over every position, padding included)."""
    errs = {k: rel_err(ours[k], ref[k]) for k in keys}
    print(f"albert {name}: " + ", ".join(f"{k} {e:.2e}" for k, e in errs.items()))
    assert all(e <= TOL for e in errs.values()), errs
    if mask is not None:    # the real tokens alone, too (what a user reads)
        m = mask.astype(bool)
        for k in keys:
            if ours[k].ndim == 3:
                assert rel_err(ours[k][m], ref[k][m]) <= TOL, k
    return errs


CASES = {
    "shared": ("AlbertForMaskedLM", {}),                               # 3 layers, 2 groups x 2
    "untied": ("AlbertForMaskedLM", dict(tie_word_embeddings=False, num_hidden_layers=4,
                                         num_hidden_groups=4, inner_group_num=1,
                                         hidden_act="gelu")),
    "base": ("AlbertModel", dict(num_hidden_layers=5, num_hidden_groups=1, inner_group_num=3)),
}


@pytest.fixture(scope="module")
def albert(tmp_path_factory):
    """name -> (HF model, save_pretrained folder, maxdecl model), built once."""
    out = {}
    for k, (name, (cls, kw)) in enumerate(CASES.items()):
        model = make_albert(cls, seed=k, **kw)
        path = save_hf(model, tmp_path_factory.mktemp(f"albert_{name}"))
        out[name] = (model, path, md.load_model(spec_path("albert"), path, variant="tiny"))
    return out


def test_albert_config_from_hf(albert):
    model, _, ours = albert["shared"]
    p = ours.params
    got = {k: p[k] for k in ("vocab", "emb_dim", "dim", "n_layers", "n_groups",
                             "inner_layers", "n_heads", "ffn_dim", "context", "n_types",
                             "mlm_head")}
    assert got == dict(vocab=VOCAB, emb_dim=16, dim=32, n_layers=3, n_groups=2,
                       inner_layers=2, n_heads=4, ffn_dim=64, context=40, n_types=2,
                       mlm_head=1)
    assert p["norm_eps"] == pytest.approx(1e-12) and p["hidden_act"] == "gelu_new"
    assert albert["untied"][2].params["hidden_act"] == "gelu"
    assert albert["base"][2].params["mlm_head"] == 0
    assert albert["base"][2].params["inner_layers"] == 3


def test_albert_outputs_names(albert):
    assert list(albert["shared"][2].output_names) == ["logits", "last_hidden_state",
                                                       "pooler_output"]
    assert list(albert["base"][2].output_names) == ["last_hidden_state", "pooler_output"]
    assert list(albert["shared"][2].input_names) == ["tokens", "token_type_ids",
                                                      "attention_mask"]


def test_albert_shares_weights(albert):
    """Only n_groups * inner_group_num layers of weights are bound, as HF stores them."""
    ours = albert["shared"][2]
    layers = {n.split(".attn_q")[0] for n in ours.weights.keys() if ".attn_q.weight" in n}
    assert layers == {"grp.0.lyr.0", "grp.0.lyr.1", "grp.1.lyr.0", "grp.1.lyr.1"}
    assert "output.weight" not in ours.weights.keys()      # tied: token_embd stands in
    assert "output.weight" in albert["untied"][2].weights.keys()


@pytest.mark.parametrize("padded", [False, True], ids=["full", "padded"])
@pytest.mark.parametrize("case", ["shared", "untied"])
def test_albert_mlm_matches_hf(albert, case, padded):
    model, _, ours = albert[case]
    ids, types, mask = batch_inputs(padded=padded)
    ref = hf_outputs(model, ids, types, mask)
    got = named_outputs(ours, ids, types, mask)
    assert got["logits"].shape == (BATCH, SEQ, VOCAB)
    check(f"{case} {'padded' if padded else 'full'}", got, ref,
          ["logits", "last_hidden_state"], mask)


@pytest.mark.parametrize("padded", [False, True], ids=["full", "padded"])
def test_albert_model_with_pooler_matches_hf(albert, padded):
    model, _, ours = albert["base"]
    ids, types, mask = batch_inputs(seed=12, padded=padded)
    ref = hf_outputs(model, ids, types, mask)
    got = named_outputs(ours, ids, types, mask)
    check(f"base {'padded' if padded else 'full'}", got, ref,
          ["last_hidden_state", "pooler_output"], mask)


def test_albert_single_sequence_matches_batch(albert):
    """A padded row gives what its real tokens alone give (the mask hides the padding)."""
    model, _, ours = albert["shared"]
    ids, types, mask = batch_inputs(padded=True)
    got = named_outputs(ours, ids, types, mask)
    alone = named_outputs(ours, ids[2:3, :4], types[2:3, :4], mask[2:3, :4])
    assert rel_err(alone["logits"][0], got["logits"][2, :4]) <= TOL


def test_albert_padding_mask_matters(albert):
    """Negative control: ignoring the mask (all ones) moves the padded rows far off."""
    model, _, ours = albert["shared"]
    ids, types, mask = batch_inputs(padded=True)
    ref = hf_outputs(model, ids, types, mask)
    got = named_outputs(ours, ids, types, np.ones_like(mask))
    m = mask.astype(bool)
    assert rel_err(got["logits"][m], ref["logits"][m]) > 100 * TOL


def test_albert_group_schedule_matters(albert):
    """Negative control: with one group only (layer i -> group 0 always) the shared
    case is far off, so the int(i / (n_layers / n_groups)) schedule is what matches."""
    model, path, _ = albert["shared"]
    td = md.load_weights(path)
    td.metadata["num_hidden_groups"] = 1
    for n in list(td.keys()):
        if ".albert_layer_groups.1." in n:
            del td[n]
    ours = md.load_model(spec_path("albert"), td, variant="tiny")
    ids, types, mask = batch_inputs(padded=False)
    ref = hf_outputs(model, ids, types, mask)
    got = named_outputs(ours, ids, types, mask)
    assert rel_err(got["last_hidden_state"], ref["last_hidden_state"]) > 100 * TOL


def test_albert_for_pretraining_matches_hf(tmp_path):
    """AlbertForPreTraining: MLM head and pooler both present (its sentence-order head
    is dropped by the mapping); prediction logits, hidden state and pooler output."""
    import torch

    model = make_albert("AlbertForPreTraining", seed=5)
    ours = md.load_model(spec_path("albert"), save_hf(model, tmp_path / "pt"), variant="tiny")
    ids, types, mask = batch_inputs(seed=13, padded=True)
    t = {"input_ids": torch.from_numpy(ids), "token_type_ids": torch.from_numpy(types),
         "attention_mask": torch.from_numpy(mask)}
    with torch.no_grad():
        base = model.albert(**t)
        ref = {"logits": model(**t).prediction_logits.numpy(),
               "last_hidden_state": base.last_hidden_state.numpy(),
               "pooler_output": base.pooler_output.numpy()}
    check("pretraining padded", named_outputs(ours, ids, types, mask), ref,
          ["logits", "last_hidden_state", "pooler_output"], mask)


def test_albert_tiny_runs_on_random_weights():
    """The spec's own tiny variant builds and runs without a checkpoint."""
    ours = md.load_model(spec_path("albert"), md.random_weights(spec_path("albert")),
                         variant="tiny")
    ids, types, mask = batch_inputs(padded=True)
    got = named_outputs(ours, ids, types, mask)
    assert got["logits"].shape == (BATCH, SEQ, 256)
    assert np.isfinite(got["logits"]).all()


def test_albert_hub_style_checkpoint_matches_hf(albert):
    """Released checkpoints (albert-base-v2) also hold the tied decoder weight and bias,
    a pooler beside the MLM head and the position_ids buffer: all load, same logits."""
    model, path, _ = albert["shared"]
    td = md.load_weights(path)
    td["albert.embeddings.position_ids"] = np.arange(40, dtype=np.int64)[None]
    td["predictions.decoder.weight"] = np.asarray(td["albert.embeddings.word_embeddings.weight"])
    td["predictions.decoder.bias"] = np.asarray(td["predictions.bias"])
    rng = np.random.default_rng(0)
    td["albert.pooler.weight"] = (rng.normal(size=(32, 32)) / 32 ** 0.5).astype(np.float32)
    td["albert.pooler.bias"] = np.zeros(32, np.float32)
    ours = md.load_model(spec_path("albert"), td, variant="tiny")
    assert "output.weight" in ours.weights.keys() and "pooler.weight" in ours.weights.keys()
    ids, types, mask = batch_inputs(padded=True)
    check("hub-style", named_outputs(ours, ids, types, mask), hf_outputs(model, ids, types, mask),
          ["logits", "last_hidden_state"], mask)
