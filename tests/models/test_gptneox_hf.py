"""specs/gptneox.yaml against transformers' GPTNeoXForCausalLM (Pythia).

A small seeded float32 GPT-NeoX: one fused query_key_value projection whose rows HF
lays out per head ([n_heads, 3, head_dim]), partial rotary embeddings (rotary_pct
0.25: 16 of each head's 64 features rotate, neox style), LayerNorms with biases, an
exact-GELU MLP with biases, the parallel residual x + attn(ln1(x)) + mlp(ln2(x)) and
an untied embed_out head. A second model takes the other branches: the sequential
residual, the tanh GELU (gelu_new), rotary_pct 0.5 with another base, and no
attention biases.
"""

import json
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest

import maxdecl as md
from maxdecl.pipelines.model_loading import params_from_metadata

from modelhelp import (TOL, _add_tokenizer, _write, assert_greedy_matches_hf, assert_logits_match,
                       compare, hf_case, hf_params, hf_state, randomize, spec_path,
                       tiny_model, without_hf_transforms)

pytest.importorskip("torch")
pytest.importorskip("transformers")

PROMPTS = [[3, 17, 42, 90, 5, 7, 64, 1], [8, 9, 20], [5, 60, 33, 2, 90, 11, 7]]
N_NEW = 6


def make_gptneox(seed=0, **kw):
    """GPTNeoXForCausalLM: dim 256 (4 heads of 64), 2 layers, ffn 512, vocab 96.

    rotary_pct and rotary_emb_base are the names Pythia's config.json uses
    (transformers 5 folds them into rope_parameters); dim and ffn are multiples of
    32, as the spec's q8_0 default needs."""
    import torch
    import transformers

    torch.manual_seed(seed)
    cfg = dict(vocab_size=96, hidden_size=256, intermediate_size=512, num_hidden_layers=2,
               num_attention_heads=4, rotary_pct=0.25, rotary_emb_base=10000,
               max_position_embeddings=64, layer_norm_eps=1e-5, hidden_act="gelu",
               use_parallel_residual=True, tie_word_embeddings=False,
               attn_implementation="eager")
    cfg.update(kw)
    return randomize(transformers.GPTNeoXForCausalLM(transformers.GPTNeoXConfig(**cfg)), seed)


# the second model: every switch the first one leaves at Pythia's setting
SEQUENTIAL = dict(use_parallel_residual=False, hidden_act="gelu_new", rotary_pct=0.5,
                  rotary_emb_base=20000, attention_bias=False)


@pytest.fixture(scope="module")
def neox(tmp_path_factory):
    return hf_case(make_gptneox(), tmp_path_factory.mktemp("gptneox_hf"))


@pytest.fixture(scope="module")
def ours(neox):
    return tiny_model("gptneox", neox[1])


@pytest.fixture(scope="module")
def neox_seq(tmp_path_factory):
    return hf_case(make_gptneox(seed=1, **SEQUENTIAL), tmp_path_factory.mktemp("gptneox_seq"))


def test_gptneox_config_from_hf(neox):
    model, path, _, _ = neox
    spec, meta, got = hf_params("gptneox", path)
    want = {"dim": 256, "n_layers": 2, "n_heads": 4, "ffn_dim": 512, "vocab": 96,
            "context": 64, "rot_dim": 16, "rope_theta": 10000.0, "parallel_residual": True,
            "hidden_act": "gelu", "rope_type": "default"}
    assert {k: got.get(k) for k in want} == want
    assert got["norm_eps"] == pytest.approx(1e-5)
    # Pythia's config.json as transformers < 5 wrote it: rotary_pct / rotary_emb_base
    # at the top level, no rope_parameters
    old = {k: v for k, v in meta.items() if k != "rope_parameters"}
    old.update(rotary_pct=0.5, rotary_emb_base=20000, use_parallel_residual=False)
    got = params_from_metadata(spec, old)
    assert got["rot_dim"] == 32 and got["rope_theta"] == 20000
    assert got["parallel_residual"] is False and "rope_type" not in got   # stays default
    # without any rotary key: HF's default rotary_pct 0.25
    del old["rotary_pct"]
    assert params_from_metadata(spec, old)["rot_dim"] == 16


def test_gptneox_prefill_and_decode_match_hf(neox, ours):
    model, path, ids, ref = neox
    assert_logits_match("gptneox", ours, ids, ref)


