"""specs/roformer.yaml against transformers' RoFormerForMaskedLM and RoFormerModel.

Small seeded float32 models: hidden 64, 4 heads (head_dim 16), 2 layers, embedding_size
32 != hidden_size (so the embeddings_project and a masked-LM head of width 32), GELU,
the sinusoidal rotary table of 64 positions that the checkpoint stores. A padded batch of
two sequences (the second with three padding tokens) with random token types, with and
without the attention mask, for rotary_value False and True; a headless RoFormerModel
with embedding_size == hidden_size (no projection) and an untied output matrix.
"""

import numpy as np
import pytest

import maxdecl as md

from modelhelp import named_outputs, randomize, rel_err, save_hf, spec_path, with_hf_config

pytest.importorskip("torch")
pytest.importorskip("transformers")

TOL = 1e-5          # max|ours - ref| <= TOL * max|ref|
VOCAB = 96
BATCH, SEQ, PAD = 2, 11, 3

CASES = {
    "mlm": dict(rotary_value=False),
    "mlm_rotary_value": dict(rotary_value=True),
    "mlm_untied": dict(rotary_value=True, tie_word_embeddings=False),
    "base": dict(rotary_value=False, embedding_size=64, head=False),
}


def make_roformer(seed=0, head=True, **kw):
    """RoFormerForMaskedLM (or RoFormerModel without ``head``), randomized, with the
    sinusoidal table put back (randomize draws every parameter, the frozen table too)."""
    import torch
    import transformers

    torch.manual_seed(seed)
    cfg = dict(vocab_size=VOCAB, embedding_size=32, hidden_size=64, num_hidden_layers=2,
               num_attention_heads=4, intermediate_size=128, max_position_embeddings=64,
               type_vocab_size=2, hidden_act="gelu", layer_norm_eps=1e-12,
               attn_implementation="eager")
    cfg.update(kw)
    config = transformers.RoFormerConfig(**cfg)
    cls = transformers.RoFormerForMaskedLM if head else transformers.RoFormerModel
    model = randomize(cls(config), seed)
    base = model.roformer if head else model
    pos = base.encoder.embed_positions
    with torch.no_grad():
        pos.weight.copy_(pos.create_weight())
    return model


def batch_inputs(seed=7):
    rng = np.random.default_rng(seed)
    tokens = rng.integers(1, VOCAB, size=(BATCH, SEQ)).astype(np.int64)
    types = rng.integers(0, 2, size=(BATCH, SEQ)).astype(np.int64)
    mask = np.ones((BATCH, SEQ), np.int64)
    mask[1, SEQ - PAD:] = 0
    tokens[1, SEQ - PAD:] = 0                 # pad_token_id
    types[1, SEQ - PAD:] = 0
    return tokens, types, mask


def hf_outputs(model, tokens, types, mask) -> dict:
    """{"logits" (masked-LM heads only), "last_hidden_state"} of transformers."""
    import torch

    args = dict(input_ids=torch.tensor(tokens), token_type_ids=torch.tensor(types),
                attention_mask=None if mask is None else torch.tensor(mask))
    with torch.no_grad():
        out = model(**args, output_hidden_states=True)
    got = {"last_hidden_state": out.hidden_states[-1].float().numpy()}
    if hasattr(out, "logits"):
        got["logits"] = out.logits.float().numpy()
    return got


@pytest.fixture(scope="module")
def cases(tmp_path_factory):
    """name -> (HF model, its save_pretrained folder, maxdecl model, refs by mask)."""
    tokens, types, mask = batch_inputs()
    out = {}
    for k, (name, kw) in enumerate(CASES.items()):
        model = make_roformer(seed=k, **kw)
        path = save_hf(model, tmp_path_factory.mktemp(f"roformer_{name}"))
        ours = md.load_model(spec_path("roformer"), path, variant="tiny")
        refs = {"padded": hf_outputs(model, tokens, types, mask),
                "unmasked": hf_outputs(model, tokens, types, None)}
        out[name] = (model, path, ours, refs)
    return out


def ours_outputs(ours, tokens, types, mask) -> dict:
    assert list(ours.input_names) == ["tokens", "token_types", "attention_mask"]
    return named_outputs(ours, tokens, types, mask)


def errors(ours, refs, masked: bool) -> dict:
    tokens, types, mask = batch_inputs()
    feed = mask if masked else np.ones_like(mask)
    got = ours_outputs(ours, tokens, types, feed)
    ref = refs["padded" if masked else "unmasked"]
    assert set(got) == set(ref), (sorted(got), sorted(ref))
    return {k: rel_err(got[k], ref[k]) for k in ref}


