"""specs/stablelm.yaml against transformers' StableLmForCausalLM (and llama.cpp).

Two small seeded float32 StableLMs (dim 256, 2 layers, GQA 4/2, partial rotary factor
0.25 so 16 of the 64 features of each head rotate, LayerNorm with bias, SwiGLU, untied
output):

- ``seq``: StableLM-3B-4E1T / StableLM-2-1.6B-like: sequential residual (attention,
  then post_attention_layernorm and the MLP), q/k/v biases as in StableLM-2 1.6B;
- ``par``: StableLM-2-12B-like: per-head q/k LayerNorm (one gain per head, no bias)
  and the parallel residual (the MLP reads the input LayerNorm's output; the layers
  have no post_attention_layernorm).

The GGUF files are written as llama.cpp's converter (StableLMModel) writes them: the
per-head norms stacked to ``attn_q_norm.weight [n_head, head_dim]``, no rope.freq_base
key, ``stablelm.use_parallel_residual`` from the config. llama.cpp decides both optional
parts by the tensors present (attn_q_norm, ffn_norm), and so does the spec.
"""

import dataclasses
from types import MappingProxyType

import numpy as np
import pytest

import maxdecl as md
from maxdecl.pipelines.model_loading import params_from_metadata

from modelhelp import (TOL, _add_tokenizer, _write, assert_greedy_matches_hf, assert_logits_match,
                       compare, gguf_writer, hf_case, hf_logits, hf_params, hf_state,
                       layer_tensors, llama_cpp_logits, randomize, spec_path, tiny_model,
                       token_ids, with_hf_config)

pytest.importorskip("torch")
pytest.importorskip("transformers")

PROMPTS = [[3, 17, 42, 90, 5, 7, 64, 1], [8, 9, 80], [5, 60, 33, 2, 90, 11, 7]]
N_NEW = 6
TOL_LLAMA_CPP = 5e-3        # of max|ref|: llama.cpp keeps its KV cache in f16

SEQ = dict(use_qkv_bias=True)                                   # 3B-4E1T / 2-1.6B-like
# a layer_norm_eps other than the spec's default, so that the param is seen to be read
PAR = dict(qk_layernorm=True, use_parallel_residual=True, layer_norm_eps=1e-6)   # 2-12B-like


def make_stablelm(seed=0, **kw):
    """StableLmForCausalLM: dim 256, ffn 512, 2 layers, GQA 4/2, head_dim 64 of which
    16 rotate (partial_rotary_factor 0.25), untied lm_head."""
    import torch
    import transformers

    torch.manual_seed(seed)
    cfg = dict(vocab_size=96, hidden_size=256, intermediate_size=512, num_hidden_layers=2,
               num_attention_heads=4, num_key_value_heads=2, layer_norm_eps=1e-5,
               max_position_embeddings=64, partial_rotary_factor=0.25, rope_theta=10000.0,
               hidden_act="silu", tie_word_embeddings=False, attn_implementation="eager")
    cfg.update(kw)
    return randomize(transformers.StableLmForCausalLM(transformers.StableLmConfig(**cfg)), seed)


@pytest.fixture(scope="module")
def seq(tmp_path_factory):
    return hf_case(make_stablelm(**SEQ), tmp_path_factory.mktemp("stablelm_seq"))


@pytest.fixture(scope="module")
def par(tmp_path_factory):
    return hf_case(make_stablelm(seed=1, **PAR), tmp_path_factory.mktemp("stablelm_par"))


@pytest.fixture(scope="module")
def ours_seq(seq):
    return tiny_model("stablelm", seq[1])


@pytest.fixture(scope="module")
def ours_par(par):
    return tiny_model("stablelm", par[1])


def with_hf_tensors(spec, **mapping):
    """The same spec with some ``formats.hf.tensors`` entries replaced (None: dropped)."""
    formats = {k: dict(v) for k, v in spec.formats.items()}
    formats["hf"]["tensors"] = {**formats["hf"]["tensors"], **mapping}
    return dataclasses.replace(spec, formats=MappingProxyType(formats))


