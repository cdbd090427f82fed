"""specs/xlnet.yaml against transformers' XLNetLMHeadModel / XLNetModel.

Small seeded float32 XLNets (attn_type "bi", bi_data false): relative attention with
content, position and segment terms, post-norm layers, a GELU FFN and lm_loss tied to
word_embedding. The plain inference path: one forward, no mems, no perm_mask, no
target_mapping; with and without an attention mask (padded rows), with and without
token_type_ids, untie_r true and false.
"""

import numpy as np
import pytest

import maxdecl as md

from modelhelp import hf_params, named_outputs, randomize, rel_err, save_hf, spec_path

pytest.importorskip("torch")
pytest.importorskip("transformers")

TOL = 1e-4              # max|ours - ref| <= TOL * max|ref|
BATCH, SEQ, VOCAB = 3, 11, 120


def make_xlnet(seed=0, **kw):
    """XLNetLMHeadModel: d_model 32, 2 layers, 4 heads (d_head 8), d_inner 64."""
    import torch
    import transformers

    torch.manual_seed(seed)
    cfg = dict(vocab_size=VOCAB, d_model=32, n_layer=2, n_head=4, d_inner=64,
               ff_activation="gelu", layer_norm_eps=1e-12, attn_type="bi", bi_data=False,
               mem_len=None, use_mems_eval=False, pad_token_id=5)
    cfg.update(kw)
    model = transformers.XLNetLMHeadModel(transformers.XLNetConfig(**cfg))
    # 0.1-scale biases (randomize's default); r_w/r_r/r_s biases and seg_embed are not
    # ".bias" names: draw them like the matrices so every term of the score matters
    return randomize(model, seed)


def inputs(seed=3):
    rng = np.random.default_rng(seed)
    ids = rng.integers(0, VOCAB, size=(BATCH, SEQ)).astype(np.int64)
    mask = np.ones((BATCH, SEQ), np.int64)
    mask[1, 7:] = 0                         # right padding
    mask[2, :4] = 0                         # left padding (XLNet pads on the left)
    tt = np.zeros((BATCH, SEQ), np.int64)
    tt[:, 6:] = 1
    tt[:, -1] = 2                           # XLNet's <cls> segment
    return ids, mask, tt


def hf_run(model, ids, mask=None, tt=None, base=False):
    import torch

    kw = {"attention_mask": None if mask is None else torch.tensor(mask),
          "token_type_ids": None if tt is None else torch.tensor(tt), "use_mems": False}
    with torch.no_grad():
        if base:
            return model(torch.tensor(ids), **kw).last_hidden_state.numpy()
        out = model(torch.tensor(ids), output_hidden_states=True, **kw)
    return out.logits.numpy(), out.hidden_states[-1].numpy()


def ours_run(model, ids, mask=None, tt=None):
    mask = np.ones_like(ids) if mask is None else mask      # attention_mask=None: all ones
    tt = np.zeros_like(ids) if tt is None else tt           # token_type_ids=None: zeros
    got = named_outputs(model, ids, mask, tt)
    return got["logits"], got["last_hidden_state"]


CASES = {"untied_r": dict(untie_r=True), "tied_r": dict(untie_r=False, seed=1)}


@pytest.fixture(scope="module", params=list(CASES))
def case(request, tmp_path_factory):
    """(name, HF model, save_pretrained folder, loaded maxdecl model)."""
    kw = dict(CASES[request.param])
    model = make_xlnet(seed=kw.pop("seed", 0), **kw)
    path = save_hf(model, tmp_path_factory.mktemp(f"xlnet_{request.param}"))
    ours = md.load_model(spec_path("xlnet"), path, variant="tiny")
    return request.param, model, path, ours


def test_xlnet_config_from_hf(case):
    name, model, path, _ = case
    got = hf_params("xlnet", path)[2]
    assert (got["vocab"], got["dim"], got["n_layers"], got["n_heads"], got["d_head"],
            got["ffn_dim"]) == (VOCAB, 32, 2, 4, 8, 64)
    assert got["hidden_act"] == "gelu" and got["attn_type"] == "bi" and not got["bi_data"]
    assert got["norm_eps"] == pytest.approx(1e-12)
    assert model.config.untie_r == (name == "untied_r")


