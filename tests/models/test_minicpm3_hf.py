"""specs/minicpm3.yaml against transformers' MiniCPM3ForCausalLM.

Small seeded float32 MiniCPM3 models: multi-head latent attention (low-rank query
q_a -> RMSNorm -> q_b, or a dense q_proj; a compressed KV latent of kv_lora_rank with one
shared rotary key, expanded per head by kv_b; v_head_dim != qk_head_dim both ways), the
muP scalings (scale_emb on the embeddings, scale_depth / sqrt(n_layers) on each residual
branch, hidden_size / dim_model_base before the tied output), and RoPE without scaling,
with linear scaling and with MiniCPM3-4B's longrope (short factors; and, where
original_max_position_embeddings is below max_position_embeddings, the long factors and
the attention factor once a forward reaches past it, as transformers switches per call).
"""

import numpy as np
import pytest

import maxdecl as md

from modelhelp import (assert_greedy_matches_hf, compare, hf_logits, hf_params, randomize,
                       rel_err, save_hf, spec_path, token_ids, with_hf_config)

pytest.importorskip("torch")
pytest.importorskip("transformers")

TOL = 1e-5          # max|ours - ref| <= TOL * max|ref|
VOCAB = 256
PROMPTS = [[3, 17, 42, 99, 5, 7, 64, 1], [8, 9, 120], [5, 60, 33, 2, 90, 11, 7]]
N_NEW = 8

LONGROPE = {"rope_type": "longrope", "rope_theta": 10000.0,
            "short_factor": [1.0, 1.7, 3.1, 5.3], "long_factor": [1.3, 4.0, 9.0, 23.0]}

CASES = {
    # MiniCPM3-4B's layout: low-rank q, longrope with max == original context (factor 1:
    # the short factors only, attention factor 1), tied output
    "longrope": dict(rope_parameters={**LONGROPE, "original_max_position_embeddings": 64}),
    # original context 8 < 64: long factors and attention factor sqrt(1 + ln 8 / ln 8) once a
    # forward reaches position 8; every projection bias; gelu MLP; untied output
    "longrope_far": dict(rope_parameters={**LONGROPE, "original_max_position_embeddings": 8},
                         attention_bias=True, mlp_bias=True, hidden_act="gelu_pytorch_tanh",
                         tie_word_embeddings=False, scale_emb=2.5, scale_depth=2.0,
                         dim_model_base=8),
    # q_lora_rank null (a dense q_proj), v_head_dim 24 > qk_head_dim 20, no RoPE scaling,
    # null scale_depth / dim_model_base (no-op scalings), attention and MLP biases
    "dense": dict(q_lora_rank=None, v_head_dim=24, attention_bias=True, mlp_bias=True,
                  scale_depth=None, dim_model_base=None,
                  rope_parameters={"rope_type": "default", "rope_theta": 500.0}),
    # linear RoPE scaling
    "linear": dict(rope_parameters={"rope_type": "linear", "rope_theta": 10000.0, "factor": 3.0}),
}


def make_minicpm3(seed=0, **kw):
    """MiniCPM3ForCausalLM: dim 64, 2 layers, 4 heads, q_lora_rank 32, kv_lora_rank 16,
    qk_nope 12 + qk_rope 8, v_head_dim 16 (dim / heads), 64 positions, scale_emb 12,
    scale_depth 1.4, dim_model_base 16 (logits scaled by 1/4).

    The embedding table is scaled to 0.003 * N(0, 1): a token's own row in the residual
    stream (times scale_emb) otherwise outweighs every branch in the tied logits, and greedy
    decoding repeats the last token."""
    import torch
    import transformers

    torch.manual_seed(seed)
    cfg = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
               num_attention_heads=4, num_key_value_heads=4, q_lora_rank=32, kv_lora_rank=16,
               qk_nope_head_dim=12, qk_rope_head_dim=8, v_head_dim=None,
               max_position_embeddings=64, rms_norm_eps=1e-5, scale_emb=12, scale_depth=1.4,
               dim_model_base=16, bos_token_id=1, eos_token_id=2, pad_token_id=0,
               attn_implementation="eager")
    cfg.update(kw)
    model = randomize(transformers.MiniCPM3ForCausalLM(transformers.MiniCPM3Config(**cfg)),
                      seed)
    with torch.no_grad():
        model.model.embed_tokens.weight.mul_(0.003)
    return model


