"""specs/bloom.yaml against transformers' BloomForCausalLM.

Small seeded float32 BLOOMs: word embeddings followed by a LayerNorm, LayerNorms with
biases, the fused query_key_value projection whose rows HF lays out per head as
[n_head, 3, head_dim], ALiBi biases (no position embeddings) with BLOOM's slopes, a
GELU (tanh) MLP with biases, the final ln_f and the output tied to the embedding.
Two configs: 4 heads (a power of two) and 6 heads (BLOOM's extra slopes for the
heads past the largest power of two).
"""

import os
import subprocess
import sys

import numpy as np
import pytest

import maxdecl as md

from modelhelp import (TOL, _add_tokenizer, _write, assert_greedy_matches_hf, assert_logits_match,
                       compare, hf_case, hf_params, hf_state, randomize, spec_path, tiny_model,
                       with_hf_config, without_hf_transforms)

pytest.importorskip("torch")
pytest.importorskip("transformers")

PROMPTS = [[3, 17, 42, 90, 5, 7, 64, 1], [8, 9, 95], [5, 60, 33, 2, 90, 11, 7]]
N_NEW = 6


def make_bloom(seed=0, **kw):
    """BloomForCausalLM: vocab 96, dim 256, 4 heads, 2 layers, tied output.

    The tied table is scaled to 0.1 * N(0, 1), as in test_qwen2_hf.py, so greedy
    decoding does not just repeat the last token."""
    import torch
    import transformers

    torch.manual_seed(seed)
    cfg = dict(vocab_size=96, hidden_size=256, n_head=4, n_layer=2, layer_norm_epsilon=1e-5,
               attn_implementation="eager")
    cfg.update(kw)
    model = randomize(transformers.BloomForCausalLM(transformers.BloomConfig(**cfg)), seed)
    with torch.no_grad():
        model.transformer.word_embeddings.weight.mul_(0.1)
    return model


def hf_slopes(n_heads: int) -> list[float]:
    from transformers.models.bloom.modeling_bloom import _get_alibi_slopes

    return _get_alibi_slopes(n_heads, "cpu").tolist()


def attention_slopes(ours) -> list[tuple]:
    return [n.attrs["alibi_slopes"] for n in ours.graph.nodes if n.op == "attention"]


@pytest.fixture(scope="module")
def bloom(tmp_path_factory):
    return hf_case(make_bloom(), tmp_path_factory.mktemp("bloom_hf"))


@pytest.fixture(scope="module")
def ours(bloom):
    return tiny_model("bloom", bloom[1])


@pytest.fixture(scope="module")
def bloom6(tmp_path_factory):
    """6 heads (not a power of two), head_dim 64."""
    return hf_case(make_bloom(seed=1, hidden_size=384, n_head=6), tmp_path_factory.mktemp("bloom6"))


@pytest.fixture(scope="module")
def ours6(bloom6):
    return tiny_model("bloom", bloom6[1])


def test_bloom_config_from_hf(bloom, bloom6):
    got = hf_params("bloom", bloom[1])[2]
    assert {k: got[k] for k in ("dim", "n_layers", "n_heads", "vocab")} == \
        {"dim": 256, "n_layers": 2, "n_heads": 4, "vocab": 96}
    assert got["norm_eps"] == pytest.approx(1e-5)
    got6 = hf_params("bloom", bloom6[1])[2]
    assert (got6["dim"], got6["n_heads"]) == (384, 6)
    assert not any(k.startswith("lm_head") for k in md.load_weights(bloom[1]).keys())   # tied


def test_bloom_prefill_and_decode_match_hf(bloom, ours):
    model, path, ids, ref = bloom
    assert attention_slopes(ours) == [tuple(hf_slopes(4))] * 2
    assert_logits_match("bloom", ours, ids, ref)


def test_bloom_greedy_generate_matches_hf(bloom, ours):
    assert_greedy_matches_hf(bloom[0], ours, PROMPTS, N_NEW)


def test_bloom_six_heads_match_hf(bloom6, ours6):
    """ALiBi slopes for 6 heads: 4 from the power-of-two base, then 2 odd powers of the
    next base (0.25, 0.0625, 0.015625, 0.00390625, 0.5, 0.125)."""
    model, path, ids, ref = bloom6
    assert ours6.params["head_dim"] == 64
    assert attention_slopes(ours6) == [tuple(hf_slopes(6))] * 2
    assert_logits_match("bloom 6 heads", ours6, ids, ref)
    assert_greedy_matches_hf(model, ours6, PROMPTS[:2], N_NEW)


@pytest.mark.parametrize("change", ["max_alibi_bias", "no qkv reorder"])
def test_bloom_alibi_and_qkv_layout_matter(bloom6, change):
    """Negative controls: other ALiBi slopes, or HF's per-head q/k/v rows read without
    the permute_rows transform as llama.cpp's [3, n_head, head_dim], give other logits."""
    model, path, ids, ref = bloom6
    spec = md.load_spec(spec_path("bloom"))
    spec = (with_hf_config(spec, max_alibi_bias=16.0) if change == "max_alibi_bias"
            else without_hf_transforms(spec))
    pre, dec = compare(md.load_model(spec, path, variant="tiny"), ref, ids)
    assert pre > 10 * TOL and dec > 10 * TOL


