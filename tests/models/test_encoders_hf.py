"""specs/bert.yaml and specs/vit.yaml against transformers' BertModel and ViTModel
(small random configs): last_hidden_state and pooler_output, weights and
hyperparameters through ``md.load_weights(path, spec=...)``."""

import numpy as np
import pytest

import maxdecl as md
from archhelp import TOL, load
from modelhelp import randomize, rel_err, save_hf

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")


def make_bert():
    torch.manual_seed(0)
    cfg = transformers.BertConfig(vocab_size=90, hidden_size=48, num_hidden_layers=2,
                                  num_attention_heads=4, intermediate_size=96,
                                  max_position_embeddings=40, type_vocab_size=2,
                                  attn_implementation="eager")
    model = randomize(transformers.BertModel(cfg), 0)
    rng = np.random.default_rng(1)
    ids = rng.integers(0, 90, 13)
    types = (np.arange(13) >= 6).astype(np.int64)
    with torch.no_grad():
        ref = model(torch.tensor(ids[None]), token_type_ids=torch.tensor(types[None]))
    return model, ids, types, ref


def test_bert_hidden_states_match_hf(tmp_path):
    model, ids, types, ref = make_bert()
    path = save_hf(model, tmp_path / "hf")
    g, td = load("bert", path)
    assert td.params["dim"] == 48 and td.params["context"] == 40
    hidden, pooled = md.compile(g, td)(ids.astype(np.int64), np.arange(13, dtype=np.int64),
                                       types)
    err_h = rel_err(hidden, ref.last_hidden_state[0].numpy())
    err_p = rel_err(pooled, ref.pooler_output.numpy())
    print(f"bert vs HF: last_hidden_state {err_h:.2e}, pooler_output {err_p:.2e}")
    assert err_h <= TOL and err_p <= TOL
    # negative control: the segment embeddings matter
    wrong, _ = md.compile(g, td)(ids.astype(np.int64), np.arange(13, dtype=np.int64),
                                 np.zeros(13, np.int64))
    assert rel_err(wrong, ref.last_hidden_state[0].numpy()) > 100 * TOL


def bert_to_gguf(model, path, position_offset: int = 0) -> str:
    """A BertModel (or RobertaModel) as llama.cpp's converter writes it (arch bert; no
    pooler): the first ``position_offset`` rows of the position table (RoBERTa's
    pad_token_id + 1, which no position reads) cut off, context_length reduced by as
    many."""
    import gguf

    from modelhelp import _add_tokenizer, _write, hf_state

    cfg, sd = model.config, hf_state(model)
    w = gguf.GGUFWriter(str(path), "bert")
    w.add_context_length(cfg.max_position_embeddings - position_offset)
    w.add_embedding_length(cfg.hidden_size)
    w.add_block_count(cfg.num_hidden_layers)
    w.add_feed_forward_length(cfg.intermediate_size)
    w.add_head_count(cfg.num_attention_heads)
    w.add_layer_norm_eps(cfg.layer_norm_eps)
    w.add_causal_attention(False)
    _add_tokenizer(w, cfg.vocab_size)
    w.add_token_type_count(cfg.type_vocab_size)
    e = "embeddings."
    t = {"token_embd.weight": sd[e + "word_embeddings.weight"],
         "position_embd.weight": sd[e + "position_embeddings.weight"][position_offset:],
         "token_types.weight": sd[e + "token_type_embeddings.weight"],
         "token_embd_norm.weight": sd[e + "LayerNorm.weight"],
         "token_embd_norm.bias": sd[e + "LayerNorm.bias"]}
    names = {"attention.self.query": "attn_q", "attention.self.key": "attn_k",
             "attention.self.value": "attn_v", "attention.output.dense": "attn_output",
             "attention.output.LayerNorm": "attn_output_norm", "intermediate.dense": "ffn_up",
             "output.dense": "ffn_down", "output.LayerNorm": "layer_output_norm"}
    for i in range(cfg.num_hidden_layers):
        for src, dst in names.items():
            for kind in ("weight", "bias"):
                t[f"blk.{i}.{dst}.{kind}"] = sd[f"encoder.layer.{i}.{src}.{kind}"]
    _write(w, t)
    return str(path)


def test_bert_gguf_hidden_states_match_hf(tmp_path):
    model, ids, types, ref = make_bert()
    g, td = load("bert", bert_to_gguf(model, tmp_path / "bert.gguf"))
    assert td.params["dim"] == 48 and td.params["vocab"] == 90
    hidden, pooled = md.compile(g, td)(ids.astype(np.int64), np.arange(13, dtype=np.int64),
                                       types)
    assert rel_err(hidden, ref.last_hidden_state[0].numpy()) <= TOL
    assert not pooled.any()                               # no pooler in llama.cpp's GGUF


def test_vit_hidden_states_match_hf(tmp_path):
    torch.manual_seed(0)
    cfg = transformers.ViTConfig(hidden_size=48, num_hidden_layers=2, num_attention_heads=4,
                                 intermediate_size=96, image_size=24, patch_size=6,
                                 num_channels=3, attn_implementation="eager")
    model = randomize(transformers.ViTModel(cfg), 0)
    path = save_hf(model, tmp_path / "hf")
    pixels = np.random.default_rng(2).standard_normal((1, 3, 24, 24)).astype(np.float32)
    with torch.no_grad():
        ref = model(torch.from_numpy(pixels))
    g, td = load("vit", path)
    assert td.params["image"] == 24 and td.params["patch"] == 6
    hidden, pooled = md.compile(g, td)(pixels)
    assert hidden.shape == (17, 48)                       # 4 x 4 patches + [CLS]
    err_h = rel_err(hidden, ref.last_hidden_state[0].numpy())
    err_p = rel_err(pooled, ref.pooler_output.numpy())
    print(f"vit vs HF: last_hidden_state {err_h:.2e}, pooler_output {err_p:.2e}")
    assert err_h <= TOL and err_p <= TOL