def test_gptneox_greedy_generate_matches_hf(neox, ours):
    assert_greedy_matches_hf(neox[0], ours, PROMPTS, N_NEW)


def test_gptneox_sequential_residual_matches_hf(neox_seq):
    """use_parallel_residual false, gelu_new, rotary_pct 0.5, base 20000, no q/k/v or
    dense biases (attention_bias false: the spec's absent fills stand in)."""
    model, path, ids, ref = neox_seq
    got = hf_params("gptneox", path)[2]
    assert got["parallel_residual"] is False and got["hidden_act"] == "gelu_new"
    assert got["rot_dim"] == 32 and got["rope_theta"] == 20000
    assert not any(k.endswith("query_key_value.bias") for k in md.load_weights(path).keys())
    ours = tiny_model("gptneox", path)
    assert_logits_match("gptneox (sequential)", ours, ids, ref)
    assert_greedy_matches_hf(model, ours, PROMPTS[:2], N_NEW)
    # erf and tanh GELU differ by only ~5e-5 of max|ref| here, under TOL: check that
    # the select took the tanh branch by comparing against the erf one
    td = md.load_weights(path)
    td.metadata["hidden_act"] = "gelu"
    erf = max(compare(md.load_model(spec_path("gptneox"), td, variant="tiny"), ref, ids))
    assert max(compare(ours, ref, ids)) < erf / 10


def _copy_with_config(src, dst, **changes):
    shutil.copytree(src, dst)
    with open(os.path.join(dst, "config.json")) as f:
        cfg = json.load(f)
    cfg.update(changes)
    with open(os.path.join(dst, "config.json"), "w") as f:
        json.dump(cfg, f)
    return str(dst)


@pytest.mark.parametrize("change", ["sequential", "full_rotary", "gguf_qkv_rows"])
def test_gptneox_switches_matter(neox, change):
    """Negative controls on the same weights: the sequential residual, rotating every
    feature of a head, or reading HF's per-head fused qkv rows without the permute_rows
    transform each give other logits, so the matches above need the spec's choices."""
    model, path, ids, ref = neox
    spec, td = md.load_spec(spec_path("gptneox")), md.load_weights(path)
    if change == "sequential":
        td.metadata["use_parallel_residual"] = False
    elif change == "full_rotary":
        td.metadata["rope_parameters"] = {**td.metadata["rope_parameters"],
                                          "partial_rotary_factor": 1.0}
    else:
        spec = without_hf_transforms(spec)
    pre, dec = compare(md.load_model(spec, td, variant="tiny"), ref, ids)
    assert pre > 10 * TOL and dec > 10 * TOL


def test_gptneox_refuses_rope_scaling(neox, tmp_path):
    path = _copy_with_config(neox[1], tmp_path / "scaled", rope_parameters={
        "rope_type": "linear", "factor": 2.0, "rope_theta": 10000.0,
        "partial_rotary_factor": 0.25})
    with pytest.raises(Exception, match="RoPE scaling linear is not modelled"):
        md.load_model(spec_path("gptneox"), path, variant="tiny")


def test_gptneox_loads_old_buffers(neox, tmp_path):
    """Pythia checkpoints saved by older transformers also hold per-layer causal-mask
    and rotary buffers (attention.bias, attention.masked_bias, rotary_emb.inv_freq);
    the mapping drops them."""
    from safetensors.numpy import load_file, save_file

    model, path, ids, ref = neox
    dst = tmp_path / "old"
    shutil.copytree(path, dst)
    (f,) = [n for n in os.listdir(dst) if n.endswith(".safetensors")]
    sd = load_file(os.path.join(dst, f))
    for i in range(2):
        p = f"gpt_neox.layers.{i}.attention."
        sd[p + "bias"] = np.tril(np.ones((64, 64), bool))[None, None]
        sd[p + "masked_bias"] = np.array(-1e9, np.float32)
        sd[p + "rotary_emb.inv_freq"] = np.ones(8, np.float32)
    save_file(sd, os.path.join(dst, f), metadata={"format": "pt"})
    pre, dec = compare(tiny_model("gptneox", dst), ref, ids)
    assert pre <= TOL and dec <= TOL


