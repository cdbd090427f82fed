"""specs/phi2.yaml against transformers' PhiForCausalLM (Phi-1.5 / Phi-2).

A small seeded float32 Phi: one LayerNorm (with bias) per block feeding attention and
the MLP in parallel, q/k/v/dense projections with biases, partial rotary embeddings
(half of each head rotates, neox halves), GELU (tanh) MLP with biases, a final
LayerNorm and an untied lm_head with a bias. Also: the same weights as a GGUF as
llama.cpp's converter writes it (arch ``phi2``, q/k/v kept separate), run by maxdecl
and, when llama-cpp-python is installed, by llama.cpp itself.
"""

import json
import shutil

import numpy as np
import pytest

import maxdecl as md
from maxdecl.pipelines.model_loading import params_from_metadata

from modelhelp import (TOL, _add_tokenizer, _write, assert_greedy_matches_hf, assert_logits_match,
                       compare, gguf_writer, hf_case, hf_params, hf_state, llama_cpp_logits,
                       randomize, spec_path, tiny_model, with_hf_config)

pytest.importorskip("torch")
pytest.importorskip("transformers")

PROMPTS = [[3, 17, 42, 90, 5, 7, 64, 1], [8, 9, 60], [5, 60, 33, 2, 90, 11, 7]]
N_NEW = 6
TOL_LLAMA_CPP = 2e-3


def make_phi(seed=0, **kw):
    """PhiForCausalLM: dim 256, 4 heads of 64 (32 of them rotating), 2 layers, FFN 512."""
    import torch
    import transformers

    torch.manual_seed(seed)
    cfg = dict(vocab_size=96, hidden_size=256, intermediate_size=512, num_hidden_layers=2,
               num_attention_heads=4, num_key_value_heads=4, layer_norm_eps=1e-5,
               max_position_embeddings=64, partial_rotary_factor=0.5, rope_theta=10000.0,
               hidden_act="gelu_new", tie_word_embeddings=False, attn_implementation="eager")
    cfg.update(kw)
    return randomize(transformers.PhiForCausalLM(transformers.PhiConfig(**cfg)), seed)


@pytest.fixture(scope="module")
def phi(tmp_path_factory):
    return hf_case(make_phi(), tmp_path_factory.mktemp("phi_hf"))


@pytest.fixture(scope="module")
def ours(phi):
    return tiny_model("phi2", phi[1])


