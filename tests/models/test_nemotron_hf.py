"""specs/nemotron.yaml against transformers' NemotronForCausalLM (and llama.cpp).

Three small seeded float32 Nemotrons (dim 256, 2 layers, GQA 4/2, vocab 256, LayerNorm1P
with bias, squared-ReLU MLP without gate, untied output):

- ``base``: Minitron-4B-like: head_dim = dim / n_heads = 64, partial_rotary_factor 0.5
  (32 of the 64 features of each head rotate), no biases;
- ``bias``: attention_bias and mlp_bias (q/k/v/o, up/down biases), linear RoPE scaling
  (factor 2), rope_theta 50000, partial_rotary_factor 0.25, norm_eps 1e-6;
- ``wide``: Minitron-8B-like: head_dim 96, so n_heads * head_dim = 384 != dim.

LayerNorm1P's gains are seeded around 0 (transformers uses 1 + w). The GGUF files are
written as llama.cpp's converter (NemotronModel) writes them: every ``*norm.weight``
stored as 1 + w, rope.dimension_count = int(partial_rotary_factor * hidden_size) //
num_attention_heads, rope.scaling.type none / linear with its factor, key_length from
config.json's head_dim.
"""

import numpy as np
import pytest

import maxdecl as md
from maxdecl.pipelines.model_loading import params_from_metadata

from modelhelp import (TOL, _add_tokenizer, _write, assert_greedy_matches_hf, assert_logits_match,
                       compare, gguf_writer, hf_case, hf_params, hf_state, layer_tensors,
                       llama_cpp_logits, randomize, rel_err, spec_path, tiny_model,
                       without_hf_transforms)

pytest.importorskip("torch")
pytest.importorskip("transformers")

PROMPTS = [[3, 17, 42, 90, 5, 7, 64, 1], [8, 9, 80], [5, 60, 33, 2, 90, 11, 7, 200]]
N_NEW = 6
TOL_LLAMA_CPP = 5e-3        # of max|ref|: llama.cpp keeps its KV cache in f16

BIAS = dict(attention_bias=True, mlp_bias=True, norm_eps=1e-6,
            rope_parameters={"rope_type": "linear", "factor": 2.0, "rope_theta": 50000.0,
                             "partial_rotary_factor": 0.25})
WIDE = dict(head_dim=96)


def make_nemotron(seed=0, **kw):
    """NemotronForCausalLM: dim 256, ffn 512, 2 layers, GQA 4/2, vocab 256, untied."""
    import torch
    import transformers

    torch.manual_seed(seed)
    cfg = dict(vocab_size=256, hidden_size=256, intermediate_size=512, num_hidden_layers=2,
               num_attention_heads=4, num_key_value_heads=2, norm_eps=1e-5,
               max_position_embeddings=64, hidden_act="relu2",
               rope_parameters={"rope_type": "default", "rope_theta": 10000.0,
                                "partial_rotary_factor": 0.5},
               tie_word_embeddings=False, attn_implementation="eager")
    cfg.update(kw)
    model = transformers.NemotronForCausalLM(transformers.NemotronConfig(**cfg))
    # LayerNorm1P uses 1 + w: gains around 0 keep the scale sane
    return randomize(model, seed, norm_center=0.0)


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    return hf_case(make_nemotron(), tmp_path_factory.mktemp("nemotron_base"))


@pytest.fixture(scope="module")
def bias(tmp_path_factory):
    return hf_case(make_nemotron(seed=1, **BIAS), tmp_path_factory.mktemp("nemotron_bias"))


@pytest.fixture(scope="module")
def wide(tmp_path_factory):
    return hf_case(make_nemotron(seed=2, **WIDE), tmp_path_factory.mktemp("nemotron_wide"))


@pytest.fixture(scope="module")
def ours_base(base):
    return tiny_model("nemotron", base[1])


@pytest.fixture(scope="module")
def ours_bias(bias):
    return tiny_model("nemotron", bias[1])


@pytest.fixture(scope="module")
def ours_wide(wide):
    return tiny_model("nemotron", wide[1])


# -- config ------------------------------------------------------------------------------