def test_bloom_bigscience_tensor_names(bloom, tmp_path):
    """The BigScience checkpoints are saved from BloomModel: no "transformer." prefix
    and no lm_head."""
    model, _, ids, ref = bloom
    model.transformer.save_pretrained(tmp_path, safe_serialization=True)
    assert "h.0.self_attention.query_key_value.weight" in md.load_weights(tmp_path).keys()
    pre, dec = compare(tiny_model("bloom", tmp_path), ref, ids)
    assert pre <= TOL and dec <= TOL


def test_bloom_refuses_post_layernorm_residual(tmp_path):
    model = make_bloom(apply_residual_connection_post_layernorm=True)
    model.save_pretrained(tmp_path, safe_serialization=True)
    with pytest.raises(md.errors.WeightsError, match="apply_residual_connection_post_layernorm"):
        tiny_model("bloom", tmp_path)


def bloom_to_gguf(model, path) -> str:
    """Write a BloomForCausalLM as llama.cpp's converter does (arch ``bloom``): the fused
    q/k/v rows (and bias) reordered from [n_head, 3, head_dim] to q, k, v, the
    embedding also written as ``output.weight``; no vocab_size key (the tokenizer's
    length gives it)."""
    import gguf

    cfg, sd = model.config, hf_state(model)
    nh, d = cfg.n_head, cfg.hidden_size
    w = gguf.GGUFWriter(os.fspath(path), "bloom")
    w.add_context_length(d)          # the converter's fallback without seq_length
    w.add_embedding_length(d)
    w.add_feed_forward_length(4 * d)
    w.add_block_count(cfg.n_layer)
    w.add_head_count(nh)
    w.add_head_count_kv(nh)
    w.add_layer_norm_eps(cfg.layer_norm_epsilon)
    w.add_file_type(gguf.LlamaFileType.ALL_F32)
    _add_tokenizer(w, cfg.vocab_size)
    p = "transformer."
    t = {"token_embd.weight": sd[p + "word_embeddings.weight"],
         "token_embd_norm.weight": sd[p + "word_embeddings_layernorm.weight"],
         "token_embd_norm.bias": sd[p + "word_embeddings_layernorm.bias"]}
    names = {"input_layernorm": "attn_norm", "self_attention.query_key_value": "attn_qkv",
             "self_attention.dense": "attn_output", "post_attention_layernorm": "ffn_norm",
             "mlp.dense_h_to_4h": "ffn_up", "mlp.dense_4h_to_h": "ffn_down"}
    for i in range(cfg.n_layer):
        for src, dst in names.items():
            for kind in ("weight", "bias"):
                x = sd[f"{p}h.{i}.{src}.{kind}"]
                if dst == "attn_qkv":
                    x = x.reshape(nh, 3, d // nh, *x.shape[1:]).swapaxes(0, 1).reshape(x.shape)
                t[f"blk.{i}.{dst}.{kind}"] = x
    t["output_norm.weight"] = sd[p + "ln_f.weight"]
    t["output_norm.bias"] = sd[p + "ln_f.bias"]
    t["output.weight"] = sd[p + "word_embeddings.weight"]
    _write(w, t)
    return os.fspath(path)


def test_bloom_gguf_matches_hf(bloom6, tmp_path):
    """The same weights as a llama.cpp-style GGUF: params from the bloom.* keys, the
    q/k/v rows in llama.cpp's order."""
    model, _, ids, ref = bloom6
    path = bloom_to_gguf(model, tmp_path / "tiny-bloom.gguf")
    got = hf_params("bloom", path)[2]
    assert (got["dim"], got["n_heads"], got["vocab"]) == (384, 6, 96)
    ours = md.load_model(spec_path("bloom"), path, variant="tiny")
    pre, dec = compare(ours, ref, ids)
    assert pre <= TOL and dec <= TOL


def test_bloom_export_round_trip(bloom6, tmp_path):
    """`maxdecl export` of the HF weights writes the q/k/v rows in llama.cpp's order (as
    its converter does), and the GGUF reads back with the same logits."""
    model, path, ids, ref = bloom6
    out = tmp_path / "exported.gguf"
    subprocess.run([sys.executable, "-m", "maxdecl", "export", "--spec", spec_path("bloom"),
                    "--variant", "tiny", "-o", str(out), path], check=True, capture_output=True)
    converted = md.load_weights(bloom_to_gguf(model, tmp_path / "converter.gguf"))
    exported = md.load_weights(out)
    for name in ("blk.0.attn_qkv.weight", "blk.1.attn_qkv.bias"):
        got, want = (np.asarray(getattr(t[name], "dequantize", lambda: t[name])())
                     for t in (exported, converted))
        np.testing.assert_allclose(got, want, atol=0.02 * np.abs(want).max())
    pre, dec = compare(tiny_model("bloom", out), ref, ids)
    assert pre <= TOL and dec <= TOL