@pytest.mark.parametrize("use_mask", [False, True], ids=["no_mask", "mask"])
@pytest.mark.parametrize("use_tt", [False, True], ids=["no_tt", "tt"])
def test_xlnet_matches_hf(case, use_mask, use_tt):
    name, model, _, ours = case
    ids, mask, tt = inputs()
    mask = mask if use_mask else None
    tt = tt if use_tt else None
    ref_logits, ref_hidden = hf_run(model, ids, mask, tt)
    logits, hidden = ours_run(ours, ids, mask, tt)
    e_logits, e_hidden = rel_err(logits, ref_logits), rel_err(hidden, ref_hidden)
    print(f"xlnet[{name}, mask={use_mask}, tt={use_tt}] vs HF: logits {e_logits:.2e}, "
          f"last_hidden_state {e_hidden:.2e} (of max|ref|)")
    assert e_logits <= TOL and e_hidden <= TOL


def test_xlnet_mask_and_segments_matter(case):
    """Negative controls: the padding mask and the segment term change HF's outputs by far
    more than the tolerance, so the comparisons above test them; token_type_ids of one
    segment do not."""
    _, model, _, _ = case
    ids, mask, tt = inputs()
    plain = hf_run(model, ids)[1]
    assert rel_err(hf_run(model, ids, mask=mask)[1], plain) > 100 * TOL
    assert rel_err(hf_run(model, ids, tt=tt)[1], plain) > 100 * TOL
    # one segment adds one score to every key of a query: the softmax cancels it, so
    # the spec feeds zeros for token_type_ids=None
    assert rel_err(hf_run(model, ids, tt=np.zeros_like(tt))[1], plain) <= TOL


def test_xlnet_base_model_matches_hf(case, tmp_path):
    """An XLNetModel checkpoint (no transformer. prefix, no lm_loss) gives the same
    last_hidden_state (the logits then come from the tied table and a zero bias)."""
    _, model, _, _ = case
    ids, mask, tt = inputs()
    path = save_hf(model.transformer, tmp_path / "base")
    keys = set(md.load_weights(path).keys())
    assert "word_embedding.weight" in keys and not any(k.startswith("transformer.") for k in keys)
    ours = md.load_model(spec_path("xlnet"), path, variant="tiny")
    ref = hf_run(model.transformer, ids, mask, tt, base=True)
    assert rel_err(ours_run(ours, ids, mask, tt)[1], ref) <= TOL


def test_xlnet_untied_lm_head(tmp_path):
    """tie_word_embeddings false: lm_loss.weight is saved and used."""
    model = make_xlnet(seed=2, tie_word_embeddings=False)
    assert not np.allclose(model.lm_loss.weight.detach().numpy(),
                           model.transformer.word_embedding.weight.detach().numpy())
    path = save_hf(model, tmp_path / "untied")
    ours = md.load_model(spec_path("xlnet"), path, variant="tiny")
    ids, mask, tt = inputs()
    ref_logits, ref_hidden = hf_run(model, ids, mask, tt)
    logits, hidden = ours_run(ours, ids, mask, tt)
    assert rel_err(logits, ref_logits) <= TOL and rel_err(hidden, ref_hidden) <= TOL


@pytest.mark.parametrize("kw, why", [(dict(attn_type="uni"), "attn_type uni"),
                                     (dict(bi_data=True), "bi_data")])
def test_xlnet_refuses_unmodelled_configs(tmp_path, kw, why):
    path = save_hf(make_xlnet(**kw), tmp_path / "refused")
    with pytest.raises(md.WeightsError, match=why):
        md.load_model(spec_path("xlnet"), path, variant="tiny")


def test_xlnet_clamp_len_matches_hf(tmp_path):
    """clamp_len 3: relative distances past 3 share the table entry of +-3 (HF's outputs
    then differ from the unclamped model's, so the position term is under test too)."""
    model = make_xlnet(seed=3, clamp_len=3)
    path = save_hf(model, tmp_path / "clamped")
    ours = md.load_model(spec_path("xlnet"), path, variant="tiny")
    assert ours.params["clamp_len"] == 3
    ids, mask, tt = inputs()
    ref_logits, ref_hidden = hf_run(model, ids, mask, tt)
    logits, hidden = ours_run(ours, ids, mask, tt)
    assert rel_err(logits, ref_logits) <= TOL and rel_err(hidden, ref_hidden) <= TOL
    model.transformer.clamp_len = -1
    assert rel_err(hf_run(model, ids, mask, tt)[1], ref_hidden) > 100 * TOL
