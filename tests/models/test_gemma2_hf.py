"""specs/gemma2.yaml against transformers' Gemma2ForCausalLM.

A small seeded float32 Gemma 2: grouped-query attention (4 query heads, 2 kv heads),
head_dim 64, RoPE rotating halves, four RMSNorms per block (HF stores w and computes
x * (1 + w); the spec's hf transforms add 1, as llama.cpp's converter does), a
GELU-tanh gated MLP, embeddings scaled by sqrt(dim), attention scaled by
query_pre_attn_scalar ** -0.5, attention logits soft-capped at 5 and final logits at
3 (both small enough to bend the values of this model), a 5-position window on the
even layers (the sequence is 16 tokens) and the output tied to the embedding.
"""

import json
import shutil

import numpy as np
import pytest

import maxdecl as md
from maxdecl.pipelines.model_loading import params_from_metadata

from modelhelp import (N_DECODE, N_PROMPT, TOL, _add_tokenizer, _write, assert_greedy_matches_hf,
                       assert_logits_match, compare, gguf_writer, hf_case, hf_logits, hf_params,
                       hf_state, llama_cpp_logits, randomize, save_hf, spec_path, tiny_model,
                       token_ids, without_hf_transforms)

pytest.importorskip("torch")
pytest.importorskip("transformers")

PROMPTS = [[3, 17, 42, 90, 5, 7, 64, 1], [8, 9, 70], [5, 60, 33, 2, 90, 11, 7]]
N_NEW = 6


def make_gemma2(seed=0, **kw):
    """Gemma2ForCausalLM: dim 256, 4 layers, GQA 4/2, head_dim 64, window 5, attention
    softcap 5, final softcap 3, tied output.

    Norm weights near 0 (HF computes x * (1 + w)); the tied table is 0.1 * N(0, 1), so
    most logits before the cap are small (median |logit| about 1, a few near 15): the
    cap of 3 bends them without flattening the top ones into ties."""
    import torch
    import transformers

    torch.manual_seed(seed)
    cfg = dict(vocab_size=96, hidden_size=256, intermediate_size=512, num_hidden_layers=4,
               num_attention_heads=4, num_key_value_heads=2, head_dim=64,
               query_pre_attn_scalar=64, sliding_window=5, attn_logit_softcapping=5.0,
               final_logit_softcapping=3.0, rms_norm_eps=1e-6, max_position_embeddings=64,
               hidden_activation="gelu_pytorch_tanh", tie_word_embeddings=True,
               attn_implementation="eager")
    cfg.update(kw)
    model = randomize(transformers.Gemma2ForCausalLM(transformers.Gemma2Config(**cfg)), seed,
                      norm_center=0.0)
    with torch.no_grad():
        model.model.embed_tokens.weight.mul_(0.1)
    return model


@pytest.fixture(scope="module")
def gemma2(tmp_path_factory):
    model = make_gemma2()
    assert list(model.config.layer_types) == ["sliding_attention", "full_attention"] * 2
    assert model.config.sliding_window < N_PROMPT
    return hf_case(model, tmp_path_factory.mktemp("gemma2_hf"))


@pytest.fixture(scope="module")
def ours(gemma2):
    return tiny_model("gemma2", gemma2[1])


def _ours_with(path, **meta):
    """The tiny model on the HF weights at ``path`` with config.json keys replaced."""
    td = md.load_weights(path)
    td.metadata.update(meta)
    return md.load_model(spec_path("gemma2"), td, variant="tiny")


def _far(model, ref, ids, factor=10):
    pre, dec = compare(model, ref, ids)
    return pre > factor * TOL and dec > factor * TOL


def test_gemma2_config_from_hf(gemma2):
    model, path, _, _ = gemma2
    spec, meta, got = hf_params("gemma2", path)
    want = {"dim": 256, "n_layers": 4, "n_heads": 4, "n_kv_heads": 2, "head_dim": 64,
            "ffn_dim": 512, "vocab": 96, "context": 64, "sliding_window": 5,
            "attn_softcap": 5.0, "final_softcap": 3.0, "query_pre_attn_scalar": 64,
            "rope_theta": 10000.0, "embed_dtype": "float32", "hidden_act": "gelu_pytorch_tanh",
            "layer_types": ["sliding_attention", "full_attention"] * 2}
    assert {k: got.get(k) for k in want} == want
    assert got["norm_eps"] == pytest.approx(1e-6)
    assert not any(k.startswith("lm_head") for k in md.load_weights(path).keys())   # tied
    # older config.json: top-level rope_theta, torch_dtype, no layer_types
    old = {k: v for k, v in meta.items() if k not in ("rope_parameters", "layer_types", "dtype")}
    got = params_from_metadata(spec, {**old, "rope_theta": 20000.0, "torch_dtype": "bfloat16"})
    assert got["rope_theta"] == 20000.0 and got["embed_dtype"] == "bfloat16"
    assert got.get("layer_types") is None
    # null caps / window mean "none" in transformers, 0 in the spec
    got = params_from_metadata(spec, {**meta, "attn_logit_softcapping": None,
                                      "final_logit_softcapping": None, "sliding_window": None})
    assert (got["attn_softcap"], got["final_softcap"], got["sliding_window"]) == (0.0, 0.0, 0)


