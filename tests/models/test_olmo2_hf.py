"""specs/olmo2.yaml against transformers' Olmo2ForCausalLM.

A small seeded float32 OLMo 2: RMSNorm after each sublayer (post_attention_layernorm,
post_feedforward_layernorm) instead of before it, RMSNorm over the whole q and k
projections (q_norm over 4 heads * 16, k_norm over 2 kv heads * 16: grouped-query,
where the released 1B / 7B have as many kv heads as query heads), RoPE rotating
halves (neox), SwiGLU, no biases, an untied output.
"""

import json
import shutil

import pytest

import maxdecl as md
from maxdecl.pipelines.model_loading import params_from_metadata

from modelhelp import (TOL, _add_tokenizer, _write, assert_greedy_matches_hf, assert_logits_match,
                       assert_tiny_decoder_params, compare, gguf_writer, hf_case, hf_params,
                       hf_state, randomize, spec_path, tiny_model)

pytest.importorskip("torch")
pytest.importorskip("transformers")

PROMPTS = [[3, 17, 42, 99, 5, 7, 64, 1], [8, 9, 120], [5, 60, 33, 2, 90, 11, 7]]
N_NEW = 6


def make_olmo2(seed=0, **kw):
    """Olmo2ForCausalLM: dim 64, 2 layers, GQA 4/2, rope_theta 500000, untied output."""
    import torch
    import transformers

    torch.manual_seed(seed)
    cfg = dict(vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
               num_attention_heads=4, num_key_value_heads=2, rms_norm_eps=1e-6,
               max_position_embeddings=64, rope_theta=500000.0, pad_token_id=1,
               bos_token_id=None, eos_token_id=2, tie_word_embeddings=False,
               attn_implementation="eager")
    cfg.update(kw)
    return randomize(transformers.Olmo2ForCausalLM(transformers.Olmo2Config(**cfg)), seed)


@pytest.fixture(scope="module")
def olmo2(tmp_path_factory):
    model = make_olmo2()
    return hf_case(model, tmp_path_factory.mktemp("olmo2_hf"))


@pytest.fixture(scope="module")
def ours(olmo2):
    return tiny_model("olmo2", olmo2[1])


def test_olmo2_config_from_hf(olmo2):
    model, path, _, _ = olmo2
    spec, meta, got = hf_params("olmo2", path)
    assert_tiny_decoder_params(got)
    assert got["rope_theta"] == 500000.0 and got["norm_eps"] == pytest.approx(1e-6)
    assert got["rope_type"] == "default"
    # config.json as OLMo-2 ships it (transformers < 5): top-level rope_theta,
    # rope_scaling null
    old = {k: v for k, v in meta.items() if k != "rope_parameters"}
    got = params_from_metadata(spec, {**old, "rope_theta": 250000.0, "rope_scaling": None})
    assert got["rope_theta"] == 250000.0 and "rope_type" not in got


def test_olmo2_prefill_and_decode_match_hf(olmo2, ours):
    model, path, ids, ref = olmo2
    assert_logits_match("olmo2", ours, ids, ref)


def test_olmo2_greedy_generate_matches_hf(olmo2, ours):
    assert_greedy_matches_hf(olmo2[0], ours, PROMPTS, N_NEW)


PER_HEAD_Q_NORM = """\
        layers:
          - {op: reshape, in: q, attrs: {shape: [seq, "{n_heads}", "{head_dim}"]}, out: q}
          - {op: mul, in: [q, q], out: q2}
          - {op: mean, in: q2, attrs: {axis: -1, keepdims: true}, out: ms}
          - {op: rsqrt, in: ms, out: ms}
          - {op: mul, in: [q, ms], out: q}
          - {op: reshape, in: q, attrs: {shape: [seq, "{n_heads * head_dim}"]}, out: q}
          - {op: mul, in: [q, .weight], out: q}
          - {op: reshape, in: q, attrs: {shape: [seq, "{n_heads}", "{head_dim}"]}, out: q}
          - {op: rope, in: [q, positions], attrs: {theta: "{rope_theta}", style: neox}, out: q}
"""
WHOLE_Q_NORM = """\
        layers:
          - {op: rms_norm, in: [q, .weight], attrs: {epsilon: "{norm_eps}"}, out: q}
          - {op: reshape, in: q, attrs: {shape: [seq, "{n_heads}", "{head_dim}"]}, out: q}
          - {op: rope, in: [q, positions], attrs: {theta: "{rope_theta}", style: neox}, out: q}
"""


def test_olmo2_whole_projection_qk_norm_matters(olmo2, tmp_path):
    """Negative control: the spec with q normalized over each head separately (as
    Qwen3's q_norm does; epsilon left out), then scaled by the same q_norm weight, gives
    other logits, so the match above needs OLMo 2's norm over the whole projection."""
    model, path, ids, ref = olmo2
    text = open(spec_path("olmo2")).read()
    assert text.count(WHOLE_Q_NORM) == 1
    per_head = tmp_path / "olmo2_per_head.yaml"
    per_head.write_text(text.replace(WHOLE_Q_NORM, PER_HEAD_Q_NORM))
    ours = md.load_model(str(per_head), path, variant="tiny")
    pre, dec = compare(ours, ref, ids)
    assert pre > 10 * TOL and dec > 10 * TOL


