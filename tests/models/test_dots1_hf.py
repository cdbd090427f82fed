"""specs/dots1.yaml against transformers' Dots1ForCausalLM (dots.llm1).

Small seeded float32 dots.llm1 models (hidden 64, vocab 256, eager attention):

- ``moe``: 3 layers, the first dense (first_k_dense_replace 1), then MoE layers with 8
  routed experts (2 per token) in 2 groups of which 1 is kept (n_group / topk_group),
  2 shared experts, norm_topk_prob on, routed_scaling_factor 2.5, a random
  e_score_correction_bias, head_dim 32 != hidden / heads, GQA (4 / 2 heads) and a
  sliding window of 5 on the last layer (max_window_layers 2);
- ``plain``: the released model's routing (n_group = topk_group = 1), norm_topk_prob
  off, scaling 1.0, every layer MoE (first_k_dense_replace 0), full attention,
  head_dim from hidden / heads, one shared expert.

Logits of a 12-token prefill and 4 decode steps through the KV cache, greedy
generation (alone and batched), the fused-expert state_dict layout, and negative
controls showing that the correction bias, the group limit and the window matter.
"""

import numpy as np
import pytest

import maxdecl as md

from modelhelp import (assert_greedy_matches_hf, compare, hf_case, hf_params,
                       randomize, spec_path, with_hf_config)

pytest.importorskip("torch")
pytest.importorskip("transformers")

TOL = 1e-5                  # max|ours - ref| <= TOL * max|ref|
PROMPTS = [[3, 17, 42, 99, 5, 7, 64, 1, 200, 13], [8, 9, 120], [5, 60, 33, 2, 90, 11, 7, 250]]
N_NEW = 8

MOE = dict(vocab_size=256, hidden_size=64, intermediate_size=128, moe_intermediate_size=32,
           num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2, head_dim=32,
           n_routed_experts=8, num_experts_per_tok=2, n_shared_experts=2, n_group=2,
           topk_group=1, first_k_dense_replace=1, norm_topk_prob=True,
           routed_scaling_factor=2.5, max_position_embeddings=64, sliding_window=5,
           max_window_layers=2, rms_norm_eps=1e-6,
           rope_parameters={"rope_type": "default", "rope_theta": 50000.0})

PLAIN = dict(vocab_size=256, hidden_size=64, intermediate_size=96, moe_intermediate_size=48,
             num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=4,
             n_routed_experts=6, num_experts_per_tok=3, n_shared_experts=1, n_group=1,
             topk_group=1, first_k_dense_replace=0, norm_topk_prob=False,
             routed_scaling_factor=1.0, max_position_embeddings=64, sliding_window=None,
             rms_norm_eps=1e-5, rope_parameters={"rope_type": "default", "rope_theta": 10000.0})


def make_dots1(seed=0, bias_spread=0.3, **cfg):
    """Dots1ForCausalLM from ``cfg``, randomized; the routers' e_score_correction_bias
    (a buffer randomize leaves at zero) drawn from ``bias_spread * N(0, 1)``."""
    import torch
    import transformers

    torch.manual_seed(seed)
    config = transformers.Dots1Config(attn_implementation="eager", **cfg)
    model = randomize(transformers.Dots1ForCausalLM(config), seed)
    gen = torch.Generator().manual_seed(seed + 100)
    with torch.no_grad():
        for layer in model.model.layers[config.first_k_dense_replace:]:
            b = layer.mlp.gate.e_score_correction_bias
            b.copy_(bias_spread * torch.randn(b.shape, generator=gen))
    return model


@pytest.fixture(scope="module")
def moe(tmp_path_factory):
    return hf_case(make_dots1(0, **MOE), tmp_path_factory.mktemp("dots1_moe"))


@pytest.fixture(scope="module")
def plain(tmp_path_factory):
    return hf_case(make_dots1(1, **PLAIN), tmp_path_factory.mktemp("dots1_plain"))


@pytest.fixture(scope="module")
def ours_moe(moe):
    return md.load_model(spec_path("dots1"), moe[1], variant="tiny")


@pytest.fixture(scope="module")
def ours_plain(plain):
    return md.load_model(spec_path("dots1"), plain[1], variant="tiny")


def errors(name, ours, case):
    _, _, ids, ref = case
    pre, dec = compare(ours, ref, ids)
    print(f"{name}: prefill {pre:.2e}, decode {dec:.2e} (of max|ref| {np.abs(ref).max():.2f})")
    return pre, dec


def test_dots1_config_from_hf(moe, plain):
    got = hf_params("dots1", moe[1])[2]
    assert (got["dim"], got["n_layers"], got["n_heads"], got["n_kv_heads"]) == (64, 3, 4, 2)
    assert (got["head_dim"], got["ffn_dim"], got["moe_ffn_dim"]) == (32, 128, 32)
    assert (got["n_expert"], got["n_expert_used"], got["n_shared"], got["n_dense"]) == (8, 2, 2, 1)
    assert (got["n_group"], got["topk_group"], got["norm_topk"]) == (2, 1, True)
    assert got["routed_scale"] == pytest.approx(2.5)
    assert got["rope_theta"] == pytest.approx(50000.0)
    assert got["sliding_window"] == 5
    assert got["layer_types"] == ["full_attention", "full_attention", "sliding_attention"]
    assert (got["vocab"], got["context"]) == (256, 64)

    got = hf_params("dots1", plain[1])[2]
    assert got["head_dim"] == 16                       # hidden_size // num_attention_heads
    assert (got["n_dense"], got["n_group"], got["norm_topk"]) == (0, 1, False)
    assert got["sliding_window"] == 0                  # null: no window
    assert got["layer_types"] == ["full_attention"] * 2


