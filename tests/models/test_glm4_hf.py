"""specs/glm4.yaml against transformers' Glm4ForCausalLM (GLM-4-0414).

Two small seeded float32 GLM-4 models:

- ``gqa``: 4 query heads over 2 kv heads, head_dim 16, q/k/v biases, partial rotary
  factor 0.5 (GLM-4-0414's), an untied output head;
- ``mha``: 4 heads over 4 kv heads, head_dim 24 (not hidden_size / heads, as
  config.json's head_dim allows), partial rotary factor 0.25 (6 of 24 features
  rotate), no attention biases and the output tied to the embedding.

Each is compared with transformers for a prompt and several decode steps through the
KV cache, from its Hugging Face folder and from a GGUF written as llama.cpp's converter
writes arch ``glm4`` (and, when llama-cpp-python is installed, run by llama.cpp too).
"""

import json
import shutil

import numpy as np
import pytest

import maxdecl as md
from maxdecl.pipelines.model_loading import params_from_metadata

from modelhelp import (N_PROMPT, TOL, _add_tokenizer, _write, assert_greedy_matches_hf,
                       assert_logits_match, compare, gguf_writer, hf_case, hf_params, hf_state,
                       layer_tensors, llama_cpp_logits, randomize, rel_err, spec_path,
                       tiny_model)

pytest.importorskip("torch")
pytest.importorskip("transformers")

PROMPTS = [[3, 17, 42, 99, 5, 7, 64, 1], [8, 9, 120], [5, 60, 33, 2, 90, 11, 7]]
N_NEW = 6

CASES = {
    "gqa": dict(num_key_value_heads=2, head_dim=16, partial_rotary_factor=0.5,
                attention_bias=True, tie_word_embeddings=False),
    "mha": dict(num_key_value_heads=4, head_dim=24, partial_rotary_factor=0.25,
                attention_bias=False, tie_word_embeddings=True),
}
ROT_DIM = {"gqa": 8, "mha": 6}

# HF Glm4 layer tensors -> llama.cpp's names (gguf-py's tensor map for MODEL_ARCH.GLM4)
GLM4_LAYERS = {
    "input_layernorm": "attn_norm", "self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k",
    "self_attn.v_proj": "attn_v", "self_attn.o_proj": "attn_output",
    "post_self_attn_layernorm": "post_attention_norm", "post_attention_layernorm": "ffn_norm",
    "mlp.gate_up_proj": "ffn_up", "mlp.down_proj": "ffn_down",
    "post_mlp_layernorm": "post_ffw_norm"}


def make_glm4(seed=0, **kw):
    """Glm4ForCausalLM: dim 64, 2 layers, 4 heads, ffn 128, vocab 128, eager attention."""
    import torch
    import transformers

    torch.manual_seed(seed)
    cfg = dict(vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
               num_attention_heads=4, num_key_value_heads=2, head_dim=16,
               partial_rotary_factor=0.5, rms_norm_eps=1e-5, max_position_embeddings=64,
               rope_theta=10000.0, attention_bias=True, tie_word_embeddings=False,
               pad_token_id=0, bos_token_id=1, eos_token_id=2, attn_implementation="eager")
    cfg.update(kw)
    model = randomize(transformers.Glm4ForCausalLM(transformers.Glm4Config(**cfg)), seed)
    if cfg["tie_word_embeddings"]:
        with torch.no_grad():            # a tied N(0, 1) table would dominate the logits
            model.model.embed_tokens.weight.mul_(0.1)
    return model


_BUILT = {}


def _case(name, tmp_path_factory):
    """(name, model, HF folder, prompt ids, HF logits) of a case, built once per session."""
    if name not in _BUILT:
        model = make_glm4(seed=list(CASES).index(name), **CASES[name])
        _BUILT[name] = (name, *hf_case(model, tmp_path_factory.mktemp(f"glm4_{name}")))
    return _BUILT[name]


@pytest.fixture(scope="module", params=list(CASES))
def glm4(request, tmp_path_factory):
    return _case(request.param, tmp_path_factory)


@pytest.fixture(scope="module")
def gqa(tmp_path_factory):
    """The GQA case alone, for the tests one case is enough for."""
    return _case("gqa", tmp_path_factory)


