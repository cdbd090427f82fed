"""specs/longformer.yaml against transformers' LongformerForMaskedLM and LongformerModel.

A small seeded float32 Longformer: per-layer windows [4, 8] (2 and 4 tokens either
side) over sequences of 27 tokens (several windows; transformers pads them to 32
internally), a batch of 2 with padding (attention_mask) and a different number of
global tokens per sequence (global_attention_mask), token types 0/1, RoBERTa-style
positions from pad_token_id + 1.
"""

import json

import numpy as np
import pytest

import maxdecl as md

from modelhelp import hf_params, named_outputs, randomize, rel_err, save_hf, spec_path, with_hf_config

pytest.importorskip("torch")
pytest.importorskip("transformers")

TOL = 1e-4          # max|ours - ref| <= TOL * max|ref|
VOCAB = 100
PAD = 1
SEQ = 27
N_REAL = (SEQ, 20)                  # real tokens of each sequence; the rest is padding
GLOBAL = ([0, 13], [0, 6, 18])      # global tokens of each sequence


def make_longformer(seed=0, head="mlm", **kw):
    import torch
    import transformers

    torch.manual_seed(seed)
    cfg = dict(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
               intermediate_size=64, attention_window=[4, 8], max_position_embeddings=66,
               type_vocab_size=2, pad_token_id=PAD, layer_norm_eps=1e-5, hidden_act="gelu")
    cfg.update(kw)
    config = transformers.LongformerConfig(**cfg)
    cls = transformers.LongformerForMaskedLM if head == "mlm" else transformers.LongformerModel
    return randomize(cls(config), seed)


def make_inputs(seed=7, with_global=True):
    """(tokens, attention_mask, global_attention_mask, token_type_ids), int64 [2, SEQ]."""
    rng = np.random.default_rng(seed)
    tokens = rng.integers(3, VOCAB, size=(2, SEQ)).astype(np.int64)
    mask = np.zeros((2, SEQ), np.int64)
    for b, n in enumerate(N_REAL):
        mask[b, :n] = 1
        tokens[b, n:] = PAD
    glob = np.zeros((2, SEQ), np.int64)
    if with_global:
        for b, idx in enumerate(GLOBAL):
            glob[b, idx] = 1
    types = rng.integers(0, 2, size=(2, SEQ)).astype(np.int64)
    return tokens, mask, glob, types


def hf_outputs(model, inputs) -> dict:
    import torch

    tokens, mask, glob, types = (torch.from_numpy(a) for a in inputs)
    with torch.no_grad():
        out = model(input_ids=tokens, attention_mask=mask, global_attention_mask=glob,
                    token_type_ids=types, output_hidden_states=True)
    res = {"last_hidden_state": out.hidden_states[-1].numpy()}
    if getattr(out, "logits", None) is not None:
        res["logits"] = out.logits.numpy()
    if getattr(out, "pooler_output", None) is not None:
        res["pooler_output"] = out.pooler_output.numpy()
    return res


def ours_outputs(model, inputs) -> dict:
    return named_outputs(model, *inputs)


@pytest.fixture(scope="module")
def mlm(tmp_path_factory):
    model = make_longformer()
    path = save_hf(model, tmp_path_factory.mktemp("longformer_mlm"))
    inputs = make_inputs()
    return model, path, inputs, hf_outputs(model, inputs)


@pytest.fixture(scope="module")
def ours(mlm):
    return md.load_model(spec_path("longformer"), mlm[1], variant="tiny")


def assert_match(got: dict, ref: dict, names, tol=TOL, label=""):
    errs = {n: rel_err(got[n], ref[n]) for n in names}
    print(f"longformer {label} vs HF: " + ", ".join(f"{n} {e:.2e}" for n, e in errs.items()))
    assert all(e <= tol for e in errs.values()), errs


def test_longformer_config_from_hf(mlm, ours):
    _, path, _, _ = mlm
    got = hf_params("longformer", path)[2]
    assert (got["dim"], got["n_layers"], got["n_heads"], got["ffn_dim"]) == (32, 2, 4, 64)
    assert (got["vocab"], got["n_positions"], got["n_token_types"], got["pad_id"]) == (100, 66, 2, 1)
    assert got["attention_window"] == [4, 8]
    assert got["norm_eps"] == pytest.approx(1e-5)
    assert got["has_lm_head"] is True and got["has_pooler"] is False
    assert ours.params["windows"] == [4, 8]
    assert ours.output_names[:2] == ["logits", "last_hidden_state"]