def with_hf_computed(spec, **computed):
    """The same spec with ``formats.hf.computed`` tensors added."""
    formats = {k: dict(v) for k, v in spec.formats.items()}
    formats["hf"]["computed"] = {**formats["hf"].get("computed", {}), **computed}
    return dataclasses.replace(spec, formats=MappingProxyType(formats))


TINY = {"dim": 256, "n_layers": 2, "n_heads": 4, "n_kv_heads": 2, "ffn_dim": 512, "vocab": 96,
        "context": 64, "rope_dim": 16, "rope_theta": 10000.0}


# -- config ------------------------------------------------------------------------------

def test_stablelm_config_from_hf(seq, par):
    spec, meta, got = hf_params("stablelm", seq[1])
    assert {k: got.get(k) for k in TINY} == TINY
    assert got["norm_eps"] == pytest.approx(1e-5)
    assert got["qk_layernorm"] is False and got["use_parallel_residual"] is False
    got = hf_params("stablelm", par[1])[2]
    assert got["qk_layernorm"] is True and got["use_parallel_residual"] is True
    assert got["norm_eps"] == pytest.approx(1e-6)

    # released config.json files (transformers < 5) state the factor and base at the top
    # level; the stablelm_epoch-era files (StableLM-3B-4E1T's first release) say rope_pct
    # and norm_eps
    old = {k: v for k, v in meta.items() if k != "rope_parameters"}
    got = params_from_metadata(spec, {**old, "partial_rotary_factor": 0.5, "rope_theta": 5e4})
    assert got["rope_dim"] == 32 and got["rope_theta"] == 5e4
    epoch = {k: v for k, v in old.items() if k != "layer_norm_eps"}
    got = params_from_metadata(spec, {**epoch, "rope_pct": 0.25, "norm_eps": 1e-6})
    assert got["rope_dim"] == 16 and got["norm_eps"] == pytest.approx(1e-6)
    assert got["rope_theta"] == 10000.0


def test_stablelm_per_head_norms_are_stacked(par, ours_par):
    """HF keeps one LayerNorm per head (``q_layernorm.norms.{h}``); the mapping stacks
    them in head order to llama.cpp's ``attn_q_norm.weight [n_head, head_dim]``."""
    model = par[0]
    w = ours_par.weights
    attn = model.model.layers[1].self_attn
    assert w["blk.1.attn_q_norm.weight"].shape == (4, 64)
    assert w["blk.1.attn_k_norm.weight"].shape == (2, 64)
    for h in range(2):
        np.testing.assert_array_equal(np.asarray(w["blk.1.attn_k_norm.weight"])[h],
                                      attn.k_layernorm.norms[h].weight.detach().numpy())


# -- logits and generation ---------------------------------------------------------------

def test_stablelm_prefill_and_decode_match_hf(seq, ours_seq):
    assert_logits_match("stablelm (3B-like)", ours_seq, seq[2], seq[3])


def test_stablelm_qk_norm_parallel_prefill_and_decode_match_hf(par, ours_par):
    assert_logits_match("stablelm (2-12B-like)", ours_par, par[2], par[3])


def test_stablelm_greedy_generate_matches_hf(seq, ours_seq, par, ours_par):
    assert_greedy_matches_hf(seq[0], ours_seq, PROMPTS, N_NEW)
    assert_greedy_matches_hf(par[0], ours_par, PROMPTS, N_NEW)


