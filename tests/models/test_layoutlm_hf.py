"""specs/layoutlm.yaml against transformers' LayoutLMForMaskedLM and LayoutLMModel.

A small seeded float32 LayoutLM: dim 32, 2 layers, 4 heads, 3 token types, a 64-row
table for each of the x, y, height and width box embeddings, post-norm BERT blocks,
the pooler and the masked-LM head tied to the word embeddings. A padded batch of two
sequences with per-token boxes (x0 < x1, y0 < y1) and random token types goes through
both, with an all-ones attention mask and with the second sequence padded.
"""

import numpy as np
import pytest

import maxdecl as md

from modelhelp import hf_params, randomize, rel_err, save_hf, spec_path

pytest.importorskip("torch")
pytest.importorskip("transformers")

TOL = 1e-5          # max|ours - ref| <= TOL * max|ref|
CFG = dict(vocab_size=99, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
           intermediate_size=48, max_position_embeddings=40, max_2d_position_embeddings=64,
           type_vocab_size=3, layer_norm_eps=1e-12, hidden_act="gelu")
BATCH, SEQ = 2, 11


def make_layoutlm(seed=0, **kw):
    """LayoutLMForMaskedLM (tied decoder) with randomize's weights."""
    import torch
    import transformers

    torch.manual_seed(seed)
    cfg = {**CFG, "attn_implementation": "eager", **kw}
    return randomize(transformers.LayoutLMForMaskedLM(transformers.LayoutLMConfig(**cfg)), seed)