@pytest.fixture(scope="module")
def cases(tmp_path_factory):
    """name -> (HF model, its folder, ids, HF logits of the whole sequence, our model)."""
    out = {}
    for k, (name, kw) in enumerate(CASES.items()):
        model = make_minicpm3(seed=k, **kw)
        path = save_hf(model, tmp_path_factory.mktemp(f"minicpm3_{name}"))
        ids = token_ids(VOCAB, seed=7 + k)
        ours = md.load_model(spec_path("minicpm3"), path, variant="tiny")
        out[name] = (model, path, ids, hf_logits(model, ids), ours)
    return out


def hf_stepwise_logits(model, ids, n_prompt):
    """transformers' logits of a prefill of ``n_prompt`` tokens and then one token at a
    time through its cache (longrope picks its factors per forward call)."""
    import torch

    with torch.no_grad():
        out = model(torch.tensor([ids[:n_prompt]]), use_cache=True)
        cache = out.cache if getattr(out, "cache", None) is not None else out.past_key_values
        rows = [out.logits[0].numpy()]
        for p in range(n_prompt, len(ids)):
            out = model(torch.tensor([[ids[p]]]), cache=cache, use_cache=True,
                        position_ids=torch.tensor([[p]]))
            cache = out.cache if getattr(out, "cache", None) is not None else out.past_key_values
            rows.append(out.logits[0].numpy())
    return np.concatenate(rows)


def test_minicpm3_config_from_hf(cases):
    _, path, _, _, _ = cases["longrope"]
    got = hf_params("minicpm3", path)[2]
    assert (got["dim"], got["n_layers"], got["n_heads"], got["vocab"], got["context"]) == \
        (64, 2, 4, VOCAB, 64)
    assert (got["q_lora_rank"], got["kv_lora_rank"], got["qk_nope_dim"], got["qk_rope_dim"],
            got["v_head_dim"]) == (32, 16, 12, 8, 16)
    assert (got["scale_emb"], got["scale_depth"], got["dim_model_base"]) == (12, 1.4, 16)
    assert got["rope_type"] == "longrope" and got["rope_orig_ctx"] == 64
    assert got["rope_short"] == LONGROPE["short_factor"]

    _, path, _, _, ours = cases["dense"]
    got = hf_params("minicpm3", path)[2]
    assert got["q_lora_rank"] == 0 and got["v_head_dim"] == 24 and got["rope_type"] == "default"
    assert ours.params["res_scale"] == pytest.approx(1.0)      # scale_depth null: sqrt(n_layers)
    assert ours.params["logit_div"] == pytest.approx(1.0)      # dim_model_base null: hidden_size

    ours = cases["longrope_far"][4]
    assert ours.params["rope_mscale"] == pytest.approx(2 ** 0.5)


@pytest.mark.parametrize("name", list(CASES))
def test_minicpm3_prefill_and_decode_match_hf(cases, name):
    """A 12-token prefill (every position's logits), then 4 tokens through the KV cache."""
    _, _, ids, ref, ours = cases[name]
    pre, dec = compare(ours, ref, ids)
    print(f"minicpm3 {name}: prefill {pre:.2e}, decode {dec:.2e} of max|ref| "
          f"{np.abs(ref).max():.2f}")
    assert pre <= TOL and dec <= TOL


def test_minicpm3_longrope_switches_per_forward(cases):
    """original context 8: a 5-token prefill uses the short factors, then each decode step
    reaching position 8 and beyond the long ones (and keys cached before keep theirs), as
    transformers' cache-driven decoding does."""
    model, _, ids, _, ours = cases["longrope_far"]
    n_prompt = 5
    ref = hf_stepwise_logits(model, ids, n_prompt)
    pre, dec = compare(ours, ref, ids, n_prompt=n_prompt)
    print(f"minicpm3 longrope switch: prefill {pre:.2e}, decode {dec:.2e}")
    assert pre <= TOL and dec <= TOL


def test_minicpm3_long_factors_matter(cases):
    """Negative control: reading short_factor in place of long_factor leaves the first
    positions as they were but puts the steps past the original context far off."""
    model, path, ids, ref, _ = cases["longrope_far"]
    spec = with_hf_config(md.load_spec(spec_path("minicpm3")),
                          rope_long="{rope_parameters['short_factor']}")
    wrong = md.load_model(spec, path, variant="tiny")
    pre, dec = compare(wrong, ref, ids)
    assert pre > 100 * TOL and dec > 100 * TOL


