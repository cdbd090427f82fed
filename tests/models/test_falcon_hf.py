"""specs/falcon.yaml against transformers' FalconForCausalLM.

Small seeded float32 Falcons: parallel attention (attention and MLP read one LayerNorm
of the residual stream and both add to it), LayerNorms with biases, the fused
query_key_value projection, RoPE rotating halves over the whole head, an exact-erf GELU
MLP of 4 * hidden, no linear biases, the final ln_f.

- "7b": Falcon-7B's layout: multi-query (4 query heads, one kv head, qkv rows
  [q_0 .. q_3, k, v]), one LayerNorm per block, output tied to the embedding;
- "40b": the new decoder architecture of Falcon-40B / 180B: 8 query heads in 2 kv
  groups (qkv rows [n_kv, q_per_kv + 2, head_dim]), ln_attn and ln_mlp, untied lm_head;
- two more layouts: the new architecture with one LayerNorm (num_ln_in_parallel_attn 1,
  as Falcon2-11B) and multi_query false (rows [n_head, 3, head_dim]).

The GGUFs are written as llama.cpp's converter (convert_hf_to_gguf.py, FalconModel)
writes them: q, k, v rows one after the other ("jploski" layout), ln_attn as
attn_norm_2, ln_mlp / input_layernorm as attn_norm, no output.weight when tied.
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
                       compare, hf_case, hf_logits, hf_params, hf_state, llama_cpp_logits, q8_0,
                       q8_0_dequantized, randomize, spec_path, tiny_model, token_ids,
                       without_hf_transforms)

pytest.importorskip("torch")
pytest.importorskip("transformers")

PROMPTS = [[3, 17, 42, 90, 5, 7, 64, 1], [8, 9, 95], [5, 60, 33, 2, 90, 11, 7]]
N_NEW = 6
TOL_LLAMA_CPP = 5e-3    # of max|ref|: llama.cpp keeps its KV cache in f16, tanh GELU


def make_falcon(seed=0, **kw):
    """FalconForCausalLM: vocab 96, dim 256, 4 heads, 2 layers, Falcon-7B's layout
    (multi-query, one LayerNorm per block, tied output) unless ``kw`` says otherwise.

    The embedding table is scaled to 0.1 * N(0, 1), as in test_qwen2_hf.py, so greedy
    decoding with the tied output does not just repeat the last token."""
    import torch
    import transformers

    torch.manual_seed(seed)
    cfg = dict(vocab_size=96, hidden_size=256, num_hidden_layers=2, num_attention_heads=4,
               layer_norm_epsilon=1e-5, max_position_embeddings=64,
               attn_implementation="eager")
    cfg.update(kw)
    model = randomize(transformers.FalconForCausalLM(transformers.FalconConfig(**cfg)), seed)
    with torch.no_grad():
        model.transformer.word_embeddings.weight.mul_(0.1)
    return model


NEW_ARCH = dict(num_attention_heads=8, num_kv_heads=2, new_decoder_architecture=True,
                tie_word_embeddings=False)
LAYOUTS = {
    "7b": {},
    "40b": NEW_ARCH,
    "new arch, one norm": {**NEW_ARCH, "num_ln_in_parallel_attn": 1, "tie_word_embeddings": True},
    "multi_query false": dict(multi_query=False),
}


@pytest.fixture(scope="module")
def f7(tmp_path_factory):
    return hf_case(make_falcon(), tmp_path_factory.mktemp("falcon7"))


@pytest.fixture(scope="module")
def ours7(f7):
    return tiny_model("falcon", f7[1])


@pytest.fixture(scope="module")
def f40(tmp_path_factory):
    return hf_case(make_falcon(seed=1, **NEW_ARCH), tmp_path_factory.mktemp("falcon40"))


@pytest.fixture(scope="module")
def ours40(f40):
    return tiny_model("falcon", f40[1])


# -- config ------------------------------------------------------------------------------

def test_falcon_config_from_hf(f7, f40):
    spec, meta, got = hf_params("falcon", f7[1])
    want = {"dim": 256, "n_layers": 2, "n_heads": 4, "n_kv_heads": 1, "ffn_dim": 1024,
            "vocab": 96, "context": 64}
    assert meta["num_kv_heads"] == 4          # transformers writes it; multi_query ignores it
    assert {k: got[k] for k in want} == want
    assert got["norm_eps"] == pytest.approx(1e-5) and got["rope_theta"] == 10000.0
    assert not any(k.startswith("lm_head") for k in md.load_weights(f7[1]).keys())   # tied
    got40 = hf_params("falcon", f40[1])[2]
    assert (got40["n_heads"], got40["n_kv_heads"], got40["ffn_dim"]) == (8, 2, 1024)
    assert "lm_head.weight" in md.load_weights(f40[1]).keys()                       # untied


@pytest.mark.parametrize("config, n_kv", [
    # tiiuae/falcon-7b's config.json: no num_kv_heads, no max_position_embeddings
    ({"hidden_size": 4544, "multi_query": True, "new_decoder_architecture": False,
      "num_attention_heads": 71, "num_hidden_layers": 32}, 1),
    # tiiuae/falcon-40b
    ({"hidden_size": 8192, "multi_query": True, "new_decoder_architecture": True,
      "num_attention_heads": 128, "num_kv_heads": 8, "num_hidden_layers": 60}, 8),
    # the older RefinedWeb / RefinedWebModel spellings
    ({"hidden_size": 8192, "n_head": 128, "n_head_kv": 8, "n_layer": 60,
      "new_decoder_architecture": True}, 8),
    ({"hidden_size": 4544, "n_head": 71, "n_layer": 32, "multi_query": True}, 1),
    # new architecture without num_kv_heads: transformers' default, one per query head
    ({"hidden_size": 512, "multi_query": True, "new_decoder_architecture": True,
      "num_attention_heads": 8, "num_hidden_layers": 2}, 8),
])
def test_falcon_config_spellings(config, n_kv):
    spec = md.load_spec(spec_path("falcon"))
    got = params_from_metadata(spec, {**config, "vocab_size": 65024, "alibi": False,
                                      "parallel_attn": True, "layer_norm_epsilon": 1e-5,
                                      "maxdecl.format": "hf"})
    assert got["n_kv_heads"] == n_kv
    assert got["dim"] == config["hidden_size"] and got["ffn_dim"] == 4 * config["hidden_size"]
    assert got.get("context", 2048) == 2048


# -- logits and generation ---------------------------------------------------------------

def test_falcon_7b_prefill_and_decode_match_hf(f7, ours7):
    model, path, ids, ref = f7
    assert_logits_match("falcon 7b", ours7, ids, ref)


def test_falcon_7b_greedy_generate_matches_hf(f7, ours7):
    assert_greedy_matches_hf(f7[0], ours7, PROMPTS, N_NEW)


def test_falcon_new_architecture_matches_hf(f40, ours40):
    model, path, ids, ref = f40
    assert ours40.params["n_kv_heads"] == 2 and ours40.params["head_dim"] == 32
    assert_logits_match("falcon 40b", ours40, ids, ref)
    assert_greedy_matches_hf(model, ours40, PROMPTS, N_NEW)


@pytest.mark.parametrize("layout", ["new arch, one norm", "multi_query false"])
def test_falcon_other_layouts_match_hf(layout, tmp_path):
    model, path, ids, ref = hf_case(make_falcon(seed=2, **LAYOUTS[layout]), tmp_path)
    assert_logits_match(f"falcon {layout}", tiny_model("falcon", path), ids, ref)


# -- negative controls -------------------------------------------------------------------

def _sequential_spec(tmp_path) -> str:
    """specs/falcon.yaml rewired as a sequential block: the MLP reads the LayerNorm (the
    same attn_norm weights) of x + attention instead of the norm of x."""
    with open(spec_path("falcon")) as f:
        text = f.read()
    mlp_in = "{op: linear, in: [h_mlp, .weight], out: m}"
    seq = ("- {op: add, in: [x, a], out: xa}\n"
           "      - {op: layer_norm, in: [xa, \"blk.{i}.attn_norm.weight\","
           " \"blk.{i}.attn_norm.bias\"], attrs: {epsilon: \"{norm_eps}\"}, out: h_seq}\n"
           "      - name: ffn_up")
    assert text.count(mlp_in) == 1 and text.count("- name: ffn_up") == 1
    text = text.replace(mlp_in, mlp_in.replace("h_mlp", "h_seq")).replace("- name: ffn_up", seq)
    path = tmp_path / "falcon_sequential.yaml"
    path.write_text(text)
    return str(path)


def test_falcon_parallel_structure_matters(f7, f40, tmp_path):
    """The same weights through a sequential block (MLP after attention) give other
    logits; so do the new architecture's ln_attn and ln_mlp swapped."""
    seq_spec = _sequential_spec(tmp_path)
    for model, path, ids, ref in (f7, f40):
        pre, dec = compare(md.load_model(seq_spec, path, variant="tiny"), ref, ids)
        assert pre > 10 * TOL and dec > 10 * TOL
    model, path, ids, ref = f40
    td = md.load_weights(path)
    for i in range(2):
        for kind in ("weight", "bias"):
            a, b = (f"transformer.h.{i}.{n}.{kind}" for n in ("ln_attn", "ln_mlp"))
            td[a], td[b] = td[b], td[a]
    pre, dec = compare(md.load_model(spec_path("falcon"), td, variant="tiny"), ref, ids)
    assert pre > 10 * TOL and dec > 10 * TOL


