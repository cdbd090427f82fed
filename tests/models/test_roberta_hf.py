"""specs/roberta.yaml against transformers' RobertaModel / XLMRobertaModel (small random
configs): last_hidden_state and pooler_output, weights and hyperparameters through
``md.load_weights(path, spec=...)``, RobertaForMaskedLM / RobertaForSequenceClassification
checkpoints (``roberta.`` prefix, heads dropped, no pooler) and a GGUF as llama.cpp's
converter writes it (arch bert, position table without its first pad_token_id + 1 rows)."""

import json
import shutil

import numpy as np
import pytest

import maxdecl as md
from archhelp import TOL, load
from modelhelp import (randomize, rel_err, save_hf, spec_path, with_hf_config,
                       without_hf_transforms)

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

PAD = 1                     # RobertaConfig's pad_token_id: positions start at PAD + 1
LENGTHS = (13, 5, 1)        # a few sequences, none padded


def tiny_config(**kw):
    cfg = dict(vocab_size=96, hidden_size=256, num_hidden_layers=2, num_attention_heads=4,
               intermediate_size=512, max_position_embeddings=66, type_vocab_size=2,
               layer_norm_eps=1e-5, pad_token_id=PAD, attn_implementation="eager")
    cfg.update(kw)
    return cfg


def sequences():
    """(ids, token types) pairs; ids avoid PAD (a PAD id would be a padding position)."""
    rng = np.random.default_rng(1)
    out = []
    for n in LENGTHS:
        ids = rng.integers(PAD + 1, 96, n).astype(np.int64)
        types = (np.arange(n) >= n // 2).astype(np.int64)      # two segments
        out.append((ids, types))
    return out


def hf_ref(base, ids, types, position_ids=None):
    """(last_hidden_state [n, dim], pooler_output [1, dim] or None) of a RobertaModel."""
    kw = {} if position_ids is None else {"position_ids": torch.tensor(position_ids[None])}
    with torch.no_grad():
        out = base(torch.tensor(ids[None]), token_type_ids=torch.tensor(types[None]), **kw)
    pooled = out.pooler_output
    return out.last_hidden_state[0].numpy(), None if pooled is None else pooled.numpy()


def run(fn, ids, types, positions=None):
    positions = np.arange(len(ids), dtype=np.int64) if positions is None else positions
    return fn(ids, positions, types)


@pytest.fixture(scope="module")
def roberta(tmp_path_factory):
    """(HF model, its directory, compiled graph, weights)."""
    torch.manual_seed(0)
    cfg = transformers.RobertaConfig(**tiny_config())
    model = randomize(transformers.RobertaModel(cfg), 0)
    path = save_hf(model, tmp_path_factory.mktemp("roberta_hf"))
    g, td = load("roberta", path)
    return model, path, md.compile(g, td), td


def test_roberta_params_from_config(roberta):
    _, _, _, td = roberta
    assert td.params == {"vocab": 96, "dim": 256, "n_layers": 2, "n_heads": 4,
                         "ffn_dim": 512, "type_vocab": 2, "layer_norm_eps": 1e-5,
                         "pad_rows": 2, "context": 64, "hidden_act": "gelu",
                         "is_decoder": False}
    # max_position_embeddings 66 rows, less the first pad_token_id + 1 (never read)
    assert td["position_embd.weight"].shape == (64, 256)
    assert td["pooler.weight"].shape == (256, 256)


def test_roberta_hidden_states_and_pooler_match_hf(roberta):
    model, _, fn, _ = roberta
    for ids, types in sequences():
        ref_h, ref_p = hf_ref(model, ids, types)
        hidden, pooled = run(fn, ids, types)
        err_h, err_p = rel_err(hidden, ref_h), rel_err(pooled, ref_p)
        print(f"roberta vs HF (n={len(ids)}): last_hidden_state {err_h:.2e}, "
              f"pooler_output {err_p:.2e}")
        assert err_h <= TOL and err_p <= TOL


def test_roberta_position_offset_matters(roberta):
    """Negative controls: BERT's positions (0..n-1 into the same table, no offset) give
    other hidden states, in HF and in the spec without its drop_rows transform."""
    model, path, fn, _ = roberta
    ids, types = sequences()[0]
    ref_h, _ = hf_ref(model, ids, types)
    bert_pos = np.arange(len(ids), dtype=np.int64)
    bert_h, _ = hf_ref(model, ids, types, position_ids=bert_pos)
    assert rel_err(bert_h, ref_h) > 100 * TOL
    spec = with_hf_config(without_hf_transforms(md.load_spec(spec_path("roberta"))),
                          context="{max_position_embeddings}")
    td = md.load_weights(path, spec=spec, variant="tiny")
    hidden, _ = run(md.compile(md.build(spec, weights=td), td), ids, types)
    assert rel_err(hidden, bert_h) <= TOL                    # what the offset-free spec is
    assert rel_err(hidden, ref_h) > 100 * TOL
    # ... and feeding positions that already hold the offset counts it twice
    wrong, _ = run(fn, ids, types, positions=bert_pos + PAD + 1)
    assert rel_err(wrong, ref_h) > 100 * TOL


def test_roberta_token_types_matter(roberta):
    model, _, fn, _ = roberta
    ids, types = sequences()[0]
    ref_h, _ = hf_ref(model, ids, types)
    wrong, _ = run(fn, ids, np.zeros_like(types))
    assert rel_err(wrong, ref_h) > 100 * TOL


@pytest.mark.parametrize("head", ["RobertaForMaskedLM", "RobertaForSequenceClassification"])
def test_roberta_task_checkpoint_loads(head, tmp_path):
    """Task models: ``roberta.``-prefixed names, their heads (``lm_head.*``,
    ``classifier.*``) dropped, no pooler (the pooled output is then tanh(0) = 0);
    through ``md.load_model`` this time."""
    torch.manual_seed(0)
    cfg = transformers.RobertaConfig(**tiny_config(layer_norm_eps=1e-12))
    task = randomize(getattr(transformers, head)(cfg), 3)
    path = save_hf(task, tmp_path / "task")
    names = md.load_weights(path).keys()
    assert "roberta.encoder.layer.0.attention.self.query.weight" in names
    assert any(n.startswith(("lm_head.", "classifier.")) for n in names)
    assert not any("pooler" in n for n in names)
    model = md.load_model(spec_path("roberta"), path)
    assert model.params["layer_norm_eps"] == 1e-12 and model.params["pad_rows"] == 2
    assert "pooler.weight" not in model.weights                 # left to its stand-in
    for ids, types in sequences():
        ref_h, _ = hf_ref(task.roberta, ids, types)
        hidden, pooled = model(ids, np.arange(len(ids), dtype=np.int64), types)
        assert rel_err(hidden, ref_h) <= TOL
        assert pooled.shape == (1, 256) and not pooled.any()


def test_xlm_roberta_matches_hf(tmp_path):
    """XLM-RoBERTa is the same network (its own config class and model type)."""
    torch.manual_seed(0)
    cfg = transformers.XLMRobertaConfig(**tiny_config(type_vocab_size=1))
    model = randomize(transformers.XLMRobertaModel(cfg), 5)
    g, td = load("roberta", save_hf(model, tmp_path / "xlmr"))
    assert td.params["type_vocab"] == 1 and td.params["pad_rows"] == 2
    fn = md.compile(g, td)
    for ids, _ in sequences():
        types = np.zeros_like(ids)
        ref_h, ref_p = hf_ref(model, ids, types)
        hidden, pooled = run(fn, ids, types)
        assert rel_err(hidden, ref_h) <= TOL and rel_err(pooled, ref_p) <= TOL


def test_roberta_refuses_other_activation(roberta, tmp_path):
    _, path, _, _ = roberta
    shutil.copytree(path, tmp_path / "act")
    with open(tmp_path / "act" / "config.json") as f:
        cfg = json.load(f)
    cfg["hidden_act"] = "gelu_new"
    with open(tmp_path / "act" / "config.json", "w") as f:
        json.dump(cfg, f)
    with pytest.raises(md.errors.WeightsError, match="hidden_act gelu_new"):
        md.load_weights(tmp_path / "act", spec=spec_path("roberta"))


def roberta_to_gguf(model, path) -> str:
    """A RobertaModel as llama.cpp's converter writes it (arch bert): no ``roberta.``
    prefix, no pooler, the first pad_token_id + 1 rows of the position table cut off
    and context_length reduced by as many."""
    from test_encoders_hf import bert_to_gguf

    return bert_to_gguf(model, path, position_offset=model.config.pad_token_id + 1)


def test_roberta_gguf_hidden_states_match_hf(roberta, tmp_path):
    pytest.importorskip("gguf")
    model, _, _, _ = roberta
    g, td = load("roberta", roberta_to_gguf(model, tmp_path / "roberta.gguf"))
    assert td.params["context"] == 64 and td.params["vocab"] == 96
    assert td.params["type_vocab"] == 2 and "pad_rows" not in td.params
    assert td["position_embd.weight"].shape == (64, 256)
    fn = md.compile(g, td)
    for ids, types in sequences():
        ref_h, _ = hf_ref(model, ids, types)
        hidden, pooled = run(fn, ids, types)
        assert rel_err(hidden, ref_h) <= TOL
        assert not pooled.any()                               # no pooler in llama.cpp's GGUF
