"""specs/glm4_moe.yaml against transformers' Glm4MoeForCausalLM.

A small seeded float32 GLM-4 MoE: 3 layers (the first dense, first_k_dense_replace 1,
the others MoE), GQA (4 query heads, 2 kv heads) with head_dim 32 != dim / n_heads,
q/k/v biases, per-head q/k RMSNorm, partial rotary (half of each head, rotate-half
layout), a sigmoid router with a random e_score_correction_bias and group-limited
top-k (8 experts in 4 groups, the best 2 groups, 3 experts a token), normalised top-k
weights times routed_scaling_factor 2.5, and one shared expert. A second config turns
the optional parts off (no biases, no q/k norm, one group, unnormalised weights, two
dense layers, tied output).
"""

import numpy as np
import pytest

import maxdecl as md

from modelhelp import (assert_greedy_matches_hf, compare, hf_case, hf_params, randomize,
                       save_hf, spec_path, with_hf_config)

pytest.importorskip("torch")
pytest.importorskip("transformers")

TOL = 1e-5            # max|ours - ref| <= TOL * max|ref|, prefill and decode alike
PROMPTS = [[3, 17, 42, 99, 5, 7, 64, 1], [8, 9, 120], [5, 60, 33, 2, 90, 11, 7]]
N_NEW = 8

BASE = dict(vocab_size=256, hidden_size=64, intermediate_size=96, num_hidden_layers=3,
            num_attention_heads=4, num_key_value_heads=2, head_dim=32,
            moe_intermediate_size=24, n_routed_experts=8, num_experts_per_tok=3,
            n_shared_experts=1, n_group=4, topk_group=2, first_k_dense_replace=1,
            norm_topk_prob=True, routed_scaling_factor=2.5, attention_bias=True,
            use_qk_norm=True, rms_norm_eps=1e-5, max_position_embeddings=64,
            tie_word_embeddings=False,
            rope_parameters={"rope_type": "default", "rope_theta": 10000.0,
                             "partial_rotary_factor": 0.5})

PLAIN = dict(BASE, attention_bias=False, use_qk_norm=False, n_group=1, topk_group=1,
             norm_topk_prob=False, routed_scaling_factor=1.0, first_k_dense_replace=2,
             num_hidden_layers=4, n_shared_experts=2, tie_word_embeddings=True,
             rope_parameters={"rope_type": "default", "rope_theta": 500000.0,
                              "partial_rotary_factor": 0.25})


def make_glm4_moe(seed=0, **kw):
    """Glm4MoeForCausalLM of BASE (updated by kw), randomized; e_score_correction_bias (a
    buffer randomize leaves at zero) drawn from 0.2 N(0, 1), about the spread of the
    sigmoid scores, so it changes which experts are chosen."""
    import torch
    import transformers

    torch.manual_seed(seed)
    cfg = dict(BASE, attn_implementation="eager")
    cfg.update(kw)
    model = randomize(transformers.Glm4MoeForCausalLM(transformers.Glm4MoeConfig(**cfg)), seed)
    gen = torch.Generator().manual_seed(seed + 100)
    with torch.no_grad():
        for name, b in sorted(model.named_buffers()):
            if name.endswith("e_score_correction_bias"):
                b.copy_(0.2 * torch.randn(b.shape, generator=gen))
    return model


@pytest.fixture(scope="module")
def glm(tmp_path_factory):
    return hf_case(make_glm4_moe(), tmp_path_factory.mktemp("glm4_moe_hf"))


@pytest.fixture(scope="module")
def plain(tmp_path_factory):
    return hf_case(make_glm4_moe(seed=1, **PLAIN), tmp_path_factory.mktemp("glm4_moe_plain"))


@pytest.fixture(scope="module")
def ours(glm):
    return md.load_model(spec_path("glm4_moe"), glm[1])


def errors(model, ref, ids):
    pre, dec = compare(model, ref, ids)
    print(f"glm4_moe vs HF: prefill {pre:.2e}, decode {dec:.2e} (of max|ref|)")
    return pre, dec


def test_glm4_moe_config_from_hf(glm):
    got = hf_params("glm4_moe", glm[1])[2]
    want = {"dim": 64, "n_layers": 3, "n_heads": 4, "n_kv_heads": 2, "head_dim": 32,
            "ffn_dim": 96, "moe_ffn_dim": 24, "n_expert": 8, "n_expert_used": 3,
            "n_shared": 1, "n_group": 4, "topk_group": 2, "n_dense": 1,
            "norm_topk_prob": True, "routed_scale": 2.5, "attn_bias": True,
            "qk_norm": True, "partial_rotary_factor": 0.5, "rope_theta": 10000.0,
            "rope_type": "default", "vocab": 256, "context": 64}
    assert {k: got.get(k) for k in want} == want