def test_falcon_qkv_layout_matters(f7, f40):
    """Reading HF's grouped query_key_value rows as llama.cpp's q | k | v (without the
    regroup_rows transform) gives other logits for the new architecture; for
    Falcon-7B's single kv head both are the same rows, so the logits are too."""
    spec = without_hf_transforms(md.load_spec(spec_path("falcon")))
    model, path, ids, ref = f40
    pre, dec = compare(md.load_model(spec, path, variant="tiny"), ref, ids)
    assert pre > 10 * TOL and dec > 10 * TOL
    model, path, ids, ref = f7
    pre, dec = compare(md.load_model(spec, path, variant="tiny"), ref, ids)
    assert pre <= TOL and dec <= TOL


# -- refusals ----------------------------------------------------------------------------

@pytest.mark.parametrize("change, match", [
    ({"alibi": True}, "ALiBi"),
    ({"parallel_attn": False}, "parallel_attn"),
    ({"bias": True}, "bias"),
    ({"activation": "relu"}, "activation relu"),
    ({"rope_parameters": {"rope_type": "linear", "factor": 2.0, "rope_theta": 10000.0}},
     "RoPE scaling linear"),
])
def test_falcon_refuses_what_it_does_not_model(f7, tmp_path, change, match):
    path = shutil.copytree(f7[1], tmp_path / "changed")
    with open(os.path.join(path, "config.json")) as f:
        cfg = json.load(f)
    with open(os.path.join(path, "config.json"), "w") as f:
        json.dump({**cfg, **change}, f)
    with pytest.raises(md.errors.WeightsError, match=match):
        tiny_model("falcon", path)


