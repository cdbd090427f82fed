"""specs/qwen2.yaml against transformers' Qwen2ForCausalLM.

A small seeded float32 Qwen2: grouped-query attention (4 query heads, 2 kv heads)
whose q/k/v projections carry biases, RoPE base 1e6 rotating halves (neox), SwiGLU,
RMSNorm, and the output tied to the embedding as in Qwen2-0.5B (so the checkpoint
has no lm_head.weight).
"""

import numpy as np
import pytest

import maxdecl as md
from maxdecl.pipelines.model_loading import params_from_metadata

from modelhelp import (TOL, _add_tokenizer, _write, assert_greedy_matches_hf, assert_logits_match,
                       assert_tiny_decoder_params, compare, gguf_writer, hf_case, hf_logits,
                       hf_params, hf_state, layer_tensors, randomize, spec_path, tiny_model,
                       token_ids)

pytest.importorskip("torch")
pytest.importorskip("transformers")

PROMPTS = [[3, 17, 42, 99, 5, 7, 64, 1], [8, 9, 120], [5, 60, 33, 2, 90, 11, 7]]
N_NEW = 6


def make_qwen2(seed=0, **kw):
    """Qwen2ForCausalLM: dim 64, 2 layers, GQA 4/2, q/k/v biases, tied output.

    The tied table is scaled to 0.1 * N(0, 1): with N(0, 1) rows each token's own
    embedding dominates its logits and greedy decoding only repeats the last token."""
    import torch
    import transformers

    torch.manual_seed(seed)
    cfg = dict(vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
               num_attention_heads=4, num_key_value_heads=2, rms_norm_eps=1e-6,
               max_position_embeddings=64, rope_theta=1000000.0, tie_word_embeddings=True,
               attn_implementation="eager")
    cfg.update(kw)
    model = randomize(transformers.Qwen2ForCausalLM(transformers.Qwen2Config(**cfg)), seed)
    with torch.no_grad():
        model.model.embed_tokens.weight.mul_(0.1)
    return model


@pytest.fixture(scope="module")
def qwen2(tmp_path_factory):
    model = make_qwen2()
    return hf_case(model, tmp_path_factory.mktemp("qwen2_hf"))


@pytest.fixture(scope="module")
def ours(qwen2):
    return tiny_model("qwen2", qwen2[1])


def test_qwen2_config_from_hf(qwen2):
    model, path, _, _ = qwen2
    spec, meta, got = hf_params("qwen2", path)
    assert_tiny_decoder_params(got)
    assert got["rope_theta"] == 1e6 and got["norm_eps"] == pytest.approx(1e-6)
    # transformers < 5 wrote rope_theta at the top level of config.json
    old = {k: v for k, v in meta.items() if k != "rope_parameters"}
    assert params_from_metadata(spec, {**old, "rope_theta": 250000.0})["rope_theta"] == 250000.0
    assert not any(k.startswith("lm_head") for k in md.load_weights(path).keys())   # tied


def test_qwen2_prefill_and_decode_match_hf(qwen2, ours):
    model, path, ids, ref = qwen2
    assert_logits_match("qwen2", ours, ids, ref)


def test_qwen2_greedy_generate_matches_hf(qwen2, ours):
    assert_greedy_matches_hf(qwen2[0], ours, PROMPTS, N_NEW)


def test_qwen2_bf16_checkpoint_loads(tmp_path):
    """A bf16 checkpoint (as most on the Hub are): its matrices stay packed bf16, its
    norm weights and biases, which ops read as float, become float32 (exactly), and the
    logits are the transformers model's on the same bf16 weights."""
    import torch

    model = make_qwen2().to(torch.bfloat16)
    model.save_pretrained(tmp_path, safe_serialization=True)
    ours = tiny_model("qwen2", tmp_path)
    w = ours.weights
    assert w["blk.0.attn_q.weight"].encoding == "bf16"
    assert w["blk.0.attn_norm.weight"].dtype == np.float32
    assert w["blk.0.attn_q.bias"].dtype == np.float32
    q_bias = model.model.layers[0].self_attn.q_proj.bias
    np.testing.assert_array_equal(w["blk.0.attn_q.bias"], q_bias.detach().float().numpy())
    ids = token_ids(model.config.vocab_size)
    model = model.float()
    model.model.rotary_emb = type(model.model.rotary_emb)(model.config)  # inv_freq in float32
    pre, dec = compare(ours, hf_logits(model, ids), ids)
    assert pre <= 1e-5 and dec <= 1e-5         # the same weights: float32 rounding only


