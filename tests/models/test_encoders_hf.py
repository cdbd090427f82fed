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


def test_bert_hidden_states_match_hf(tmp_path):
    torch.manual_seed(0)
    cfg = transformers.BertConfig(vocab_size=90, hidden_size=48, num_hidden_layers=2,
                                  num_attention_heads=4, intermediate_size=96,
                                  max_position_embeddings=40, type_vocab_size=2,
                                  attn_implementation="eager")
    model = randomize(transformers.BertModel(cfg), 0)
    path = save_hf(model, tmp_path / "hf")
    rng = np.random.default_rng(1)
    ids = rng.integers(0, 90, 13)
    types = (np.arange(13) >= 6).astype(np.int64)
    with torch.no_grad():
        ref = model(torch.tensor(ids[None]), token_type_ids=torch.tensor(types[None]))
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
