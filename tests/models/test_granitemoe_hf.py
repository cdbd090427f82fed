"""specs/granitemoe.yaml against transformers' GraniteMoeForCausalLM (and llama.cpp).

Small seeded float32 GraniteMoe models (dim 128, 2 layers, GQA 4/2, 6 experts of width 96,
2 used per token, vocab 320, RMSNorm eps 1e-6, rope base 50000) whose four multipliers are
far from 1 and from their neutral values, so that a multiplier applied wrongly, twice or
not at all shows: embedding_multiplier 0.3, attention_multiplier 0.06 (1/sqrt(head_dim)
would be 0.177), residual_multiplier 2.0, logits_scaling 3.

- ``tied``: tie_word_embeddings (as Granite 3.x MoE): the checkpoint has no lm_head.weight;
- ``untied``: its own lm_head.

The HF folder keeps each layer's experts as save_pretrained writes them:
``block_sparse_moe.input_linear.weight`` [E, 2 * ffn, dim] (gate rows, then up rows),
``output_linear.weight`` [E, dim, ffn], ``router.layer.weight`` [E, dim]. The GGUF is
written as llama.cpp's converter (GraniteMoeModel, a GraniteModel, a LlamaModel) writes
it from that folder: arch ``granitemoe``, q/k rows permuted to adjacent pairs,
input_linear split into ``ffn_gate_exps`` / ``ffn_up_exps``, the multipliers under
granitemoe.embedding_scale, .attention.scale, .residual_scale and .logit_scale.
"""

import os

import numpy as np
import pytest

import maxdecl as md
from maxdecl.pipelines.model_loading import params_from_metadata

from modelhelp import (TOL, _add_tokenizer, _write, assert_greedy_matches_hf, compare,
                       gguf_writer, hf_case, hf_params, hf_state, llama_cpp_logits, llama_cpp_permute,
                       randomize, spec_path, tiny_model)

pytest.importorskip("torch")
pytest.importorskip("transformers")

PROMPTS = [[3, 17, 42, 290, 5, 7, 64, 1], [8, 9, 300], [5, 60, 33, 2, 90, 11, 7]]
N_NEW = 6
TOL_LLAMA_CPP = 5e-3        # of max|ref|: llama.cpp keeps its KV cache in f16

MULT = dict(embedding_multiplier=0.3, attention_multiplier=0.06, residual_multiplier=2.0,
            logits_scaling=3.0)
CFG = dict(vocab_size=320, hidden_size=128, intermediate_size=96, num_hidden_layers=2,
           num_attention_heads=4, num_key_value_heads=2, num_local_experts=6,
           num_experts_per_tok=2, rms_norm_eps=1e-6, max_position_embeddings=64,
           rope_theta=50000.0, hidden_act="silu")
TINY = {"dim": 128, "n_layers": 2, "n_heads": 4, "n_kv_heads": 2, "ffn_dim": 96,
        "n_expert": 6, "n_expert_used": 2, "vocab": 320, "context": 64, "rope_theta": 50000.0}


def make_granitemoe(seed=0, tied=True, **kw):
    """GraniteMoeForCausalLM with CFG and MULT, randomized (modelhelp.randomize)."""
    import torch
    import transformers

    torch.manual_seed(seed)
    cfg = dict(CFG, tie_word_embeddings=tied, attn_implementation="eager", **MULT)
    cfg.update(kw)
    model = transformers.GraniteMoeForCausalLM(transformers.GraniteMoeConfig(**cfg))
    return randomize(model, seed)


@pytest.fixture(scope="module")
def tied(tmp_path_factory):
    return hf_case(make_granitemoe(), tmp_path_factory.mktemp("granitemoe_tied"))


@pytest.fixture(scope="module")
def untied(tmp_path_factory):
    return hf_case(make_granitemoe(seed=1, tied=False),
                   tmp_path_factory.mktemp("granitemoe_untied"))


@pytest.fixture(scope="module")
def ours_tied(tied):
    return tiny_model("granitemoe", tied[1])


# -- config and weights ------------------------------------------------------------------

