"""specs/jamba.yaml against transformers' JambaForCausalLM (small random configs).

A seeded float32 Jamba (dim 64, 4 layers, GQA 4 / 2 heads, 4 experts with 2 used per
token, vocab 256) whose layer pattern comes from config.json: attention on the odd
layers (attn_layer_period 2, offset 1), Mamba on the even ones, MoE on layers 0 and 3
(expert_layer_period 3, offset 0), so every pairing occurs once or more (Mamba + MoE,
attention + dense, Mamba + dense, attention + MoE). It is saved with save_pretrained and
loaded by maxdecl from the directory; a prefill, then one token at a time through the KV
caches and the conv / SSM states, matches transformers' logits, and greedy generation
gives transformers' ids. A second config (another pattern, tied output, projection
biases, no conv bias, GELU) checks that the pattern and the optional parts follow
config.json and the checkpoint.
"""

import numpy as np
import pytest

import maxdecl as md
from archhelp import TOL, decoder_errors, error_with_state_reset, load
from modelhelp import (assert_greedy_matches_hf, compare, hf_case, randomize,
                       spec_path)

pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")


def make_jamba(seed=0, **kw):
    """JambaForCausalLM, float32: dim 64, 4 layers, 4 / 2 heads, 4 experts (2 used),
    Mamba d_inner 128, d_state 8, d_conv 4, dt_rank 6, vocab 256, untied output."""
    import torch

    torch.manual_seed(seed)
    cfg = dict(vocab_size=256, hidden_size=64, intermediate_size=96, num_hidden_layers=4,
               num_attention_heads=4, num_key_value_heads=2, num_experts=4,
               num_experts_per_tok=2, attn_layer_period=2, attn_layer_offset=1,
               expert_layer_period=3, expert_layer_offset=0, mamba_d_state=8,
               mamba_d_conv=4, mamba_expand=2, mamba_dt_rank=6, rms_norm_eps=1e-6,
               max_position_embeddings=64, use_mamba_kernels=False,
               tie_word_embeddings=False, attn_implementation="eager",
               pad_token_id=0, bos_token_id=1, eos_token_id=2)
    cfg.update(kw)
    return randomize(transformers.JambaForCausalLM(transformers.JambaConfig(**cfg)), seed)


def kinds(graph) -> dict:
    """{layer index: (mixer, mlp)} from the ops each block's graph holds."""
    ops = {}
    for n in graph.nodes:
        parts = n.layer.split(".")
        if parts[0] == "blk":
            ops.setdefault(int(parts[1]), set()).add(n.op)
    return {i: ("attention" if "attention" in o else "mamba" if "selective_scan" in o else "?",
                "moe" if "expert_linear" in o else "dense")
            for i, o in sorted(ops.items())}


def hf_kinds(cfg) -> dict:
    return {i: (t, "moe" if e > 1 else "dense")
            for i, (t, e) in enumerate(zip(cfg.layers_block_type, cfg.layers_num_experts))}


@pytest.fixture(scope="module")
def jamba(tmp_path_factory):
    return hf_case(make_jamba(), tmp_path_factory.mktemp("jamba_hf"))


@pytest.fixture(scope="module")
def jamba_model(jamba):
    _, path, _, _ = jamba
    return md.load_model(spec_path("jamba"), path, variant="tiny")


def test_jamba_weights_and_pattern_from_config(jamba):
    model, path, _, _ = jamba
    td = md.load_weights(path, spec=spec_path("jamba"), variant="tiny")
    p = td.params
    assert (p["attn_layer_period"], p["attn_layer_offset"]) == (2, 1)
    assert (p["expert_layer_period"], p["expert_layer_offset"]) == (3, 0)
    assert p["dt_rank"] == 6 and p["d_inner"] == 128 and p["n_expert"] == 4
    assert td["blk.0.ffn_gate_exps.weight"].shape == (4, 96, 64)      # experts stacked
    assert td["blk.3.ffn_down_exps.weight"].shape == (4, 64, 96)
    assert "blk.1.ffn_gate.weight" in td and "blk.1.ffn_gate_exps.weight" not in td
    assert "blk.1.attn_q.weight" in td and "blk.1.ssm_in.weight" not in td
    assert td["blk.2.ssm_conv1d.weight"].shape == (128, 4)             # squeezed
    mixer = model.model.layers[2].mamba
    np.testing.assert_allclose(td["blk.2.ssm_scan.a"], -np.exp(mixer.A_log.detach().numpy()),
                               rtol=1e-6)
    np.testing.assert_array_equal(td["blk.2.ssm_dt_norm.weight"],
                                  mixer.dt_layernorm.weight.detach().numpy())
    assert "output.weight" in td                                       # untied
    g = md.build(spec_path("jamba"), weights=td)
    assert kinds(g) == hf_kinds(model.config) == {
        0: ("mamba", "moe"), 1: ("attention", "dense"),
        2: ("mamba", "dense"), 3: ("attention", "moe")}
    # state: a KV cache per attention layer, conv + SSM states per Mamba layer
    state = [v.name for v in g.inputs if v.name in g.output_names]
    assert state == ["blk.0.ssm_conv1d.conv_state", "blk.0.ssm_scan.ssm_state",
                     "blk.1.attn.kv_cache", "blk.2.ssm_conv1d.conv_state",
                     "blk.2.ssm_scan.ssm_state", "blk.3.attn.kv_cache"]


