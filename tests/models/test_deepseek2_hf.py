"""specs/deepseek2.yaml against transformers' DeepseekV2ForCausalLM (and llama.cpp).

Small seeded float32 DeepSeek-V2s: Multi-head Latent Attention (q_proj, or the q_lora
path q_a -> RMSNorm -> q_b; kv_a_proj_with_mqa giving the compressed kv and one shared
rope key; kv_a_layernorm; kv_b_proj per head), RoPE on the rope part only (complex
pairs), the first `first_k_dense_replace` layers dense (also 0 and 2), the others a
softmax top-k MoE (greedy and group_limited_greedy, routed_scaling_factor) plus shared
experts, RMSNorm, untied output; YaRN as DeepSeek-V2 ships it (and with an attention
factor other than 1). Prefill and decode through the latent KV cache, greedy ids.

The GGUFs are written as llama.cpp's converter (convert_hf_to_gguf.py, DeepseekV2Model)
writes them: head_count_kv 1, key_length kv_lora_rank + rope, value_length
kv_lora_rank, key_length_mla / value_length_mla, kv_b_proj split into attn_k_b (per head
transposed) and attn_v_b, experts stacked; and in the legacy layout (one attn_kv_b) that
llama.cpp still reads. llama.cpp itself runs them (skipped without llama_cpp).
"""

import json
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest

import maxdecl as md

from archhelp import TOL, decoder_errors
from modelhelp import (_add_tokenizer, _write, assert_greedy_matches_hf, hf_logits, hf_state,
                       llama_cpp_logits, randomize, save_hf, spec_path, tiny_model, token_ids,
                       with_hf_config)

pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

SPEC = spec_path("deepseek2")
LLAMA_CPP_TOL = 5e-3            # of max|ref|: llama.cpp's KV cache is f16

YARN = dict(rope_type="yarn", rope_theta=10000.0, factor=40.0,
            original_max_position_embeddings=16, beta_fast=32, beta_slow=1,
            mscale=0.707, mscale_all_dim=0.707)       # DeepSeek-V2's, on a short context

CONFIGS = {
    # V2-Lite's layout: q_proj, one dense layer, greedy routing
    "lite": dict(),
    # V2's query path (q_a -> norm -> q_b) and a routed scale
    "q_lora": dict(q_lora_rank=48, routed_scaling_factor=2.5),
    "all_moe": dict(first_k_dense_replace=0),
    "two_dense": dict(first_k_dense_replace=2, rms_norm_eps=1e-5),
    "group_limited": dict(topk_method="group_limited_greedy", n_group=4, topk_group=2),
    "yarn": dict(rope_parameters=YARN, max_position_embeddings=640),
    # mscale != mscale_all_dim: cos/sin times an attention factor of 1.094
    # V2's attention (q_lora) with YaRN: what llama.cpp's converter writes for V2
    "q_lora_yarn": dict(q_lora_rank=48, rope_parameters=YARN, max_position_embeddings=640),
    "yarn_attn_factor": dict(rope_parameters=dict(YARN, factor=8.0, mscale=1.0, mscale_all_dim=0.5),
                             max_position_embeddings=128),
}


def make_deepseek2(seed=0, **kw):
    import torch

    torch.manual_seed(seed)
    cfg = dict(vocab_size=320, hidden_size=256, intermediate_size=384, moe_intermediate_size=96,
               num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=4,
               q_lora_rank=None, kv_lora_rank=64, qk_nope_head_dim=32, qk_rope_head_dim=16,
               v_head_dim=32, n_routed_experts=8, n_shared_experts=2, num_experts_per_tok=3,
               first_k_dense_replace=1, rms_norm_eps=1e-6, max_position_embeddings=128,
               rope_theta=10000.0, tie_word_embeddings=False, attn_implementation="eager")
    cfg.update(kw)
    config = transformers.DeepseekV2Config(**cfg)
    return randomize(transformers.DeepseekV2ForCausalLM(config), seed)


_CASES = {}


def case(name, tmp_path_factory):
    """(model, HF folder, prompt ids, reference logits) of CONFIGS[name], built once."""
    if name not in _CASES:
        model = make_deepseek2(seed=len(_CASES), **CONFIGS[name])
        path = save_hf(model, tmp_path_factory.mktemp(f"ds2_{name}"))
        ids = token_ids(model.config.vocab_size)
        _CASES[name] = (model, path, ids, hf_logits(model, ids))
    return _CASES[name]


