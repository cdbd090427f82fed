"""specs/mixtral.yaml and specs/qwen3_moe.yaml against transformers with small random
configs: 4-8 experts, 2 used per token, prefill and decode through the KV cache."""

import numpy as np
import pytest

import maxdecl as md
from archhelp import TOL, decoder_errors, load
from modelhelp import hf_case, hf_logits, randomize, save_hf, token_ids

pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")


def make_mixtral(seed=0):
    import torch

    torch.manual_seed(seed)
    cfg = transformers.MixtralConfig(
        vocab_size=96, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, num_local_experts=6,
        num_experts_per_tok=2, rms_norm_eps=1e-5, max_position_embeddings=64,
        rope_theta=1e6, tie_word_embeddings=False, attn_implementation="eager")
    return randomize(transformers.MixtralForCausalLM(cfg), seed)


@pytest.fixture(scope="module")
def mixtral(tmp_path_factory):
    model = make_mixtral()
    return hf_case(model, tmp_path_factory.mktemp("mixtral_hf"))


def test_mixtral_weights_stack_experts_and_read_config(mixtral):
    _, path, _, _ = mixtral
    td = md.load_weights(path, spec="specs/mixtral.yaml", variant="tiny")
    assert td["blk.1.ffn_gate_exps.weight"].shape == (6, 96, 64)     # experts stacked
    assert td["blk.0.ffn_down_exps.weight"].shape == (6, 64, 96)
    assert td.params["n_expert"] == 6 and td.params["n_expert_used"] == 2
    assert td.params["dim"] == 64


def test_mixtral_prefill_and_decode_match_hf(mixtral):
    _, path, ids, ref = mixtral
    g, td = load("mixtral", path)
    pre, dec = decoder_errors(g, td, ref, ids)
    print(f"mixtral vs HF: prefill {pre:.2e}, decode {dec:.2e} (of max|ref|)")
    assert pre <= TOL and dec <= TOL


def test_mixtral_quantized_experts_stay_close(mixtral):
    """q8_0 experts (3-D, quantized per expert row-wise) run the packed kernels."""
    _, path, ids, ref = mixtral
    g0, td = load("mixtral", path)
    codec = md.codecs.get("q8_0")
    for name in list(td.keys()):
        if name.endswith("_exps.weight"):
            w = np.asarray(td[name], np.float32)
            td[name] = md.QuantizedTensor(codec.quantize(w), w.shape, "q8_0")
    g = md.build("specs/mixtral.yaml", weights=td)
    pre, dec = decoder_errors(g, td, ref, ids)
    assert pre < 0.05 and dec < 0.05


def make_qwen3_moe(seed=0, norm_topk_prob=True):
    import torch

    torch.manual_seed(seed)
    cfg = transformers.Qwen3MoeConfig(
        vocab_size=96, hidden_size=64, moe_intermediate_size=48, intermediate_size=128,
        num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=24,
        num_experts=8, num_experts_per_tok=2, norm_topk_prob=norm_topk_prob,
        rms_norm_eps=1e-6, max_position_embeddings=64, rope_theta=1e6,
        tie_word_embeddings=False, attn_implementation="eager")
    return randomize(transformers.Qwen3MoeForCausalLM(cfg), seed)


@pytest.mark.parametrize("norm_topk_prob", [True, False])
def test_qwen3_moe_prefill_and_decode_match_hf(tmp_path, norm_topk_prob):
    model = make_qwen3_moe(seed=1, norm_topk_prob=norm_topk_prob)
    path = save_hf(model, tmp_path / "hf")
    ids = token_ids(model.config.vocab_size, seed=4)
    ref = hf_logits(model, ids)
    g, td = load("qwen3_moe", path)
    assert td.params["norm_topk_prob"] is norm_topk_prob
    pre, dec = decoder_errors(g, td, ref, ids)
    print(f"qwen3_moe (norm_topk_prob={norm_topk_prob}) vs HF: prefill {pre:.2e}, "
          f"decode {dec:.2e} (of max|ref|)")
    assert pre <= TOL and dec <= TOL


def mixtral_to_gguf(model, path, quantize=None) -> str:
    """A MixtralForCausalLM as llama.cpp's converter writes it: arch llama, q/k rows
    permuted, experts stacked into blk.N.ffn_{gate,up,down}_exps [n_expert, rows, cols]."""
    import gguf

    from modelhelp import _add_tokenizer, _write, hf_state, llama_cpp_permute

    cfg, sd = model.config, hf_state(model)
    nh, nkv, f = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.intermediate_size
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_context_length(cfg.max_position_embeddings)
    w.add_embedding_length(cfg.hidden_size)
    w.add_block_count(cfg.num_hidden_layers)
    w.add_feed_forward_length(f)
    w.add_head_count(nh)
    w.add_head_count_kv(nkv)
    w.add_layer_norm_rms_eps(cfg.rms_norm_eps)
    w.add_rope_freq_base(1e6)
    w.add_expert_count(cfg.num_local_experts)
    w.add_expert_used_count(cfg.num_experts_per_tok)
    w.add_vocab_size(cfg.vocab_size)
    _add_tokenizer(w, cfg.vocab_size)
    t = {"token_embd.weight": sd["model.embed_tokens.weight"]}
    for i in range(cfg.num_hidden_layers):
        p = f"model.layers.{i}."
        gate_up = sd[p + "mlp.experts.gate_up_proj"]               # [E, 2F, D]: gate, then up
        t.update({
            f"blk.{i}.attn_norm.weight": sd[p + "input_layernorm.weight"],
            f"blk.{i}.attn_q.weight": llama_cpp_permute(sd[p + "self_attn.q_proj.weight"], nh),
            f"blk.{i}.attn_k.weight": llama_cpp_permute(sd[p + "self_attn.k_proj.weight"], nh,
                                                        nkv),
            f"blk.{i}.attn_v.weight": sd[p + "self_attn.v_proj.weight"],
            f"blk.{i}.attn_output.weight": sd[p + "self_attn.o_proj.weight"],
            f"blk.{i}.ffn_norm.weight": sd[p + "post_attention_layernorm.weight"],
            f"blk.{i}.ffn_gate_inp.weight": sd[p + "mlp.gate.weight"],
            f"blk.{i}.ffn_gate_exps.weight": gate_up[:, :f],
            f"blk.{i}.ffn_up_exps.weight": gate_up[:, f:],
            f"blk.{i}.ffn_down_exps.weight": sd[p + "mlp.experts.down_proj"],
        })
    t["output_norm.weight"] = sd["model.norm.weight"]
    t["output.weight"] = sd["lm_head.weight"]
    _write(w, t, quantize)
    return str(path)


