"""specs/biogpt.yaml against transformers' BioGptForCausalLM.

A small seeded float32 BioGPT: learned positions (a table of 64 + 2 rows read at
position + 2), token embeddings scaled by sqrt(hidden_size) (or not, scale_embedding
False), biased q/k/v/out projections, GELU MLP, LayerNorms with bias, the output tied to
the token embeddings. config.json's layer_norm_eps is set far from torch's 1e-5: BioGPT's
LayerNorms ignore it, and a spec that read it would be far off.
"""

import numpy as np
import pytest

import maxdecl as md

from modelhelp import (assert_greedy_matches_hf, compare, hf_logits, hf_params, save_hf,
                       spec_path, tiny_model, token_ids, with_hf_config)

pytest.importorskip("torch")
pytest.importorskip("transformers")

TOL = 1e-5          # max|ours - ref| <= TOL * max|ref|, prefill and decode each
PROMPTS = [[3, 17, 42, 99, 5, 7, 64, 1], [8, 9, 120], [5, 60, 33, 2, 90, 11, 7]]
N_NEW = 6


def make_biogpt(seed=0, **kw):
    """BioGptForCausalLM: dim 64, 2 layers, 4 heads, ffn 128, vocab 128, 64 positions,
    tied output; weights from modelhelp's randomize, then the token table scaled so that
    the embeddings after the sqrt(hidden_size) factor are 0.1 * N(0, 1), the position
    table by 0.5 and the residual branches (out_proj, fc2) by 4: otherwise each token's
    own embedding dominates the tied logits and greedy decoding repeats the last token."""
    import torch
    import transformers

    from modelhelp import randomize

    torch.manual_seed(seed)
    cfg = dict(vocab_size=128, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
               intermediate_size=128, max_position_embeddings=64, hidden_act="gelu",
               layer_norm_eps=0.5, scale_embedding=True, pad_token_id=1, bos_token_id=0,
               eos_token_id=2, attn_implementation="eager")
    cfg.update(kw)
    model = randomize(transformers.BioGptForCausalLM(transformers.BioGptConfig(**cfg)), seed)
    scale = model.config.hidden_size ** 0.5 if model.config.scale_embedding else 1.0
    with torch.no_grad():
        model.biogpt.embed_tokens.weight.mul_(0.1 / scale)
        model.biogpt.embed_positions.weight.mul_(0.5)
        for layer in model.biogpt.layers:
            layer.self_attn.out_proj.weight.mul_(4.0)
            layer.fc2.weight.mul_(4.0)
    return model


@pytest.fixture(scope="module", params=[True, False], ids=["scaled", "unscaled"])
def biogpt(request, tmp_path_factory):
    """(HF model, its save_pretrained folder, prompt ids, HF logits) for scale_embedding
    True and False (different seeds)."""
    scaled = request.param
    model = make_biogpt(seed=0 if scaled else 1, scale_embedding=scaled)
    path = save_hf(model, tmp_path_factory.mktemp(f"biogpt_{'scaled' if scaled else 'unscaled'}"))
    ids = token_ids(model.config.vocab_size, seed=7 if scaled else 8)
    return model, path, ids, hf_logits(model, ids)


@pytest.fixture(scope="module")
def ours(biogpt):
    return tiny_model("biogpt", biogpt[1])


def _report(name, pre, dec):
    print(f"{name}: prefill {pre:.2e}, decode {dec:.2e} (of max|ref|)")


def test_biogpt_config_from_hf(biogpt):
    model, path, _, _ = biogpt
    got = hf_params("biogpt", path)[2]
    assert (got["dim"], got["n_layers"], got["n_heads"], got["ffn_dim"]) == (64, 2, 4, 128)
    assert (got["vocab"], got["context"], got["hidden_act"]) == (128, 64, "gelu")
    assert got["scale_embedding"] is model.config.scale_embedding


def test_biogpt_params_as_used(biogpt, ours):
    model = biogpt[0]
    p = ours.params
    assert p["norm_eps"] == pytest.approx(1e-5)         # not config.json's 0.5
    assert p["head_dim"] == 16
    assert ours.weights["position_embd.weight"].shape == (64, 64)    # 66 rows less 2
    np.testing.assert_array_equal(np.asarray(ours.weights["position_embd.weight"]),
                                  model.biogpt.embed_positions.weight[2:].detach().numpy())
    assert "output.weight" not in ours.weights                      # tied


