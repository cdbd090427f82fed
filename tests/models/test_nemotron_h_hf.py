"""specs/nemotron_h.yaml against transformers' NemotronHForCausalLM.

Small seeded float32 Nemotron-H models (dim 64) whose layer patterns mix the four
mixers: Mamba-2 ('M': 8 heads of 8 in 2 groups, state 16, conv 4), attention
without positional encoding ('*': 4 query and 2 key/value heads of 16), the
squared-ReLU MLP ('-') and the sigmoid-routed MoE ('E': 8 non-gated experts, 2 per
token, a shared expert, group-limited routing with a score-correction bias, an
optional latent projection). HF's Mamba-2 prefill runs its chunked scan over chunks
of 8 (so a 12-token prompt crosses a chunk boundary); decoding then steps through
the conv/SSM states and the KV caches.
"""

import json
import os

import numpy as np
import pytest

import maxdecl as md

from archhelp import TOL, decoder_errors, error_with_state_reset, load, mamba2_dynamics
from modelhelp import (assert_greedy_matches_hf, compare, hf_logits, hf_params, randomize,
                       save_hf, spec_path, token_ids, with_hf_config)

pytest.importorskip("torch")
pytest.importorskip("transformers")

VOCAB = 128
N_TOKENS = 16                  # 12 prompt tokens, then 4 decode steps
PROMPTS = [[3, 17, 42, 99, 5, 7, 64, 1], [8, 9, 120], [5, 60, 33, 2, 90, 11, 7]]
N_NEW = 6

CASES = {
    # Mamba-2, MLP, attention: the brief's hybrid pattern
    "hybrid": dict(hybrid_override_pattern="M-M*-"),
    # MoE: 4 groups of 2 experts, the best 2 groups kept; score-correction bias
    "moe": dict(hybrid_override_pattern="ME*-E", n_group=4, topk_group=2),
    # MoE through a latent projection, unnormalised top-k weights scaled by 2.5,
    # and every optional bias (use_bias: Mamba in/out projections; mlp_bias: MLPs,
    # shared experts and latent projections)
    "latent": dict(hybrid_override_pattern="M*E-", moe_latent_size=24, norm_topk_prob=False,
                   routed_scaling_factor=2.5, use_bias=True, mlp_bias=True),
}


def make_nemotron_h(seed=0, **kw):
    import torch
    import transformers

    torch.manual_seed(seed)
    cfg = dict(vocab_size=VOCAB, hidden_size=64, num_attention_heads=4, num_key_value_heads=2,
               head_dim=16, intermediate_size=96, mamba_num_heads=8, mamba_head_dim=8,
               n_groups=2, ssm_state_size=16, conv_kernel=4, chunk_size=8,
               n_routed_experts=8, num_experts_per_tok=2, moe_intermediate_size=32,
               moe_shared_expert_intermediate_size=48, n_group=1, topk_group=1,
               layer_norm_epsilon=1e-5, max_position_embeddings=64,
               attn_implementation="eager")
    cfg.update(kw)
    model = randomize(transformers.NemotronHForCausalLM(transformers.NemotronHConfig(**cfg)),
                      seed)
    gen = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for layer in model.model.layers:
            if layer.block_type == "linear_attention":
                mamba2_dynamics(layer.mixer, cfg["mamba_num_heads"], gen)
            elif layer.block_type == "moe":     # a buffer: randomize leaves it at zeros
                bias = layer.mixer.gate.e_score_correction_bias
                bias.copy_(0.1 * torch.randn(bias.shape, generator=gen))
    return model


@pytest.fixture(scope="module")
def cases(tmp_path_factory):
    """name -> (HF model, save_pretrained folder, ids, HF logits of the whole sequence)."""
    out = {}
    for k, (name, kw) in enumerate(CASES.items()):
        model = make_nemotron_h(seed=k, **kw)
        path = save_hf(model, tmp_path_factory.mktemp(f"nemotron_h_{name}"))
        ids = token_ids(VOCAB, n=N_TOKENS, seed=7 + k)
        out[name] = (model, path, ids, hf_logits(model, ids))
    return out


@pytest.fixture(scope="module")
def ours(cases):
    return {name: md.load_model(spec_path("nemotron_h"), c[1]) for name, c in cases.items()}


def test_nemotron_h_config_from_hf(cases):
    _, path, _, _ = cases["hybrid"]
    got = hf_params("nemotron_h", path)[2]
    assert got["layer_types"] == ["linear_attention", "mlp", "linear_attention",
                                  "full_attention", "mlp"]
    assert (got["dim"], got["vocab"], got["context"]) == (64, VOCAB, 64)
    assert (got["n_heads"], got["n_kv_heads"], got["head_dim"], got["ffn_dim"]) == (4, 2, 16, 96)
    assert (got["ssm_heads"], got["ssm_head_dim"], got["ssm_groups"], got["d_state"],
            got["d_conv"]) == (8, 8, 2, 16, 4)
    assert got["mlp_act"] == "relu2" and got["mamba_act"] == "silu"
    assert got["norm_eps"] == pytest.approx(1e-5) and got["dt_min"] == pytest.approx(1e-3)
    assert got["moe_latent"] == 0
    got = hf_params("nemotron_h", cases["latent"][1])[2]
    assert (got["moe_latent"], got["norm_topk_prob"], got["routed_scale"]) == (24, False, 2.5)