def test_gemma2_variants_have_the_released_sizes():
    """The 2b, 9b and 27b variants count the parameters of google/gemma-2-{2b,9b,27b}
    (the output is the embedding table, counted once)."""
    from maxdecl.builder import describe_tree

    sizes = {v: describe_tree(spec_path("gemma2"), v)[0].params for v in ("2b", "9b", "27b")}
    assert sizes == {"2b": 2_614_341_888, "9b": 9_241_705_984, "27b": 27_227_128_320}


@pytest.mark.parametrize("variant, scale", [("2b", 256 ** -0.5), ("9b", 256 ** -0.5),
                                            ("27b", 144 ** -0.5)])
def test_gemma2_variants_slide_even_layers_and_scale_as_llama_cpp(variant, scale):
    """Without layer_types and query_pre_attn_scalar (a GGUF file), the even layers slide
    and scores are scaled as llama.cpp does: 1 / sqrt(head_dim), 1 / sqrt(dim / n_heads)
    for the 27B (head_dim 128, query_pre_attn_scalar 144 in its config.json)."""
    spec = md.load_spec(spec_path("gemma2"), variant)
    attn = {op.path: op.attrs for op in spec.program().ops if op.op == "attention"}
    assert len(attn) == spec.params["n_layers"]
    for i in range(spec.params["n_layers"]):
        a = attn[f"blk.{i}.attn"]
        assert a["sliding_window"] == (4096 if i % 2 == 0 else None)
        assert a["scale"] == pytest.approx(scale) and a["softcap"] == 50.0


def test_gemma2_prefill_and_decode_match_hf(gemma2, ours):
    model, path, ids, ref = gemma2
    assert len(ids) == N_PROMPT + N_DECODE
    assert_logits_match("gemma2", ours, ids, ref)


def test_gemma2_greedy_generate_matches_hf(gemma2, ours):
    assert_greedy_matches_hf(gemma2[0], ours, PROMPTS, N_NEW)


def test_gemma2_embed_scale_in_checkpoint_dtype(tmp_path):
    """transformers multiplies the embedding by sqrt(dim) cast to the weights' dtype
    (sqrt(3584) = 59.87 is 59.75 in bfloat16, Gemma 2 9B's): a bfloat16 checkpoint of
    width 288 (sqrt 16.97, 17.0 in bfloat16) gets 17.0, and the logits of HF's model on
    the same bfloat16 weights, run in float32 with that scale."""
    import torch

    assert torch.tensor(3584 ** 0.5, dtype=torch.bfloat16).item() == 59.75
    model = make_gemma2(hidden_size=288).to(torch.bfloat16)
    path = save_hf(model, tmp_path / "hf")
    assert json.loads((tmp_path / "hf" / "config.json").read_text())["dtype"] == "bfloat16"
    ours = tiny_model("gemma2", path)
    assert ours.params["embed_dtype"] == "bfloat16" and ours.params["embed_scale"] == 17.0
    model = model.float()
    model.model.embed_tokens.embed_scale.fill_(17.0)
    ids = token_ids(model.config.vocab_size)
    ref = hf_logits(model, ids)
    pre, dec = compare(ours, ref, ids)
    assert pre <= TOL and dec <= TOL


def test_gemma2_norms_need_the_added_one(gemma2):
    """Negative control: without the spec's ``add: 1.0`` the logits are far off."""
    model, path, ids, ref = gemma2
    spec = without_hf_transforms(md.load_spec(spec_path("gemma2")))
    assert _far(md.load_model(spec, path, variant="tiny"), ref, ids, 30)


@pytest.mark.parametrize("key", ["attn_logit_softcapping", "final_logit_softcapping",
                                 "sliding_window"])
def test_gemma2_feature_matters(gemma2, key):
    """Negative controls: the same weights without the attention soft-cap, the final
    soft-cap or the window (config.json's null) give other logits, so the match above
    needs each of them."""
    model, path, ids, ref = gemma2
    assert _far(_ours_with(path, **{key: None}), ref, ids)


def test_gemma2_scale_and_layer_types_from_config(tmp_path):
    """A config.json with query_pre_attn_scalar != head_dim and a layer_types list that
    is not the even/odd default: the spec follows both (each also checked to matter)."""
    kinds = ["full_attention", "sliding_attention", "sliding_attention", "full_attention"]
    model = make_gemma2(query_pre_attn_scalar=24, layer_types=kinds)
    assert list(model.config.layer_types) == kinds
    path = save_hf(model, tmp_path / "hf")
    ids = token_ids(model.config.vocab_size)
    ref = hf_logits(model, ids)
    ours = tiny_model("gemma2", path)
    assert ours.params["attn_scale"] == pytest.approx(24 ** -0.5)
    pre, dec = compare(ours, ref, ids)
    assert pre <= TOL and dec <= TOL
    assert _far(_ours_with(path, query_pre_attn_scalar=64), ref, ids)
    assert _far(_ours_with(path, layer_types=None), ref, ids)


