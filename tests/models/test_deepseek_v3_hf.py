"""specs/deepseek_v3.yaml against transformers' DeepseekV3ForCausalLM.

Small seeded float32 DeepSeek-V3s (hidden 64, 3 layers, vocab 128, eager attention):

- ``v3``: DeepSeek-V3's layout: the q_lora path (q_a -> RMSNorm -> q_b), interleaved
  RoPE, one dense layer, then MoE layers with 8 experts in 4 groups of which 2 are
  kept (n_group > 1, topk_group < n_group), norm_topk_prob, routed_scaling_factor 2.5;
- ``q_proj``: q_lora_rank null (q_proj), rotate_half RoPE (rope_interleave false), every
  layer MoE (first_k_dense_replace 0), one group, no renormalisation, 3 experts used,
  2 shared experts, v_head_dim != qk_nope_head_dim, the output tied to the embedding;
- ``yarn``: two dense layers, 2 groups of 4 (1 kept) and YaRN RoPE as DeepSeek-V3 ships
  it (mscale != mscale_all_dim here, so the cos/sin factor is not 1).

Every router has a non-zero ``e_score_correction_bias`` (a buffer that ``randomize``
leaves at zero, so it is set here). Each model is compared with transformers for a
prompt and decode steps through the latent KV cache (within 1e-5 of max|ref|), and by
greedy generation; a torch ``state_dict`` saved as one file (experts fused, as
transformers 5 holds them in memory) loads with the ``tiny`` variant's sizes. The
negative controls show that the bias, the group limit, norm_topk_prob, the RoPE layout,
YaRN and the weights each change the logits far beyond the tolerance.
"""

import json
import os
import shutil
from math import log

import numpy as np
import pytest

import maxdecl as md

from archhelp import TOL as MATCH_TOL
from archhelp import decoder_errors
from modelhelp import (TOL, assert_greedy_matches_hf, compare, hf_case, hf_logits, randomize,
                       spec_path, tiny_model, token_ids, with_hf_config)

pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

SPEC = spec_path("deepseek_v3")

YARN = dict(rope_type="yarn", rope_theta=10000.0, factor=8.0, original_max_position_embeddings=16,
            beta_fast=32, beta_slow=1, mscale=1.0, mscale_all_dim=0.5)

CONFIGS = {
    "v3": dict(),
    "q_proj": dict(q_lora_rank=None, rope_interleave=False, first_k_dense_replace=0,
                   n_group=1, topk_group=1, norm_topk_prob=False, routed_scaling_factor=1.0,
                   num_experts_per_tok=3, n_shared_experts=2, v_head_dim=24,
                   tie_word_embeddings=True),
    "yarn": dict(first_k_dense_replace=2, n_group=2, topk_group=1, rope_parameters=YARN,
                 max_position_embeddings=128),
}


def make_deepseek_v3(seed=0, **kw):
    import torch

    torch.manual_seed(seed)
    cfg = dict(vocab_size=128, hidden_size=64, intermediate_size=96, moe_intermediate_size=32,
               num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=4,
               q_lora_rank=24, kv_lora_rank=32, qk_nope_head_dim=16, qk_rope_head_dim=8,
               v_head_dim=12, n_routed_experts=8, n_shared_experts=1, num_experts_per_tok=2,
               n_group=4, topk_group=2, first_k_dense_replace=1, norm_topk_prob=True,
               routed_scaling_factor=2.5, rms_norm_eps=1e-6, max_position_embeddings=64,
               rope_theta=10000.0, tie_word_embeddings=False, attn_implementation="eager")
    cfg.update(kw)
    model = randomize(transformers.DeepseekV3ForCausalLM(transformers.DeepseekV3Config(**cfg)), seed)
    gen = torch.Generator().manual_seed(1000 + seed)
    with torch.no_grad():                # a buffer: randomize leaves it at zero
        for layer in model.model.layers:
            if hasattr(layer.mlp, "gate"):
                bias = layer.mlp.gate.e_score_correction_bias
                bias.copy_(0.5 * torch.randn(bias.shape, generator=gen))
        if cfg["tie_word_embeddings"]:   # a tied N(0, 1) table would dominate the logits
            model.model.embed_tokens.weight.mul_(0.1)
    return model


_BUILT = {}


def case(name, tmp_path_factory):
    """(model, HF folder, prompt ids, reference logits) of CONFIGS[name], built once."""
    if name not in _BUILT:
        model = make_deepseek_v3(seed=list(CONFIGS).index(name), **CONFIGS[name])
        _BUILT[name] = hf_case(model, tmp_path_factory.mktemp(f"dsv3_{name}"))
    return _BUILT[name]


