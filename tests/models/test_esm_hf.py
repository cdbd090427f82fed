"""specs/esm.yaml against transformers' EsmForMaskedLM / EsmModel (ESM-2).

A small seeded float32 ESM-2: rotary position embeddings (rotate-half, the query
scaled by head_dim ** -0.5 before the rotation), pre-LN layers with biases, exact GELU,
a final emb_layer_norm_after, token dropout (<mask> embeddings zeroed, the rest scaled by
0.88 / (1 - the row's mask fraction)) and the masked-LM head tied to the embeddings.
Batches with and without padding (attention_mask); an EsmModel checkpoint (no LM head,
a pooler, names without ``esm.``) and an ESM-1b-style config (absolute positions,
LayerNorm after the embeddings) too.
"""

import numpy as np
import pytest

import maxdecl as md

from modelhelp import hf_params, named_outputs, randomize, rel_err, save_hf, spec_path, with_hf_config

pytest.importorskip("torch")
pytest.importorskip("transformers")

TOL = 1e-5          # max|ours - ref| <= TOL * max|ref|
VOCAB, CLS, PAD, EOS, MASK = 33, 0, 1, 2, 32
SEQ = 14


def esm_config(**kw):
    import transformers

    cfg = dict(vocab_size=VOCAB, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
               intermediate_size=128, max_position_embeddings=64,
               position_embedding_type="rotary", rope_theta=10000.0, token_dropout=True,
               mask_token_id=MASK, pad_token_id=PAD, layer_norm_eps=1e-5,
               emb_layer_norm_before=False, attn_implementation="eager")
    cfg.update(kw)
    return transformers.EsmConfig(**cfg)


def make_esm(cls_name="EsmForMaskedLM", seed=0, **kw):
    import torch
    import transformers

    torch.manual_seed(seed)
    return randomize(getattr(transformers, cls_name)(esm_config(**kw)), seed)


def batches():
    """(unpadded ids, attention_mask), (padded ids, attention_mask): <cls> ... <eos>
    sequences of amino-acid ids 4..31 with a few <mask> tokens (token dropout)."""
    rng = np.random.default_rng(7)
    ids = rng.integers(4, 32, size=(3, SEQ))
    ids[:, 0], ids[:, -1] = CLS, EOS
    ids[0, [3, 8]] = MASK
    ids[2, 5] = MASK
    full = (ids.copy(), np.ones_like(ids))
    lengths = [SEQ, 9, 5]
    padded, mask = ids.copy(), np.zeros_like(ids)
    for r, n in enumerate(lengths):
        padded[r, n - 1] = EOS
        padded[r, n:] = PAD
        mask[r, :n] = 1
    padded[1, 2] = MASK
    return full, (padded, mask)


def hf_outputs(model, ids, mask) -> dict:
    import torch

    t, m = torch.tensor(ids), torch.tensor(mask)
    with torch.no_grad():
        if hasattr(model, "lm_head"):
            out = model(input_ids=t, attention_mask=m)
            base = model.esm(input_ids=t, attention_mask=m)
            return {"logits": out.logits.numpy(), "last_hidden_state": base.last_hidden_state.numpy()}
        out = model(input_ids=t, attention_mask=m)
        return {"last_hidden_state": out.last_hidden_state.numpy(),
                "pooler_output": out.pooler_output.numpy()}


@pytest.fixture(scope="module")
def esm_mlm(tmp_path_factory):
    model = make_esm()
    return model, save_hf(model, tmp_path_factory.mktemp("esm_mlm"))


@pytest.fixture(scope="module")
def ours(esm_mlm):
    return md.load_model(spec_path("esm"), esm_mlm[1], variant="tiny")


def errors(ours, hf, ids, mask) -> dict:
    ref = hf_outputs(hf, ids, mask)
    got = named_outputs(ours, ids.astype(np.int64), mask.astype(np.int64))
    assert set(ref) <= set(got), (sorted(got), sorted(ref))
    return {k: rel_err(got[k], ref[k]) for k in ref}


def test_esm_config_from_hf(esm_mlm):
    got = hf_params("esm", esm_mlm[1])[2]
    assert (got["dim"], got["n_layers"], got["n_heads"], got["ffn_dim"], got["vocab"]) == \
        (64, 2, 4, 128, VOCAB)
    assert got["pos_type"] == "rotary" and got["token_dropout"] is True
    assert (got["mask_token"], got["pad_token"]) == (MASK, PAD)
    assert got["norm_eps"] == pytest.approx(1e-5)
    assert got["has_head"] is True and got["has_pooler"] is False


def test_esm_outputs_are_named(ours):
    assert ours.input_names == ["tokens", "attention_mask"]
    assert ours.output_names == ["logits", "last_hidden_state"]


@pytest.mark.parametrize("padded", [False, True], ids=["unpadded", "padded"])
def test_esm_mlm_logits_and_hidden_match_hf(esm_mlm, ours, padded):
    ids, mask = batches()[int(padded)]
    errs = errors(ours, esm_mlm[0], ids, mask)
    print(f"esm mlm ({'padded' if padded else 'unpadded'}) vs HF: {errs}")
    assert errs["logits"] <= TOL and errs["last_hidden_state"] <= TOL