def glm4_to_gguf(model, path) -> str:
    """Write a Glm4ForCausalLM as llama.cpp's converter does (``Glm4Model``, arch
    ``glm4``): HF's q/k row order kept (llama.cpp rotates adjacent pairs, as HF's Glm4),
    the fused gate_up_proj as blk.N.ffn_up, the sandwich norms as post_attention_norm /
    ffn_norm / post_ffw_norm, head_dim as key/value_length, the rotated width
    (head_dim * partial_rotary_factor) as rope.dimension_count, no output.weight when
    tied."""
    import gguf

    cfg, sd = model.config, hf_state(model)
    rp = cfg.rope_parameters
    w = gguf_writer(path, "glm4", cfg)
    w.add_layer_norm_rms_eps(cfg.rms_norm_eps)
    w.add_key_length(cfg.head_dim)
    w.add_value_length(cfg.head_dim)
    w.add_rope_dimension_count(int(cfg.head_dim * rp["partial_rotary_factor"]))
    w.add_rope_freq_base(float(rp["rope_theta"]))
    w.add_file_type(gguf.LlamaFileType.ALL_F32)
    _add_tokenizer(w, cfg.vocab_size)
    t = {"token_embd.weight": sd["model.embed_tokens.weight"]}
    t.update(layer_tensors(sd, cfg.num_hidden_layers, GLM4_LAYERS))
    t["output_norm.weight"] = sd["model.norm.weight"]
    if not cfg.tie_word_embeddings:
        t["output.weight"] = sd["lm_head.weight"]
    _write(w, t)
    return str(path)


def test_glm4_config_from_hf(glm4):
    name, model, path, _, _ = glm4
    spec, meta, got = hf_params("glm4", path)
    case = CASES[name]
    want = {"dim": 64, "n_layers": 2, "n_heads": 4, "n_kv_heads": case["num_key_value_heads"],
            "head_dim": case["head_dim"], "ffn_dim": 128, "vocab": 128, "context": 64,
            "partial_rotary_factor": case["partial_rotary_factor"], "rope_theta": 10000.0,
            "rope_type": "none", "hidden_act": "silu"}
    assert {k: got.get(k) for k in want} == want
    assert got["norm_eps"] == pytest.approx(1e-5)
    # the derived params the model runs with (rot_dim from head_dim and the factor)
    params = tiny_model("glm4", path).params
    assert params["rot_dim"] == ROT_DIM[name] and params["head_dim"] == case["head_dim"]
    # config.json as GLM-4-0414 ships it (transformers < 5): top-level rope_theta and
    # partial_rotary_factor
    old = {k: v for k, v in meta.items() if k != "rope_parameters"}
    got = params_from_metadata(spec, {**old, "rope_theta": 20000.0, "partial_rotary_factor": 0.75,
                                      "rope_scaling": None})
    assert got["rope_theta"] == 20000.0 and got["partial_rotary_factor"] == 0.75
    assert got["rope_type"] == "none"


def test_glm4_prefill_and_decode_match_hf(glm4):
    name, model, path, ids, ref = glm4
    assert_logits_match(f"glm4 {name}", tiny_model("glm4", path), ids, ref)


def test_glm4_greedy_generate_matches_hf(gqa):
    _, model, path, _, _ = gqa
    assert_greedy_matches_hf(model, tiny_model("glm4", path), PROMPTS, N_NEW)


def test_glm4_rotary_details_matter(gqa, tmp_path):
    """Negative controls: rotating every feature of each head, or rotating halves
    (``neox``) instead of adjacent pairs, gives other logits."""
    _, model, path, ids, ref = gqa
    td = md.load_weights(path)
    td.metadata["rope_parameters"] = {**td.metadata["rope_parameters"],
                                      "partial_rotary_factor": 1.0}
    pre, dec = compare(md.load_model(spec_path("glm4"), td, variant="tiny"), ref, ids)
    assert pre > 10 * TOL and dec > 10 * TOL
    text = open(spec_path("glm4")).read()
    assert text.count("style: normal") == 2
    neox = tmp_path / "glm4_neox.yaml"
    neox.write_text(text.replace("style: normal", "style: neox"))
    pre, dec = compare(md.load_model(str(neox), path, variant="tiny"), ref, ids)
    assert pre > 10 * TOL and dec > 10 * TOL


def test_glm4_post_norms_matter(gqa):
    """Negative control: the post-attention / post-MLP norm gains read as another
    layer's give other logits (so each of the four norms is bound where HF has it)."""
    _, model, path, ids, ref = gqa
    td = md.load_weights(path)
    a = "model.layers.0.post_self_attn_layernorm.weight"
    b = "model.layers.0.post_mlp_layernorm.weight"
    td[a], td[b] = td[b], td[a]
    pre, dec = compare(md.load_model(spec_path("glm4"), td, variant="tiny"), ref, ids)
    assert pre > 10 * TOL and dec > 10 * TOL


