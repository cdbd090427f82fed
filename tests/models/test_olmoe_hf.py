"""specs/olmoe.yaml against transformers' OlmoeForCausalLM (and llama.cpp).

A small seeded float32 OLMoE: dim 64, 2 layers, grouped-query attention (4 query heads,
2 kv heads), RMSNorm over the whole q projection (64 features) and the whole k
projection (2 kv heads * 16 = 32 features), RoPE on halves (neox) with base 50000,
8 SwiGLU experts of width 32 with 2 used per token (softmax over all experts, then
top-2), an untied output. A second model turns on everything the released checkpoints
leave off: norm_topk_prob (the top-2 weights renormalised), clip_qkv (q, k, v clamped)
and attention_bias, with tied embeddings. Checked: logits of a prefill and of decode
steps through the KV cache, greedy ids (alone and batched), negative controls for the
renormalisation and the clamp, a GGUF written as llama.cpp's converter does (maxdecl
and, when llama-cpp-python is installed, llama.cpp itself) and maxdecl export's round
trip.
"""

import json
import shutil
import subprocess
import sys

import numpy as np
import pytest

import maxdecl as md

from modelhelp import (TOL, _add_tokenizer, _write, assert_greedy_matches_hf,
                       assert_logits_match, compare, gguf_writer, hf_case, hf_logits,
                       hf_params, hf_state, layer_tensors, llama_cpp_logits, randomize,
                       rel_err, spec_path, tiny_model, token_ids, with_hf_config)

pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

PROMPTS = [[3, 17, 42, 199, 5, 7, 64, 1], [8, 9, 120], [250, 60, 33, 2, 90, 11, 7]]
N_NEW = 6
TOL_LLAMA_CPP = 5e-3        # of max|ref|: llama.cpp keeps its KV cache in f16


def make_olmoe(seed=0, **kw):
    """OlmoeForCausalLM: dim 64, 2 layers, GQA 4/2, 8 experts (top-2) of width 32,
    rope_theta 50000, vocab 256, untied output."""
    import torch

    torch.manual_seed(seed)
    cfg = dict(vocab_size=256, hidden_size=64, intermediate_size=32, num_hidden_layers=2,
               num_attention_heads=4, num_key_value_heads=2, num_experts=8,
               num_experts_per_tok=2, norm_topk_prob=False, clip_qkv=None,
               attention_bias=False, rms_norm_eps=1e-5, max_position_embeddings=96,
               rope_theta=50000.0, pad_token_id=1, bos_token_id=None, eos_token_id=2,
               tie_word_embeddings=False, attn_implementation="eager")
    cfg.update(kw)
    return randomize(transformers.OlmoeForCausalLM(transformers.OlmoeConfig(**cfg)), seed)


@pytest.fixture(scope="module")
def olmoe(tmp_path_factory):
    return hf_case(make_olmoe(), tmp_path_factory.mktemp("olmoe_hf"))


@pytest.fixture(scope="module")
def ours(olmoe):
    return tiny_model("olmoe", olmoe[1])


@pytest.fixture(scope="module")
def olmoe_all_on(tmp_path_factory):
    """norm_topk_prob, clip_qkv 1.0 (clamps a good share of q, k and v), attention
    biases and tied embeddings."""
    model = make_olmoe(seed=3, norm_topk_prob=True, clip_qkv=1.0, attention_bias=True,
                       tie_word_embeddings=True)
    return hf_case(model, tmp_path_factory.mktemp("olmoe_all_on_hf"))


def test_olmoe_config_and_weights_from_hf(olmoe):
    _, path, _, _ = olmoe
    _, _, got = hf_params("olmoe", path)
    assert (got["dim"], got["n_layers"], got["n_heads"], got["n_kv_heads"]) == (64, 2, 4, 2)
    assert (got["ffn_dim"], got["n_expert"], got["n_expert_used"]) == (32, 8, 2)
    assert got["norm_topk_prob"] is False and got["rope_theta"] == 50000.0
    assert got["context"] == 96 and got["vocab"] == 256 and got["rope_type"] == "default"
    assert "clip_qkv" not in got                       # null in config.json: no clamp
    td = md.load_weights(path, spec=spec_path("olmoe"), variant="tiny")
    assert td["blk.0.ffn_gate_exps.weight"].shape == (8, 32, 64)       # experts stacked
    assert td["blk.1.ffn_down_exps.weight"].shape == (8, 64, 32)
    assert td["blk.0.attn_q_norm.weight"].shape == (64,)                # whole q projection
    assert td["blk.0.attn_k_norm.weight"].shape == (32,)                # whole k projection
    assert "blk.0.attn_q.bias" not in td                                # zero fill stands in