def test_esm_padding_changes_the_output(esm_mlm, ours):
    """Negative control: the padded batch's real rows differ from the same rows run
    without the mask (the mask reaches the attention and the token-dropout length)."""
    ids, mask = batches()[1]
    with_mask = named_outputs(ours, ids, mask)["logits"]
    without = named_outputs(ours, ids, np.ones_like(mask))["logits"]
    assert rel_err(without[1, :9], with_mask[1, :9]) > 100 * TOL


def test_esm_token_dropout_matters(esm_mlm):
    """Negative control: the same checkpoint read as if token_dropout were off is far
    from transformers on a batch holding <mask> tokens."""
    spec = with_hf_config(md.load_spec(spec_path("esm")), token_dropout="{False}")
    off = md.load_model(spec, esm_mlm[1], variant="tiny")
    ids, mask = batches()[0]
    assert errors(off, esm_mlm[0], ids, mask)["logits"] > 100 * TOL


def test_esm_rotary_theta_matters(esm_mlm):
    """Negative control: another rope_theta is far from transformers."""
    spec = with_hf_config(md.load_spec(spec_path("esm")), rope_theta=100.0)
    off = md.load_model(spec, esm_mlm[1], variant="tiny")
    ids, mask = batches()[0]
    assert errors(off, esm_mlm[0], ids, mask)["logits"] > 100 * TOL


def test_esm_base_model_with_pooler_matches_hf(tmp_path):
    """An EsmModel checkpoint: names without ``esm.``, a pooler, no LM head."""
    hf = make_esm("EsmModel", seed=1)
    path = save_hf(hf, tmp_path / "base")
    ours = md.load_model(spec_path("esm"), path, variant="tiny")
    assert ours.output_names == ["last_hidden_state", "pooler_output"]
    for ids, mask in batches():
        errs = errors(ours, hf, ids, mask)
        print(f"esm base vs HF: {errs}")
        assert errs["last_hidden_state"] <= TOL and errs["pooler_output"] <= TOL


def test_esm1b_style_absolute_positions_match_hf(tmp_path):
    """ESM-1b's layout: learned absolute positions counted from pad + 1 over the real
    tokens, a LayerNorm after the embeddings."""
    hf = make_esm(seed=2, position_embedding_type="absolute", emb_layer_norm_before=True)
    path = save_hf(hf, tmp_path / "abs")
    ours = md.load_model(spec_path("esm"), path, variant="tiny")
    for ids, mask in batches():
        errs = errors(ours, hf, ids, mask)
        print(f"esm absolute vs HF: {errs}")
        assert errs["logits"] <= TOL and errs["last_hidden_state"] <= TOL


def test_esm_torch_state_dict_names_load(esm_mlm, tmp_path):
    """The in-memory names (LayerNorm.weight / .bias, lm_head.decoder.weight) map too."""
    import shutil

    from safetensors.torch import save_file

    hf, path = esm_mlm
    folder = tmp_path / "sd"
    folder.mkdir()
    shutil.copy(f"{path}/config.json", folder / "config.json")
    sd = {k: v.contiguous().clone() for k, v in hf.state_dict().items()}
    assert "esm.encoder.layer.0.LayerNorm.weight" in sd and "lm_head.decoder.weight" in sd
    # older hub checkpoints (facebook/esm2_*) also hold one inv_freq per layer and the
    # position_ids buffer: both are dropped
    inv = sd.pop("esm.rotary_embeddings.inv_freq", None)
    if inv is None:
        inv = hf.esm.rotary_embeddings.inv_freq.clone()
    for i in range(2):
        sd[f"esm.encoder.layer.{i}.attention.self.rotary_embeddings.inv_freq"] = inv.clone()
    sd["esm.embeddings.position_ids"] = hf.esm.embeddings.position_ids.clone()
    save_file(sd, str(folder / "model.safetensors"))
    ours = md.load_model(spec_path("esm"), str(folder), variant="tiny")
    ids, mask = batches()[1]
    errs = errors(ours, hf, ids, mask)
    assert errs["logits"] <= TOL and errs["last_hidden_state"] <= TOL


def test_esm_decoder_config_is_refused(tmp_path):
    hf = make_esm(seed=3, is_decoder=True)
    path = save_hf(hf, tmp_path / "dec")
    with pytest.raises(md.WeightsError, match="is_decoder"):
        md.load_model(spec_path("esm"), path, variant="tiny")


def test_esm_classifier_checkpoint_is_refused(tmp_path):
    """A head the spec does not model (token classification) is refused by name, not
    loaded with its classifier left out."""
    hf = make_esm("EsmForTokenClassification", seed=4, num_labels=3)
    path = save_hf(hf, tmp_path / "tok")
    with pytest.raises(md.WeightsError, match="EsmForTokenClassification"):
        md.load_model(spec_path("esm"), path, variant="tiny")