@pytest.mark.parametrize("name", list(CASES))
@pytest.mark.parametrize("masked", [False, True], ids=["no_mask", "padded"])
def test_roformer_matches_hf(cases, name, masked):
    _, _, ours, refs = cases[name]
    errs = errors(ours, refs, masked)
    print(f"roformer {name} {'padded' if masked else 'no mask'}: "
          + ", ".join(f"{k} {v:.2e}" for k, v in errs.items()))
    assert all(e <= TOL for e in errs.values()), errs


def test_roformer_whole_position_table(cases):
    """One sequence as long as the table (64 positions): every row of the stored
    sinusoidal table is read, at the positions transformers reads it."""
    model, _, ours, _ = cases["mlm_rotary_value"]
    rng = np.random.default_rng(11)
    tokens = rng.integers(1, VOCAB, size=(1, 64)).astype(np.int64)
    types = rng.integers(0, 2, size=(1, 64)).astype(np.int64)
    mask = np.ones_like(tokens)
    ref = hf_outputs(model, tokens, types, mask)
    got = ours_outputs(ours, tokens, types, mask)
    errs = {k: rel_err(got[k], ref[k]) for k in ref}
    print("roformer mlm_rotary_value 64 positions: "
          + ", ".join(f"{k} {v:.2e}" for k, v in errs.items()))
    assert all(e <= TOL for e in errs.values()), errs


def test_roformer_outputs_by_head(cases):
    """Masked-LM checkpoints give logits first, then last_hidden_state; a RoFormerModel
    gives only last_hidden_state."""
    assert list(cases["mlm"][2].output_names) == ["logits", "last_hidden_state"]
    assert list(cases["base"][2].output_names) == ["last_hidden_state"]


def test_roformer_config_from_hf(cases):
    p = cases["mlm_rotary_value"][2].params
    assert (p["vocab"], p["dim"], p["emb_dim"], p["n_layers"], p["n_heads"], p["ffn_dim"],
            p["context"], p["n_token_types"]) == (VOCAB, 64, 32, 2, 4, 128, 64, 2)
    assert p["rotary_value"] is True and p["has_mlm"] is True and p["project"] is True
    assert p["norm_eps"] == pytest.approx(1e-12)
    q = cases["base"][2].params
    assert q["rotary_value"] is False and q["has_mlm"] is False and q["project"] is False
    assert q["emb_dim"] == q["dim"] == 64


def test_roformer_tied_and_untied_output(cases):
    """A tied head stores no decoder matrix (the word embeddings stand in); an untied
    one binds its own, and its logits still match (test above)."""
    assert "output.weight" not in cases["mlm"][2].weights
    assert "output.weight" in cases["mlm_untied"][2].weights
    assert "embd_proj.weight" in cases["mlm"][2].weights
    assert "embd_proj.weight" not in cases["base"][2].weights


def test_roformer_rotary_value_matters(cases):
    """Negative control: the rotary_value checkpoint read as if its values did not rotate."""
    _, path, _, refs = cases["mlm_rotary_value"]
    spec = with_hf_config(md.load_spec(spec_path("roformer")), rotary_value="{False}")
    ours = md.load_model(spec, path, variant="tiny")
    assert errors(ours, refs, masked=True)["logits"] > 100 * TOL


def test_roformer_padding_mask_matters(cases):
    """Negative control: the padded batch run without its mask."""
    _, _, ours, refs = cases["mlm"]
    tokens, types, mask = batch_inputs()
    got = ours_outputs(ours, tokens, types, np.ones_like(mask))
    real = mask.astype(bool)                      # compare the real tokens only
    assert rel_err(got["logits"][real], refs["padded"]["logits"][real]) > 100 * TOL


def test_roformer_positions_matter(cases):
    """Negative control: the rotary table matters (a table of zeros for sin, ones for cos
    is the identity rotation)."""
    _, path, _, refs = cases["mlm"]
    td = md.load_weights(path)
    name = "roformer.encoder.embed_positions.weight"
    table = np.asarray(td[name]).copy()
    table[:, : table.shape[1] // 2] = 0.0
    table[:, table.shape[1] // 2:] = 1.0
    td[name] = table
    ours = md.load_model(spec_path("roformer"), td, variant="tiny")
    assert errors(ours, refs, masked=True)["logits"] > 100 * TOL


def test_roformer_refuses_a_decoder(cases, tmp_path):
    """RoFormerForCausalLM's causal self-attention is not modelled: refused on load."""
    _, path, _, _ = cases["mlm"]
    spec = with_hf_config(md.load_spec(spec_path("roformer")), is_decoder="{True}")
    with pytest.raises(md.WeightsError, match="is_decoder"):
        md.load_model(spec, path, variant="tiny")