def test_olmoe_prefill_and_decode_match_hf(olmoe, ours):
    _, _, ids, ref = olmoe
    assert_logits_match("olmoe", ours, ids, ref)


def test_olmoe_greedy_generate_matches_hf(olmoe, ours):
    assert_greedy_matches_hf(olmoe[0], ours, PROMPTS, N_NEW)


def test_olmoe_norm_topk_clip_bias_tied_match_hf(olmoe_all_on):
    model, path, ids, ref = olmoe_all_on
    ours = tiny_model("olmoe", path)
    assert ours.params["norm_topk_prob"] is True and ours.params["clip_qkv"] == 1.0
    assert "output.weight" not in ours.weights and "blk.1.attn_output.bias" in ours.weights
    assert_logits_match("olmoe (norm_topk_prob, clip_qkv, bias, tied)", ours, ids, ref)
    assert_greedy_matches_hf(model, ours, PROMPTS[:2], N_NEW)


@pytest.mark.parametrize("entry", ["norm_topk_prob", "clip_qkv"])
def test_olmoe_renormalisation_and_clamp_matter(olmoe_all_on, entry):
    """Negative controls: reading norm_topk_prob as false, or clip_qkv as absent, from
    the same checkpoint gives other logits."""
    _, path, ids, ref = olmoe_all_on
    spec = with_hf_config(md.load_spec(spec_path("olmoe"), variant="tiny"),
                          **{entry: "{False}" if entry == "norm_topk_prob" else "{None}"})
    ours = md.load_model(spec, path, variant="tiny")
    pre, dec = compare(ours, ref, ids)
    assert pre > 10 * TOL and dec > 10 * TOL