def test_glm4_refuses_what_it_does_not_model(gqa, tmp_path):
    _, _, path, _, _ = gqa
    spec = md.load_spec(spec_path("glm4"))
    base = {"maxdecl.format": "hf", "hidden_act": "silu"}
    with pytest.raises(md.WeightsError, match="RoPE scaling yarn is not modelled"):
        params_from_metadata(spec, {**base, "rope_parameters": {
            "rope_type": "yarn", "rope_theta": 1e4, "partial_rotary_factor": 0.5}})
    with pytest.raises(md.WeightsError, match="hidden_act gelu"):
        params_from_metadata(spec, {**base, "hidden_act": "gelu"})
    with pytest.raises(md.WeightsError, match="RoPE scaling yarn"):
        params_from_metadata(spec, {"maxdecl.format": "gguf", "general.architecture": "glm4",
                                    "glm4.rope.scaling.type": "yarn"})
    # a whole checkpoint folder with YaRN in config.json
    long = tmp_path / "long"
    shutil.copytree(path, long)
    cfg = json.loads((long / "config.json").read_text())
    cfg["rope_parameters"] = {**cfg["rope_parameters"], "rope_type": "yarn", "factor": 4.0,
                              "original_max_position_embeddings": 64}
    (long / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(md.WeightsError, match="RoPE scaling yarn"):
        md.load_model(spec_path("glm4"), str(long), variant="tiny")


@pytest.fixture(scope="module")
def glm4_gguf(glm4, tmp_path_factory):
    name, model = glm4[0], glm4[1]
    return glm4_to_gguf(model, tmp_path_factory.mktemp(f"glm4_gguf_{name}") / f"{name}.gguf")


def test_glm4_gguf_matches_hf(glm4, glm4_gguf):
    """The same weights as llama.cpp's converter writes them: params from the glm4.*
    keys (head_dim from key_length, the rotated width from rope.dimension_count)."""
    name, _, _, ids, ref = glm4
    got = hf_params("glm4", glm4_gguf)[2]
    assert got["head_dim"] == CASES[name]["head_dim"] and got["rot_dim"] == ROT_DIM[name]
    assert got["n_kv_heads"] == CASES[name]["num_key_value_heads"] and got["vocab"] == 128
    ours = md.load_model(spec_path("glm4"), glm4_gguf, variant="tiny")
    pre, dec = compare(ours, ref, ids)
    print(f"glm4 {name} gguf vs HF: prefill {pre:.2e}, decode {dec:.2e}")
    assert pre <= TOL and dec <= TOL


def test_llama_cpp_runs_the_gguf_as_hf(glm4, glm4_gguf):
    """llama.cpp itself on the converter-style GGUF gives HF's logits (so the GGUF
    layout above is llama.cpp's, not just ours)."""
    llama_cpp = pytest.importorskip("llama_cpp")
    name, _, _, ids, ref = glm4
    got = llama_cpp_logits(llama_cpp, glm4_gguf, ids)
    print(f"glm4 {name} llama.cpp vs HF: {rel_err(got, ref):.2e}")
    assert rel_err(got, ref) <= TOL
    assert rel_err(got[:N_PROMPT], ref[:N_PROMPT]) <= TOL
    assert np.isfinite(got).all()


def test_glm4_export_round_trip(glm4, tmp_path):
    """`maxdecl export` of the HF folder writes what the converter writes for the keys
    that matter (key_length, the rotated width as rope.dimension_count, no output.weight
    when tied); maxdecl and llama.cpp (when installed) run the file as transformers."""
    import subprocess
    import sys

    import gguf

    name, model, path, ids, ref = glm4
    out = tmp_path / "x.gguf"
    subprocess.run([sys.executable, "-m", "maxdecl", "export", path, "--spec",
                    spec_path("glm4"), "--variant", "tiny", "-o", str(out)],
                   check=True, capture_output=True)
    r = gguf.GGUFReader(str(out))
    fields = r.fields
    assert fields["general.architecture"].contents() == "glm4"
    assert fields["glm4.rope.dimension_count"].contents() == ROT_DIM[name]
    assert fields["glm4.attention.key_length"].contents() == CASES[name]["head_dim"]
    names = {t.name for t in r.tensors}
    assert ("output.weight" in names) == (not CASES[name]["tie_word_embeddings"])
    assert ("blk.0.attn_q.bias" in names) == CASES[name]["attention_bias"]
    pre, dec = compare(md.load_model(spec_path("glm4"), str(out), variant="tiny"), ref, ids)
    assert pre <= TOL and dec <= TOL
    try:
        import llama_cpp
    except ImportError:
        return
    from modelhelp import with_tokenizer
    got = llama_cpp_logits(llama_cpp, with_tokenizer(out, tmp_path / "tok.gguf", 128), ids)
    assert rel_err(got, ref) <= TOL