def test_glm4_moe_model_params(ours):
    p = ours.params
    assert (p["rot_dim"], p["group_size"], p["shared_ffn_dim"]) == (16, 2, 24)


def test_glm4_moe_prefill_and_decode_match_hf(glm, ours):
    """Every prompt position's logits in one prefill, then one token at a time through
    the KV cache, against transformers' logits of the whole sequence."""
    _, _, ids, ref = glm
    pre, dec = errors(ours, ref, ids)
    assert pre <= TOL and dec <= TOL


def test_glm4_moe_optional_parts_off_match_hf(plain):
    """No q/k/v biases, no q/k norm, one expert group, unnormalised top-k weights, two
    dense layers, two shared experts, a quarter of each head rotated, tied output."""
    _, path, ids, ref = plain
    model = md.load_model(spec_path("glm4_moe"), path)
    assert "output.weight" not in model.weights              # tied: the embedding stands in
    assert model.params["rot_dim"] == 8 and model.params["n_dense"] == 2
    pre, dec = errors(model, ref, ids)
    assert pre <= TOL and dec <= TOL


def test_glm4_moe_greedy_generate_matches_hf(glm, ours):
    assert_greedy_matches_hf(glm[0], ours, PROMPTS, N_NEW)


def test_glm4_moe_correction_bias_matters(glm):
    """Negative control: without e_score_correction_bias other experts are chosen."""
    _, path, ids, ref = glm
    td = md.load_weights(path)
    for i in (1, 2):
        name = f"model.layers.{i}.mlp.gate.e_score_correction_bias"
        td[name] = np.zeros_like(np.asarray(td[name]))
    pre, dec = errors(md.load_model(spec_path("glm4_moe"), td), ref, ids)
    assert pre > 100 * TOL


def test_glm4_moe_group_limit_matters(glm):
    """Negative control: letting every group through (topk_group = n_group) changes the
    choice, so the group-limited top-k is exercised."""
    _, path, ids, ref = glm
    spec = with_hf_config(md.load_spec(spec_path("glm4_moe")), topk_group="{n_group}")
    pre, dec = errors(md.load_model(spec, path), ref, ids)
    assert pre > 100 * TOL


def test_glm4_moe_fused_state_dict_loads(glm, tmp_path):
    """A torch state_dict saved as one file holds transformers 5's in-memory names (the
    experts fused as gate_up_proj [E, 2F, D]); without config.json the tiny variant,
    which is this config, gives the sizes."""
    import safetensors.torch

    model, _, ids, ref = glm
    sd = {k: v.contiguous() for k, v in model.state_dict().items()}
    assert "model.layers.1.mlp.experts.gate_up_proj" in sd
    f = tmp_path / "model.safetensors"
    safetensors.torch.save_file(sd, str(f))
    pre, dec = errors(md.load_model(spec_path("glm4_moe"), str(f), variant="tiny"), ref, ids)
    assert pre <= TOL and dec <= TOL


def test_glm4_moe_refuses_rope_scaling(tmp_path):
    model = make_glm4_moe(seed=2, num_hidden_layers=2, rope_parameters={
        "rope_type": "linear", "factor": 2.0, "rope_theta": 10000.0,
        "partial_rotary_factor": 0.5})
    path = save_hf(model, tmp_path / "scaled")
    with pytest.raises(md.WeightsError, match="RoPE scaling linear"):
        md.load_model(spec_path("glm4_moe"), path)


def test_glm4_moe_checkpoint_with_mtp_layer_loads(glm):
    """As released (num_nextn_predict_layers 1): the MTP layer's tensors after the last
    decoder layer are ignored and the logits are those of the decoder alone."""
    model, path, ids, ref = glm
    td = md.load_weights(path)
    n = model.config.num_hidden_layers
    last = f"model.layers.{n - 1}."
    for k in list(td.keys()):
        if k.startswith(last):
            td[k.replace(last, f"model.layers.{n}.")] = np.asarray(td[k])
    d, v = model.config.hidden_size, model.config.vocab_size
    for name, shape in [("eh_proj.weight", (d, 2 * d)), ("enorm.weight", (d,)),
                        ("hnorm.weight", (d,)), ("shared_head.norm.weight", (d,)),
                        ("shared_head.head.weight", (v, d)), ("embed_tokens.weight", (v, d))]:
        td[f"model.layers.{n}.{name}"] = np.ones(shape, np.float32)
    pre, dec = errors(md.load_model(spec_path("glm4_moe"), td), ref, ids)
    assert pre <= TOL and dec <= TOL