def test_biogpt_prefill_and_decode_match_hf(biogpt, ours):
    """Prefill logits of 12 tokens, then 4 tokens one at a time through the KV cache."""
    model, path, ids, ref = biogpt
    pre, dec = compare(ours, ref, ids)
    _report(f"biogpt scale_embedding={model.config.scale_embedding}", pre, dec)
    assert pre <= TOL and dec <= TOL


def test_biogpt_greedy_generate_matches_hf(biogpt, ours):
    """ours.generate (greedy) against transformers' generate, alone and batched."""
    model = biogpt[0]
    import torch

    out = model.generate(torch.tensor([PROMPTS[0]]), max_new_tokens=N_NEW, do_sample=False,
                         eos_token_id=None, pad_token_id=0)[0, len(PROMPTS[0]):].tolist()
    assert len(set(out)) > 1, out             # the comparison is not of one repeated token
    assert_greedy_matches_hf(model, ours, PROMPTS, N_NEW)


def test_biogpt_scale_embedding_matters(biogpt):
    """Negative control: the same weights with config.json's scale_embedding flipped."""
    model, path, ids, ref = biogpt
    td = md.load_weights(path)
    td.metadata["scale_embedding"] = not model.config.scale_embedding
    pre, dec = compare(md.load_model(spec_path("biogpt"), td, variant="tiny"), ref, ids)
    assert pre > 100 * TOL and dec > 100 * TOL


def test_biogpt_layer_norm_eps_is_not_config_json(biogpt):
    """Negative control: a spec reading config.json's layer_norm_eps (0.5 here) into its
    LayerNorms is far off; transformers' BioGPT uses nn.LayerNorm's 1e-5."""
    model, path, ids, ref = biogpt
    spec = with_hf_config(md.load_spec(spec_path("biogpt")), norm_eps="layer_norm_eps")
    ours = md.load_model(spec, path, variant="tiny")
    assert ours.params["norm_eps"] == pytest.approx(0.5)
    pre, dec = compare(ours, ref, ids)
    assert pre > 100 * TOL and dec > 100 * TOL


def test_biogpt_position_offset_matters(biogpt):
    """Negative control: the table read from row 0 (no offset of 2) is far off."""
    model, path, ids, ref = biogpt
    td = md.load_weights(path)
    name = "biogpt.embed_positions.weight"
    t = np.asarray(td[name])
    td[name] = np.ascontiguousarray(np.concatenate([t[2:4], t[:-2]]))   # rows shifted by 2
    pre, dec = compare(md.load_model(spec_path("biogpt"), td, variant="tiny"), ref, ids)
    assert pre > 100 * TOL and dec > 100 * TOL


def test_biogpt_base_model_names_match_hf(biogpt, tmp_path):
    """A BioGptModel checkpoint (names without biogpt., no output_projection) loads and,
    the output being tied, gives the same logits."""
    model, _, ids, ref = biogpt
    path = save_hf(model.biogpt, tmp_path / "base")
    keys = set(md.load_weights(path).keys())
    assert "embed_tokens.weight" in keys and not any(k.startswith("biogpt.") for k in keys)
    pre, dec = compare(md.load_model(spec_path("biogpt"), path, variant="tiny"), ref, ids)
    assert pre <= TOL and dec <= TOL


def test_biogpt_untied_output_matches_hf(tmp_path):
    """tie_word_embeddings False: output_projection.weight is saved and used."""
    model = make_biogpt(seed=2, tie_word_embeddings=False)
    path = save_hf(model, tmp_path / "untied")
    ids = token_ids(128, seed=9)
    ref = hf_logits(model, ids)
    ours = md.load_model(spec_path("biogpt"), path, variant="tiny")
    assert "output.weight" in ours.weights
    pre, dec = compare(ours, ref, ids)
    _report("biogpt untied", pre, dec)
    assert pre <= TOL and dec <= TOL


def test_biogpt_stops_at_the_position_table(ours):
    """Learned positions end at max_position_embeddings: past it is an InputError."""
    with pytest.raises(md.InputError, match="context of 64"):
        ours.generate(list(range(60)), 8, temperature=0)