def test_gemma2_config_without_layer_types(gemma2, tmp_path):
    """A config.json from before transformers wrote layer_types: the even layers slide,
    as in transformers and llama.cpp."""
    model, path, ids, ref = gemma2
    copy = shutil.copytree(path, tmp_path / "old")
    cfg = json.loads((copy / "config.json").read_text())
    del cfg["layer_types"]
    (copy / "config.json").write_text(json.dumps(cfg))
    pre, dec = compare(tiny_model("gemma2", copy), ref, ids)
    assert pre <= TOL and dec <= TOL


@pytest.mark.parametrize("meta, why", [
    ({"hidden_activation": "gelu"}, "hidden activation gelu"),
    ({"attention_bias": True}, "attention biases"),
    ({"rope_parameters": {"rope_type": "linear", "factor": 2.0, "rope_theta": 1e4}},
     "RoPE scaling linear"),
    ({"use_bidirectional_attention": True}, "bidirectional"),
    ({"tie_word_embeddings": False}, "not tied")])
def test_gemma2_refuses_what_it_does_not_model(gemma2, meta, why):
    with pytest.raises(md.MaxdeclError, match=f"do not fit .*{why}"):
        _ours_with(gemma2[1], **meta)


def gemma2_to_gguf(model, path, quantize=None) -> str:
    """Write a Gemma2ForCausalLM as llama.cpp's convert_hf_to_gguf.py does (arch
    ``gemma2``): HF's q/k row order kept (neox rope), norm weights stored as ``1 + w``,
    the soft-caps and the window as metadata, no rope base (llama.cpp's 10000), no
    query_pre_attn_scalar (llama.cpp scales by 1 / sqrt(head_dim)), no output.weight."""
    import gguf

    cfg, sd = model.config, hf_state(model)
    w = gguf_writer(path, "gemma2", cfg)
    w.add_name("tiny-gemma2")
    w.add_layer_norm_rms_eps(cfg.rms_norm_eps)
    w.add_key_length(cfg.head_dim)
    w.add_value_length(cfg.head_dim)
    w.add_file_type(gguf.LlamaFileType.ALL_F32)
    w.add_attn_logit_softcapping(cfg.attn_logit_softcapping)
    w.add_final_logit_softcapping(cfg.final_logit_softcapping)
    w.add_sliding_window(cfg.sliding_window)
    _add_tokenizer(w, cfg.vocab_size)
    names = {"input_layernorm": "attn_norm", "self_attn.q_proj": "attn_q",
             "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v",
             "self_attn.o_proj": "attn_output", "post_attention_layernorm": "post_attention_norm",
             "pre_feedforward_layernorm": "ffn_norm", "mlp.gate_proj": "ffn_gate",
             "mlp.up_proj": "ffn_up", "mlp.down_proj": "ffn_down",
             "post_feedforward_layernorm": "post_ffw_norm"}
    t = {"token_embd.weight": sd["model.embed_tokens.weight"]}
    for i in range(cfg.num_hidden_layers):
        for src, dst in names.items():
            x = sd[f"model.layers.{i}.{src}.weight"]
            t[f"blk.{i}.{dst}.weight"] = x + 1.0 if "norm" in src else x
    t["output_norm.weight"] = sd["model.norm.weight"] + 1.0
    _write(w, t, quantize)
    return str(path)


@pytest.fixture(scope="module")
def gemma2_gguf(gemma2, tmp_path_factory):
    return gemma2_to_gguf(gemma2[0], tmp_path_factory.mktemp("gemma2_gguf") / "tiny-gemma2.gguf")


def test_gemma2_gguf_matches_hf(gemma2, gemma2_gguf):
    """The same weights as a llama.cpp-style GGUF: params from the gemma2.* keys, the
    tied output from token_embd.weight, the scale from key_length."""
    model, _, ids, ref = gemma2
    got = hf_params("gemma2", gemma2_gguf)[2]
    assert got["n_kv_heads"] == 2 and got["vocab"] == 96 and got["head_dim"] == 64
    assert (got["attn_softcap"], got["final_softcap"], got["sliding_window"]) == (5.0, 3.0, 5)
    ours = md.load_model(spec_path("gemma2"), gemma2_gguf, variant="tiny")
    assert ours.params["attn_scale"] == pytest.approx(64 ** -0.5)
    pre, dec = compare(ours, ref, ids)
    assert pre <= TOL and dec <= TOL


def test_llama_cpp_runs_the_gemma2_gguf_with_the_reference_logits(gemma2, gemma2_gguf):
    """llama.cpp itself (llama-cpp-python) runs the converter-style file with HF's
    logits, so the layout above is llama.cpp's own; skipped without llama_cpp."""
    llama_cpp = pytest.importorskip("llama_cpp")
    model, _, ids, ref = gemma2
    theirs = llama_cpp_logits(llama_cpp, gemma2_gguf, ids)
    scale = float(np.abs(ref).max())
    assert np.abs(theirs - ref).max() <= 5e-3 * scale     # llama.cpp's KV cache is f16
