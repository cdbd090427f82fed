"""specs/gpt_oss.yaml against transformers' GptOssForCausalLM.

Small seeded float32 gpt-oss models: dim 64, GQA (4 query heads, 2 kv heads, head_dim
16), q/k/v/o biases, learned attention sinks (randomized, N(0, 1.5)), sliding window 4
(shorter than the 16-token sequence) on the layers layer_types marks sliding, 4 experts
with biases (top-2, softmax over the chosen router logits) through gpt-oss's clamped
SwiGLU (gate and up interleaved in HF's gate_up_proj). The first model keeps
transformers' default YaRN RoPE (factor 32, truncate false); the second plain RoPE, its
own layer_types, a swiglu_limit small enough that the clamps bite, and a tied output.
The HF experts load straight into llama.cpp's layout (gate_up_proj cut apart by an
interleaved split, the expert weights transposed). Checked: logits of a prefill and of
decode steps through the KV cache, negative controls (sinks, window, clamp), the expert
tensors as loaded from the HF folder and from a torch ``state_dict`` file, a GGUF written
as llama.cpp's converter does, and ``maxdecl export`` of the HF folder (llama.cpp's
tensor names, the same logits).
"""

import subprocess
import sys

import numpy as np
import pytest

import maxdecl as md

from modelhelp import (TOL, _add_tokenizer, _write, assert_logits_match, compare,
                       gguf_writer, hf_case, hf_logits, hf_params, hf_state, randomize,
                       spec_path, tiny_model, token_ids, with_hf_config)

pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")


def make_gpt_oss(seed=0, **kw):
    import torch

    torch.manual_seed(seed)
    cfg = dict(vocab_size=256, hidden_size=64, intermediate_size=32, num_hidden_layers=2,
               num_attention_heads=4, num_key_value_heads=2, head_dim=16,
               num_local_experts=4, num_experts_per_tok=2, sliding_window=4,
               max_position_embeddings=128, rms_norm_eps=1e-5, tie_word_embeddings=False,
               attn_implementation="eager")
    cfg.update(kw)
    model = randomize(transformers.GptOssForCausalLM(transformers.GptOssConfig(**cfg)), seed)
    gen = torch.Generator().manual_seed(seed + 100)
    with torch.no_grad():
        for layer in model.model.layers:        # sinks of either sign, some large
            layer.self_attn.sinks.copy_(1.5 * torch.randn(layer.self_attn.sinks.shape,
                                                          generator=gen))
    return model.eval()


@pytest.fixture(scope="module")
def yarn_case(tmp_path_factory):
    return hf_case(make_gpt_oss(), tmp_path_factory.mktemp("gpt_oss_hf"))


def plain_model():
    return make_gpt_oss(
        seed=1, num_hidden_layers=3, swiglu_limit=0.3, tie_word_embeddings=True,
        layer_types=["full_attention", "sliding_attention", "sliding_attention"],
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0})


@pytest.fixture(scope="module")
def plain_case(tmp_path_factory):
    return hf_case(plain_model(), tmp_path_factory.mktemp("gpt_oss_plain_hf"))


def test_gpt_oss_config_from_hf(yarn_case, plain_case):
    _, _, got = hf_params("gpt_oss", yarn_case[1])
    assert (got["dim"], got["n_layers"], got["n_heads"], got["n_kv_heads"]) == (64, 2, 4, 2)
    assert (got["ffn_dim"], got["n_expert"], got["n_expert_used"]) == (32, 4, 2)
    assert got["window"] == 4
    assert got["rope_type"] == "yarn" and got["rope_truncate"] is False
    assert got["rope_factor"] == 32.0 and got["rope_orig_ctx"] == 4096
    _, _, got = hf_params("gpt_oss", plain_case[1])
    assert got["rope_type"] == "none" and got["rope_theta"] == 10000.0
    assert got["swiglu_limit"] == 0.3
    assert got["layer_types"] == ["full_attention", "sliding_attention", "sliding_attention"]


def test_gpt_oss_yarn_prefill_and_decode_match_hf(yarn_case):
    _, path, ids, ref = yarn_case
    ours = tiny_model("gpt_oss", path)
    assert ours.params["mscale"] > 1.0                  # YaRN's attention factor is on
    assert_logits_match("gpt_oss (yarn)", ours, ids, ref)


def test_gpt_oss_plain_rope_layer_types_clamp_tied_match_hf(plain_case):
    _, path, ids, ref = plain_case
    ours = tiny_model("gpt_oss", path)
    assert "output.weight" not in ours.weights
    assert_logits_match("gpt_oss (plain rope, layer_types, clamp, tied)", ours, ids, ref)