def build(path, spec=SPEC):
    td = md.load_weights(path, spec=spec, variant="tiny")
    return md.build(spec, weights=td), td


def edited_copy(path, dst, edit=None, config=None) -> str:
    """A copy of the HF folder ``path`` with ``edit(tensors)`` applied to its weights and
    ``config`` entries changed in its config.json (negative controls)."""
    from safetensors.numpy import load_file, save_file

    dst = shutil.copytree(path, dst)
    if edit is not None:
        f = os.path.join(dst, "model.safetensors")
        tensors = load_file(f)
        edit(tensors)
        save_file(tensors, f, metadata={"format": "pt"})
    if config:
        with open(os.path.join(dst, "config.json")) as fh:
            cfg = json.load(fh)
        cfg.update(config)
        with open(os.path.join(dst, "config.json"), "w") as fh:
            json.dump(cfg, fh)
    return os.fspath(dst)


# -- loading -----------------------------------------------------------------------------

def test_params_and_weights_from_config(tmp_path_factory):
    _, path, _, _ = case("v3", tmp_path_factory)
    ours = tiny_model("deepseek_v3", path)
    p = ours.params
    assert (p["dim"], p["n_layers"], p["n_dense"], p["n_heads"], p["vocab"]) == (64, 3, 1, 4, 128)
    assert (p["q_lora_rank"], p["kv_lora_rank"], p["qk_nope_dim"], p["qk_rope_dim"], p["v_dim"]) \
        == (24, 32, 16, 8, 12)
    assert (p["n_expert"], p["n_expert_used"], p["n_expert_shared"]) == (8, 2, 1)
    assert (p["n_group"], p["topk_group"], p["norm_topk_prob"]) == (4, 2, True)
    assert p["routed_scale"] == pytest.approx(2.5) and p["rope_style"] == "normal"
    assert p["rope_type"] == "none" and p["attn_scale"] == pytest.approx(24 ** -0.5)
    w = ours.weights
    assert w["blk.0.ffn_gate.weight"].shape == (96, 64) and "blk.0.ffn_gate_inp.weight" not in w
    assert w["blk.1.ffn_gate_exps.weight"].shape == (8, 32, 64)
    assert w["blk.2.ffn_down_shexp.weight"].shape == (64, 32)
    assert np.abs(np.asarray(w["blk.1.exp_probs_b.bias"])).max() > 0.1      # the bias is read
    assert ours.session.initial_state()["blk.0.kv_cache"].shape == (2, 0, 1, 40)   # latent
    q = tiny_model("deepseek_v3", case("q_proj", tmp_path_factory)[1])
    assert q.params["q_lora_rank"] == 0 and q.params["rope_style"] == "neox"
    assert "blk.0.attn_q.weight" in q.weights and "blk.0.attn_q_a.weight" not in q.weights
    assert "output.weight" not in q.weights                 # tied: the embedding stands in


# -- against transformers ------------------------------------------------------------------

@pytest.mark.parametrize("name", list(CONFIGS))
def test_prefill_and_decode_match_hf(name, tmp_path_factory):
    _, path, ids, ref = case(name, tmp_path_factory)
    g, td = build(path)
    pre, dec = decoder_errors(g, td, ref, ids)
    print(f"deepseek_v3 {name} vs HF: prefill {pre:.2e}, decode {dec:.2e} (of max|ref|)")
    assert pre <= MATCH_TOL and dec <= MATCH_TOL


def test_greedy_generation_matches_hf(tmp_path_factory):
    model, path, ids, _ = case("v3", tmp_path_factory)
    ours = tiny_model("deepseek_v3", path)
    # assert_greedy_matches_hf calls HF generate with pad_token_id=0 and no attention
    # mask, so a prompt must not hold token 0 (ids[13] is 0 here): HF would mask it
    prompts = [ids[:7], ids[2:5], ids[6:13]]
    assert all(0 not in p for p in prompts)
    assert_greedy_matches_hf(model, ours, prompts, 6)


def test_fused_state_dict_file_matches_hf(tmp_path):
    """transformers 5's in-memory names (experts.gate_up_proj [E, 2F, D], split by the
    spec; experts.down_proj [E, D, F]) in one .safetensors without config.json: the
    ``tiny`` variant gives the sizes, so the model is built to them."""
    from safetensors.torch import save_file

    model = make_deepseek_v3(seed=7, intermediate_size=128, q_lora_rank=32, v_head_dim=16,
                             vocab_size=256)
    sd = {k: v.contiguous() for k, v in model.state_dict().items()}
    assert "model.layers.1.mlp.experts.gate_up_proj" in sd
    save_file(sd, str(tmp_path / "model.safetensors"), metadata={"format": "pt"})
    ids = token_ids(256)
    ours = md.load_model(SPEC, str(tmp_path / "model.safetensors"), variant="tiny")
    assert ours.weights["blk.1.ffn_up_exps.weight"].shape == (8, 32, 64)
    pre, dec = compare(ours, hf_logits(model, ids), ids)
    assert pre <= MATCH_TOL and dec <= MATCH_TOL