def test_olmoe_rope_scaling_is_refused(olmoe, tmp_path):
    _, path, _, _ = olmoe
    scaled = tmp_path / "scaled"
    shutil.copytree(path, scaled)
    cfg = json.loads((scaled / "config.json").read_text())
    cfg["rope_parameters"] = {"rope_type": "linear", "factor": 2.0, "rope_theta": 50000.0}
    (scaled / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(md.WeightsError, match="RoPE scaling linear is not modelled"):
        tiny_model("olmoe", scaled)


# -- GGUF, as llama.cpp's convert_hf_to_gguf.py (OlmoeModel) writes it -------------------

OLMOE_LAYERS = {
    "input_layernorm": "attn_norm", "self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k",
    "self_attn.v_proj": "attn_v", "self_attn.o_proj": "attn_output",
    "self_attn.q_norm": "attn_q_norm", "self_attn.k_norm": "attn_k_norm",
    "post_attention_layernorm": "ffn_norm", "mlp.gate": "ffn_gate_inp"}


def olmoe_to_gguf(model, path) -> str:
    """Arch ``olmoe``: HF's q/k row order kept (neox RoPE), q_norm / k_norm as
    ``attn_q_norm`` / ``attn_k_norm``, the router as ``ffn_gate_inp``, the experts
    stacked into ``ffn_{gate,up,down}_exps`` [E, rows, cols], intermediate_size as
    ``feed_forward_length``, rms eps 1e-5 (the converter writes that constant), and no
    key for norm_topk_prob or clip_qkv, as the converter writes them."""
    import gguf

    cfg, sd = model.config, hf_state(model)
    w = gguf_writer(path, "olmoe", cfg)
    w.add_rope_freq_base(float(cfg.rope_parameters["rope_theta"]))
    w.add_layer_norm_rms_eps(1e-5)
    w.add_expert_count(cfg.num_experts)
    w.add_expert_used_count(cfg.num_experts_per_tok)
    w.add_file_type(gguf.LlamaFileType.ALL_F32)
    _add_tokenizer(w, cfg.vocab_size)
    t = {"token_embd.weight": sd["model.embed_tokens.weight"],
         **layer_tensors(sd, cfg.num_hidden_layers, OLMOE_LAYERS)}
    f = cfg.intermediate_size
    for i in range(cfg.num_hidden_layers):
        p = f"model.layers.{i}.mlp.experts."
        t[f"blk.{i}.ffn_gate_exps.weight"] = sd[p + "gate_up_proj"][:, :f]   # [E, 2F, D]:
        t[f"blk.{i}.ffn_up_exps.weight"] = sd[p + "gate_up_proj"][:, f:]     # gate, then up
        t[f"blk.{i}.ffn_down_exps.weight"] = sd[p + "down_proj"]
    t["output_norm.weight"] = sd["model.norm.weight"]
    t["output.weight"] = sd["lm_head.weight"]
    _write(w, t)
    return str(path)


@pytest.fixture(scope="module")
def olmoe_mha_gguf(tmp_path_factory):
    """As many kv heads as query heads: llama.cpp's olmoe reads attn_k_norm as n_embd
    wide (the released checkpoints have no GQA)."""
    model = make_olmoe(seed=1, num_key_value_heads=4)
    path = olmoe_to_gguf(model, tmp_path_factory.mktemp("olmoe_gguf") / "o.gguf")
    ids = token_ids(model.config.vocab_size, seed=9)
    return model, path, ids, hf_logits(model, ids)


def test_olmoe_converter_gguf_matches_hf(olmoe_mha_gguf):
    _, path, ids, ref = olmoe_mha_gguf
    ours = md.load_model(spec_path("olmoe"), path, variant="tiny")
    assert ours.params["n_kv_heads"] == 4 and ours.params["vocab"] == 256
    assert ours.params["rope_theta"] == 50000.0 and ours.params["context"] == 96
    assert ours.weights["blk.0.ffn_gate_exps.weight"].shape == (8, 32, 64)
    assert_logits_match("olmoe converter GGUF", ours, ids, ref)


def test_olmoe_gguf_runs_in_llama_cpp(olmoe_mha_gguf):
    llama_cpp = pytest.importorskip("llama_cpp")
    _, path, ids, ref = olmoe_mha_gguf
    theirs = llama_cpp_logits(llama_cpp, path, ids)
    ours = np.asarray(md.load_model(spec_path("olmoe"), path, variant="tiny").logits(ids))
    err_cpp, err_ours = rel_err(theirs, ref), rel_err(ours, ref)
    print(f"olmoe GGUF: llama.cpp vs HF {err_cpp:.2e}, maxdecl vs HF {err_ours:.2e}, "
          f"maxdecl vs llama.cpp {rel_err(ours, theirs):.2e} (of max|ref|)")
    assert err_cpp <= TOL_LLAMA_CPP and err_ours <= TOL
    assert (theirs.argmax(-1) == ours.argmax(-1)).mean() >= 0.9


def test_olmoe_export_round_trip(olmoe_all_on, tmp_path):
    """maxdecl export of the HF folder with norm_topk_prob and clip_qkv writes both keys
    (llama.cpp's converter writes neither); the GGUF reloads with the same logits."""
    _, path, ids, ref = olmoe_all_on
    out = tmp_path / "export.gguf"
    subprocess.run([sys.executable, "-m", "maxdecl", "export", str(path), "--spec",
                    spec_path("olmoe"), "-o", str(out), "--variant", "tiny"],
                   check=True, capture_output=True, text=True)
    meta = md.load_weights(str(out)).metadata
    assert bool(meta["olmoe.expert_weights_norm"]) is True
    assert float(meta["olmoe.attention.clamp_kqv"]) == 1.0
    ours = md.load_model(spec_path("olmoe"), str(out), variant="tiny")
    assert_logits_match("olmoe export round trip", ours, ids, ref)


def test_olmoe_torch_state_dict_with_fused_experts(tmp_path):
    """A torch state_dict saved as one .safetensors: transformers 5 holds the experts
    fused in memory (gate_up_proj [E, 2F, D], down_proj [E, D, F]), which save_pretrained
    splits per expert but a plain save does not. The spec's `split` entry cuts gate_up
    into the stacked gate and up weights; the sizes come from the variant."""
    safetensors_torch = pytest.importorskip("safetensors.torch")
    model = make_olmoe(seed=5, rope_theta=10000.0, max_position_embeddings=128)
    sd = {k: v.contiguous() for k, v in model.state_dict().items()}
    assert "model.layers.0.mlp.experts.gate_up_proj" in sd
    path = tmp_path / "model.safetensors"
    safetensors_torch.save_file(sd, str(path))
    ids = token_ids(model.config.vocab_size)
    ref = hf_logits(model, ids)
    ours = md.load_model(spec_path("olmoe"), str(path), variant="tiny")
    pre, dec = compare(ours, ref, ids)
    assert pre <= TOL and dec <= TOL