def test_dots1_moe_prefill_and_decode_match_hf(moe, ours_moe):
    pre, dec = errors("dots1 moe", ours_moe, moe)
    assert pre <= TOL and dec <= TOL


def test_dots1_plain_prefill_and_decode_match_hf(plain, ours_plain):
    pre, dec = errors("dots1 plain", ours_plain, plain)
    assert pre <= TOL and dec <= TOL


def test_dots1_moe_greedy_generate_matches_hf(moe, ours_moe):
    assert_greedy_matches_hf(moe[0], ours_moe, PROMPTS, N_NEW)


def test_dots1_plain_greedy_generate_matches_hf(plain, ours_plain):
    assert_greedy_matches_hf(plain[0], ours_plain, PROMPTS, N_NEW)


def test_dots1_graph_has_dense_and_moe_layers(ours_moe):
    """first_k_dense_replace 1: blk.0 has a dense MLP, blk.1 and blk.2 route."""
    w = ours_moe.weights
    assert "blk.0.ffn.gate.weight" in w and "blk.0.ffn_gate_inp.weight" not in w
    for i in (1, 2):
        assert w[f"blk.{i}.ffn_gate_exps.weight"].shape == (8, 32, 64)
        assert w[f"blk.{i}.ffn_shexp.gate.weight"].shape == (64, 64)    # 2 shared * 32
        assert f"blk.{i}.exp_probs_b.bias" in w and f"blk.{i}.ffn.gate.weight" not in w


def test_dots1_fused_expert_state_dict_loads(moe, tmp_path):
    """A torch state_dict of the in-memory model (experts fused as gate_up_proj
    [E, 2F, D] and down_proj [E, D, F]) saved as one file loads through the split."""
    import safetensors.torch

    model, _, ids, ref = moe
    sd = {k: v.contiguous() for k, v in model.state_dict().items()}
    assert "model.layers.1.mlp.experts.gate_up_proj" in sd
    path = tmp_path / "state_dict.safetensors"
    safetensors.torch.save_file(sd, str(path))
    ours = md.load_model(spec_path("dots1"), str(path), variant="tiny")
    pre, dec = compare(ours, ref, ids)
    assert pre <= TOL and dec <= TOL


def test_dots1_correction_bias_matters(moe):
    """Negative control: with the correction bias zeroed the experts chosen change."""
    _, path, ids, ref = moe
    td = md.load_weights(path)
    for i in (1, 2):
        name = f"model.layers.{i}.mlp.gate.e_score_correction_bias"
        td[name] = np.zeros_like(np.asarray(td[name]))
    pre, dec = compare(md.load_model(spec_path("dots1"), td, variant="tiny"), ref, ids)
    assert pre > 100 * TOL


def test_dots1_group_limit_matters(moe):
    """Negative control: choosing over all groups (topk_group = n_group) differs."""
    _, path, ids, ref = moe
    spec = with_hf_config(md.load_spec(spec_path("dots1")), topk_group="{2}")
    pre, dec = compare(md.load_model(spec, path, variant="tiny"), ref, ids)
    assert pre > 100 * TOL


def test_dots1_sliding_window_matters(moe):
    """Negative control: the last layer's window of 5 (12 prompt tokens) matters."""
    _, path, ids, ref = moe
    spec = with_hf_config(md.load_spec(spec_path("dots1")), sliding_window="{0}")
    pre, dec = compare(md.load_model(spec, path, variant="tiny"), ref, ids)
    assert pre > 100 * TOL and dec > 100 * TOL


def test_dots1_scaling_and_norm_matter(moe):
    """Negative control: routed_scaling_factor and norm_topk_prob are read."""
    _, path, ids, ref = moe
    for values in ({"routed_scale": "{1.0}"}, {"norm_topk": "{False}"}):
        spec = with_hf_config(md.load_spec(spec_path("dots1")), **values)
        pre, _ = compare(md.load_model(spec, path, variant="tiny"), ref, ids)
        assert pre > 100 * TOL, values


def test_dots1_refuses_rope_scaling(moe, tmp_path):
    """A checkpoint with a RoPE scaling the spec does not model is refused."""
    model = make_dots1(0, **{**MOE, "rope_parameters": {"rope_type": "linear", "factor": 2.0,
                                                          "rope_theta": 50000.0}})
    path = tmp_path / "scaled"
    model.save_pretrained(str(path))
    with pytest.raises(md.WeightsError, match="RoPE scaling linear"):
        md.load_model(spec_path("dots1"), str(path), variant="tiny")



def test_dots1_older_config_json_reads_the_same(moe, tmp_path):
    """A config.json as the released checkpoints write it (rope_theta at the top level,
    no rope_parameters, no layer_types: derived from sliding_window and
    max_window_layers as Dots1Config does) gives the same params and logits."""
    import json
    import shutil

    _, path, ids, ref = moe
    old = tmp_path / "old"
    shutil.copytree(path, old)
    cfg = json.loads((old / "config.json").read_text())
    cfg["rope_theta"] = cfg.pop("rope_parameters")["rope_theta"]
    del cfg["layer_types"]
    (old / "config.json").write_text(json.dumps(cfg))
    got = hf_params("dots1", old)[2]
    assert got["rope_theta"] == pytest.approx(50000.0)
    assert got["layer_types"] == ["full_attention", "full_attention", "sliding_attention"]
    pre, dec = compare(md.load_model(spec_path("dots1"), str(old), variant="tiny"), ref, ids)
    assert pre <= TOL and dec <= TOL