def test_granitemoe_config_and_fused_experts_from_hf(tied, ours_tied):
    spec, meta, got = hf_params("granitemoe", tied[1])
    assert {k: got.get(k) for k in TINY} == TINY
    assert got["norm_eps"] == pytest.approx(1e-6)
    assert {k: got[k] for k in MULT} == MULT
    assert got["shared_ffn_dim"] == 0
    p = ours_tied.params
    assert p["emb_scale"] == 0.3 and p["res_scale"] == 2.0 and p["logit_div"] == 3.0
    assert p["attn_scale"] == pytest.approx(0.06)
    w = ours_tied.weights
    # input_linear [6, 192, 128] (in memory, transformers 5: experts.gate_up_proj) split
    # on load: its gate rows, then its up rows
    sd = hf_state(tied[0])
    gate_up = next(v for k, v in sd.items() if k.startswith("model.layers.0.")
                   and ("input_linear" in k or "gate_up_proj" in k))
    assert gate_up.shape == (6, 192, 128)
    np.testing.assert_array_equal(w["blk.0.ffn_gate_exps.weight"], gate_up[:, :96])
    np.testing.assert_array_equal(w["blk.0.ffn_up_exps.weight"], gate_up[:, 96:])
    assert w["blk.1.ffn_down_exps.weight"].shape == (6, 128, 96)
    assert w["blk.0.ffn_gate_inp.weight"].shape == (6, 128)
    assert "output.weight" not in w   # tied

    # a config.json without the multipliers: transformers' defaults (1.0)
    bare = {k: v for k, v in meta.items() if k not in MULT}
    assert {k: params_from_metadata(spec, bare)[k] for k in MULT} == dict.fromkeys(MULT, 1.0)


def test_granitemoe_refuses_what_it_does_not_model(tied):
    spec, meta, _ = hf_params("granitemoe", tied[1])
    for bad, why in (({"hidden_act": "gelu"}, "hidden_act"),
                     ({"attention_bias": True}, "biases"),
                     ({"shared_intermediate_size": 64}, "shared expert"),
                     ({"rope_parameters": {"rope_type": "linear", "factor": 2.0,
                                           "rope_theta": 1e4}}, "RoPE scaling linear")):
        with pytest.raises(md.WeightsError, match=why):
            params_from_metadata(spec, {**meta, **bad})


# -- logits and generation ---------------------------------------------------------------

def _check(name, model, ids, ref):
    pre, dec = compare(model, ref, ids)
    print(f"{name} vs HF: prefill {pre:.2e}, decode {dec:.2e} (of max|ref|)")
    assert pre <= TOL and dec <= TOL
    return max(pre, dec)


def test_granitemoe_tied_prefill_and_decode_match_hf(tied, ours_tied):
    _check("granitemoe (tied)", ours_tied, tied[2], tied[3])


def test_granitemoe_untied_prefill_and_decode_match_hf(untied):
    ours = tiny_model("granitemoe", untied[1])
    assert "output.weight" in ours.weights
    _check("granitemoe (untied)", ours, untied[2], untied[3])