def test_stablelm_bf16_checkpoint_loads(tmp_path):
    """A bf16 12B-like checkpoint: matrices stay bf16, the stacked per-head norms and the
    LayerNorm biases become float32 exactly; logits as transformers' on the same weights."""
    import torch

    model = make_stablelm(seed=1, **PAR).to(torch.bfloat16)
    model.save_pretrained(tmp_path, safe_serialization=True)
    ours = tiny_model("stablelm", tmp_path)
    w = ours.weights
    assert w["blk.0.attn_q.weight"].encoding == "bf16"
    assert w["blk.0.attn_q_norm.weight"].dtype == np.float32
    assert w["blk.0.attn_norm.bias"].dtype == np.float32
    ids = token_ids(model.config.vocab_size)
    pre, dec = compare(ours, hf_logits(model.float(), ids), ids)
    assert pre <= TOL and dec <= TOL


# -- negative controls -------------------------------------------------------------------

def _ours(spec, path):
    return md.load_model(spec, path, variant="tiny")


def test_stablelm_qk_layernorm_matters(par):
    """The 2-12B-like checkpoint read without its per-head q/k norms (mapped to null, so
    the spec skips the norms) gives other logits."""
    model, path, ids, ref = par
    spec = with_hf_tensors(md.load_spec(spec_path("stablelm")), **{
        "model.layers.{i}.self_attn.q_layernorm.norms.{h}.weight": None,
        "model.layers.{i}.self_attn.k_layernorm.norms.{h}.weight": None})
    pre, dec = compare(_ours(spec, path), ref, ids)
    assert pre > 10 * TOL and dec > 10 * TOL


def test_stablelm_parallel_residual_matters(seq, par):
    """The sequential checkpoint without its post_attention_layernorm runs the parallel
    residual, and the parallel one given a unit post_attention_layernorm runs the
    sequential form: both give other logits."""
    base = md.load_spec(spec_path("stablelm"))
    model, path, ids, ref = seq
    spec = with_hf_tensors(base, **{
        "model.layers.{i}.post_attention_layernorm.weight": None,
        "model.layers.{i}.post_attention_layernorm.bias": None})
    pre, dec = compare(_ours(spec, path), ref, ids)
    assert pre > 10 * TOL and dec > 10 * TOL

    model, path, ids, ref = par
    spec = with_hf_computed(base, **{f"blk.{i}.ffn_norm.weight": 1.0 for i in range(2)})
    ours = _ours(spec, path)
    np.testing.assert_array_equal(ours.weights["blk.1.ffn_norm.weight"], np.ones(256, np.float32))
    pre, dec = compare(ours, ref, ids)
    assert pre > 10 * TOL and dec > 10 * TOL


def test_stablelm_config_flags_do_not_override_the_tensors(par):
    """The flags are read but the tensors decide (as in llama.cpp, whose GGUF has no
    qk_layernorm key): config.json flags turned off change nothing."""
    model, path, ids, ref = par
    spec = with_hf_config(md.load_spec(spec_path("stablelm")),
                          qk_layernorm="{False}", use_parallel_residual="{False}")
    pre, dec = compare(_ours(spec, path), ref, ids)
    assert pre <= TOL and dec <= TOL


# -- GGUF --------------------------------------------------------------------------------

def stablelm_to_gguf(model, path, parallel_key=None) -> str:
    """Write a StableLmForCausalLM as llama.cpp's converter does (arch ``stablelm``):
    rope.dimension_count = int(partial_rotary_factor * head_dim), no rope.freq_base,
    use_parallel_residual (``parallel_key`` overrides it: the converter writes true for a
    config without the key), HF's q/k row order (neox rope), biases as ``.bias``, the
    per-head q/k norms stacked to ``[n_head, head_dim]``."""
    import gguf

    cfg, sd = model.config, hf_state(model)
    head_dim = cfg.hidden_size // cfg.num_attention_heads
    factor = cfg.rope_parameters["partial_rotary_factor"]
    w = gguf_writer(path, "stablelm", cfg)
    w.add_rope_dimension_count(int(factor * head_dim))
    w.add_parallel_residual(cfg.use_parallel_residual if parallel_key is None else parallel_key)
    w.add_layer_norm_eps(cfg.layer_norm_eps)
    w.add_file_type(gguf.LlamaFileType.ALL_F32)
    _add_tokenizer(w, cfg.vocab_size)
    t = {"token_embd.weight": sd["model.embed_tokens.weight"],
         **layer_tensors(sd, cfg.num_hidden_layers)}
    for i in range(cfg.num_hidden_layers):
        p = f"model.layers.{i}."
        for src, dst, n in (("q_layernorm", "attn_q_norm", cfg.num_attention_heads),
                            ("k_layernorm", "attn_k_norm", cfg.num_key_value_heads)):
            if p + f"self_attn.{src}.norms.0.weight" in sd:
                t[f"blk.{i}.{dst}.weight"] = np.stack(
                    [sd[p + f"self_attn.{src}.norms.{h}.weight"] for h in range(n)])
    t["output_norm.weight"] = sd["model.norm.weight"]
    t["output_norm.bias"] = sd["model.norm.bias"]
    t["output.weight"] = sd["lm_head.weight"]
    _write(w, t)
    return str(path)


