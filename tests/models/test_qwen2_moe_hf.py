"""specs/qwen2_moe.yaml against transformers' Qwen2MoeForCausalLM (and llama.cpp).

A small seeded float32 Qwen2-MoE: dim 128, 3 layers of which layer 1 is dense
(mlp_only_layers), grouped-query attention (4 query heads, 2 kv heads) with q/k/v
biases, RoPE base 1e6 on halves, 8 routed SwiGLU experts of width 64 with 2 used per
token (softmax over all experts, then top-2), a shared expert of width 96 scaled by
sigmoid(shared_expert_gate(x)), an untied output. Checked: logits of a prefill and of
decode steps through the KV cache, greedy ids, llama.cpp-converter GGUFs (maxdecl and,
when llama-cpp-python is installed, llama.cpp itself), and maxdecl export round trip.
"""

import json
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest

import maxdecl as md

from modelhelp import (TOL, _add_tokenizer, _write, assert_greedy_matches_hf, compare,
                       hf_case, hf_logits, hf_params, hf_state, layer_tensors,
                       llama_cpp_logits, randomize, rel_err, spec_path, tiny_model, token_ids)

pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

PROMPTS = [[3, 17, 42, 199, 5, 7, 64, 1], [8, 9, 120], [250, 60, 33, 2, 90, 11, 7]]
N_NEW = 6
TOL_LLAMA_CPP = 5e-3        # of max|ref|: llama.cpp keeps its KV cache in f16


def make_qwen2_moe(seed=0, mlp_only_layers=(1,), n_layers=3, norm_topk_prob=False, **kw):
    """Qwen2MoeForCausalLM: dim 128, GQA 4/2 with q/k/v biases, 8 experts (top-2) of
    width 64, shared expert of width 96, dense layers of width 256, vocab 256."""
    import torch

    torch.manual_seed(seed)
    cfg = dict(vocab_size=256, hidden_size=128, intermediate_size=256,
               moe_intermediate_size=64, shared_expert_intermediate_size=96,
               num_hidden_layers=n_layers, num_attention_heads=4, num_key_value_heads=2,
               num_experts=8, num_experts_per_tok=2, norm_topk_prob=norm_topk_prob,
               decoder_sparse_step=1, mlp_only_layers=list(mlp_only_layers),
               rms_norm_eps=1e-6, max_position_embeddings=128, rope_theta=1e6,
               tie_word_embeddings=False, attn_implementation="eager")
    cfg.update(kw)
    model = transformers.Qwen2MoeForCausalLM(transformers.Qwen2MoeConfig(**cfg))
    return randomize(model, seed)


@pytest.fixture(scope="module")
def qwen2_moe(tmp_path_factory):
    return hf_case(make_qwen2_moe(), tmp_path_factory.mktemp("qwen2_moe_hf"))


@pytest.fixture(scope="module")
def ours(qwen2_moe):
    return tiny_model("qwen2_moe", qwen2_moe[1])


def test_qwen2_moe_config_and_weights_from_hf(qwen2_moe):
    _, path, _, _ = qwen2_moe
    _, _, got = hf_params("qwen2_moe", path)
    assert got["mlp_only_layers"] == [1] and got["decoder_sparse_step"] == 1
    assert got["n_expert"] == 8 and got["n_expert_used"] == 2
    assert (got["ffn_dim"], got["expert_ffn_dim"], got["shexp_ffn_dim"]) == (256, 64, 96)
    assert got["norm_topk_prob"] is False and got["rope_theta"] == 1e6
    td = md.load_weights(path, spec=spec_path("qwen2_moe"), variant="tiny")
    assert td["blk.0.ffn_gate_exps.weight"].shape == (8, 64, 128)      # experts stacked
    assert td["blk.2.ffn_down_exps.weight"].shape == (8, 128, 64)
    assert td["blk.0.ffn_gate_inp_shexp.weight"].shape == (1, 128)
    assert td["blk.1.ffn_gate.weight"].shape == (256, 128)             # the dense layer
    assert "blk.1.ffn_gate_inp.weight" not in td and "blk.0.ffn_gate.weight" not in td


def test_qwen2_moe_prefill_and_decode_match_hf(qwen2_moe, ours):
    _, _, ids, ref = qwen2_moe
    pre, dec = compare(ours, ref, ids)
    print(f"qwen2_moe vs HF: prefill {pre:.2e}, decode {dec:.2e} (of max|ref|)")
    assert pre <= TOL and dec <= TOL


def test_qwen2_moe_greedy_generate_matches_hf(qwen2_moe, ours):
    assert_greedy_matches_hf(qwen2_moe[0], ours, PROMPTS, N_NEW)