def build(path, spec=SPEC):
    td = md.load_weights(path, spec=spec, variant="tiny")
    return md.build(spec, weights=td), td


# -- transformers ----------------------------------------------------------------------

def test_params_from_config(tmp_path_factory):
    _, path, _, _ = case("lite", tmp_path_factory)
    got = md.load_weights(path, spec=SPEC, variant="tiny").params
    assert (got["q_lora_rank"], got["kv_lora_rank"], got["qk_rope_dim"]) == (0, 64, 16)
    assert (got["key_length"], got["value_length"], got["key_length_mla"]) == (48, 32, 0)
    assert (got["n_expert"], got["n_expert_used"], got["n_expert_shared"]) == (8, 3, 2)
    assert (got["n_dense"], got["n_layers"], got["vocab"], got["rope_type"]) == (1, 3, 320, "none")
    ours = tiny_model("deepseek2", path)
    assert ours.params["kv_split"] is False and ours.params["nope"] == 32
    assert ours.params["attn_scale"] == pytest.approx(48 ** -0.5)
    # dense layer 0 (ffn_*), MoE layers 1 and 2 (experts stacked, shared experts)
    w = ours.weights
    assert w["blk.0.ffn_gate.weight"].shape == (384, 256) and "blk.0.ffn_gate_inp.weight" not in w
    assert w["blk.2.ffn_gate_exps.weight"].shape == (8, 96, 256)
    assert w["blk.1.ffn_down_shexp.weight"].shape == (256, 192)
    assert ours.session.initial_state()["blk.0.kv_cache"].shape == (2, 0, 1, 80)   # latent


@pytest.mark.parametrize("name", list(CONFIGS))
def test_prefill_and_decode_match_hf(name, tmp_path_factory):
    _, path, ids, ref = case(name, tmp_path_factory)
    g, td = build(path)
    pre, dec = decoder_errors(g, td, ref, ids)
    print(f"deepseek2 {name} vs HF: prefill {pre:.2e}, decode {dec:.2e} (of max|ref|)")
    assert pre <= TOL and dec <= TOL


@pytest.mark.parametrize("name", ["lite", "yarn"])
def test_greedy_generation_matches_hf(name, tmp_path_factory):
    model, path, ids, _ = case(name, tmp_path_factory)
    ours = tiny_model("deepseek2", path)
    assert_greedy_matches_hf(model, ours, [ids[:7], ids[2:5], ids[5:14]], 8)


@pytest.mark.parametrize("name, change", [
    ("group_limited", {"topk_method": "{'greedy'}"}),       # the group mask matters
    ("yarn", {"rope_type": "{'none'}"}),                     # YaRN matters
    ("yarn_attn_factor", {"yarn_attn_factor": 1.0}),         # its cos/sin factor matters
    ("q_lora", {"routed_scale": 1.0}),                       # routed_scaling_factor matters
])
def test_negative_controls(name, change, tmp_path_factory):
    _, path, ids, ref = case(name, tmp_path_factory)
    g, td = build(path, with_hf_config(md.load_spec(SPEC), **change))
    pre, dec = decoder_errors(g, td, ref, ids)
    assert max(pre, dec) > 100 * TOL


def test_hub_style_config_reads_the_same(tmp_path_factory, tmp_path):
    """DeepSeek-V2-Lite's own config.json layout (rope_scaling with `type`, top-level
    rope_theta, q_lora_rank null, scoring_func) gives the params transformers 5's gives."""
    _, path, ids, ref = case("yarn", tmp_path_factory)
    hub = shutil.copytree(path, tmp_path / "hub")
    with open(os.path.join(hub, "config.json")) as f:
        cfg = json.load(f)
    rp = cfg.pop("rope_parameters")
    cfg["rope_theta"] = rp.pop("rope_theta")
    rp["type"] = rp.pop("rope_type")
    cfg.update(rope_scaling=rp, scoring_func="softmax", n_group=1, topk_group=1)
    with open(os.path.join(hub, "config.json"), "w") as f:
        json.dump(cfg, f)
    a = tiny_model("deepseek2", path).params
    b = tiny_model("deepseek2", hub).params
    assert a == b and b["rope_type"] == "yarn" and b["yarn_log_mul"] == pytest.approx(0.0707)
    g, td = build(hub)
    pre, dec = decoder_errors(g, td, ref, ids)
    assert pre <= TOL and dec <= TOL