def phi_to_gguf(model, path) -> str:
    """Write a PhiForCausalLM as llama.cpp's convert_hf_to_gguf.py (Phi2Model) does:
    arch ``phi2``, q/k/v separate and in HF's row order (llama.cpp ropes phi2 neox
    style), ``rope.dimension_count = int(partial_rotary_factor * n_embd) // n_head``,
    LayerNorm eps, the lm_head as ``output.weight`` / ``output.bias``.

    (The converter writes ``feed_forward_length = 4 * n_embd``, right for every released
    Phi; here the FFN width is written as it is, 512, so llama.cpp accepts the tensors.)"""
    import gguf

    cfg, sd = model.config, hf_state(model)
    rp = getattr(cfg, "rope_parameters", None) or {}
    rot_pct = rp.get("partial_rotary_factor", getattr(cfg, "partial_rotary_factor", 0.5))
    w = gguf_writer(path, "phi2", cfg)
    w.add_layer_norm_eps(cfg.layer_norm_eps)
    w.add_rope_dimension_count(int(rot_pct * cfg.hidden_size) // cfg.num_attention_heads)
    w.add_file_type(gguf.LlamaFileType.ALL_F32)
    w.add_add_bos_token(False)
    _add_tokenizer(w, cfg.vocab_size)
    names = {"input_layernorm": "attn_norm", "self_attn.q_proj": "attn_q",
             "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v",
             "self_attn.dense": "attn_output", "mlp.fc1": "ffn_up", "mlp.fc2": "ffn_down"}
    t = {"token_embd.weight": sd["model.embed_tokens.weight"]}
    for i in range(cfg.num_hidden_layers):
        for src, dst in names.items():
            for kind in ("weight", "bias"):
                t[f"blk.{i}.{dst}.{kind}"] = sd[f"model.layers.{i}.{src}.{kind}"]
    t["output_norm.weight"] = sd["model.final_layernorm.weight"]
    t["output_norm.bias"] = sd["model.final_layernorm.bias"]
    t["output.weight"] = sd["lm_head.weight"]
    t["output.bias"] = sd["lm_head.bias"]
    _write(w, t)
    return str(path)


@pytest.fixture(scope="module")
def phi_gguf(phi, tmp_path_factory):
    return phi_to_gguf(phi[0], tmp_path_factory.mktemp("phi_gguf") / "tiny-phi2.gguf")


def test_phi2_config_from_hf(phi):
    model, path, _, _ = phi
    spec, meta, got = hf_params("phi2", path)
    want = {"dim": 256, "n_layers": 2, "n_heads": 4, "n_kv_heads": 4, "ffn_dim": 512,
            "vocab": 96, "context": 64, "partial_rotary_factor": 0.5, "rope_theta": 10000.0,
            "qk_layernorm": False, "hidden_act": "gelu_new", "rope_type": "none"}
    assert {k: got.get(k) for k in want} == want
    assert got["norm_eps"] == pytest.approx(1e-5)
    # Phi-2's own config.json (transformers < 5): top-level partial_rotary_factor and
    # rope_theta, rope_scaling null, num_key_value_heads null
    old = {k: v for k, v in meta.items() if k != "rope_parameters"}
    old.update(partial_rotary_factor=0.4, rope_theta=20000.0, rope_scaling=None,
               num_key_value_heads=None)
    got = params_from_metadata(spec, old)
    assert got["partial_rotary_factor"] == 0.4 and got["rope_theta"] == 20000.0
    assert got["n_kv_heads"] == 4 and got.get("rope_type", "none") == "none"
    assert md.load_model(spec_path("phi2"), path, variant="tiny").params["rot_dim"] == 32


def test_phi2_prefill_and_decode_match_hf(phi, ours):
    model, path, ids, ref = phi
    assert_logits_match("phi2", ours, ids, ref)


def test_phi2_greedy_generate_matches_hf(phi, ours):
    assert_greedy_matches_hf(phi[0], ours, PROMPTS, N_NEW)


def test_phi2_lm_head_bias_matters(phi):
    """Negative control: the same weights with lm_head.bias zeroed give other logits."""
    model, path, ids, ref = phi
    td = md.load_weights(path)
    td["lm_head.bias"] = np.zeros_like(np.asarray(td["lm_head.bias"]))
    pre, dec = compare(md.load_model(spec_path("phi2"), td, variant="tiny"), ref, ids)
    assert pre > 10 * TOL and dec > 10 * TOL


def test_phi2_partial_rotary_factor_matters(phi):
    """Negative control: reading another rotary fraction (a quarter of each head) gives
    other logits, so the match above needs rot_dim from the config."""
    model, path, ids, ref = phi
    spec = with_hf_config(md.load_spec(spec_path("phi2")), partial_rotary_factor=0.25)
    other = md.load_model(spec, path, variant="tiny")
    assert other.params["rot_dim"] == 16
    pre, dec = compare(other, ref, ids)
    assert pre > 10 * TOL and dec > 10 * TOL


def test_phi2_qk_layernorm_matches_hf(tmp_path):
    """qk_layernorm: a LayerNorm over head_dim (one gain and bias for all heads) on q
    and k before the rotation."""
    model, path, ids, ref = hf_case(make_phi(seed=1, qk_layernorm=True), tmp_path)
    assert "model.layers.0.self_attn.q_layernorm.bias" in md.load_weights(path).keys()
    ours = tiny_model("phi2", path)
    assert ours.params["qk_layernorm"] is True
    assert_logits_match("phi2 qk_layernorm", ours, ids, ref)


def test_phi2_refuses_unmodelled_configs(phi, tmp_path):
    """RoPE scaling (either config layout) and activations other than GELU tanh are
    refused; llama.cpp's rope.scaling.type "none" loads."""
    spec = md.load_spec(spec_path("phi2"))
    path = tmp_path / "linear"
    shutil.copytree(phi[1], path)
    cfg = json.loads((path / "config.json").read_text())
    cfg["rope_parameters"] = {**cfg["rope_parameters"], "rope_type": "linear", "factor": 2.0}
    (path / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(md.WeightsError, match="RoPE scaling linear is not modelled"):
        tiny_model("phi2", path)
    old = {"maxdecl.format": "hf", "rope_scaling": {"type": "dynamic", "factor": 2.0}}
    with pytest.raises(md.WeightsError, match="dynamic"):
        params_from_metadata(spec, old)
    with pytest.raises(md.WeightsError, match="hidden_act relu"):
        params_from_metadata(spec, {"maxdecl.format": "hf", "hidden_act": "relu"})
    meta = {"maxdecl.format": "gguf", "general.architecture": "phi2",
            "phi2.rope.scaling.type": "yarn"}
    with pytest.raises(md.WeightsError, match="RoPE scaling yarn"):
        params_from_metadata(spec, meta)
    meta["phi2.rope.scaling.type"] = "none"
    assert params_from_metadata(spec, meta)["rope_type"] == "none"


def test_phi2_gguf_matches_hf(phi, phi_gguf):
    """The llama.cpp-style GGUF: params from the phi2.* keys (rot_dim from
    rope.dimension_count, vocab from the token list), output.bias loaded."""
    model, _, ids, ref = phi
    got = hf_params("phi2", phi_gguf)[2]
    assert got["rot_dim"] == 32 and got["vocab"] == 96 and got["dim"] == 256
    ours = md.load_model(spec_path("phi2"), phi_gguf, variant="tiny")
    assert ours.params["rot_dim"] == 32
    pre, dec = compare(ours, ref, ids)
    assert pre <= TOL and dec <= TOL


def test_llama_cpp_runs_the_phi2_gguf_with_the_reference_logits(phi, phi_gguf):
    """llama.cpp itself (llama-cpp-python; skipped without it) runs the GGUF with the
    transformers model's logits, and maxdecl reads the same file."""
    llama_cpp = pytest.importorskip("llama_cpp")
    model, _, ids, ref = phi
    theirs = llama_cpp_logits(llama_cpp, phi_gguf, ids)
    ours = np.asarray(md.load_model(spec_path("phi2"), phi_gguf, variant="tiny").logits(ids))
    scale = float(np.abs(ref).max())
    assert np.abs(theirs - ref).max() <= TOL_LLAMA_CPP * scale
    assert np.abs(ours - ref).max() <= 1e-5 * scale
