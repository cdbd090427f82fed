"""specs/squeezebert.yaml against transformers' SqueezeBertForMaskedLM and SqueezeBertModel.

Small seeded float32 models: dim 64, 2 layers, 4 heads, FFN 128, with every grouped
projection above one group and the groups differing (q 2, k 4, v 2, post-attention 2,
intermediate 4, output 2), so a filter read with the wrong group count or layout
either fails to bind or gives wrong numbers. HF keeps the hidden state channels-first
([batch, dim, seq]) and runs each projection as a kernel-1 grouped Conv1d; the spec
keeps it channels-last and runs them as height-1 grouped conv2d. Inputs are a batch
of two sequences with random token types, once with an all-ones attention mask and
once with the second row padded.
"""

import numpy as np
import pytest

import maxdecl as md

from modelhelp import hf_params, named_outputs, randomize, save_hf, spec_path

pytest.importorskip("torch")
pytest.importorskip("transformers")

TOL = 1e-5          # max|ours - ref| <= TOL * max|ref|
VOCAB = 128
BATCH, SEQ = 2, 11
GROUPS = dict(q_groups=2, k_groups=4, v_groups=2, post_attention_groups=2,
              intermediate_groups=4, output_groups=2)


def make_squeezebert(seed=0, cls="SqueezeBertForMaskedLM", **kw):
    import torch
    import transformers

    torch.manual_seed(seed)
    cfg = dict(vocab_size=VOCAB, hidden_size=64, embedding_size=64, num_hidden_layers=2,
               num_attention_heads=4, intermediate_size=128, max_position_embeddings=64,
               type_vocab_size=2, hidden_act="gelu", layer_norm_eps=1e-12,
               attn_implementation="eager", **GROUPS)
    cfg.update(kw)
    model = getattr(transformers, cls)(transformers.SqueezeBertConfig(**cfg))
    return randomize(model, seed)


def inputs(seed=7, padded=False):
    rng = np.random.default_rng(seed)
    ids = rng.integers(1, VOCAB, size=(BATCH, SEQ)).astype(np.int64)
    types = rng.integers(0, 2, size=(BATCH, SEQ)).astype(np.int64)
    mask = np.ones((BATCH, SEQ), np.int64)
    if padded:
        mask[1, SEQ - 4:] = 0
        ids[1, SEQ - 4:] = 0                   # pad_token_id
        types[1, SEQ - 4:] = 0
    return ids, mask, types


def hf_outputs(model, ids, mask, types) -> dict:
    import torch

    t = {"input_ids": torch.tensor(ids), "attention_mask": torch.tensor(mask),
         "token_type_ids": torch.tensor(types)}
    with torch.no_grad():
        if hasattr(model, "cls"):             # the MLM model: its base model's outputs too
            base = model.transformer(**t)
            logits = model(**t).logits
            return {"logits": logits.numpy(), "last_hidden_state": base.last_hidden_state.numpy(),
                    "pooler_output": base.pooler_output.numpy()}
        out = model(**t)
    return {"last_hidden_state": out.last_hidden_state.numpy(),
            "pooler_output": out.pooler_output.numpy()}


def errors(ours, ref) -> dict:
    """{output: max|ours - ref| / max|ref|} over the reference's outputs."""
    assert set(ours) == set(ref), (sorted(ours), sorted(ref))
    out = {}
    for k, r in ref.items():
        o = np.asarray(ours[k], np.float64)
        assert o.shape == r.shape, (k, o.shape, r.shape)
        out[k] = float(np.abs(o - r).max() / np.abs(r).max())
    return out


def case(make_kw, folder):
    model = make_squeezebert(**make_kw)
    path = save_hf(model, folder)
    refs = {p: hf_outputs(model, *inputs(padded=p)) for p in (False, True)}
    ours = md.load_model(spec_path("squeezebert"), path, variant="tiny")
    return model, path, ours, refs


@pytest.fixture(scope="module")
def mlm(tmp_path_factory):
    return case({}, tmp_path_factory.mktemp("squeezebert_mlm"))


@pytest.fixture(scope="module")
def mlm_untied(tmp_path_factory):
    """An untied head (decoder.weight saved, decoder.bias != predictions.bias) and a
    layer_norm_eps far from 1e-12: transformers applies it to the embedding and head
    LayerNorms only, the in-layer ones keep their fixed 1e-12."""
    return case(dict(seed=1, tie_word_embeddings=False, layer_norm_eps=0.1),
                tmp_path_factory.mktemp("squeezebert_untied"))


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    return case(dict(seed=2, cls="SqueezeBertModel"), tmp_path_factory.mktemp("squeezebert_base"))


def run(ours, padded):
    return named_outputs(ours, *inputs(padded=padded))


def test_squeezebert_config_from_hf(mlm):
    got = hf_params("squeezebert", mlm[1])[2]
    assert (got["dim"], got["n_layers"], got["n_heads"], got["ffn_dim"], got["vocab"]) == (
        64, 2, 4, 128, VOCAB)
    assert (got["context"], got["n_types"], got["hidden_act"]) == (64, 2, "gelu")
    assert {k: got[k] for k in GROUPS} == GROUPS
    assert got["has_mlm"] is True
    assert got["norm_eps"] == pytest.approx(1e-12)