def test_nemotron_config_from_hf(base, bias, wide):
    tiny = {"context": 64, "dim": 256, "n_layers": 2, "ffn_dim": 512, "n_heads": 4,
            "n_kv_heads": 2, "vocab": 256, "hidden_act": "relu2"}
    spec, meta, got = hf_params("nemotron", base[1])
    assert {k: got[k] for k in tiny} == tiny
    assert (got["head_dim"], got["rope_dim"], got["rope_theta"]) == (64, 32, 10000.0)
    assert (got["rope_scaling"], got["rope_scale"]) == ("none", 1.0)
    assert got["norm_eps"] == pytest.approx(1e-5)

    got = hf_params("nemotron", bias[1])[2]
    assert (got["rope_dim"], got["rope_theta"]) == (16, 50000.0)
    assert (got["rope_scaling"], got["rope_scale"]) == ("linear", 2.0)
    assert got["norm_eps"] == pytest.approx(1e-6)
    got = hf_params("nemotron", wide[1])[2]
    assert (got["head_dim"], got["rope_dim"]) == (96, 48)

    # released config.json files (Minitron, transformers 4.x) state the factor and base
    # at the top level, rope_scaling null; older ones have no head_dim, and NemotronConfig
    # defaults the factor to 0.5
    old = {k: v for k, v in meta.items() if k != "rope_parameters"}
    got = params_from_metadata(spec, {**old, "partial_rotary_factor": 0.25, "rope_theta": 5e4,
                                      "rope_scaling": None, "head_dim": 128})
    assert (got["rope_dim"], got["rope_theta"], got["rope_scaling"]) == (32, 5e4, "none")
    older = {k: v for k, v in old.items() if k != "head_dim"}
    got = params_from_metadata(spec, {**older, "rope_scaling": {"type": "linear", "factor": 4.0}})
    assert (got["rope_dim"], got["rope_scaling"], got["rope_scale"]) == (32, "linear", 4.0)
    assert "head_dim" not in got       # the variant's null: dim // n_heads


@pytest.mark.parametrize("key, value, why", [
    ("hidden_act", "silu", "hidden_act silu"),
    ("rope_parameters", {"rope_type": "dynamic", "factor": 2.0, "rope_theta": 1e4,
                         "partial_rotary_factor": 0.5}, "RoPE scaling dynamic")])
def test_nemotron_refuses_what_it_does_not_model(base, key, value, why):
    td = md.load_weights(base[1])
    td.metadata[key] = value
    with pytest.raises(md.errors.WeightsError, match=why):
        md.load_model(spec_path("nemotron"), td, variant="tiny")


# -- logits and generation ---------------------------------------------------------------

def test_nemotron_prefill_and_decode_match_hf(base, ours_base):
    assert_logits_match("nemotron (Minitron-4B-like)", ours_base, base[2], base[3])


def test_nemotron_biases_linear_rope_prefill_and_decode_match_hf(bias, ours_bias):
    assert ours_bias.weights["blk.1.ffn_down.bias"].shape == (256,)
    assert_logits_match("nemotron (biases, linear RoPE)", ours_bias, bias[2], bias[3])


def test_nemotron_wide_heads_prefill_and_decode_match_hf(wide, ours_wide):
    assert ours_wide.weights["blk.0.attn_q.weight"].shape == (384, 256)
    assert_logits_match("nemotron (Minitron-8B-like)", ours_wide, wide[2], wide[3])


def test_nemotron_greedy_generate_matches_hf(base, ours_base, bias, ours_bias, wide, ours_wide):
    for case, ours in ((base, ours_base), (bias, ours_bias), (wide, ours_wide)):
        assert_greedy_matches_hf(case[0], ours, PROMPTS, N_NEW)


def test_nemotron_tied_checkpoint_reads_the_embedding(tmp_path):
    """tie_word_embeddings: the checkpoint has no lm_head.weight, and the output reads
    token_embd.weight (its ``absent:`` stand-in)."""
    model, path, ids, ref = hf_case(make_nemotron(seed=3, tie_word_embeddings=True), tmp_path)
    ours = tiny_model("nemotron", path)
    assert "output.weight" not in ours.weights
    pre, dec = compare(ours, ref, ids)
    assert pre <= TOL and dec <= TOL


def test_nemotron_layernorm1p_matters(base):
    """Read without the +1 on the norm gains (transformers' LayerNorm1P), the logits differ."""
    model, path, ids, ref = base
    spec = without_hf_transforms(md.load_spec(spec_path("nemotron")))
    pre, dec = compare(md.load_model(spec, path, variant="tiny"), ref, ids)
    assert pre > 10 * TOL and dec > 10 * TOL


# -- GGUF --------------------------------------------------------------------------------

NEMOTRON_LAYERS = {
    "input_layernorm": "attn_norm", "self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k",
    "self_attn.v_proj": "attn_v", "self_attn.o_proj": "attn_output",
    "post_attention_layernorm": "ffn_norm", "mlp.up_proj": "ffn_up", "mlp.down_proj": "ffn_down"}