def test_qwen2_moe_norm_topk_prob_and_sparse_step(tmp_path):
    """norm_topk_prob true (the k weights renormalised) and decoder_sparse_step 2 (odd
    layers sparse, even dense) with no mlp_only_layers; and the shared expert's gate
    matters (negative control: zeroed it scales the shared expert by 0.5)."""
    model = make_qwen2_moe(seed=3, mlp_only_layers=(), norm_topk_prob=True,
                           decoder_sparse_step=2)
    path = os.path.join(tmp_path, "hf")
    model.save_pretrained(path, safe_serialization=True)
    ids = token_ids(model.config.vocab_size, seed=5)
    ref = hf_logits(model, ids)
    ours = tiny_model("qwen2_moe", path)
    assert ours.params["norm_topk_prob"] is True and ours.params["decoder_sparse_step"] == 2
    assert "blk.0.ffn_gate.weight" in ours.weights and "blk.1.ffn_gate_inp.weight" in ours.weights
    pre, dec = compare(ours, ref, ids)
    print(f"qwen2_moe (norm_topk_prob, step 2) vs HF: prefill {pre:.2e}, decode {dec:.2e}")
    assert pre <= TOL and dec <= TOL
    td = md.load_weights(path)
    td["model.layers.1.mlp.shared_expert_gate.weight"] = np.zeros((1, 128), np.float32)
    pre, dec = compare(md.load_model(spec_path("qwen2_moe"), td, variant="tiny"), ref, ids)
    assert pre > 10 * TOL and dec > 10 * TOL


def test_qwen2_moe_without_qkv_bias(tmp_path):
    """qkv_bias false: the checkpoint has no q/k/v biases and the zero fills stand in."""
    model = make_qwen2_moe(seed=4, n_layers=2, mlp_only_layers=(), qkv_bias=False)
    path = os.path.join(tmp_path, "hf")
    model.save_pretrained(path, safe_serialization=True)
    ids = token_ids(model.config.vocab_size, seed=6)
    pre, dec = compare(tiny_model("qwen2_moe", path), hf_logits(model, ids), ids)
    assert pre <= TOL and dec <= TOL