@pytest.mark.parametrize("key, value, why", [
    ("norm_topk_prob", True, "norm_topk_prob"),
    ("topk_method", "noaux_tc", "topk_method noaux_tc"),
    ("scoring_func", "sigmoid", "scoring_func sigmoid"),
    ("rope_parameters", {"rope_type": "linear", "factor": 2.0, "rope_theta": 1e4},
     "RoPE scaling linear"),
])
def test_refused_configs(key, value, why, tmp_path_factory, tmp_path):
    _, path, _, _ = case("lite", tmp_path_factory)
    bad = shutil.copytree(path, tmp_path / "bad")
    with open(os.path.join(bad, "config.json")) as f:
        cfg = json.load(f)
    cfg[key] = value
    with open(os.path.join(bad, "config.json"), "w") as f:
        json.dump(cfg, f)
    with pytest.raises(md.WeightsError, match=why):
        md.load_weights(bad, spec=SPEC, variant="tiny")


# -- GGUF, as llama.cpp's converter writes it --------------------------------------------

def deepseek2_to_gguf(model, path, split=True, quantize=None, norm_topk_prob=None) -> str:
    """A DeepseekV2ForCausalLM as convert_hf_to_gguf.py's DeepseekV2Model writes it
    (``split``: attn_k_b / attn_v_b; else the legacy single attn_kv_b).
    ``norm_topk_prob`` overrides the expert_weights_norm key (transformers ignores it)."""
    import gguf

    cfg, sd = model.config, hf_state(model)
    h, r, rope = cfg.num_attention_heads, cfg.kv_lora_rank, cfg.qk_rope_head_dim
    nope, v, f = cfg.qk_nope_head_dim, cfg.v_head_dim, cfg.moe_intermediate_size
    w = gguf.GGUFWriter(os.fspath(path), "deepseek2")
    w.add_context_length(cfg.max_position_embeddings)
    w.add_embedding_length(cfg.hidden_size)
    w.add_block_count(cfg.num_hidden_layers)
    w.add_feed_forward_length(cfg.intermediate_size)
    w.add_head_count(h)
    w.add_head_count_kv(1 if split else h)          # MLA as MQA (the converter's override)
    w.add_layer_norm_rms_eps(cfg.rms_norm_eps)
    w.add_rope_freq_base(float(cfg.rope_parameters["rope_theta"]))
    w.add_expert_used_count(cfg.num_experts_per_tok)
    w.add_leading_dense_block_count(cfg.first_k_dense_replace)
    w.add_vocab_size(cfg.vocab_size)
    # the converter writes q_lora_rank only when set; llama.cpp then reads none only for
    # 26 or 27 layers (V2-Lite), so these 3-layer files state 0 (as maxdecl export does)
    w.add_q_lora_rank(cfg.q_lora_rank or 0)
    w.add_kv_lora_rank(r)
    if split:
        w.add_key_length(r + rope)
        w.add_value_length(r)
        w.add_key_length_mla(nope + rope)
        w.add_value_length_mla(v)
    else:
        w.add_key_length(nope + rope)
        w.add_value_length(v)
    w.add_expert_feed_forward_length(f)
    w.add_expert_count(cfg.n_routed_experts)
    w.add_expert_shared_count(cfg.n_shared_experts)
    w.add_expert_weights_scale(cfg.routed_scaling_factor)
    w.add_expert_weights_norm(cfg.norm_topk_prob if norm_topk_prob is None else norm_topk_prob)
    w.add_expert_gating_func(gguf.ExpertGatingFuncType.SOFTMAX)
    w.add_rope_dimension_count(rope)
    rp = cfg.rope_parameters
    if rp.get("rope_type") == "yarn":
        w.add_rope_scaling_type(gguf.RopeScalingType.YARN)
        w.add_rope_scaling_factor(rp["factor"])
        w.add_rope_scaling_orig_ctx_len(rp["original_max_position_embeddings"])
        w.add_rope_scaling_yarn_log_mul(0.1 * rp["mscale_all_dim"])
    _add_tokenizer(w, cfg.vocab_size)
    names, t = gguf.TENSOR_NAMES, gguf.MODEL_TENSOR
    layer = {"input_layernorm": t.ATTN_NORM, "self_attn.q_proj": t.ATTN_Q,
             "self_attn.q_a_proj": t.ATTN_Q_A, "self_attn.q_a_layernorm": t.ATTN_Q_A_NORM,
             "self_attn.q_b_proj": t.ATTN_Q_B, "self_attn.kv_a_proj_with_mqa": t.ATTN_KV_A_MQA,
             "self_attn.kv_a_layernorm": t.ATTN_KV_A_NORM, "self_attn.o_proj": t.ATTN_OUT,
             "post_attention_layernorm": t.FFN_NORM, "mlp.gate_proj": t.FFN_GATE,
             "mlp.up_proj": t.FFN_UP, "mlp.down_proj": t.FFN_DOWN, "mlp.gate": t.FFN_GATE_INP,
             "mlp.shared_experts.gate_proj": t.FFN_GATE_SHEXP,
             "mlp.shared_experts.up_proj": t.FFN_UP_SHEXP,
             "mlp.shared_experts.down_proj": t.FFN_DOWN_SHEXP}
    out = {"token_embd.weight": sd["model.embed_tokens.weight"]}
    for i in range(cfg.num_hidden_layers):
        p = f"model.layers.{i}."

        def put(kind, arr):
            out[names[kind].format(bid=i) + ".weight"] = arr

        for src, dst in layer.items():
            if p + src + ".weight" in sd:
                put(dst, sd[p + src + ".weight"])
        kv_b = sd[p + "self_attn.kv_b_proj.weight"]
        if split:                                    # [H, nope + v, r] -> k_b^T, v_b
            kv_b = kv_b.reshape(h, nope + v, r)
            put(t.ATTN_K_B, kv_b[:, :nope].transpose(0, 2, 1))       # [H, r, nope]
            put(t.ATTN_V_B, kv_b[:, nope:])                          # [H, v, r]
        else:
            put(t.ATTN_KV_B, kv_b)
        if p + "mlp.experts.down_proj" in sd:
            gate_up = sd[p + "mlp.experts.gate_up_proj"]            # [E, 2F, D]: gate, up
            put(t.FFN_GATE_EXP, gate_up[:, :f])
            put(t.FFN_UP_EXP, gate_up[:, f:])
            put(t.FFN_DOWN_EXP, sd[p + "mlp.experts.down_proj"])
    out["output_norm.weight"] = sd["model.norm.weight"]
    out["output.weight"] = sd["lm_head.weight"]
    _write(w, out, quantize)
    return os.fspath(path)


