"""specs/mixtral.yaml and specs/qwen3_moe.yaml against transformers with small random
configs: 4-8 experts, 2 used per token, prefill and decode through the KV cache."""

import numpy as np
import pytest

import maxdecl as md
from archhelp import TOL, decoder_errors, load
from modelhelp import hf_logits, randomize, save_hf, token_ids

pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")


def make_mixtral(seed=0):
    import torch

    torch.manual_seed(seed)
    cfg = transformers.MixtralConfig(
        vocab_size=96, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, num_local_experts=6,
        num_experts_per_tok=2, rms_norm_eps=1e-5, max_position_embeddings=64,
        rope_theta=1e6, tie_word_embeddings=False, attn_implementation="eager")
    return randomize(transformers.MixtralForCausalLM(cfg), seed)


@pytest.fixture(scope="module")
def mixtral(tmp_path_factory):
    model = make_mixtral()
    path = save_hf(model, tmp_path_factory.mktemp("mixtral_hf"))
    ids = token_ids(model.config.vocab_size)
    return model, path, ids, hf_logits(model, ids)


def test_mixtral_weights_stack_experts_and_read_config(mixtral):
    _, path, _, _ = mixtral
    td = md.load_weights(path, spec="specs/mixtral.yaml", variant="tiny")
    assert td["blk.1.ffn_gate_exps.weight"].shape == (6, 96, 64)     # experts stacked
    assert td["blk.0.ffn_down_exps.weight"].shape == (6, 64, 96)
    assert td.params["n_expert"] == 6 and td.params["n_expert_used"] == 2
    assert td.params["dim"] == 64


def test_mixtral_prefill_and_decode_match_hf(mixtral):
    _, path, ids, ref = mixtral
    g, td = load("mixtral", path)
    pre, dec = decoder_errors(g, td, ref, ids)
    print(f"mixtral vs HF: prefill {pre:.2e}, decode {dec:.2e} (of max|ref|)")
    assert pre <= TOL and dec <= TOL


def test_mixtral_quantized_experts_stay_close(mixtral):
    """q8_0 experts (3-D, quantized per expert row-wise) run the packed kernels."""
    _, path, ids, ref = mixtral
    g0, td = load("mixtral", path)
    codec = md.codecs.get("q8_0")
    for name in list(td.keys()):
        if name.endswith("_exps.weight"):
            w = np.asarray(td[name], np.float32)
            td[name] = md.QuantizedTensor(codec.quantize(w), w.shape, "q8_0")
    g = md.build("specs/mixtral.yaml", weights=td)
    pre, dec = decoder_errors(g, td, ref, ids)
    assert pre < 0.05 and dec < 0.05


def make_qwen3_moe(seed=0, norm_topk_prob=True):
    import torch

    torch.manual_seed(seed)
    cfg = transformers.Qwen3MoeConfig(
        vocab_size=96, hidden_size=64, moe_intermediate_size=48, intermediate_size=128,
        num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=24,
        num_experts=8, num_experts_per_tok=2, norm_topk_prob=norm_topk_prob,
        rms_norm_eps=1e-6, max_position_embeddings=64, rope_theta=1e6,
        tie_word_embeddings=False, attn_implementation="eager")
    return randomize(transformers.Qwen3MoeForCausalLM(cfg), seed)


@pytest.mark.parametrize("norm_topk_prob", [True, False])
def test_qwen3_moe_prefill_and_decode_match_hf(tmp_path, norm_topk_prob):
    model = make_qwen3_moe(seed=1, norm_topk_prob=norm_topk_prob)
    path = save_hf(model, tmp_path / "hf")
    ids = token_ids(model.config.vocab_size, seed=4)
    ref = hf_logits(model, ids)
    g, td = load("qwen3_moe", path)
    assert td.params["norm_topk_prob"] is norm_topk_prob
    pre, dec = decoder_errors(g, td, ref, ids)
    print(f"qwen3_moe (norm_topk_prob={norm_topk_prob}) vs HF: prefill {pre:.2e}, "
          f"decode {dec:.2e} (of max|ref|)")
    assert pre <= TOL and dec <= TOL