def test_squeezebert_output_names(mlm, base):
    assert mlm[2].output_names == ["logits", "last_hidden_state", "pooler_output"]
    assert base[2].output_names == ["last_hidden_state", "pooler_output"]
    assert mlm[2].input_names == ["tokens", "attention_mask", "token_type_ids"]


@pytest.mark.parametrize("padded", [False, True], ids=["no_mask", "padded"])
def test_squeezebert_mlm_matches_hf(mlm, padded):
    _, _, ours, refs = mlm
    err = errors(run(ours, padded), refs[padded])
    print(f"squeezebert mlm ({'padded' if padded else 'no mask'}) vs HF:",
          {k: f"{v:.2e}" for k, v in err.items()})
    assert all(v <= TOL for v in err.values()), err


@pytest.mark.parametrize("padded", [False, True], ids=["no_mask", "padded"])
def test_squeezebert_untied_head_matches_hf(mlm_untied, padded):
    _, path, ours, refs = mlm_untied
    assert "output.weight" in ours.weights           # the head's own matrix, not the table
    err = errors(run(ours, padded), refs[padded])
    print(f"squeezebert untied ({'padded' if padded else 'no mask'}) vs HF:",
          {k: f"{v:.2e}" for k, v in err.items()})
    assert all(v <= TOL for v in err.values()), err


@pytest.mark.parametrize("padded", [False, True], ids=["no_mask", "padded"])
def test_squeezebert_base_model_matches_hf(base, padded):
    """A SqueezeBertModel checkpoint (no transformer. prefix, no head): no logits."""
    _, path, ours, refs = base
    keys = set(md.load_weights(path).keys())
    assert "embeddings.word_embeddings.weight" in keys
    assert not any(k.startswith(("transformer.", "cls.")) for k in keys)
    err = errors(run(ours, padded), refs[padded])
    print(f"squeezebert base ({'padded' if padded else 'no mask'}) vs HF:",
          {k: f"{v:.2e}" for k, v in err.items()})
    assert all(v <= TOL for v in err.values()), err


def test_squeezebert_padding_mask_matters(mlm):
    """Negative control: the padded row's real tokens differ from the same tokens seen
    with the padding unmasked, and equal the row cut to its real length."""
    import torch

    model, _, ours, refs = mlm
    ids, mask, types = inputs(padded=True)
    got = run(ours, padded=True)["last_hidden_state"]
    unmasked = named_outputs(ours, ids, np.ones_like(mask), types)["last_hidden_state"]
    n = int(mask[1].sum())
    assert np.abs(got[1, :n] - unmasked[1, :n]).max() > 100 * TOL * np.abs(got).max()
    with torch.no_grad():
        short = model.transformer(input_ids=torch.tensor(ids[1:, :n]),
                                  token_type_ids=torch.tensor(types[1:, :n])).last_hidden_state
    assert np.abs(got[1, :n] - short[0].numpy()).max() <= TOL * np.abs(got).max()


def test_squeezebert_untied_bias_is_decoder_bias(mlm_untied):
    """The untied head saves both cls.predictions.bias and decoder.bias, and the
    forward adds decoder.bias: the spec binds that one (the other is its fallback)."""
    model, path, ours, _ = mlm_untied
    want = model.cls.predictions.decoder.bias.detach().numpy()
    other = model.cls.predictions.bias.detach().numpy()
    assert not np.allclose(want, other)
    np.testing.assert_array_equal(np.asarray(ours.weights["output.bias"]), want)


def test_squeezebert_group_counts_matter(mlm):
    """Negative control: the same filters read with one group for q fail to bind
    (their shape is [dim, dim / q_groups, 1, 1])."""
    from modelhelp import with_hf_config

    spec = with_hf_config(md.load_spec(spec_path("squeezebert")), q_groups="{1}")
    with pytest.raises(Exception, match="attn_q"):
        md.load_model(spec, mlm[1], variant="tiny")


def test_squeezebert_refuses_embedding_size_mismatch(mlm):
    td = md.load_weights(mlm[1])
    td.metadata["embedding_size"] = 32
    with pytest.raises(md.WeightsError, match="embedding_size"):
        md.load_model(spec_path("squeezebert"), td, variant="tiny")


def test_squeezebert_in_layer_norm_eps_is_fixed(mlm_untied):
    """Negative control: reading config's layer_norm_eps (0.1 here) for the in-layer
    LayerNorms too, as BERT would, moves the outputs well past the tolerance."""
    from modelhelp import with_hf_config

    _, path, _, refs = mlm_untied
    spec = with_hf_config(md.load_spec(spec_path("squeezebert")), conv_eps="{layer_norm_eps}")
    wrong = md.load_model(spec, path, variant="tiny")
    assert wrong.params["conv_eps"] == pytest.approx(0.1)
    err = errors(run(wrong, False), refs[False])
    assert err["last_hidden_state"] > 10 * TOL, err
