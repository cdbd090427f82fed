"""specs/phi3.yaml against transformers' Phi3ForCausalLM.

A small seeded float32 Phi-3: the fused qkv_proj (grouped-query: 4 query heads, 2 kv
heads) and gate_up_proj, RoPE rotating halves on half of each head's features
(partial_rotary_factor 0.5, as Phi-4-mini rotates 0.75), and a sliding window (5)
shorter than the test sequence, as Phi-3-mini-4k's 2047 is shorter than its context.
"""

import pytest

import maxdecl as md
from maxdecl.pipelines.model_loading import params_from_metadata

from modelhelp import (N_PROMPT, TOL, _add_tokenizer, _write, assert_greedy_matches_hf,
                       assert_logits_match, assert_tiny_decoder_params, compare, gguf_writer,
                       hf_case, hf_params, hf_state, randomize, spec_path, tiny_model)

pytest.importorskip("torch")
pytest.importorskip("transformers")

PROMPTS = [[3, 17, 42, 99, 5, 7, 64, 1], [8, 9, 120], [5, 60, 33, 2, 90, 11, 7]]
N_NEW = 6
WINDOW = 5


def make_phi3(seed=0, **kw):
    """Phi3ForCausalLM: dim 64, 2 layers, GQA 4/2, partial rotary 0.5, window 5."""
    import torch
    import transformers

    torch.manual_seed(seed)
    cfg = dict(vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
               num_attention_heads=4, num_key_value_heads=2, rms_norm_eps=1e-5,
               max_position_embeddings=64, original_max_position_embeddings=64,
               rope_theta=10000.0, partial_rotary_factor=0.5, sliding_window=WINDOW,
               pad_token_id=0, bos_token_id=1, eos_token_id=2, tie_word_embeddings=False,
               attn_implementation="eager")
    cfg.update(kw)
    return randomize(transformers.Phi3ForCausalLM(transformers.Phi3Config(**cfg)), seed)


@pytest.fixture(scope="module")
def phi3(tmp_path_factory):
    model = make_phi3()
    assert model.config.sliding_window < N_PROMPT
    return hf_case(model, tmp_path_factory.mktemp("phi3_hf"))


@pytest.fixture(scope="module")
def ours(phi3):
    return tiny_model("phi3", phi3[1])


def test_phi3_config_from_hf(phi3):
    model, path, _, _ = phi3
    spec, meta, got = hf_params("phi3", path)
    assert_tiny_decoder_params(got)
    assert got["rot_dim"] == 8                       # head_dim 16 * partial_rotary_factor 0.5
    assert got["window"] == WINDOW and got["rope_theta"] == 10000.0
    # config.json as Phi-3-mini-4k ships it (transformers < 5): top-level rope_theta,
    # no partial_rotary_factor (all of each head rotates)
    old = {k: v for k, v in meta.items() if k not in ("rope_parameters", "partial_rotary_factor")}
    got = params_from_metadata(spec, {**old, "rope_theta": 20000.0, "sliding_window": None})
    assert got["rot_dim"] == 16 and got["rope_theta"] == 20000.0
    assert got["window"] == 0                        # null: no window


def test_phi3_prefill_and_decode_match_hf(phi3, ours):
    model, path, ids, ref = phi3
    assert_logits_match("phi3", ours, ids, ref)


def test_phi3_greedy_generate_matches_hf(phi3, ours):
    assert_greedy_matches_hf(phi3[0], ours, PROMPTS, N_NEW)


def test_phi3_window_and_partial_rotary_matter(phi3):
    """Negative controls: the same weights without the window, or rotating every
    feature of each head, give other logits."""
    model, path, ids, ref = phi3
    for change in ({"sliding_window": None}, {"partial_rotary_factor": 1.0}):
        td = md.load_weights(path)
        td.metadata.update(change)
        if "partial_rotary_factor" in change:
            td.metadata["rope_parameters"] = {**td.metadata["rope_parameters"], **change}
        ours = md.load_model(spec_path("phi3"), td, variant="tiny")
        pre, dec = compare(ours, ref, ids)
        assert pre > 10 * TOL and dec > 10 * TOL, change


