"""specs/xmod.yaml against transformers' X-MOD (small random configs): XmodForMaskedLM
logits and hidden states for a padded batch whose sequences use different language
adapters (``lang_ids``), XmodModel's pooler, the pre-norm / adapter-norm switches, an
untied decoder, XmodForCausalLM's causal attention, and negative controls showing that
the adapters, the language choice and the padding mask matter."""

import json
import shutil

import numpy as np
import pytest

import maxdecl as md
from modelhelp import named_outputs, randomize, rel_err, save_hf, spec_path

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

TOL = 1e-5                  # max|ours - ref| <= TOL * max|ref|
PAD = 1
LANGS = ["en_XX", "de_DE", "fr_XX"]     # not the tiny variant's list: config.json decides
VOCAB = 300


def tiny_config(**kw):
    cfg = dict(vocab_size=VOCAB, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
               intermediate_size=128, max_position_embeddings=40, type_vocab_size=2,
               layer_norm_eps=1e-5, pad_token_id=PAD, languages=LANGS,
               adapter_reduction_factor=2, attn_implementation="eager")
    cfg.update(kw)
    return transformers.XmodConfig(**cfg)


def batch():
    """(tokens, lang_ids, attention_mask, token_type_ids): three sequences of 11 tokens,
    the second right-padded to 6, each in another language."""
    rng = np.random.default_rng(3)
    tokens = rng.integers(PAD + 1, VOCAB, (3, 11)).astype(np.int64)
    mask = np.ones_like(tokens)
    tokens[1, 6:] = PAD
    mask[1, 6:] = 0
    types = (np.arange(11)[None, :] >= 5).astype(np.int64).repeat(3, axis=0)
    lang = np.array([0, 2, 1], np.int64)
    return tokens, lang, mask, types


def hf_run(model, tokens, lang, mask, types):
    """(logits or None, last_hidden_state, pooler_output or None) of an HF X-MOD model."""
    kw = dict(lang_ids=torch.tensor(lang), attention_mask=torch.tensor(mask),
              token_type_ids=torch.tensor(types))
    ids = torch.tensor(tokens)
    with torch.no_grad():
        if hasattr(model, "lm_head"):
            base = model.roberta(ids, **kw)
            logits = model(ids, **kw).logits.numpy()
        else:
            base, logits = model(ids, **kw), None
    pooled = base.pooler_output
    return logits, base.last_hidden_state.numpy(), None if pooled is None else pooled.numpy()


def build(cls, folder, seed=0, **cfg):
    torch.manual_seed(seed)
    hf = randomize(getattr(transformers, cls)(tiny_config(**cfg)), seed)
    path = save_hf(hf, folder)
    return hf, path, md.load_model(spec_path("xmod"), path)


@pytest.fixture(scope="module")
def mlm(tmp_path_factory):
    """(HF XmodForMaskedLM, its directory, maxdecl model): post-norm, tied decoder."""
    return build("XmodForMaskedLM", tmp_path_factory.mktemp("xmod_mlm"))


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    """(HF XmodModel with its pooler, its directory, maxdecl model)."""
    return build("XmodModel", tmp_path_factory.mktemp("xmod_base"), seed=1)


def test_xmod_params_from_config(mlm):
    _, _, model = mlm
    p = model.params
    assert {k: p[k] for k in ("vocab", "dim", "n_layers", "n_heads", "ffn_dim", "n_positions",
                              "type_vocab", "pad", "bottleneck", "n_langs", "context")} == {
        "vocab": VOCAB, "dim": 64, "n_layers": 2, "n_heads": 4, "ffn_dim": 128,
        "n_positions": 40, "type_vocab": 2, "pad": PAD, "bottleneck": 32, "n_langs": 3,
        "context": 40 - PAD - 1}
    assert p["languages"] == LANGS and p["has_lm_head"] is True
    assert p["layer_norm_eps"] == 1e-5 and p["pre_norm"] is False
    assert model.output_names[:3] == ["logits", "last_hidden_state", "pooler_output"]
    assert model.input_names == ["tokens", "lang_ids", "attention_mask", "token_type_ids"]
    assert "encoder.layer.1.output.adapter_modules.fr_XX.dense2.weight" in model.weights
    assert "lm_head.decoder.weight" not in model.weights        # tied: the word embeddings


def test_xmod_mlm_mixed_languages_match_hf(mlm):
    """One padded batch, three sequences, three language adapters."""
    hf, _, model = mlm
    inputs = batch()
    ref_logits, ref_h, _ = hf_run(hf, *inputs)
    got = named_outputs(model, *inputs)
    err_l = rel_err(got["logits"], ref_logits)
    err_h = rel_err(got["last_hidden_state"], ref_h)
    print(f"xmod MLM vs HF: logits {err_l:.2e}, last_hidden_state {err_h:.2e}")
    assert got["logits"].shape == (3, 11, VOCAB)
    assert err_l <= TOL and err_h <= TOL
    assert not got["pooler_output"].any()                      # no pooler in a MLM checkpoint