def test_longformer_mlm_matches_hf(mlm, ours):
    """Masked-LM logits and last hidden state, padding and global tokens included
    (every position, the padded ones too)."""
    _, _, inputs, ref = mlm
    got = ours_outputs(ours, inputs)
    assert got["logits"].shape == (2, SEQ, VOCAB)
    assert_match(got, ref, ["logits", "last_hidden_state"], label="mlm")


def test_longformer_real_positions_match_hf(mlm, ours):
    """The same on the real (unpadded) tokens only, each sequence on its own."""
    _, _, inputs, ref = mlm
    got = ours_outputs(ours, inputs)
    for b, n in enumerate(N_REAL):
        for name in ("logits", "last_hidden_state"):
            assert rel_err(got[name][b, :n], ref[name][b, :n]) <= TOL


def test_longformer_without_global_tokens_matches_hf(mlm, ours):
    """global_attention_mask all zeros: transformers' purely local path."""
    model, _, _, _ = mlm
    inputs = make_inputs(seed=8, with_global=False)
    ref = hf_outputs(model, inputs)
    assert_match(ours_outputs(ours, inputs), ref, ["logits", "last_hidden_state"], label="local")


def test_longformer_checkpoint_with_saved_decoder_loads(mlm):
    """Older checkpoints also save the tied lm_head.decoder.weight and .bias: they bind
    (the decoder weight instead of the embedding stand-in) and give the same logits."""
    model, path, inputs, ref = mlm
    td = md.load_weights(path)
    td["lm_head.decoder.weight"] = np.asarray(td["longformer.embeddings.word_embeddings.weight"])
    td["lm_head.decoder.bias"] = np.asarray(td["lm_head.bias"])
    ours = md.load_model(spec_path("longformer"), td, variant="tiny")
    assert "output.weight" in ours.weights
    assert_match(ours_outputs(ours, inputs), ref, ["logits", "last_hidden_state"], label="old ckpt")


def test_longformer_global_tokens_matter(mlm):
    """Negative control on the reference: the global tokens change the outputs."""
    model, _, inputs, ref = mlm
    local = hf_outputs(model, make_inputs(with_global=False))
    assert rel_err(local["last_hidden_state"], ref["last_hidden_state"]) > 100 * TOL


def test_longformer_window_matters(mlm):
    """Negative control: with windows wider than the sequence the outputs are far off,
    so the sliding window is exercised."""
    _, path, inputs, ref = mlm
    spec = with_hf_config(md.load_spec(spec_path("longformer")), attention_window="{[64, 64]}")
    wide = md.load_model(spec, path, variant="tiny")
    got = ours_outputs(wide, inputs)
    assert rel_err(got["last_hidden_state"], ref["last_hidden_state"]) > 100 * TOL


def test_longformer_single_int_window(mlm, tmp_path):
    """A config.json whose attention_window is one int (every layer) loads too."""
    model = make_longformer(seed=1, attention_window=[6, 6])
    path = save_hf(model, tmp_path / "int_window")
    cfg_path = path + "/config.json"
    with open(cfg_path) as f:
        cfg = json.load(f)
    cfg["attention_window"] = 6
    with open(cfg_path, "w") as f:
        json.dump(cfg, f)
    inputs = make_inputs(seed=9)
    ref = hf_outputs(model, inputs)
    ours = md.load_model(spec_path("longformer"), path, variant="tiny")
    assert ours.params["windows"] == [6, 6]
    assert_match(ours_outputs(ours, inputs), ref, ["logits", "last_hidden_state"], label="int window")


def test_longformer_base_model_matches_hf(tmp_path):
    """A LongformerModel checkpoint (no longformer. prefix, a pooler, no LM head)."""
    model = make_longformer(seed=2, head="base")
    path = save_hf(model, tmp_path / "base")
    keys = set(md.load_weights(path).keys())
    assert "pooler.dense.weight" in keys and not any(k.startswith("longformer.") for k in keys)
    inputs = make_inputs(seed=10)
    ref = hf_outputs(model, inputs)
    ours = md.load_model(spec_path("longformer"), path, variant="tiny")
    assert ours.output_names == ["last_hidden_state", "pooler_output"]
    assert_match(ours_outputs(ours, inputs), ref, ["last_hidden_state", "pooler_output"],
                 label="base")