@pytest.mark.parametrize("entry,value", [("window", "{0}"), ("swiglu_limit", "{100.0}"),
                                         ("rope_type", "{'none'}")])
def test_gpt_oss_negative_controls(yarn_case, plain_case, entry, value):
    """Reading the window as none, the clamp as loose or YaRN as off gives other logits."""
    _, path, ids, ref = plain_case if entry != "rope_type" else yarn_case
    spec = with_hf_config(md.load_spec(spec_path("gpt_oss"), variant="tiny"), **{entry: value})
    pre, dec = compare(md.load_model(spec, path, variant="tiny"), ref, ids)
    assert max(pre, dec) > 10 * TOL


def test_gpt_oss_greedy_alone_and_batched_match_hf(plain_case):
    """Sinks are attention's input, so sequences decode together (``rows=``)."""
    from modelhelp import assert_greedy_matches_hf

    model, path, _, _ = plain_case
    assert_greedy_matches_hf(model, tiny_model("gpt_oss", path), [[3, 17, 42, 99, 5], [8, 9],
                                                                    [5, 60, 33, 2]], 5)


def test_gpt_oss_sinks_matter(yarn_case):
    _, path, ids, ref = yarn_case
    td = md.load_weights(path, spec=spec_path("gpt_oss"), variant="tiny")
    for i in range(2):
        td[f"blk.{i}.attn_sinks.weight"] = np.full((4,), -1e4, np.float32)   # no sink
    pre, dec = compare(md.load_model(spec_path("gpt_oss"), td, variant="tiny"), ref, ids)
    assert max(pre, dec) > 10 * TOL


# -- GGUF, as llama.cpp's convert_hf_to_gguf.py (GptOssModel) writes it ----------------

LAYERS = {"input_layernorm": "attn_norm", "self_attn.q_proj": "attn_q",
          "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v",
          "self_attn.o_proj": "attn_output", "post_attention_layernorm": "post_attention_norm",
          "mlp.router": "ffn_gate_inp"}


def gpt_oss_to_gguf(model, path) -> str:
    """Arch ``gpt-oss``: q/k rows in HF order (neox RoPE), ``attn_sinks.weight``,
    gate_up_proj de-interleaved into ``ffn_gate_exps`` / ``ffn_up_exps`` [E, F, D] (and
    biases), down_proj transposed to ``ffn_down_exps`` [E, D, F]; no layer_types key
    (llama.cpp: even layers slide)."""
    import gguf

    cfg, sd = model.config, hf_state(model)
    w = gguf_writer(path, "gpt-oss", cfg)
    w.add_key_length(cfg.head_dim)
    w.add_value_length(cfg.head_dim)
    w.add_rope_freq_base(float(cfg.rope_parameters["rope_theta"]))
    w.add_layer_norm_rms_eps(cfg.rms_norm_eps)
    w.add_expert_count(cfg.num_local_experts)
    w.add_expert_used_count(cfg.num_experts_per_tok)
    w.add_sliding_window(cfg.sliding_window)
    w.add_expert_feed_forward_length(cfg.intermediate_size)
    w.add_file_type(gguf.LlamaFileType.ALL_F32)
    _add_tokenizer(w, cfg.vocab_size)
    t = {"token_embd.weight": sd["model.embed_tokens.weight"]}
    for i in range(cfg.num_hidden_layers):
        p = f"model.layers.{i}."
        for src, dst in LAYERS.items():
            for kind in ("weight", "bias"):
                if p + f"{src}.{kind}" in sd:
                    t[f"blk.{i}.{dst}.{kind}"] = sd[p + f"{src}.{kind}"]
        t[f"blk.{i}.attn_sinks.weight"] = sd[p + "self_attn.sinks"]
        gu = sd[p + "mlp.experts.gate_up_proj"].transpose(0, 2, 1)     # [E, 2F, D]
        gub = sd[p + "mlp.experts.gate_up_proj_bias"]
        t[f"blk.{i}.ffn_gate_exps.weight"], t[f"blk.{i}.ffn_up_exps.weight"] = gu[:, ::2], gu[:, 1::2]
        t[f"blk.{i}.ffn_gate_exps.bias"], t[f"blk.{i}.ffn_up_exps.bias"] = gub[:, ::2], gub[:, 1::2]
        t[f"blk.{i}.ffn_down_exps.weight"] = sd[p + "mlp.experts.down_proj"].transpose(0, 2, 1)
        t[f"blk.{i}.ffn_down_exps.bias"] = sd[p + "mlp.experts.down_proj_bias"]
    t["output_norm.weight"] = sd["model.norm.weight"]
    if not cfg.tie_word_embeddings:
        t["output.weight"] = sd["lm_head.weight"]
    _write(w, t)
    return str(path)