@pytest.mark.parametrize("name, split", [("q_lora", True), ("q_lora_yarn", True),
                                         ("lite", True), ("all_moe", False), ("yarn", False)])
def test_gguf_matches_hf_and_llama_cpp(name, split, tmp_path_factory, tmp_path):
    """The converter's file (split k_b / v_b, MQA keys) and the legacy one (attn_kv_b)
    run as transformers; llama.cpp runs them with the same logits."""
    model, _, ids, ref = case(name, tmp_path_factory)
    path = deepseek2_to_gguf(model, tmp_path / f"{name}.gguf", split=split)
    g, td = build(path)
    assert td.params.get("key_length_mla") == (48 if split else None)
    assert ("blk.0.attn_k_b.weight" in td) is split and ("blk.0.attn_kv_b.weight" in td) is not split
    pre, dec = decoder_errors(g, td, ref, ids)
    print(f"deepseek2 {name} GGUF (split={split}) vs HF: prefill {pre:.2e}, decode {dec:.2e}")
    assert pre <= TOL and dec <= TOL
    llama_cpp = pytest.importorskip("llama_cpp")
    theirs = llama_cpp_logits(llama_cpp, path, ids)
    err = np.abs(theirs - ref).max() / np.abs(ref).max()
    print(f"llama.cpp vs HF: {err:.2e} (of max|ref|)")
    assert err <= LLAMA_CPP_TOL