@pytest.mark.parametrize("lang", range(len(LANGS)))
def test_xmod_mlm_each_language_matches_hf(mlm, lang):
    hf, _, model = mlm
    tokens, _, mask, types = batch()
    langs = np.full(3, lang, np.int64)
    ref_logits, ref_h, _ = hf_run(hf, tokens, langs, mask, types)
    got = named_outputs(model, tokens, langs, mask, types)
    assert rel_err(got["logits"], ref_logits) <= TOL
    assert rel_err(got["last_hidden_state"], ref_h) <= TOL


def test_xmod_language_and_mask_matter(mlm):
    """Negative controls: another adapter, or no padding mask, gives other logits."""
    hf, _, model = mlm
    tokens, lang, mask, types = batch()
    ref_logits, _, _ = hf_run(hf, tokens, lang, mask, types)
    other = named_outputs(model, tokens, (lang + 1) % 3, mask, types)["logits"]
    assert rel_err(other, ref_logits) > 100 * TOL
    unmasked = named_outputs(model, tokens, lang, np.ones_like(mask), types)["logits"]
    assert rel_err(unmasked[1], ref_logits[1]) > 100 * TOL
    assert rel_err(unmasked[0], ref_logits[0]) <= TOL         # unpadded rows unchanged
    # the adapters themselves: zero them in HF and the reference moves away
    with torch.no_grad():
        saved = {n: p.clone() for n, p in hf.named_parameters() if "adapter_modules" in n}
        for n, p in hf.named_parameters():
            if "adapter_modules" in n:
                p.zero_()
        no_adapter, _, _ = hf_run(hf, tokens, lang, mask, types)
        for n, p in hf.named_parameters():
            if n in saved:
                p.copy_(saved[n])
    assert rel_err(no_adapter, ref_logits) > 100 * TOL


def test_xmod_base_hidden_and_pooler_match_hf(base):
    hf, _, model = base
    inputs = batch()
    assert model.params["has_lm_head"] is False
    assert model.output_names[:2] == ["last_hidden_state", "pooler_output"]
    _, ref_h, ref_p = hf_run(hf, *inputs)
    got = named_outputs(model, *inputs)
    err_h = rel_err(got["last_hidden_state"], ref_h)
    err_p = rel_err(got["pooler_output"], ref_p)
    print(f"xmod base vs HF: last_hidden_state {err_h:.2e}, pooler_output {err_p:.2e}")
    assert err_h <= TOL and err_p <= TOL


CASES = {
    # xmod-large-prenorm's layout: pre-norm blocks, a final encoder LayerNorm
    "prenorm": dict(pre_norm=True),
    # an adapter LayerNorm of its own, residual taken before it
    "adapter_ln": dict(adapter_layer_norm=True, ln_before_adapter=False),
    # no norm before the adapter at all, another activation, another reduction
    "no_adapter_norm": dict(adapter_reuse_layer_norm=False, hidden_act="gelu_new",
                            adapter_reduction_factor=4, pre_norm=True),
    # its own output matrix
    "untied": dict(tie_word_embeddings=False),
}


@pytest.mark.parametrize("case", CASES)
def test_xmod_config_switches_match_hf(case, tmp_path):
    hf, path, model = build("XmodForMaskedLM", tmp_path / case, seed=2, **CASES[case])
    if case == "untied":
        assert "lm_head.decoder.weight" in model.weights
    inputs = batch()
    ref_logits, ref_h, _ = hf_run(hf, *inputs)
    got = named_outputs(model, *inputs)
    err_l = rel_err(got["logits"], ref_logits)
    err_h = rel_err(got["last_hidden_state"], ref_h)
    print(f"xmod {case} vs HF: logits {err_l:.2e}, last_hidden_state {err_h:.2e}")
    assert err_l <= TOL and err_h <= TOL


def test_xmod_causal_lm_matches_hf(tmp_path):
    """XmodForCausalLM (is_decoder): causal self-attention, same head."""
    hf, _, model = build("XmodForCausalLM", tmp_path / "clm", seed=4, is_decoder=True)
    tokens, lang, mask, types = batch()
    with torch.no_grad():
        ref = hf(torch.tensor(tokens), lang_ids=torch.tensor(lang),
                 attention_mask=torch.tensor(mask), token_type_ids=torch.tensor(types),
                 use_cache=False).logits.numpy()
    got = named_outputs(model, tokens, lang, mask, types)
    err = rel_err(got["logits"], ref)
    print(f"xmod causal LM vs HF: logits {err:.2e}")
    assert err <= TOL


def test_xmod_refuses_cross_attention(mlm, tmp_path):
    _, path, _ = mlm
    shutil.copytree(path, tmp_path / "x")
    with open(tmp_path / "x" / "config.json") as f:
        cfg = json.load(f)
    cfg.update(is_decoder=True, add_cross_attention=True)
    with open(tmp_path / "x" / "config.json", "w") as f:
        json.dump(cfg, f)
    with pytest.raises(md.errors.WeightsError, match="cross-attention"):
        md.load_weights(tmp_path / "x", spec=spec_path("xmod"))