def gptneox_to_gguf(model, path) -> str:
    """Write a GPTNeoXForCausalLM as llama.cpp's convert_hf_to_gguf.py does (arch
    ``gptneox``): the fused qkv rows reordered from [n_head, 3, head_dim] to
    [3, n_head, head_dim], rope.dimension_count, use_parallel_residual, the LayerNorm
    epsilon; no vocab_size key (the tokenizer's length gives it)."""
    import gguf

    cfg, sd = model.config, hf_state(model)
    nh, dim = cfg.num_attention_heads, cfg.hidden_size
    w = gguf.GGUFWriter(os.fspath(path), "gptneox")
    w.add_context_length(cfg.max_position_embeddings)
    w.add_embedding_length(dim)
    w.add_block_count(cfg.num_hidden_layers)
    w.add_feed_forward_length(cfg.intermediate_size)
    w.add_rope_dimension_count(int(cfg.rope_parameters["partial_rotary_factor"] * (dim // nh)))
    w.add_head_count(nh)
    w.add_parallel_residual(cfg.use_parallel_residual)
    w.add_layer_norm_eps(cfg.layer_norm_eps)
    w.add_file_type(gguf.LlamaFileType.ALL_F32)
    _add_tokenizer(w, cfg.vocab_size)
    names = {"input_layernorm": "attn_norm", "attention.query_key_value": "attn_qkv",
             "attention.dense": "attn_output", "post_attention_layernorm": "ffn_norm",
             "mlp.dense_h_to_4h": "ffn_up", "mlp.dense_4h_to_h": "ffn_down"}
    t = {"token_embd.weight": sd["gpt_neox.embed_in.weight"]}
    for i in range(cfg.num_hidden_layers):
        for src, dst in names.items():
            for kind in ("weight", "bias"):
                x = sd.get(f"gpt_neox.layers.{i}.{src}.{kind}")
                if x is None:
                    continue
                if src == "attention.query_key_value":
                    x = x.reshape(nh, 3, dim // nh, *x.shape[1:]).swapaxes(0, 1).reshape(x.shape)
                t[f"blk.{i}.{dst}.{kind}"] = x
    t["output_norm.weight"] = sd["gpt_neox.final_layer_norm.weight"]
    t["output_norm.bias"] = sd["gpt_neox.final_layer_norm.bias"]
    t["output.weight"] = sd["lm_head.weight"]     # transformers 5's name for embed_out
    _write(w, t)
    return os.fspath(path)


def test_gptneox_gguf_matches_hf(neox, tmp_path):
    """The same weights as llama.cpp's converter writes them: params from the
    gptneox.* keys, the fused qkv in GGUF row order ([3, n_heads, head_dim])."""
    model, _, ids, ref = neox
    path = gptneox_to_gguf(model, tmp_path / "tiny-gptneox.gguf")
    got = hf_params("gptneox", path)[2]
    assert got["rot_dim"] == 16 and got["vocab"] == 96
    assert got["parallel_residual"] is True and got["norm_eps"] == pytest.approx(1e-5)
    pre, dec = compare(md.load_model(spec_path("gptneox"), path, variant="tiny"), ref, ids)
    assert pre <= TOL and dec <= TOL


def test_gptneox_export_round_trip(neox_seq, tmp_path):
    """``maxdecl export`` of the HF checkpoint writes the fused qkv rows in llama.cpp's
    order (as its converter does) and ``gptneox.hidden_act`` keeps gelu_new; loading it
    back gives HF's logits."""
    model, path, ids, ref = neox_seq
    out = tmp_path / "exported.gguf"
    subprocess.run([sys.executable, "-m", "maxdecl", "export", "--spec", spec_path("gptneox"),
                    "--variant", "tiny", "-o", str(out), path], check=True, capture_output=True)
    got = hf_params("gptneox", out)[2]
    assert got["hidden_act"] == "gelu_new"
    converted = md.load_weights(gptneox_to_gguf(model, tmp_path / "converter.gguf"))
    exported = md.load_weights(out)
    for name in ("blk.0.attn_qkv.weight", "blk.1.attn_qkv.weight"):    # no biases here
        got_w, want = (np.asarray(getattr(t[name], "dequantize", lambda: t[name])())
                       for t in (exported, converted))
        np.testing.assert_allclose(got_w, want, atol=0.02 * np.abs(want).max())
    assert got["parallel_residual"] is False and got["rot_dim"] == 32
    pre, dec = compare(tiny_model("gptneox", out), ref, ids)
    assert pre <= TOL and dec <= TOL