def nemotron_to_gguf(model, path, rope_dim=None) -> str:
    """Write a NemotronForCausalLM as llama.cpp's converter (NemotronModel) does (arch
    ``nemotron``): norm gains + 1, rope.dimension_count = int(factor * hidden_size) //
    n_heads (``rope_dim`` overrides it), rope.scaling.type none or linear with its factor,
    layer_norm_epsilon, vocab_size, key/value_length = head_dim, HF's q/k row order
    (neox rope), biases as ``.bias``."""
    import gguf

    cfg, sd = model.config, hf_state(model)
    rp = cfg.rope_parameters
    w = gguf_writer(path, "nemotron", cfg)
    w.add_rope_freq_base(float(rp["rope_theta"]))
    w.add_key_length(cfg.head_dim)
    w.add_value_length(cfg.head_dim)
    w.add_file_type(gguf.LlamaFileType.ALL_F32)
    w.add_vocab_size(cfg.vocab_size)
    w.add_layer_norm_eps(cfg.norm_eps)
    if rope_dim is None:
        rope_dim = int(rp["partial_rotary_factor"] * cfg.hidden_size) // cfg.num_attention_heads
    w.add_rope_dimension_count(rope_dim)
    if rp.get("factor") is None:
        w.add_rope_scaling_type(gguf.RopeScalingType.NONE)
    else:
        w.add_rope_scaling_type(gguf.RopeScalingType.LINEAR)
        w.add_rope_scaling_factor(rp["factor"])
    _add_tokenizer(w, cfg.vocab_size)
    w.add_pad_token_id(0)
    w.add_unk_token_id(1)
    t = {"token_embd.weight": sd["model.embed_tokens.weight"],
         **layer_tensors(sd, cfg.num_hidden_layers, NEMOTRON_LAYERS)}
    t["output_norm.weight"] = sd["model.norm.weight"]
    t["output_norm.bias"] = sd["model.norm.bias"]
    t["output.weight"] = sd["lm_head.weight"]
    _write(w, {k: v + 1.0 if k.endswith("norm.weight") else v for k, v in t.items()})
    return str(path)


@pytest.fixture(scope="module")
def ggufs(base, bias, tmp_path_factory):
    folder = tmp_path_factory.mktemp("nemotron_gguf")
    return {"base": nemotron_to_gguf(base[0], folder / "base.gguf"),
            "bias": nemotron_to_gguf(bias[0], folder / "bias.gguf")}


@pytest.mark.parametrize("name", ["base", "bias"])
def test_nemotron_gguf_matches_hf(name, base, bias, ggufs):
    """The same weights as llama.cpp-style GGUFs: params from the nemotron.* keys, the
    norm gains already 1 + w, the same logits."""
    model, path, ids, ref = {"base": base, "bias": bias}[name]
    from_hf = hf_params("nemotron", path)[2]
    got = hf_params("nemotron", ggufs[name])[2]
    for k in ("context", "dim", "n_layers", "ffn_dim", "n_heads", "n_kv_heads", "head_dim",
              "vocab", "rope_dim", "rope_theta", "rope_scaling"):
        assert got[k] == from_hf[k], k
    assert got.get("rope_scale", 1.0) == from_hf["rope_scale"]
    assert got["norm_eps"] == pytest.approx(from_hf["norm_eps"])
    ours = md.load_model(spec_path("nemotron"), ggufs[name], variant="tiny")
    np.testing.assert_allclose(np.asarray(ours.weights["blk.0.attn_norm.weight"]),
                               model.model.layers[0].input_layernorm.weight.detach().numpy() + 1)
    pre, dec = compare(ours, ref, ids)
    assert pre <= TOL and dec <= TOL


def test_nemotron_wide_gguf_follows_the_file(wide, tmp_path):
    """Minitron-8B-like heads (head_dim 96 != 256 / 4): the converter's rope.dimension_count,
    int(0.5 * 256) // 4 = 32, is not transformers' int(0.5 * 96) = 48; the spec runs what
    the file states (as llama.cpp does), so only a file stating 48 gives HF's logits."""
    model, _, ids, ref = wide
    conv = nemotron_to_gguf(model, tmp_path / "conv.gguf")
    fixed = nemotron_to_gguf(model, tmp_path / "fixed.gguf", rope_dim=48)
    assert hf_params("nemotron", conv)[2]["rope_dim"] == 32
    ours = md.load_model(spec_path("nemotron"), fixed, variant="tiny")
    assert ours.params["head_dim"] == 96
    pre, dec = compare(ours, ref, ids)
    assert pre <= TOL and dec <= TOL
    ours_conv = md.load_model(spec_path("nemotron"), conv, variant="tiny")
    assert rel_err(np.asarray(ours_conv.logits(ids)), ref) > 10 * TOL


@pytest.mark.parametrize("name", ["base", "bias"])
def test_llama_cpp_runs_the_nemotron_gguf_with_the_reference_logits(name, base, bias, ggufs):
    """llama.cpp itself (llama-cpp-python; skipped without it) runs the GGUF with the
    transformers model's logits, and maxdecl reads the same file."""
    llama_cpp = pytest.importorskip("llama_cpp")
    model, _, ids, ref = {"base": base, "bias": bias}[name]
    try:
        theirs = llama_cpp_logits(llama_cpp, ggufs[name], ids)
    except ValueError as e:           # "Failed to load model from file"
        pytest.skip(f"this llama.cpp cannot load the file: {e}")
    ours = np.asarray(md.load_model(spec_path("nemotron"), ggufs[name], variant="tiny").logits(ids))
    scale = float(np.abs(ref).max())
    print(f"nemotron {name}: llama.cpp vs HF {np.abs(theirs - ref).max() / scale:.2e}, "
          f"maxdecl vs llama.cpp {np.abs(ours - theirs).max() / scale:.2e} (of max|ref|)")
    assert np.abs(theirs - ref).max() <= TOL_LLAMA_CPP * scale
    assert np.abs(ours - theirs).max() <= TOL_LLAMA_CPP * scale
    assert np.abs(ours - ref).max() <= 1e-5 * scale