def phi3_to_gguf(model, path) -> str:
    """Write a Phi3ForCausalLM as llama.cpp's converter does (arch ``phi3``): HF's
    q/k row order kept (neox rope), gate_up_proj as the fused blk.N.ffn_up, the rotated
    width as rope.dimension_count and the window as attention.sliding_window."""
    import gguf

    cfg, sd = model.config, hf_state(model)
    head_dim = cfg.hidden_size // cfg.num_attention_heads
    w = gguf_writer(path, "phi3", cfg)
    w.add_layer_norm_rms_eps(cfg.rms_norm_eps)
    w.add_rope_dimension_count(int(head_dim * cfg.rope_parameters["partial_rotary_factor"]))
    w.add_rope_freq_base(float(cfg.rope_parameters["rope_theta"]))
    w.add_sliding_window(cfg.sliding_window or 0)
    w.add_file_type(gguf.LlamaFileType.ALL_F32)
    _add_tokenizer(w, cfg.vocab_size)
    names = {"input_layernorm": "attn_norm", "self_attn.qkv_proj": "attn_qkv",
             "self_attn.o_proj": "attn_output", "post_attention_layernorm": "ffn_norm",
             "mlp.gate_up_proj": "ffn_up", "mlp.down_proj": "ffn_down"}
    t = {"token_embd.weight": sd["model.embed_tokens.weight"]}
    for i in range(cfg.num_hidden_layers):
        for src, dst in names.items():
            t[f"blk.{i}.{dst}.weight"] = sd[f"model.layers.{i}.{src}.weight"]
    t["output_norm.weight"] = sd["model.norm.weight"]
    t["output.weight"] = sd["lm_head.weight"]
    _write(w, t)
    return str(path)


def test_phi3_gguf_matches_hf(phi3, tmp_path):
    """The same weights as a llama.cpp-style GGUF (phi3.* keys, fused ffn_up)."""
    model, _, ids, ref = phi3
    path = phi3_to_gguf(model, tmp_path / "tiny-phi3.gguf")
    got = hf_params("phi3", path)[2]
    assert (got["rot_dim"], got["window"], got["n_kv_heads"]) == (8, WINDOW, 2)
    ours = md.load_model(spec_path("phi3"), path, variant="tiny")
    pre, dec = compare(ours, ref, ids)
    assert pre <= TOL and dec <= TOL


@pytest.mark.parametrize("layout", ["rope_parameters", "rope_scaling"])
def test_phi3_long_context_rope_is_refused(phi3, tmp_path, layout):
    """Phi-3's 128k models scale RoPE (longrope), which the spec does not model: their
    config.json is refused when loading (formats.hf.refuse), in both config layouts,
    instead of running with wrong positions."""
    import json
    import shutil

    _, path, _, _ = phi3
    long = tmp_path / "long"
    shutil.copytree(path, long)
    cfg = json.loads((long / "config.json").read_text())
    cfg.pop("rope_parameters", None)
    cfg.pop("rope_scaling", None)
    if layout == "rope_parameters":          # transformers >= 5
        cfg["rope_parameters"] = {"rope_type": "longrope", "rope_theta": 10000.0,
                                  "partial_rotary_factor": 0.5}
    else:                                    # older config.json
        cfg["rope_scaling"] = {"type": "longrope", "short_factor": [1.0] * 4,
                               "long_factor": [1.0] * 4}
    (long / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(md.WeightsError, match="RoPE scaling longrope .* not modelled"):
        md.load_model(spec_path("phi3"), str(long), variant="tiny")
    md.load_model(spec_path("phi3"), path, variant="tiny")          # the plain one loads