# -- negative controls: each part matters ----------------------------------------------------

@pytest.mark.parametrize("name, change", [
    ("v3", {"n_group": 1, "topk_group": 1}),                 # the group limit matters
    ("yarn", {"topk_group": 2}),                             # ... here too
    ("v3", {"norm_topk_prob": "{False}"}),                   # renormalisation matters
    ("v3", {"routed_scale": 1.0}),                           # routed_scaling_factor matters
    ("v3", {"rope_interleave": "{False}"}),                  # the RoPE pairing matters
    ("q_proj", {"rope_interleave": "{True}"}),
    ("yarn", {"rope_type": "{'none'}"}),                     # YaRN matters
    ("yarn", {"yarn_attn_factor": 1.0}),                     # its cos/sin factor matters
    ("yarn", {"yarn_log_mul": 0.0}),                         # its softmax-scale mscale matters
])
def test_negative_controls_config(name, change, tmp_path_factory):
    _, path, ids, ref = case(name, tmp_path_factory)
    g, td = build(path, with_hf_config(md.load_spec(SPEC), **change))
    pre, dec = decoder_errors(g, td, ref, ids)
    print(f"negative control: prefill {pre:.2e}, decode {dec:.2e}")
    assert max(pre, dec) > 100 * TOL, (pre, dec)


def _zero_bias(t):
    for k in t:
        if k.endswith("e_score_correction_bias"):
            t[k] = np.zeros_like(t[k])


def _perturb_kv_b(t):
    k = "model.layers.1.self_attn.kv_b_proj.weight"
    t[k] = t[k] + 0.1 * np.random.default_rng(0).standard_normal(t[k].shape).astype(t[k].dtype)


@pytest.mark.parametrize("name, edit", [
    ("v3", _zero_bias),              # e_score_correction_bias matters (the expert choice)
    ("q_proj", _zero_bias),
    ("v3", _perturb_kv_b),           # a perturbed weight gives a large error
])
def test_negative_controls_weights(name, edit, tmp_path_factory, tmp_path):
    _, path, ids, ref = case(name, tmp_path_factory)
    g, td = build(edited_copy(path, tmp_path / "edited", edit))
    pre, dec = decoder_errors(g, td, ref, ids)
    print(f"negative control: prefill {pre:.2e}, decode {dec:.2e}")
    assert max(pre, dec) > 100 * TOL, (pre, dec)


def test_hub_style_config_reads_the_same(tmp_path_factory, tmp_path):
    """DeepSeek-V3's own config.json layout (rope_scaling with `type`, a top-level
    rope_theta, topk_method and scoring_func keys) gives the params transformers 5's does."""
    _, path, ids, ref = case("yarn", tmp_path_factory)
    with open(os.path.join(path, "config.json")) as fh:
        rp = dict(json.load(fh)["rope_parameters"])
    theta = rp.pop("rope_theta")
    rp["type"] = rp.pop("rope_type")
    hub = edited_copy(path, tmp_path / "hub", config=dict(
        rope_parameters=None, rope_scaling=rp, rope_theta=theta, topk_method="noaux_tc",
        scoring_func="sigmoid"))
    a, b = tiny_model("deepseek_v3", path), tiny_model("deepseek_v3", hub)
    assert a.params == b.params and b.params["rope_type"] == "yarn"
    assert b.params["yarn_attn_factor"] == pytest.approx((0.1 * log(8) + 1) / (0.05 * log(8) + 1))
    pre, dec = compare(b, ref, ids)
    assert pre <= MATCH_TOL and dec <= MATCH_TOL


@pytest.mark.parametrize("config, why", [
    ({"attention_bias": True}, "attention biases"),
    ({"rope_parameters": {"rope_type": "linear", "factor": 2.0, "rope_theta": 1e4}},
     "RoPE scaling linear"),
    ({"quantization_config": {"quant_method": "fp8"}}, "quantized checkpoint"),
])
def test_refused_configs(config, why, tmp_path_factory, tmp_path):
    _, path, _, _ = case("v3", tmp_path_factory)
    bad = edited_copy(path, tmp_path / "bad", config=config)
    with pytest.raises(md.WeightsError, match=why):
        md.load_weights(bad, spec=SPEC, variant="tiny")