# -- GGUF, as llama.cpp's converter writes it ---------------------------------------------

def falcon_to_gguf(model, path, reorder_qkv=True, quantize=None) -> str:
    """Write a FalconForCausalLM as llama.cpp's converter does (arch ``falcon``): the
    fused q/k/v rows reordered from HF's per-kv-head groups [n_kv, q_per_kv + 2,
    head_dim] to q (all heads), k, v; context 2048 and FFN 4 * hidden (the converter's
    constants); ln_attn as attn_norm_2; no output.weight when tied; no vocab_size key.

    The converter takes n_head_kv from config.json's num_kv_heads (else 1); transformers
    writes num_kv_heads = num_attention_heads for multi-query models, which the
    converter would misread, so here it is the count the model really uses (the
    released Falcon-7B config.json has no num_kv_heads: 1). ``reorder_qkv=False``
    keeps HF's rows (a negative control); ``quantize``: as modelhelp's ``_write``."""
    import gguf

    cfg, sd = model.config, hf_state(model)
    nh, d = cfg.num_attention_heads, cfg.hidden_size
    nkv = (cfg.num_kv_heads if cfg.new_decoder_architecture
           else 1 if cfg.multi_query else nh)
    hd = d // nh
    w = gguf.GGUFWriter(os.fspath(path), "falcon")
    w.add_context_length(2048)
    w.add_tensor_data_layout("jploski")
    w.add_embedding_length(d)
    w.add_feed_forward_length(4 * d)
    w.add_block_count(cfg.num_hidden_layers)
    w.add_head_count(nh)
    w.add_head_count_kv(nkv)
    w.add_layer_norm_eps(cfg.layer_norm_epsilon)
    w.add_file_type(gguf.LlamaFileType.ALL_F32)
    _add_tokenizer(w, cfg.vocab_size)
    p = "transformer."
    t = {"token_embd.weight": sd[p + "word_embeddings.weight"]}
    names = {"input_layernorm": "attn_norm", "ln_mlp": "attn_norm", "ln_attn": "attn_norm_2",
             "self_attention.query_key_value": "attn_qkv", "self_attention.dense": "attn_output",
             "mlp.dense_h_to_4h": "ffn_up", "mlp.dense_4h_to_h": "ffn_down"}
    for i in range(cfg.num_hidden_layers):
        for src, dst in names.items():
            for kind in ("weight", "bias"):
                name = f"{p}h.{i}.{src}.{kind}"
                if name not in sd:
                    continue
                x = sd[name]
                if dst == "attn_qkv" and reorder_qkv:
                    qkv = x.reshape(nkv, nh // nkv + 2, hd, d)
                    x = np.concatenate([qkv[:, :-2].reshape(nh * hd, d),
                                        qkv[:, -2].reshape(nkv * hd, d),
                                        qkv[:, -1].reshape(nkv * hd, d)])
                t[f"blk.{i}.{dst}.{kind}"] = x
    t["output_norm.weight"] = sd[p + "ln_f.weight"]
    t["output_norm.bias"] = sd[p + "ln_f.bias"]
    if not cfg.tie_word_embeddings:
        t["output.weight"] = sd["lm_head.weight"]
    _write(w, t, quantize)
    return os.fspath(path)


@pytest.fixture(scope="module")
def ggufs(f7, f40, tmp_path_factory):
    folder = tmp_path_factory.mktemp("falcon_gguf")
    return {"7b": falcon_to_gguf(f7[0], folder / "falcon7.gguf"),
            "40b": falcon_to_gguf(f40[0], folder / "falcon40.gguf")}


def test_falcon_gguf_matches_hf(f7, f40, ggufs):
    """The same weights as llama.cpp-style GGUFs: params from the falcon.* keys, q/k/v
    rows in llama.cpp's order, Falcon-7B's tied output from token_embd.weight and the
    attention reading attn_norm without an attn_norm_2."""
    for case, want in ((f7, (256, 4, 1, 96, 2048)), (f40, (256, 8, 2, 96, 2048))):
        model, _, ids, ref = case
        path = ggufs["40b" if model.config.new_decoder_architecture else "7b"]
        got = hf_params("falcon", path)[2]
        assert (got["dim"], got["n_heads"], got["n_kv_heads"], got["vocab"], got["context"]) == want
        keys = md.load_weights(path).keys()
        assert ("blk.0.attn_norm_2.weight" in keys) == model.config.new_decoder_architecture
        assert ("output.weight" in keys) == (not model.config.tie_word_embeddings)
        pre, dec = compare(md.load_model(spec_path("falcon"), path, variant="tiny"), ref, ids)
        assert pre <= TOL and dec <= TOL


def test_falcon_gguf_needs_the_qkv_reorder(f40, tmp_path):
    """Negative control: a GGUF keeping HF's grouped rows is read wrongly (as llama.cpp
    would read it)."""
    model, _, ids, ref = f40
    path = falcon_to_gguf(model, tmp_path / "unordered.gguf", reorder_qkv=False)
    pre, dec = compare(md.load_model(spec_path("falcon"), path, variant="tiny"), ref, ids)
    assert pre > 10 * TOL and dec > 10 * TOL


def test_llama_cpp_runs_the_falcon_ggufs(f7, f40, ggufs):
    """llama.cpp itself (llama-cpp-python) runs the converter-style GGUFs with the
    transformers logits; skipped without llama_cpp."""
    llama_cpp = pytest.importorskip("llama_cpp")
    for model, _, _, _ in (f7, f40):
        path = ggufs["40b" if model.config.new_decoder_architecture else "7b"]
        ids = token_ids(model.config.vocab_size)
        ref = hf_logits(model, ids)
        theirs = llama_cpp_logits(llama_cpp, path, ids)
        scale = float(np.abs(ref).max())
        err = np.abs(theirs - ref).max() / scale
        print(f"llama.cpp falcon {path}: {err:.2e} of max|ref|")
        assert err <= TOL_LLAMA_CPP


def test_falcon_q8_0_gguf_matches_dequantized_hf(f40, tmp_path):
    """Q8_0 matrices (the fused qkv included) run the packed kernels and give the
    logits of the HF model holding the dequantized weights."""
    model, _, ids, _ = f40
    path = falcon_to_gguf(model, tmp_path / "falcon40-q8_0.gguf", quantize=q8_0)
    ours = md.load_model(spec_path("falcon"), path, variant="tiny")
    assert ours.weights["blk.0.attn_qkv.weight"].encoding == "q8_0"
    pre, dec = compare(ours, hf_logits(q8_0_dequantized(model), ids), ids)
    assert pre <= TOL and dec <= TOL


def test_falcon_export_round_trip(f7, f40, ggufs, tmp_path):
    """`maxdecl export` of the HF weights writes the q/k/v rows as llama.cpp's converter
    does (regrouped for the new architecture; already so for Falcon-7B's one kv head),
    and maxdecl reads the file back with the same logits."""
    for case, name in ((f7, "7b"), (f40, "40b")):
        model, path, ids, ref = case
        out = tmp_path / f"exported-{name}.gguf"
        subprocess.run([sys.executable, "-m", "maxdecl", "export", "--spec", spec_path("falcon"),
                        "--variant", "tiny", "-o", str(out), path], check=True,
                       capture_output=True)
        exported, converted = md.load_weights(out), md.load_weights(ggufs[name])
        for t in (exported, converted):
            assert t["blk.0.attn_qkv.weight"].shape == converted["blk.0.attn_qkv.weight"].shape
        got, want = (np.asarray(getattr(t["blk.0.attn_qkv.weight"], "dequantize",
                                        lambda: t["blk.0.attn_qkv.weight"])())
                     for t in (exported, converted))
        np.testing.assert_allclose(got, want, atol=0.02 * np.abs(want).max())
        pre, dec = compare(tiny_model("falcon", out), ref, ids)
        assert pre <= TOL and dec <= TOL