def test_gpt_oss_converter_gguf_matches_hf(tmp_path):
    pytest.importorskip("gguf")
    # plain RoPE (the converter writes no YaRN truncate flag), HF's default layer kinds and
    # swiglu_limit (the converter writes no key; llama.cpp hard-codes 7.0)
    model = make_gpt_oss(seed=2, num_hidden_layers=3,
                         rope_parameters={"rope_type": "default", "rope_theta": 10000.0})
    path = gpt_oss_to_gguf(model, tmp_path / "g.gguf")
    ids = token_ids(256, seed=9)
    ours = md.load_model(spec_path("gpt_oss"), path, variant="tiny")
    assert ours.params["window"] == 4
    assert ours.params["rope_type"] == "none" and ours.params["n_layers"] == 3
    assert ours.weights["blk.0.ffn_gate_exps.weight"].shape == (4, 32, 64)
    assert_logits_match("gpt_oss converter GGUF", ours, ids, hf_logits(model, ids))


def test_gpt_oss_hf_experts_load_in_llama_cpp_layout(yarn_case, tmp_path):
    """gate_up_proj [E, D, 2F] (gate the even columns, up the odd ones) and its bias load
    as ffn_gate_exps / ffn_up_exps [E, F, D], down_proj [E, F, D] as ffn_down_exps
    [E, D, F]: from the saved folder and from a torch ``state_dict`` file alike."""
    from safetensors.torch import save_file

    model, path, _, _ = yarn_case
    sd = hf_state(model)
    lone = tmp_path / "state_dict.safetensors"
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, str(lone))
    for src in (path, str(lone)):
        td = md.load_weights(src, spec=spec_path("gpt_oss"), variant="tiny")
        assert not [n for n in td.keys() if "_hf" in n or "gate_up" in n]
        for i in range(2):
            p = f"model.layers.{i}.mlp.experts."
            gu, gub = sd[p + "gate_up_proj"], sd[p + "gate_up_proj_bias"]
            want = {"ffn_gate_exps.weight": gu[:, :, ::2].transpose(0, 2, 1),
                    "ffn_up_exps.weight": gu[:, :, 1::2].transpose(0, 2, 1),
                    "ffn_gate_exps.bias": gub[:, ::2], "ffn_up_exps.bias": gub[:, 1::2],
                    "ffn_down_exps.weight": sd[p + "down_proj"].transpose(0, 2, 1),
                    "ffn_down_exps.bias": sd[p + "down_proj_bias"]}
            for name, w in want.items():
                got = np.asarray(td[f"blk.{i}.{name}"])
                assert got.shape == w.shape, (src, name)
                np.testing.assert_array_equal(got, w)
        assert td["blk.0.ffn_gate_exps.weight"].shape == (4, 32, 64)
        assert td["blk.0.ffn_down_exps.weight"].shape == (4, 64, 32)


def test_gpt_oss_export_round_trip(yarn_case, tmp_path):
    """`maxdecl export` of the HF folder writes llama.cpp's expert tensors (what its
    converter writes), and the GGUF reads back with the same logits."""
    pytest.importorskip("gguf")
    model, path, ids, ref = yarn_case
    out = tmp_path / "exported.gguf"
    subprocess.run([sys.executable, "-m", "maxdecl", "export", "--spec", spec_path("gpt_oss"),
                    "--variant", "tiny", "-o", str(out), path], check=True, capture_output=True)
    exported = md.load_weights(out)
    converted = md.load_weights(gpt_oss_to_gguf(model, tmp_path / "converter.gguf"))
    assert not [n for n in exported.keys() if "_hf" in n or "gate_up" in n]
    for i in range(2):
        for name in ("ffn_gate_exps", "ffn_up_exps", "ffn_down_exps"):
            for kind in ("weight", "bias"):
                key = f"blk.{i}.{name}.{kind}"
                assert key in exported.keys(), key
                got, want = (np.asarray(getattr(t[key], "dequantize", lambda: t[key])())
                             for t in (exported, converted))
                assert got.shape == want.shape, key
                np.testing.assert_allclose(got, want, atol=1e-6 * np.abs(want).max(), err_msg=key)
    assert exported["blk.0.ffn_gate_exps.weight"].shape == (4, 32, 64)
    assert exported["blk.0.ffn_down_exps.weight"].shape == (4, 64, 32)
    ours = tiny_model("gpt_oss", str(out))
    assert ours.params["rope_truncate"] is False and ours.params["rope_type"] == "yarn"
    assert_logits_match("gpt_oss (exported GGUF)", ours, ids, ref)
