"""specs/lfm2_moe.yaml against transformers' Lfm2MoeForCausalLM.

Small seeded float32 LFM2-MoE models, saved with ``save_pretrained`` and loaded through
the spec's ``formats.hf`` mapping:

* ``base``: 4 layers ``conv, full_attention, conv, full_attention``, one dense layer
  then MoE layers (8 experts, top 3), a random ``expert_bias`` (it changes which experts
  are chosen), ``norm_topk_prob``, tied output, the config class's RoPE base; its sizes
  are the spec's ``tiny`` variant, so a torch ``state_dict`` without config.json loads
  too.
* ``alt``: 5 layers ``full_attention, conv, conv, full_attention, conv``, two dense
  layers, a 4-tap convolution with biases (``conv_bias``), no expert bias, no
  renormalisation of the top-k weights, ``routed_scaling_factor`` 2.5, an untied
  output, 6 heads over 2 KV heads, RoPE base 10000.

Each is checked on the logits of a 12-token prefill and of 4 single-token steps through
the caches (conv states and KV caches), and on greedy generation against
transformers' ``generate``.
"""

import numpy as np
import pytest

import maxdecl as md

from archhelp import TOL, decoder_errors, error_with_state_reset, hf_cases, load
from modelhelp import (N_DECODE, N_PROMPT, assert_greedy_matches_hf, hf_params, randomize,
                       rel_err, spec_path, tiny_model)

pytest.importorskip("torch")
pytest.importorskip("transformers")

VOCAB = 256
PROMPTS = [[3, 17, 42, 99, 5, 7, 64, 1, 200], [8, 9, 120], [5, 60, 33, 2, 90, 11, 7, 250]]
N_NEW = 6

CASES = {
    "base": dict(),
    "alt": dict(num_hidden_layers=5, num_dense_layers=2, num_attention_heads=6,
                num_key_value_heads=2, hidden_size=96, intermediate_size=128,
                moe_intermediate_size=48, num_experts=6, num_experts_per_tok=2,
                layer_types=["full_attention", "conv", "conv", "full_attention", "conv"],
                conv_L_cache=4, conv_bias=True, use_expert_bias=False, norm_topk_prob=False,
                routed_scaling_factor=2.5, tie_word_embeddings=False,
                rope_parameters={"rope_type": "default", "rope_theta": 10000.0}),
}


def make_lfm2_moe(seed=0, **kw):
    """Lfm2MoeForCausalLM with randomize's weights; the expert bias (a buffer, which
    randomize leaves at zeros) drawn from 0.3 N(0, 1), of the order of the sigmoid
    scores it is added to. A tied embedding is scaled to 0.1 N(0, 1): otherwise each
    token's own embedding dominates the tied logits and greedy decoding repeats it."""
    import torch
    import transformers

    torch.manual_seed(seed)
    cfg = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=96, moe_intermediate_size=32,
               num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2,
               num_dense_layers=1, num_experts=8, num_experts_per_tok=3,
               layer_types=["conv", "full_attention", "conv", "full_attention"],
               conv_L_cache=3, max_position_embeddings=128, norm_eps=1e-5,
               bos_token_id=1, eos_token_id=2, pad_token_id=0,
               attn_implementation="eager")
    cfg.update(kw)
    model = randomize(transformers.Lfm2MoeForCausalLM(transformers.Lfm2MoeConfig(**cfg)), seed)
    gen = torch.Generator().manual_seed(seed + 100)
    with torch.no_grad():
        if model.config.tie_word_embeddings:
            model.model.embed_tokens.weight.mul_(0.1)
        for layer in model.model.layers:
            ff = layer.feed_forward
            if getattr(ff, "use_expert_bias", False):
                ff.expert_bias.copy_(0.3 * torch.randn(ff.expert_bias.shape, generator=gen))
    return model


@pytest.fixture(scope="module")
def cases(tmp_path_factory):
    return hf_cases(make_lfm2_moe, CASES, tmp_path_factory, "lfm2_moe", VOCAB,
                    N_PROMPT + N_DECODE)


@pytest.fixture(scope="module")
def graphs(cases):
    return {name: load("lfm2_moe", c[1]) for name, c in cases.items()}


def test_lfm2_moe_spec_validates():
    assert md.validate_spec(spec_path("lfm2_moe")) == []


def test_lfm2_moe_config_from_hf(cases):
    got = hf_params("lfm2_moe", cases["base"][1])[2]
    assert (got["dim"], got["n_layers"], got["n_heads"], got["n_kv_heads"], got["vocab"],
            got["context"]) == (64, 4, 4, 2, VOCAB, 128)
    assert (got["ffn_dim"], got["moe_ffn_dim"], got["n_expert"], got["n_expert_used"],
            got["n_dense"]) == (96, 32, 8, 3, 1)
    assert got["layer_types"] == ["conv", "full_attention", "conv", "full_attention"]
    assert got["rope_theta"] == pytest.approx(1e6)     # the config class's default
    assert got["use_expert_bias"] is True and got["norm_topk_prob"] is True
    alt = hf_params("lfm2_moe", cases["alt"][1])[2]
    assert (alt["dim"], alt["n_layers"], alt["n_heads"], alt["n_kv_heads"]) == (96, 5, 6, 2)
    assert (alt["conv_k"], alt["conv_bias"], alt["n_dense"]) == (4, True, 2)
    assert (alt["use_expert_bias"], alt["norm_topk_prob"]) == (False, False)
    assert alt["routed_scale"] == pytest.approx(2.5)
    assert alt["rope_theta"] == pytest.approx(1e4)