def test_jamba_prefill_and_decode_match_hf(jamba):
    """md.build + md.compile, stepped by hand through every state."""
    _, path, ids, ref = jamba
    g, td = load("jamba", path)
    pre, dec = decoder_errors(g, td, ref, ids)
    print(f"jamba vs HF: prefill {pre:.2e}, decode {dec:.2e} (of max|ref|)")
    assert pre <= TOL and dec <= TOL


def test_jamba_model_session_matches_hf(jamba, jamba_model):
    """The same through md.load_model's session (what generate uses)."""
    _, _, ids, ref = jamba
    pre, dec = compare(jamba_model, ref, ids)
    print(f"jamba (session) vs HF: prefill {pre:.2e}, decode {dec:.2e} (of max|ref|)")
    assert pre <= TOL and dec <= TOL


@pytest.mark.parametrize("reset", ["kv_cache", "ssm_state", "conv_state"])
def test_jamba_every_state_matters(jamba, reset):
    """Negative controls: a decode step with one kind of state reset to zeros diverges."""
    _, path, ids, ref = jamba
    g, td = load("jamba", path)
    assert error_with_state_reset(g, td, ref, ids, reset) > 100 * TOL


def test_jamba_greedy_matches_hf(jamba, jamba_model):
    model, _, ids, _ = jamba
    prompts = [ids[:10], ids[3:8], ids[5:14]]
    assert_greedy_matches_hf(model, jamba_model, prompts, n_new=6)


def test_jamba_other_pattern_tied_biases(tmp_path):
    """Attention on layer 2 only (period 4, offset 2), MoE on layers 1 and 3 (period 2,
    offset 1), tied output, in/out projection biases, no conv bias, GELU activations."""
    model = make_jamba(seed=3, attn_layer_period=4, attn_layer_offset=2,
                       expert_layer_period=2, expert_layer_offset=1, num_experts=3,
                       tie_word_embeddings=True, mamba_proj_bias=True, mamba_conv_bias=False,
                       hidden_act="gelu")
    _, path, ids, ref = hf_case(model, tmp_path / "hf")
    g, td = load("jamba", path)
    assert "output.weight" not in td and "blk.0.ssm_in.bias" in td
    assert "blk.0.ssm_conv1d.bias" not in td
    assert kinds(g) == hf_kinds(model.config) == {
        0: ("mamba", "dense"), 1: ("mamba", "moe"),
        2: ("attention", "dense"), 3: ("mamba", "moe")}
    pre, dec = decoder_errors(g, td, ref, ids)
    print(f"jamba (tied, biases, gelu) vs HF: prefill {pre:.2e}, decode {dec:.2e}")
    assert pre <= TOL and dec <= TOL


def test_jamba_config_defaults_and_refusal():
    """Keys a config.json leaves out take JambaConfig's defaults, not the tiny variant's
    (dt_rank "auto" = ceil(hidden_size / 16)); offsets past their periods are refused."""
    from maxdecl.pipelines.model_loading import params_from_metadata

    spec = md.load_spec(spec_path("jamba"), variant="tiny")
    got = params_from_metadata(spec, {"maxdecl.format": "hf", "hidden_size": 200,
                                      "mamba_dt_rank": "auto"})
    assert (got["attn_layer_period"], got["attn_layer_offset"]) == (8, 4)
    assert (got["expert_layer_period"], got["expert_layer_offset"]) == (2, 1)
    assert got["dt_rank"] == 13 and got["d_inner"] == 400 and got["n_expert"] == 16
    with pytest.raises(md.WeightsError, match="offsets must be smaller"):
        params_from_metadata(spec, {"maxdecl.format": "hf", "attn_layer_period": 2,
                                    "attn_layer_offset": 2})


def test_jamba_without_experts(tmp_path):
    """num_experts 1: every layer has the dense MLP (no router, no expert weights)."""
    model = make_jamba(seed=5, num_experts=1, num_experts_per_tok=1)
    _, path, ids, ref = hf_case(model, tmp_path / "hf")
    g, td = load("jamba", path)
    assert not any(n.endswith("_exps.weight") or ".ffn_gate_inp." in n for n in td.keys())
    assert {m for _, m in kinds(g).values()} == {"dense"}
    pre, dec = decoder_errors(g, td, ref, ids)
    assert pre <= TOL and dec <= TOL