def test_qwen2_qkv_biases_matter(qwen2):
    """Negative control: the same weights with the q/k/v biases zeroed give other
    logits, so the match above needs the spec's biases."""
    model, path, ids, ref = qwen2
    td = md.load_weights(path)
    for name in list(td.keys()):
        if name.endswith("_proj.bias"):
            td[name] = np.zeros_like(np.asarray(td[name]))
    ours = md.load_model(spec_path("qwen2"), td, variant="tiny")
    pre, dec = compare(ours, ref, ids)
    assert pre > 10 * TOL and dec > 10 * TOL


def qwen2_to_gguf(model, path) -> str:
    """Write a Qwen2ForCausalLM as llama.cpp's converter does (arch ``qwen2``): HF's
    q/k row order kept (neox rope), biases as ``.bias``, no output.weight when tied."""
    import gguf

    cfg, sd = model.config, hf_state(model)
    w = gguf_writer(path, "qwen2", cfg)
    w.add_layer_norm_rms_eps(cfg.rms_norm_eps)
    w.add_rope_freq_base(float(cfg.rope_parameters["rope_theta"]))
    w.add_file_type(gguf.LlamaFileType.ALL_F32)
    _add_tokenizer(w, cfg.vocab_size)
    t = {"token_embd.weight": sd["model.embed_tokens.weight"],
         **layer_tensors(sd, cfg.num_hidden_layers)}
    t["output_norm.weight"] = sd["model.norm.weight"]
    assert "lm_head.weight" not in sd or cfg.tie_word_embeddings
    _write(w, t)
    return str(path)


def test_qwen2_gguf_matches_hf(qwen2, tmp_path):
    """The same weights as a llama.cpp-style GGUF: params from the qwen2.* keys, the
    tied output from token_embd.weight."""
    model, _, ids, ref = qwen2
    path = qwen2_to_gguf(model, tmp_path / "tiny-qwen2.gguf")
    got = hf_params("qwen2", path)[2]
    assert got["rope_theta"] == 1e6 and got["n_kv_heads"] == 2 and got["vocab"] == 128
    ours = md.load_model(spec_path("qwen2"), path, variant="tiny")
    pre, dec = compare(ours, ref, ids)
    assert pre <= TOL and dec <= TOL


def test_qwen2_refuses_rope_scaling(qwen2, tmp_path):
    """Qwen2.5's YaRN long-context scaling is not modelled: refused from config.json
    (either layout) and from a GGUF's rope.scaling.type; llama.cpp's "none" loads."""
    import json
    import shutil

    spec = md.load_spec(spec_path("qwen2"))
    path = tmp_path / "yarn"
    shutil.copytree(qwen2[1], path)
    cfg = json.loads((path / "config.json").read_text())
    cfg["rope_parameters"] = {**cfg.get("rope_parameters", {}), "rope_type": "yarn",
                              "factor": 4.0}
    (path / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(md.WeightsError, match="RoPE scaling yarn is not modelled"):
        tiny_model("qwen2", path)
    old = {"maxdecl.format": "hf", "rope_scaling": {"type": "yarn", "factor": 4.0}}
    with pytest.raises(md.WeightsError, match="yarn"):
        params_from_metadata(spec, old)
    gguf_meta = {"maxdecl.format": "gguf", "general.architecture": "qwen2",
                 "qwen2.rope.scaling.type": "yarn"}
    with pytest.raises(md.WeightsError, match="RoPE scaling yarn"):
        params_from_metadata(spec, gguf_meta)
    gguf_meta["qwen2.rope.scaling.type"] = "none"
    assert params_from_metadata(spec, gguf_meta)["rope_scaling"] == "none"