@pytest.mark.parametrize("name", list(CASES))
def test_minicpm3_greedy_generate_matches_hf(cases, name):
    """Greedy ids of transformers' generate, for one prompt and for three decoded together
    (prompts of 8, 3 and 7 tokens: with original context 8 they cross it at different steps)."""
    model, _, _, _, ours = cases[name]
    assert_greedy_matches_hf(model, ours, PROMPTS, N_NEW)


def test_minicpm3_generations_are_not_degenerate(cases):
    """The seeded tied model does not just repeat tokens (else greedy matching proves little)."""
    ours = cases["longrope"][4]
    ids = [t for out in ours.generate(PROMPTS, N_NEW, temperature=0) for t in out.ids]
    assert len(set(ids)) >= 8, ids


@pytest.mark.parametrize("key, wrong", [
    ("scale_emb", "{1}"),
    ("scale_depth", "{num_hidden_layers ** 0.5}"),          # residual scale 1
    ("dim_model_base", "{hidden_size}"),                     # no logit scaling
    ("rope_short", "{None}"),                                # longrope factors of ones
])
def test_minicpm3_scalings_matter(cases, key, wrong):
    """Negative controls: each muP scaling (and the longrope short factors) read wrong from
    config.json puts the logits far off."""
    _, path, ids, ref, _ = cases["longrope"]
    spec = with_hf_config(md.load_spec(spec_path("minicpm3")), **{key: wrong})
    pre, dec = compare(md.load_model(spec, path, variant="tiny"), ref, ids)
    assert pre > 100 * TOL and dec > 100 * TOL


def test_minicpm3_batched_logits_match_single(cases):
    """Three prompts in one batched prefill give each prompt's own logits (the longrope
    switch is decided per sequence)."""
    model, _, _, _, ours = cases["longrope_far"]
    prompts = [list(range(10, 22)), [3, 4, 5], list(range(30, 37))]    # 12 (past 8), 3, 7 tokens
    for p in prompts:
        assert rel_err(ours.logits(p), hf_logits(model, p)) <= TOL
    outs = ours.generate(prompts, 4, temperature=0)
    import torch
    for p, o in zip(prompts, outs):
        want = model.generate(torch.tensor([p]), max_new_tokens=4, do_sample=False,
                              eos_token_id=None, pad_token_id=0)[0, len(p):].tolist()
        assert o.ids == want


def test_minicpm3_4b_remote_code_config_layout():
    """openbmb/MiniCPM3-4B's own config.json (the trust_remote_code layout: rope_scaling
    with "type", top-level rope_theta, no v_head_dim) gives the 4b sizes and the longrope
    factors."""
    from maxdecl.pipelines.model_loading import params_from_metadata

    short = [1.0 + 0.05 * k for k in range(16)]
    long = [1.0 + 2.0 * k for k in range(16)]
    meta = {"maxdecl.format": "hf", "architectures": ["MiniCPM3ForCausalLM"],
            "bos_token_id": 1, "eos_token_id": [2, 73440], "hidden_act": "silu",
            "hidden_size": 2560, "num_hidden_layers": 62, "intermediate_size": 6400,
            "max_position_embeddings": 32768, "num_attention_heads": 40,
            "num_key_value_heads": 40, "qk_nope_head_dim": 64, "qk_rope_head_dim": 32,
            "q_lora_rank": 768, "kv_lora_rank": 256, "rms_norm_eps": 1e-05,
            "rope_scaling": {"type": "longrope", "long_factor": long, "short_factor": short,
                             "original_max_position_embeddings": 32768},
            "vocab_size": 73448, "scale_emb": 12, "dim_model_base": 256, "scale_depth": 1.4,
            "rope_theta": 10000.0, "tie_word_embeddings": True}
    spec = md.load_spec(spec_path("minicpm3"))
    got = params_from_metadata(spec, meta)
    want = {k: v for k, v in spec.variants["4b"].items() if k not in ("rope_short", "rope_long")}
    assert {k: got[k] for k in want} == want
    assert got["rope_short"] == short and got["rope_long"] == long