def test_mixtral_gguf_matches_hf(mixtral, tmp_path):
    model, _, ids, ref = mixtral
    path = mixtral_to_gguf(model, tmp_path / "mixtral.gguf")
    g, td = load("mixtral", path)
    assert td.params["n_expert"] == 6 and td.params["n_expert_used"] == 2
    pre, dec = decoder_errors(g, td, ref, ids)
    print(f"mixtral GGUF vs HF: prefill {pre:.2e}, decode {dec:.2e} (of max|ref|)")
    assert pre <= TOL and dec <= TOL


def test_mixtral_gguf_q8_0_experts_load_packed(mixtral, tmp_path):
    """Q8_0 expert tensors from GGUF stay packed per expert ([E, rows, cols // 32 * 34])."""
    import gguf

    def q8(name, arr):
        if not name.endswith("_exps.weight"):
            return None
        qt = gguf.GGMLQuantizationType.Q8_0
        return gguf.quants.quantize(arr, qt), qt

    model, _, ids, ref = mixtral
    path = mixtral_to_gguf(model, tmp_path / "mixtral-q8.gguf", quantize=q8)
    g, td = load("mixtral", path)
    w = td["blk.0.ffn_gate_exps.weight"]
    assert isinstance(w, md.QuantizedTensor) and w.encoding == "q8_0"
    assert w.shape == (6, 96, 64) and w.data.shape == (6, 96, 2 * 34)
    pre, dec = decoder_errors(g, td, ref, ids)
    assert pre < 0.05 and dec < 0.05


def test_qwen3_moe_gguf_matches_hf(tmp_path):
    """arch qwen3moe as llama.cpp writes it: HF q/k row order (neox RoPE), QK-norms,
    experts stacked; llama.cpp renormalises the top-k weights (norm_topk_prob true)."""
    import gguf

    from modelhelp import _add_tokenizer, _write, hf_state

    model = make_qwen3_moe(seed=2, norm_topk_prob=True)
    cfg, sd = model.config, hf_state(model)
    f = cfg.moe_intermediate_size
    w = gguf.GGUFWriter(str(tmp_path / "q.gguf"), "qwen3moe")
    w.add_context_length(cfg.max_position_embeddings)
    w.add_embedding_length(cfg.hidden_size)
    w.add_block_count(cfg.num_hidden_layers)
    w.add_head_count(cfg.num_attention_heads)
    w.add_head_count_kv(cfg.num_key_value_heads)
    w.add_key_length(cfg.head_dim)
    w.add_value_length(cfg.head_dim)
    w.add_expert_feed_forward_length(f)
    w.add_expert_count(cfg.num_experts)
    w.add_expert_used_count(cfg.num_experts_per_tok)
    w.add_layer_norm_rms_eps(cfg.rms_norm_eps)
    w.add_rope_freq_base(1e6)
    _add_tokenizer(w, cfg.vocab_size)
    t = {"token_embd.weight": sd["model.embed_tokens.weight"]}
    names = {"input_layernorm": "attn_norm", "self_attn.q_proj": "attn_q",
             "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v",
             "self_attn.q_norm": "attn_q_norm", "self_attn.k_norm": "attn_k_norm",
             "self_attn.o_proj": "attn_output", "post_attention_layernorm": "ffn_norm",
             "mlp.gate": "ffn_gate_inp"}
    for i in range(cfg.num_hidden_layers):
        p = f"model.layers.{i}."
        for src, dst in names.items():
            t[f"blk.{i}.{dst}.weight"] = sd[p + src + ".weight"]
        gate_up = sd[p + "mlp.experts.gate_up_proj"]               # [E, 2F, D]: gate, then up
        t[f"blk.{i}.ffn_gate_exps.weight"] = gate_up[:, :f]
        t[f"blk.{i}.ffn_up_exps.weight"] = gate_up[:, f:]
        t[f"blk.{i}.ffn_down_exps.weight"] = sd[p + "mlp.experts.down_proj"]
    t["output_norm.weight"] = sd["model.norm.weight"]
    t["output.weight"] = sd["lm_head.weight"]
    _write(w, t)
    ids = token_ids(cfg.vocab_size, seed=6)
    g, td = load("qwen3_moe", tmp_path / "q.gguf")
    assert td.params["head_dim"] == 24 and td.params["n_expert"] == 8
    pre, dec = decoder_errors(g, td, hf_logits(model, ids), ids)
    assert pre <= TOL and dec <= TOL