def test_qwen2_moe_refuses_sliding_window(qwen2_moe, tmp_path):
    path = tmp_path / "sw"
    shutil.copytree(qwen2_moe[1], path)
    cfg = json.loads((path / "config.json").read_text())
    cfg.update(use_sliding_window=True, sliding_window=4)
    (path / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(md.WeightsError, match="sliding-window"):
        tiny_model("qwen2_moe", path)


# -- GGUF, as llama.cpp's convert_hf_to_gguf.py (Qwen2MoeModel) writes it ---------------

QWEN2MOE_LAYERS = {
    "input_layernorm": "attn_norm", "self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k",
    "self_attn.v_proj": "attn_v", "self_attn.o_proj": "attn_output",
    "post_attention_layernorm": "ffn_norm", "mlp.gate_proj": "ffn_gate",
    "mlp.up_proj": "ffn_up", "mlp.down_proj": "ffn_down", "mlp.gate": "ffn_gate_inp",
    "mlp.shared_expert.gate_proj": "ffn_gate_shexp", "mlp.shared_expert.up_proj": "ffn_up_shexp",
    "mlp.shared_expert.down_proj": "ffn_down_shexp",
    "mlp.shared_expert_gate": "ffn_gate_inp_shexp"}


def qwen2_moe_to_gguf(model, path, extra_keys=False) -> str:
    """Arch ``qwen2moe``: HF q/k row order (neox RoPE), biases as ``.bias``, experts
    stacked into ``ffn_{gate,up,down}_exps`` [E, rows, cols], the shared expert as
    ``*_shexp`` and its gate ``ffn_gate_inp_shexp`` [1, dim] (ggml [dim, 1]), as the
    converter writes them. ``extra_keys`` adds maxdecl's ``qwen2moe.mlp_only_layers`` /
    ``decoder_sparse_step`` / ``expert_weights_norm`` (the converter writes none of
    them; llama.cpp treats every layer as sparse)."""
    import gguf

    cfg, sd = model.config, hf_state(model)
    w = gguf.GGUFWriter(str(path), "qwen2moe")
    w.add_block_count(cfg.num_hidden_layers)
    w.add_context_length(cfg.max_position_embeddings)
    w.add_embedding_length(cfg.hidden_size)
    w.add_feed_forward_length(cfg.intermediate_size)
    w.add_head_count(cfg.num_attention_heads)
    w.add_head_count_kv(cfg.num_key_value_heads)
    w.add_rope_freq_base(float(cfg.rope_parameters["rope_theta"]))
    w.add_layer_norm_rms_eps(cfg.rms_norm_eps)
    w.add_expert_used_count(cfg.num_experts_per_tok)
    w.add_file_type(gguf.LlamaFileType.ALL_F32)
    w.add_expert_count(cfg.num_experts)
    w.add_expert_feed_forward_length(cfg.moe_intermediate_size)
    w.add_expert_shared_feed_forward_length(cfg.shared_expert_intermediate_size)
    if extra_keys:
        w.add_array("qwen2moe.mlp_only_layers", list(cfg.mlp_only_layers))
        w.add_uint32("qwen2moe.decoder_sparse_step", cfg.decoder_sparse_step)
        w.add_expert_weights_norm(cfg.norm_topk_prob)
    _add_tokenizer(w, cfg.vocab_size)
    t = {"token_embd.weight": sd["model.embed_tokens.weight"],
         **layer_tensors(sd, cfg.num_hidden_layers, QWEN2MOE_LAYERS)}
    for i in range(cfg.num_hidden_layers):
        p = f"model.layers.{i}.mlp.experts."
        if p + "gate_up_proj" in sd:                  # in memory: [E, 2F, D], gate then up
            f = cfg.moe_intermediate_size
            t[f"blk.{i}.ffn_gate_exps.weight"] = sd[p + "gate_up_proj"][:, :f]
            t[f"blk.{i}.ffn_up_exps.weight"] = sd[p + "gate_up_proj"][:, f:]
            t[f"blk.{i}.ffn_down_exps.weight"] = sd[p + "down_proj"]
    t["output_norm.weight"] = sd["model.norm.weight"]
    t["output.weight"] = sd["lm_head.weight"]
    _write(w, t)
    return str(path)


def test_qwen2_moe_gguf_with_dense_layer_matches_hf(qwen2_moe, tmp_path):
    """The converter's layout plus the maxdecl keys that say which layer is dense."""
    model, _, ids, ref = qwen2_moe
    path = qwen2_moe_to_gguf(model, tmp_path / "q.gguf", extra_keys=True)
    ours = md.load_model(spec_path("qwen2_moe"), path, variant="tiny")
    assert ours.params["mlp_only_layers"] == [1] and ours.params["n_layers"] == 3
    pre, dec = compare(ours, ref, ids)
    assert pre <= TOL and dec <= TOL


def test_qwen2_moe_export_round_trip(qwen2_moe, tmp_path):
    """maxdecl export of the HF folder writes the dense layer's key; the GGUF reloads
    with the same logits."""
    _, path, ids, ref = qwen2_moe
    out = tmp_path / "export.gguf"
    subprocess.run([sys.executable, "-m", "maxdecl", "export", str(path), "--spec",
                    spec_path("qwen2_moe"), "-o", str(out), "--variant", "tiny"],
                   check=True, capture_output=True, text=True)
    meta = md.load_weights(str(out)).metadata
    assert list(meta["qwen2moe.mlp_only_layers"]) == [1]
    ours = md.load_model(spec_path("qwen2_moe"), str(out), variant="tiny")
    pre, dec = compare(ours, ref, ids)
    assert pre <= TOL and dec <= TOL


@pytest.fixture(scope="module")
def all_sparse(tmp_path_factory):
    """Every layer sparse (as llama.cpp runs qwen2moe), norm_topk_prob false (llama.cpp
    never renormalises), and a pure converter GGUF (no maxdecl keys)."""
    model = make_qwen2_moe(seed=1, mlp_only_layers=(), n_layers=2)
    path = qwen2_moe_to_gguf(model, tmp_path_factory.mktemp("qwen2moe_gguf") / "s.gguf")
    ids = token_ids(model.config.vocab_size, seed=9)
    return model, path, ids, hf_logits(model, ids)


def test_qwen2_moe_converter_gguf_matches_hf(all_sparse):
    model, path, ids, ref = all_sparse
    ours = md.load_model(spec_path("qwen2_moe"), path, variant="tiny")
    assert ours.params["mlp_only_layers"] == [] and ours.params["vocab"] == 256
    assert ours.weights["blk.0.ffn_gate_inp_shexp.weight"].shape == (1, 128)
    pre, dec = compare(ours, ref, ids)
    print(f"qwen2_moe converter GGUF vs HF: prefill {pre:.2e}, decode {dec:.2e}")
    assert pre <= TOL and dec <= TOL


def test_qwen2_moe_gguf_runs_in_llama_cpp(all_sparse):
    llama_cpp = pytest.importorskip("llama_cpp")
    model, path, ids, ref = all_sparse
    theirs = llama_cpp_logits(llama_cpp, path, ids)
    ours = np.asarray(md.load_model(spec_path("qwen2_moe"), path, variant="tiny").logits(ids))
    err_cpp, err_ours = rel_err(theirs, ref), rel_err(ours, ref)
    print(f"qwen2_moe GGUF: llama.cpp vs HF {err_cpp:.2e}, maxdecl vs HF {err_ours:.2e}, "
          f"maxdecl vs llama.cpp {rel_err(ours, theirs):.2e} (of max|ref|)")
    assert err_cpp <= TOL_LLAMA_CPP and err_ours <= TOL
    assert (theirs.argmax(-1) == ours.argmax(-1)).mean() >= 0.9