def olmo2_to_gguf(model, path) -> str:
    """Write an Olmo2ForCausalLM as llama.cpp's converter does (arch ``olmo2``): HF's
    q/k row order kept (neox rope), q_norm / k_norm as attn_q_norm / attn_k_norm, the
    post-sublayer norms as post_attention_norm / post_ffw_norm; a sliding window only
    when the config has one (OLMo 3)."""
    import gguf

    cfg, sd = model.config, hf_state(model)
    w = gguf_writer(path, "olmo2", cfg)
    w.add_rope_freq_base(float(cfg.rope_parameters["rope_theta"]))
    w.add_layer_norm_rms_eps(cfg.rms_norm_eps)
    if getattr(cfg, "sliding_window", None) is not None:      # OLMo 3 (the converter's
        w.add_sliding_window(cfg.sliding_window)               # layer pattern left out)
    w.add_file_type(gguf.LlamaFileType.ALL_F32)
    _add_tokenizer(w, cfg.vocab_size)
    names = {"self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k",
             "self_attn.v_proj": "attn_v", "self_attn.o_proj": "attn_output",
             "self_attn.q_norm": "attn_q_norm", "self_attn.k_norm": "attn_k_norm",
             "post_attention_layernorm": "post_attention_norm",
             "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up", "mlp.down_proj": "ffn_down",
             "post_feedforward_layernorm": "post_ffw_norm"}
    t = {"token_embd.weight": sd["model.embed_tokens.weight"]}
    for i in range(cfg.num_hidden_layers):
        for src, dst in names.items():
            t[f"blk.{i}.{dst}.weight"] = sd[f"model.layers.{i}.{src}.weight"]
    t["output_norm.weight"] = sd["model.norm.weight"]
    if not cfg.tie_word_embeddings:
        t["output.weight"] = sd["lm_head.weight"]
    _write(w, t)
    return str(path)


def test_olmo2_gguf_matches_hf(olmo2, tmp_path):
    """The same weights as a llama.cpp-style GGUF (olmo2.* keys, post_*_norm names)."""
    model, _, ids, ref = olmo2
    path = olmo2_to_gguf(model, tmp_path / "tiny-olmo2.gguf")
    got = hf_params("olmo2", path)[2]
    assert (got["n_kv_heads"], got["vocab"], got["rope_theta"]) == (2, 128, 500000.0)
    assert got["norm_eps"] == pytest.approx(1e-6) and "window" not in got
    ours = md.load_model(spec_path("olmo2"), path, variant="tiny")
    pre, dec = compare(ours, ref, ids)
    assert pre <= TOL and dec <= TOL


def test_olmo3_gguf_with_a_window_is_refused(olmo2, tmp_path):
    """llama.cpp's converter files OLMo 3 (sliding windows on 3 of every 4 layers) under
    arch olmo2 too, with olmo2.attention.sliding_window: such a GGUF is refused when
    loading (formats.gguf.refuse), not run without its windows."""
    import copy

    model, _, _, _ = olmo2
    olmo3 = copy.copy(model)
    olmo3.config = copy.deepcopy(model.config)
    olmo3.config.sliding_window = 4
    path = olmo2_to_gguf(olmo3, tmp_path / "olmo3.gguf")
    with pytest.raises(md.WeightsError, match="sliding window .*OLMo 3.* not modelled"):
        md.load_model(spec_path("olmo2"), path, variant="tiny")


@pytest.mark.parametrize("layout", ["rope_parameters", "rope_scaling"])
def test_olmo2_rope_scaling_is_refused(olmo2, tmp_path, layout):
    """A config.json with RoPE scaling (yarn, as OLMo 3's long-context models use),
    which the spec does not model, is refused when loading (formats.hf.refuse), in
    both config layouts."""
    _, path, _, _ = olmo2
    scaled = tmp_path / "scaled"
    shutil.copytree(path, scaled)
    cfg = json.loads((scaled / "config.json").read_text())
    cfg.pop("rope_parameters", None)
    cfg.pop("rope_scaling", None)
    yarn = {"factor": 8.0, "original_max_position_embeddings": 64, "attention_factor": 1.2}
    if layout == "rope_parameters":          # transformers >= 5
        cfg["rope_parameters"] = {"rope_type": "yarn", "rope_theta": 500000.0, **yarn}
    else:                                    # older config.json
        cfg["rope_theta"] = 500000.0
        cfg["rope_scaling"] = {"rope_type": "yarn", **yarn}
    (scaled / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(md.WeightsError, match="RoPE scaling yarn is not modelled"):
        md.load_model(spec_path("olmo2"), str(scaled), variant="tiny")