def test_nemotron_h_params_derived(ours):
    p = ours["hybrid"].params
    assert p["n_layers"] == 5
    assert (p["d_inner"], p["conv_dim"], p["d_in_proj"]) == (64, 128, 200)


@pytest.mark.parametrize("name", list(CASES))
def test_nemotron_h_prefill_and_decode_match_hf(cases, ours, name):
    """Prefill logits of 12 tokens, then 4 tokens one at a time through the states."""
    model, path, ids, ref = cases[name]
    pre, dec = compare(ours[name], ref, ids)
    print(f"nemotron_h {name} vs HF: prefill {pre:.2e}, decode {dec:.2e} (of max|ref|)")
    assert pre <= TOL and dec <= TOL


@pytest.mark.parametrize("name", list(CASES))
def test_nemotron_h_low_level_stepping_matches_hf(cases, name):
    """The same through md.load_weights / md.build / md.compile (every state by name)."""
    _, path, ids, ref = cases[name]
    g, td = load("nemotron_h", path)
    names = [v.name for v in g.inputs]
    pattern = CASES[name]["hybrid_override_pattern"]
    for i, t in enumerate(pattern):
        assert (f"blk.{i}.conv_state" in names) == (t == "M")
        assert (f"blk.{i}.ssm_state" in names) == (t == "M")
        assert (f"blk.{i}.kv_cache" in names) == (t == "*")
    pre, dec = decoder_errors(g, td, ref, ids)
    assert pre <= TOL and dec <= TOL


@pytest.mark.parametrize("name", ["hybrid", "moe"])
def test_nemotron_h_greedy_generate_matches_hf(cases, ours, name):
    assert_greedy_matches_hf(cases[name][0], ours[name], PROMPTS, N_NEW)


@pytest.mark.parametrize("state", ["conv_state", "ssm_state", "kv_cache"])
def test_nemotron_h_every_state_matters(cases, state):
    """Negative control: resetting one kind of state after the prefill spoils decoding."""
    _, path, ids, ref = cases["hybrid"]
    g, td = load("nemotron_h", path)
    assert error_with_state_reset(g, td, ref, ids, reset=state) > 10 * TOL


def test_nemotron_h_group_routing_matters(cases):
    """Negative control: the 'moe' case routes within the best 2 of 4 expert groups;
    routing over all experts (topk_group read as 4) gives other logits."""
    _, path, ids, ref = cases["moe"]
    spec = with_hf_config(md.load_spec(spec_path("nemotron_h")), n_expert_groups_used="{4}")
    pre, dec = compare(md.load_model(spec, path), ref, ids)
    assert max(pre, dec) > 10 * TOL


def test_nemotron_h_legacy_config_keys(cases, tmp_path):
    """Older config.json files (the released Nemotron-H checkpoints) spell the layer
    types as hybrid_override_pattern and the Mamba sizes with a mamba_ prefix."""
    model, path, ids, ref = cases["hybrid"]
    legacy = tmp_path / "legacy"
    legacy.mkdir()
    cfg = json.load(open(os.path.join(path, "config.json")))
    for key in ("layers_block_type", "n_groups", "conv_kernel", "time_step_min"):
        cfg.pop(key)
    cfg.update(hybrid_override_pattern="M-M*-", num_hidden_layers=5, mamba_n_groups=2,
               mamba_d_conv=4, mamba_dt_min=0.001)
    json.dump(cfg, open(legacy / "config.json", "w"))
    os.symlink(os.path.join(path, "model.safetensors"), legacy / "model.safetensors")
    got = hf_params("nemotron_h", legacy)[2]
    assert got["layer_types"] == ["linear_attention", "mlp", "linear_attention",
                                  "full_attention", "mlp"]
    assert (got["ssm_groups"], got["d_conv"]) == (2, 4)
    pre, dec = compare(md.load_model(spec_path("nemotron_h"), str(legacy)), ref, ids)
    assert pre <= TOL and dec <= TOL


def test_nemotron_h_unknown_layer_type_is_refused(cases, tmp_path):
    _, path, _, _ = cases["hybrid"]
    bad = tmp_path / "bad"
    bad.mkdir()
    cfg = json.load(open(os.path.join(path, "config.json")))
    cfg["layers_block_type"] = ["linear_attention", "sliding_attention"]
    json.dump(cfg, open(bad / "config.json", "w"))
    os.symlink(os.path.join(path, "model.safetensors"), bad / "model.safetensors")
    with pytest.raises(md.WeightsError, match="unknown layer types"):
        md.load_model(spec_path("nemotron_h"), str(bad))


def test_nemotron_h_in_memory_state_dict(cases, tmp_path):
    """A torch state_dict saved as one file (transformers 5's in-memory names: model.*,
    the experts fused as experts.up_proj [E, F, D]) with the config beside it."""
    from safetensors.torch import save_file

    model, path, ids, ref = cases["moe"]
    sd = {k: v.contiguous() for k, v in model.state_dict().items()}
    assert "model.layers.1.mixer.experts.up_proj" in sd
    folder = tmp_path / "sd"
    folder.mkdir()
    save_file(sd, str(folder / "model.safetensors"))
    with open(os.path.join(path, "config.json")) as f:
        (folder / "config.json").write_text(f.read())
    pre, dec = compare(md.load_model(spec_path("nemotron_h"), str(folder)), ref, ids)
    assert pre <= TOL and dec <= TOL