def test_granitemoe_routing_and_multipliers_matter(tied, ours_tied):
    """Negative controls: Qwen3-MoE's router order (softmax over all experts, top-k, no
    renormalisation) or a multiplier left at 1 moves the logits by far more than TOL."""
    import copy

    import torch

    model, _, ids, ref = tied
    for attr, value in (("residual_multiplier", 1.0), ("attention_multiplier", 1.0)):
        other = copy.deepcopy(model)
        for layer in other.model.layers:
            if attr == "residual_multiplier":
                layer.residual_multiplier = value
            else:
                layer.self_attn.scaling = value
        with torch.no_grad():
            lg = other(torch.tensor([ids])).logits[0].numpy()
        assert np.abs(lg - ref).max() > 100 * TOL * np.abs(ref).max(), attr
    router = model.model.layers[0].block_sparse_moe.router
    h = torch.randn(5, CFG["hidden_size"], generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        _, w, _ = router(h)
        p = torch.softmax(router.weight @ h.T, dim=0).T.topk(2).values
    assert float((w - p).abs().max()) > 0.05                  # the orders differ


def test_granitemoe_greedy_matches_hf(tied, ours_tied):
    assert_greedy_matches_hf(tied[0], ours_tied, PROMPTS, N_NEW)


# -- GGUF as llama.cpp's converter writes it ---------------------------------------------

def granitemoe_to_gguf(hf_dir, path, scales=True) -> str:
    """convert_hf_to_gguf.py's GraniteMoeModel on a saved HF folder: LlamaModel's keys and
    q/k permutation, GraniteModel's multiplier keys (only non-zero ones), the experts'
    input_linear split at intermediate_size into gate and up."""
    import json
    import types

    import gguf
    from safetensors.numpy import load_file

    with open(os.path.join(hf_dir, "config.json")) as f:
        hp = json.load(f)
    cfg = types.SimpleNamespace(**hp)
    sd = load_file(os.path.join(hf_dir, "model.safetensors"))
    nh, nkv, f = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.intermediate_size
    w = gguf_writer(path, "granitemoe", cfg)
    w.add_rope_freq_base(float(hp["rope_parameters"]["rope_theta"]))
    w.add_layer_norm_rms_eps(cfg.rms_norm_eps)
    w.add_expert_count(cfg.num_local_experts)
    w.add_expert_used_count(cfg.num_experts_per_tok)
    w.add_file_type(gguf.LlamaFileType.ALL_F32)
    w.add_vocab_size(cfg.vocab_size)
    w.add_rope_dimension_count(cfg.hidden_size // nh)
    if scales:
        w.add_attention_scale(cfg.attention_multiplier)
        w.add_embedding_scale(cfg.embedding_multiplier)
        w.add_residual_scale(cfg.residual_multiplier)
    w.add_logit_scale(cfg.logits_scaling)
    _add_tokenizer(w, cfg.vocab_size)
    t = {"token_embd.weight": sd["model.embed_tokens.weight"]}
    for i in range(cfg.num_hidden_layers):
        p = f"model.layers.{i}."
        gate_up = sd[p + "block_sparse_moe.input_linear.weight"]       # [E, 2F, D]
        assert gate_up.shape[-2] == 2 * f
        t.update({
            f"blk.{i}.attn_norm.weight": sd[p + "input_layernorm.weight"],
            f"blk.{i}.attn_q.weight": llama_cpp_permute(sd[p + "self_attn.q_proj.weight"], nh, nh),
            f"blk.{i}.attn_k.weight": llama_cpp_permute(sd[p + "self_attn.k_proj.weight"], nh, nkv),
            f"blk.{i}.attn_v.weight": sd[p + "self_attn.v_proj.weight"],
            f"blk.{i}.attn_output.weight": sd[p + "self_attn.o_proj.weight"],
            f"blk.{i}.ffn_norm.weight": sd[p + "post_attention_layernorm.weight"],
            f"blk.{i}.ffn_gate_inp.weight": sd[p + "block_sparse_moe.router.layer.weight"],
            f"blk.{i}.ffn_gate_exps.weight": gate_up[:, :f],
            f"blk.{i}.ffn_up_exps.weight": gate_up[:, f:],
            f"blk.{i}.ffn_down_exps.weight": sd[p + "block_sparse_moe.output_linear.weight"],
        })
    t["output_norm.weight"] = sd["model.norm.weight"]
    if "lm_head.weight" in sd:
        t["output.weight"] = sd["lm_head.weight"]
    _write(w, t)
    return str(path)


@pytest.fixture(scope="module")
def ggufs(tied, untied, tmp_path_factory):
    folder = tmp_path_factory.mktemp("granitemoe_gguf")
    return {"tied": granitemoe_to_gguf(tied[1], folder / "tied.gguf"),
            "untied": granitemoe_to_gguf(untied[1], folder / "untied.gguf")}


@pytest.mark.parametrize("name", ["tied", "untied"])
def test_granitemoe_gguf_matches_hf(name, tied, untied, ggufs):
    """The converter's GGUF: params from the granitemoe.* keys, split experts, the HF
    model's logits; llama.cpp (when llama-cpp-python is installed) agrees loosely."""
    _, _, ids, ref = {"tied": tied, "untied": untied}[name]
    got = hf_params("granitemoe", ggufs[name])[2]
    assert {k: got.get(k) for k in TINY} == TINY
    assert {k: got[k] for k in MULT} == pytest.approx(MULT)
    ours = md.load_model(spec_path("granitemoe"), ggufs[name], variant="tiny")
    assert ours.weights["blk.1.ffn_gate_exps.weight"].shape == (6, 96, 128)
    assert ("output.weight" in ours.weights) is (name == "untied")
    _check(f"granitemoe GGUF ({name})", ours, ids, ref)
    try:
        import llama_cpp
    except ImportError:
        return
    theirs = llama_cpp_logits(llama_cpp, ggufs[name], ids)
    err = np.abs(theirs - ref).max() / np.abs(ref).max()
    print(f"granitemoe GGUF ({name}): llama.cpp vs HF {err:.2e} (of max|ref|)")
    assert err <= TOL_LLAMA_CPP


def test_granitemoe_gguf_refusals(ggufs):
    spec = md.load_spec(spec_path("granitemoe"))
    meta = dict(md.load_weights(ggufs["tied"]).metadata)
    for key, value, why in (("granitemoe.rope.scaling.type", "linear", "RoPE scaling linear"),
                            ("granitemoe.rope.scaling.finetuned", False, "without RoPE"),
                            ("granitemoe.expert_shared_feed_forward_length", 64,
                             "shared expert")):
        with pytest.raises(md.WeightsError, match=why):
            params_from_metadata(spec, {**meta, key: value})


def test_granitemoe_gguf_without_optional_scales_uses_llama_cpp_defaults(tmp_path):
    """A GGUF without embedding_scale, residual_scale and attention.scale (the converter
    skips zeros) runs them as llama.cpp does: no embedding or residual scaling, attention
    scaled by 1/sqrt(head_dim); the HF model with those values gives the same logits."""
    head_dim = CFG["hidden_size"] // CFG["num_attention_heads"]
    _, hf_dir, ids, ref = hf_case(
        make_granitemoe(seed=2, embedding_multiplier=1.0, residual_multiplier=1.0,
                        attention_multiplier=head_dim ** -0.5), tmp_path / "hf")
    path = granitemoe_to_gguf(hf_dir, tmp_path / "plain.gguf", scales=False)
    ours = md.load_model(spec_path("granitemoe"), path, variant="tiny")
    assert ours.params["emb_scale"] == 1.0 and ours.params["res_scale"] == 1.0
    assert ours.params["attn_scale"] == pytest.approx(head_dim ** -0.5)
    _check("granitemoe GGUF (no optional scales)", ours, ids, ref)


def test_granitemoe_export_writes_the_converters_layout(tied, tmp_path):
    """``maxdecl export`` of the HF folder writes llama.cpp's split experts
    (blk.N.ffn_gate_exps and ffn_up_exps, cut from input_linear on load), which maxdecl
    reads back with the same logits, and llama.cpp itself runs (when installed)."""
    import gguf

    from maxdecl.cli import main

    _, hf_dir, ids, ref = tied
    out = tmp_path / "exported.gguf"
    assert main(["export", str(hf_dir), "--spec", spec_path("granitemoe"), "-o", str(out)]) == 0
    reader = gguf.GGUFReader(str(out))
    names = {t.name for t in reader.tensors}
    assert {"blk.0.ffn_gate_exps.weight", "blk.0.ffn_up_exps.weight"} <= names
    assert not any("gate_up" in n for n in names)
    assert float(reader.fields["granitemoe.logit_scale"].contents()) == 3.0
    ours = md.load_model(spec_path("granitemoe"), str(out))
    _check("granitemoe export", ours, ids, ref)
    try:
        import llama_cpp
    except ImportError:
        return
    from modelhelp import with_tokenizer

    path = with_tokenizer(str(out), tmp_path / "exported_tok.gguf", CFG["vocab_size"])
    theirs = llama_cpp_logits(llama_cpp, path, ids)
    assert np.abs(theirs - ref).max() / np.abs(ref).max() <= TOL_LLAMA_CPP