def make_inputs(seed=3):
    """tokens, bbox, all-ones mask, padded mask, token types: int64 numpy arrays."""
    rng = np.random.default_rng(seed)
    n2d = CFG["max_2d_position_embeddings"]
    tokens = rng.integers(0, CFG["vocab_size"], size=(BATCH, SEQ))
    x0 = rng.integers(0, n2d // 2, size=(BATCH, SEQ))
    y0 = rng.integers(0, n2d // 2, size=(BATCH, SEQ))
    x1 = x0 + rng.integers(0, n2d // 2, size=(BATCH, SEQ))      # width 0..n2d/2 - 1
    y1 = y0 + rng.integers(0, n2d // 2, size=(BATCH, SEQ))
    bbox = np.stack([x0, y0, x1, y1], axis=-1)
    ones = np.ones((BATCH, SEQ), np.int64)
    padded = ones.copy()
    padded[1, 7:] = 0                                            # the second row: 7 tokens
    types = rng.integers(0, CFG["type_vocab_size"], size=(BATCH, SEQ))
    return (tokens.astype(np.int64), bbox.astype(np.int64), ones, padded,
            types.astype(np.int64))


def hf_outputs(model, tokens, bbox, mask, types) -> dict:
    """logits (MLM models only), last_hidden_state and pooler_output of transformers."""
    import torch

    kw = dict(input_ids=torch.from_numpy(tokens), bbox=torch.from_numpy(bbox),
              attention_mask=torch.from_numpy(mask), token_type_ids=torch.from_numpy(types))
    with torch.no_grad():
        if hasattr(model, "layoutlm"):
            base = model.layoutlm(**kw)
            out = {"logits": model(**kw).logits.numpy()}
        else:
            base, out = model(**kw), {}
    out["last_hidden_state"] = base.last_hidden_state.numpy()
    out["pooler_output"] = base.pooler_output.numpy()
    return out


def ours_outputs(model, tokens, bbox, mask, types) -> dict:
    return dict(zip(model.output_names, model(tokens, bbox, mask, types)))


@pytest.fixture(scope="module")
def inputs():
    return make_inputs()


@pytest.fixture(scope="module")
def mlm(tmp_path_factory):
    """(HF LayoutLMForMaskedLM, its save_pretrained folder)."""
    model = make_layoutlm()
    return model, save_hf(model, tmp_path_factory.mktemp("layoutlm_mlm"))


@pytest.fixture(scope="module")
def ours(mlm):
    return md.load_model(spec_path("layoutlm"), mlm[1], variant="tiny")


@pytest.fixture(scope="module")
def encoder(mlm, tmp_path_factory):
    """The same weights saved as a LayoutLMModel (no head, no layoutlm. prefix), and
    maxdecl's model of it."""
    path = save_hf(mlm[0].layoutlm, tmp_path_factory.mktemp("layoutlm_base"))
    return path, md.load_model(spec_path("layoutlm"), path, variant="tiny")


def assert_match(name, got, want, tol=TOL):
    errs = {k: rel_err(got[k], want[k]) for k in want}
    print(f"layoutlm {name} vs HF: " + ", ".join(f"{k} {e:.2e}" for k, e in errs.items()))
    assert all(e <= tol for e in errs.values()), errs


def test_layoutlm_config_from_hf(mlm):
    got = hf_params("layoutlm", mlm[1])[2]
    assert (got["dim"], got["n_layers"], got["n_heads"], got["ffn_dim"]) == (32, 2, 4, 48)
    assert (got["vocab"], got["context"], got["n_2d_pos"], got["n_types"]) == (99, 40, 64, 3)
    assert got["norm_eps"] == pytest.approx(1e-12)
    assert got["hidden_act"] == "gelu"
    assert got["has_mlm"] is True


def test_layoutlm_config_drives_sizes(tmp_path):
    """Sizes come from config.json, not the variant: a model with other sizes loads
    through the tiny variant and matches."""
    import transformers

    model = randomize(transformers.LayoutLMModel(transformers.LayoutLMConfig(
        **{**CFG, "hidden_size": 48, "num_attention_heads": 6, "intermediate_size": 40,
           "max_2d_position_embeddings": 80, "type_vocab_size": 2, "vocab_size": 70,
           "hidden_act": "gelu_new", "layer_norm_eps": 1e-6, "num_hidden_layers": 3},
        attn_implementation="eager")), seed=5)
    path = save_hf(model, tmp_path / "other")
    ours = md.load_model(spec_path("layoutlm"), path, variant="tiny")
    assert (ours.params["dim"], ours.params["head_dim"], ours.params["n_layers"]) == (48, 8, 3)
    tokens, bbox, _, padded, types = make_inputs()
    tokens, types = tokens % 70, types % 2
    assert_match("other sizes", ours_outputs(ours, tokens, bbox, padded, types),
                 hf_outputs(model, tokens, bbox, padded, types))


def test_layoutlm_outputs(ours):
    assert list(ours.input_names) == ["tokens", "bbox", "attention_mask", "token_type_ids"]
    assert list(ours.output_names) == ["logits", "last_hidden_state", "pooler_output"]


def test_layoutlm_mlm_matches_hf_without_padding(mlm, ours, inputs):
    tokens, bbox, ones, _, types = inputs
    want = hf_outputs(mlm[0], tokens, bbox, ones, types)
    got = ours_outputs(ours, tokens, bbox, ones, types)
    assert got["logits"].shape == (BATCH, SEQ, CFG["vocab_size"])
    assert_match("mlm, all-ones mask", got, want)


def test_layoutlm_mlm_matches_hf_with_padding(mlm, ours, inputs):
    tokens, bbox, _, padded, types = inputs
    want = hf_outputs(mlm[0], tokens, bbox, padded, types)
    got = ours_outputs(ours, tokens, bbox, padded, types)
    assert_match("mlm, padded", got, want)


def test_layoutlm_padding_mask_matters(mlm, ours, inputs):
    """Negative control: the mask changes the padded row, and only that row."""
    tokens, bbox, ones, padded, types = inputs
    a = ours_outputs(ours, tokens, bbox, ones, types)["last_hidden_state"]
    b = ours_outputs(ours, tokens, bbox, padded, types)["last_hidden_state"]
    assert np.array_equal(a[0], b[0])
    assert rel_err(b[1], a[1]) > 100 * TOL


def test_layoutlm_bbox_matters(mlm, ours, inputs):
    """Negative control: every box coordinate and the height and width tables count:
    swapping x and y, or zeroing the boxes, moves the outputs far past TOL."""
    tokens, bbox, ones, _, types = inputs
    want = hf_outputs(mlm[0], tokens, bbox, ones, types)
    for other in (np.zeros_like(bbox), bbox[..., [1, 0, 3, 2]], bbox[..., [0, 1, 0, 3]]):
        got = ours_outputs(ours, tokens, other, ones, types)
        assert rel_err(got["last_hidden_state"], want["last_hidden_state"]) > 100 * TOL


def test_layoutlm_bbox_only_through_the_spec_tables(mlm, ours, inputs):
    """HF and ours agree on boxes at the table's edges (0 and max_2d - 1, zero-size
    boxes), as the [CLS] / [SEP] boxes [0, 0, 0, 0] and [1000, 1000, 1000, 1000] are."""
    tokens, bbox, ones, _, types = inputs
    edge = bbox.copy()
    top = CFG["max_2d_position_embeddings"] - 1
    edge[:, 0] = 0
    edge[:, -1] = top
    edge[0, 1] = [0, 0, top, top]
    assert_match("edge boxes", ours_outputs(ours, tokens, edge, ones, types),
                 hf_outputs(mlm[0], tokens, edge, ones, types))


def test_layoutlm_base_model_matches_hf(mlm, encoder, inputs):
    """A LayoutLMModel checkpoint: names without layoutlm., no head, so no logits."""
    path, ours = encoder
    keys = set(md.load_weights(path).keys())
    assert "embeddings.word_embeddings.weight" in keys
    assert not any(k.startswith(("layoutlm.", "cls.")) for k in keys)
    assert ours.params["has_mlm"] is False
    assert list(ours.output_names) == ["last_hidden_state", "pooler_output"]
    tokens, bbox, ones, padded, types = inputs
    for mask in (ones, padded):
        assert_match("LayoutLMModel", ours_outputs(ours, tokens, bbox, mask, types),
                     hf_outputs(mlm[0].layoutlm, tokens, bbox, mask, types))


def test_layoutlm_untied_head_matches_hf(tmp_path, inputs):
    """tie_word_embeddings false: the checkpoint's own decoder matrix is used."""
    model = make_layoutlm(seed=1, tie_word_embeddings=False)
    assert model.cls.predictions.decoder.weight.data_ptr() != \
        model.layoutlm.embeddings.word_embeddings.weight.data_ptr()
    path = save_hf(model, tmp_path / "untied")
    td = md.load_weights(path)
    assert "cls.predictions.decoder.weight" in set(td.keys())
    # an untied head saves both biases, and they differ: the decoder's is the one used
    assert not np.array_equal(np.asarray(td["cls.predictions.bias"]),
                              np.asarray(td["cls.predictions.decoder.bias"]))
    ours = md.load_model(spec_path("layoutlm"), path, variant="tiny")
    tokens, bbox, _, padded, types = inputs
    assert_match("untied head", ours_outputs(ours, tokens, bbox, padded, types),
                 hf_outputs(model, tokens, bbox, padded, types))


def test_layoutlm_box_outside_the_tables_fails(ours, inputs):
    """As transformers raises an IndexError, a coordinate at max_2d or a box with
    x1 < x0 (a negative width) is an error, not a wrapped-around row."""
    tokens, bbox, ones, _, types = inputs
    top = CFG["max_2d_position_embeddings"]
    for box, where in (([10, 10, top, 20], "x_position_embd"), ([10, 10, 5, 20], "w_position_embd")):
        bad = bbox.copy()
        bad[0, 0] = box
        with pytest.raises(md.GraphError, match=f"{where}: embedding: IndexError"):
            ours(tokens, bad, ones, types)