def test_gguf_q8_0_k_b_v_b_stay_packed(tmp_path_factory, tmp_path):
    """Q8_0 attn_k_b / attn_v_b (3-D, per head) run packed through expert_linear; the
    reference is transformers on kv_b_proj rebuilt from the dequantized blocks."""
    import copy

    import gguf
    import torch

    qt = gguf.GGMLQuantizationType.Q8_0

    def q8(name, arr):
        if name.endswith(("attn_k_b.weight", "attn_v_b.weight")):
            return gguf.quants.quantize(arr, qt), qt
        return None

    model, _, ids, _ = case("q_lora", tmp_path_factory)
    path = deepseek2_to_gguf(model, tmp_path / "q8.gguf", quantize=q8)
    g, td = build(path)
    kb = td["blk.1.attn_k_b.weight"]
    assert isinstance(kb, md.QuantizedTensor) and kb.encoding == "q8_0" and kb.shape == (4, 64, 32)
    deq, cfg = copy.deepcopy(model), model.config
    h, nope, r = cfg.num_attention_heads, cfg.qk_nope_head_dim, cfg.kv_lora_rank
    with torch.no_grad():
        for i, lyr in enumerate(deq.model.layers):
            k_b, v_b = (gguf.quants.dequantize(td[f"blk.{i}.attn_{n}_b.weight"].data, qt)
                        for n in ("k", "v"))
            kv_b = np.concatenate([k_b.reshape(h, r, nope).transpose(0, 2, 1),
                                   v_b.reshape(h, -1, r)], axis=1).reshape(-1, r)
            lyr.self_attn.kv_b_proj.weight.copy_(torch.from_numpy(np.ascontiguousarray(kv_b)))
    ref = hf_logits(deq, ids)
    pre, dec = decoder_errors(g, td, ref, ids)
    assert pre <= TOL and dec <= TOL


def test_llama_cpp_renormalises_as_the_spec(tmp_path_factory, tmp_path):
    """expert_weights_norm true: no transformers reference (it ignores norm_topk_prob),
    so maxdecl and llama.cpp are compared with each other."""
    llama_cpp = pytest.importorskip("llama_cpp")
    model, _, ids, ref = case("q_lora", tmp_path_factory)
    path = deepseek2_to_gguf(model, tmp_path / "norm.gguf", norm_topk_prob=True)
    g, td = build(path)
    assert td.params["norm_topk_prob"] is True
    ours = np.concatenate(_steps(g, td, ids))
    theirs = llama_cpp_logits(llama_cpp, path, ids)
    scale = np.abs(theirs).max()
    assert np.abs(ours - theirs).max() <= LLAMA_CPP_TOL * scale
    assert np.abs(ours - ref).max() > 100 * TOL * scale       # and renormalising matters


def _steps(g, td, ids, n_prompt=12):
    from archhelp import Stepper

    s = Stepper(g, td)
    pre, state = s.step(ids[:n_prompt], 0, s.initial_state())
    out = [pre]
    for pos in range(n_prompt, len(ids)):
        lg, state = s.step([ids[pos]], pos, state)
        out.append(lg[-1:])
    return out


def test_export_round_trip_runs_in_llama_cpp(tmp_path_factory, tmp_path):
    """`maxdecl export` of the HF folder (V2-Lite layout: q_proj, YaRN) writes the
    legacy attn_kv_b layout with its keys; it reads back with the same logits, and
    llama.cpp runs it (with a tokenizer added, which the HF folder lacks)."""
    import gguf

    model, path, ids, ref = case("yarn", tmp_path_factory)
    out = tmp_path / "exported.gguf"
    subprocess.run([sys.executable, "-m", "maxdecl", "export", "--spec", SPEC, "--variant", "tiny",
                    "-o", str(out), path], check=True, capture_output=True)
    reader = gguf.GGUFReader(out)
    keys = {f.name: f.contents() for f in reader.fields.values() if f.name.startswith("deepseek2.")}
    assert keys["deepseek2.attention.key_length"] == 48 and keys["deepseek2.attention.q_lora_rank"] == 0
    assert keys["deepseek2.rope.scaling.type"] == "yarn"
    assert "blk.1.attn_kv_b.weight" in {t.name for t in reader.tensors}
    g, td = build(out)
    pre, dec = decoder_errors(g, td, ref, ids)
    assert pre <= TOL and dec <= TOL
    llama_cpp = pytest.importorskip("llama_cpp")
    with_tok = tmp_path / "exported-tok.gguf"
    w = gguf.GGUFWriter(os.fspath(with_tok), "deepseek2")
    for f in reader.fields.values():
        if not f.name.startswith("GGUF.") and f.name != "general.architecture":
            w.add_key_value(f.name, f.contents(), f.types[0])
    _add_tokenizer(w, model.config.vocab_size)
    for t in reader.tensors:
        w.add_tensor(t.name, np.asarray(t.data).reshape([int(d) for d in reversed(t.shape)]))
    _write(w, {})
    theirs = llama_cpp_logits(llama_cpp, with_tok, ids)
    assert np.abs(theirs - ref).max() <= LLAMA_CPP_TOL * np.abs(ref).max()