@pytest.fixture(scope="module")
def ggufs(seq, par, tmp_path_factory):
    folder = tmp_path_factory.mktemp("stablelm_gguf")
    return {"seq": stablelm_to_gguf(seq[0], folder / "seq.gguf"),
            "par": stablelm_to_gguf(par[0], folder / "par.gguf")}


def test_stablelm_gguf_matches_hf(seq, par, ggufs):
    """The same weights as llama.cpp-style GGUFs: params from the stablelm.* keys (the
    base 10000 that the converter does not write is the default), the same logits."""
    for case, name in ((seq, "seq"), (par, "par")):
        model, _, ids, ref = case
        got = hf_params("stablelm", ggufs[name])[2]
        assert {k: got.get(k) for k in TINY if k != "rope_theta"} == \
            {k: v for k, v in TINY.items() if k != "rope_theta"}
        assert got["use_parallel_residual"] is (name == "par")
        assert got["norm_eps"] == pytest.approx(model.config.layer_norm_eps)
        ours = md.load_model(spec_path("stablelm"), ggufs[name], variant="tiny")
        if name == "par":
            assert ours.weights["blk.0.attn_q_norm.weight"].shape == (4, 64)
        pre, dec = compare(ours, ref, ids)
        assert pre <= TOL and dec <= TOL


def test_stablelm_gguf_parallel_key_defaults_true(seq, tmp_path):
    """llama.cpp's converter writes use_parallel_residual = true for a config.json
    without the key (the stablelm_epoch-era StableLM-3B-4E1T), though the layers keep
    their ffn_norm; llama.cpp runs such a file sequentially (ffn_norm present), and so
    does the spec."""
    model, _, ids, ref = seq
    path = stablelm_to_gguf(model, tmp_path / "seq-key-true.gguf", parallel_key=True)
    assert hf_params("stablelm", path)[2]["use_parallel_residual"] is True
    pre, dec = compare(md.load_model(spec_path("stablelm"), path, variant="tiny"), ref, ids)
    assert pre <= TOL and dec <= TOL


@pytest.mark.parametrize("name", ["seq", "par"])
def test_llama_cpp_runs_the_stablelm_gguf_with_the_reference_logits(name, seq, par, ggufs):
    """llama.cpp itself (llama-cpp-python; skipped without it) runs the GGUF with the
    transformers model's logits, and maxdecl reads the same file."""
    llama_cpp = pytest.importorskip("llama_cpp")
    model, _, ids, ref = {"seq": seq, "par": par}[name]
    theirs = llama_cpp_logits(llama_cpp, ggufs[name], ids)
    ours = np.asarray(md.load_model(spec_path("stablelm"), ggufs[name], variant="tiny").logits(ids))
    scale = float(np.abs(ref).max())
    assert np.abs(theirs - ref).max() <= TOL_LLAMA_CPP * scale
    assert np.abs(ours - ref).max() <= 1e-5 * scale