@pytest.mark.parametrize("name", list(CASES))
def test_lfm2_moe_layer_types_follow_config(cases, graphs, name):
    """Each layer runs a short conv or attention as config.json's layer_types says, and
    a dense MLP before num_dense_layers, the MoE after it."""
    cfg = cases[name][0].config
    graph = graphs[name][0]
    ops_of = {}
    for node in graph.nodes:
        parts = node.layer.split(".")
        if parts[0] == "blk":
            ops_of.setdefault(int(parts[1]), set()).add(node.op)
    for i, kind in enumerate(cfg.layer_types):
        ops = ops_of[i]
        assert ("causal_conv1d" in ops) == (kind == "conv"), (i, kind)
        assert ("attention" in ops) == (kind == "full_attention"), (i, kind)
        assert ("expert_linear" in ops) == (i >= cfg.num_dense_layers), i
    states = sorted(v.name for v in graph.inputs if v.name.startswith("blk."))
    want = sorted(f"blk.{i}.{'conv_state' if t == 'conv' else 'kv_cache'}"
                  for i, t in enumerate(cfg.layer_types))
    assert states == want


@pytest.mark.parametrize("name", list(CASES))
def test_lfm2_moe_prefill_and_decode_match_hf(cases, graphs, name):
    _, _, ids, ref = cases[name]
    pre, dec = decoder_errors(*graphs[name], ref, ids)
    print(f"lfm2_moe[{name}] vs HF: prefill {pre:.2e}, decode {dec:.2e} (of max|ref|)")
    assert pre <= TOL and dec <= TOL


@pytest.mark.parametrize("name", list(CASES))
def test_lfm2_moe_greedy_generate_matches_hf(cases, name):
    model, path, _, _ = cases[name]
    assert_greedy_matches_hf(model, tiny_model("lfm2_moe", path), PROMPTS, N_NEW)


def test_lfm2_moe_routing_matches_hf(cases, graphs):
    """The experts each MoE layer chooses (and their weights) are transformers'
    router's, on the hidden states transformers feeds it."""
    import torch

    model, _, ids, _ = cases["base"]
    td = graphs["base"][1]
    cfg = model.config
    seen = {}

    def hook(mod, args, out):
        seen[mod] = (args[0].detach(), out)

    hooks = [layer.feed_forward.gate.register_forward_hook(hook)
             for layer in model.model.layers[cfg.num_dense_layers:]]
    try:
        with torch.no_grad():
            model(torch.tensor([ids]), use_cache=False)
    finally:
        for h in hooks:
            h.remove()
    for i in range(cfg.num_dense_layers, cfg.num_hidden_layers):
        router = model.model.layers[i].feed_forward.gate
        h, (_, want_w, want_ids) = seen[router]
        p = 1 / (1 + np.exp(-(h.numpy() @ np.asarray(td[f"blk.{i}.moe.ffn_gate_inp.weight"]).T)))
        s = p + np.asarray(td[f"blk.{i}.moe.exp_probs_b.bias"])
        got_ids = np.argsort(-s, axis=-1, kind="stable")[:, :cfg.num_experts_per_tok]
        np.testing.assert_array_equal(got_ids, want_ids.numpy())
        w = np.take_along_axis(p, got_ids, axis=1)
        w = w / (w.sum(-1, keepdims=True) + 1e-6) * cfg.routed_scaling_factor
        assert rel_err(w, want_w.numpy()) <= TOL


def test_lfm2_moe_expert_bias_matters(cases):
    """Negative control: without the expert bias (which only chooses experts) the
    logits move far off."""
    _, path, ids, ref = cases["base"]
    td = md.load_weights(path, spec=spec_path("lfm2_moe"), variant="tiny")
    for name in list(td.keys()):
        if name.endswith("exp_probs_b.bias"):
            td[name] = np.zeros_like(np.asarray(td[name]))
    graph = md.build(spec_path("lfm2_moe"), weights=td)
    pre, dec = decoder_errors(graph, td, ref, ids)
    assert pre > 100 * TOL and dec > 100 * TOL


@pytest.mark.parametrize("state", ["conv_state", "kv_cache"])
def test_lfm2_moe_states_matter(cases, graphs, state):
    """Negative control: a decode step after the prefill with the conv states (or the
    KV caches) emptied is far off, so both caches carry the prompt."""
    _, _, ids, ref = cases["base"]
    assert error_with_state_reset(*graphs["base"], ref, ids, reset=state) > 100 * TOL


def test_lfm2_moe_state_dict_with_fused_experts_loads(cases, tmp_path):
    """A torch state_dict saved as one file holds transformers 5's in-memory names
    (experts fused as gate_up_proj [E, 2F, D] and down_proj [E, D, F]); without a
    config.json the tiny variant gives the sizes (those of the base case)."""
    from safetensors.torch import save_file

    model, _, ids, ref = cases["base"]
    sd = {k: v.detach().clone().contiguous() for k, v in model.state_dict().items()}
    assert any(k.endswith("experts.gate_up_proj") for k in sd)
    file = tmp_path / "state_dict.safetensors"
    save_file(sd, str(file))
    graph, td = load("lfm2_moe", file)
    pre, dec = decoder_errors(graph, td, ref, ids)
    assert pre <= TOL and dec <= TOL
