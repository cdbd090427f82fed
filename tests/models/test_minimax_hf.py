"""specs/minimax.yaml against transformers' MiniMaxForCausalLM.

A small seeded float32 MiniMax whose layers mix lightning attention (linear attention
with a per-head decay, layers 0, 1 and 3) and softmax attention with RoPE (layer 2),
each followed by the sparse MoE (4 experts, top 2). The residual weights
(alpha / beta factors) are all different from 1, so each is exercised. transformers'
block_size is 8, so its prefill of a 12-token prompt runs two blocks (the chunked
form) while its decode steps run the recurrence: the spec's single selective_scan
must match both.
"""

import numpy as np
import pytest

import maxdecl as md

from archhelp import error_with_state_reset
from modelhelp import assert_greedy_matches_hf, hf_case, ours_logits, rel_err, spec_path, token_ids

pytest.importorskip("torch")
pytest.importorskip("transformers")

TOL = 1e-4          # max|ours - ref| <= TOL * max|ref|
LAYER_TYPES = ["linear_attention", "linear_attention", "full_attention", "linear_attention"]
LINEAR = [i for i, t in enumerate(LAYER_TYPES) if t == "linear_attention"]
PROMPTS = [[3, 17, 42, 99, 5, 7, 64, 1, 200, 33, 150], [8, 9, 120, 77, 255],
           [5, 60, 33, 2, 90, 11, 7, 140, 19]]
N_NEW = 8


def make_minimax(seed=0, **kw):
    """MiniMaxForCausalLM: dim 64, 4 layers (3 lightning, 1 softmax), 4 heads of 16
    (2 kv heads), 4 experts of width 96 (top 2), vocab 256, 64 positions, untied."""
    import torch
    import transformers

    from modelhelp import randomize

    torch.manual_seed(seed)
    cfg = dict(vocab_size=256, hidden_size=64, intermediate_size=96, num_hidden_layers=4,
               num_attention_heads=4, num_key_value_heads=2, head_dim=16,
               num_local_experts=4, num_experts_per_tok=2, layer_types=LAYER_TYPES,
               block_size=8, max_position_embeddings=64, rms_norm_eps=1e-5,
               rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
               full_attn_alpha_factor=1.3, full_attn_beta_factor=0.8,
               linear_attn_alpha_factor=0.9, linear_attn_beta_factor=1.2,
               mlp_alpha_factor=1.1, mlp_beta_factor=0.7,
               bos_token_id=1, eos_token_id=2, attn_implementation="eager")
    cfg.update(kw)
    return randomize(transformers.MiniMaxForCausalLM(transformers.MiniMaxConfig(**cfg)), seed)


@pytest.fixture(scope="module")
def minimax(tmp_path_factory):
    return hf_case(make_minimax(), tmp_path_factory.mktemp("minimax_hf"))


@pytest.fixture(scope="module")
def ours(minimax):
    return md.load_model(spec_path("minimax"), minimax[1], variant="tiny")


def test_minimax_config_from_hf(ours):
    p = ours.params
    assert (p["dim"], p["n_layers"], p["n_heads"], p["n_kv_heads"], p["head_dim"]) == (64, 4, 4, 2, 16)
    assert (p["ffn_dim"], p["n_expert"], p["n_expert_used"], p["vocab"], p["context"]) == (96, 4, 2, 256, 64)
    assert p["layer_types"] == LAYER_TYPES
    assert p["rope_theta"] == 10000.0 and p["norm_eps"] == pytest.approx(1e-5)
    assert (p["full_attn_alpha"], p["full_attn_beta"], p["linear_attn_alpha"], p["linear_attn_beta"],
            p["mlp_alpha"], p["mlp_beta"]) == (1.3, 0.8, 0.9, 1.2, 1.1, 0.7)
    ops = {n.op for n in ours.graph.nodes}
    assert {"selective_scan", "attention", "expert_linear"} <= ops


def test_minimax_prefill_and_decode_match_hf(minimax, ours):
    """12 tokens in one prefill, then 4 single-token steps through the lightning states
    and the KV cache, against one full-sequence forward."""
    _, _, ids, ref = minimax
    pre, dec = ours_logits(ours, ids)
    e_pre, e_dec = rel_err(pre, ref[:12]), rel_err(dec, ref[12:])
    print(f"minimax vs HF: prefill {e_pre:.2e}, decode {e_dec:.2e} (of max|ref| {np.abs(ref).max():.2f})")
    assert e_pre <= TOL and e_dec <= TOL


def _batched_logits(ours, prompts):
    """Every position's logits of all ``prompts`` in one batched call (``rows=``), each
    sequence with its own empty states."""
    g = ours.graph
    run = md.compile(g, ours.weights)
    lens = [len(p) for p in prompts]
    feed = {"tokens": np.concatenate([np.asarray(p, np.int64) for p in prompts]),
            "positions": np.concatenate([np.arange(n, dtype=np.int64) for n in lens]),
            "logit_rows": np.arange(sum(lens), dtype=np.int64)}
    args = []
    for v in g.inputs:
        if v.name in feed:
            args.append(feed[v.name])
        else:
            empty = np.zeros([d if isinstance(d, int) else 0 for d in v.type.shape], v.type.dtype.numpy)
            args.append(md.PerSequence([empty.copy() for _ in prompts]))
    logits = np.asarray(run(*args, rows=lens)[0])
    return np.split(logits, np.cumsum(lens)[:-1])


def test_minimax_batch_of_two_prompts_matches_hf(minimax, ours):
    """transformers' logits of a [2, 12] batch against maxdecl's batched step over the
    two sequences' rows (and each prompt alone)."""
    import torch

    model = minimax[0]
    prompts = [token_ids(256, 12, seed=11), token_ids(256, 12, seed=12)]
    with torch.no_grad():
        ref = model(torch.tensor(prompts), use_cache=False).logits.float().numpy()
    got = _batched_logits(ours, prompts)
    errs = [rel_err(got[b], ref[b]) for b in range(2)]
    alone = [rel_err(ours.logits(p), ref[b]) for b, p in enumerate(prompts)]
    print(f"minimax batch of 2 vs HF: batched {max(errs):.2e}, alone {max(alone):.2e}")
    assert max(errs) <= TOL and max(alone) <= TOL


def test_minimax_greedy_generate_matches_hf(minimax, ours):
    """Greedy ids equal transformers' generate (its MiniMaxCache: linear states and KV
    cache), for one prompt and for three prompts of different lengths together."""
    assert_greedy_matches_hf(minimax[0], ours, PROMPTS, N_NEW)


@pytest.mark.parametrize("state", ["lin_state", "kv_cache"])
def test_minimax_states_matter(minimax, ours, state):
    """Negative control: a decode step after the prefill with the lightning states
    (or the KV cache) emptied is far off."""
    _, _, ids, ref = minimax
    assert error_with_state_reset(ours.graph, ours.weights, ref, ids, reset=state) > 100 * TOL


def test_minimax_slopes_computed_without_buffers(minimax):
    """A checkpoint without the slope_rate buffers (they are derived, not trained) gets
    them from the spec's fill, as transformers computes them."""
    _, path, ids, ref = minimax
    td = md.load_weights(path)
    slopes = {i: np.asarray(td[f"model.layers.{i}.self_attn.slope_rate"]).reshape(-1) for i in LINEAR}
    for i in LINEAR:
        del td[f"model.layers.{i}.self_attn.slope_rate"]
    ours = md.load_model(spec_path("minimax"), td, variant="tiny")
    assert not any(k.endswith("attn_slope") for k in ours.weights.keys())
    pre, dec = ours_logits(ours, ids)
    assert rel_err(pre, ref[:12]) <= TOL and rel_err(dec, ref[12:]) <= TOL
    assert all(s.min() > 0 for s in slopes.values())       # real decays were in the file


def test_minimax_slopes_matter(minimax):
    """Negative control: the per-layer slopes are read (layer 0's given to every layer
    is far off)."""
    _, path, ids, ref = minimax
    td = md.load_weights(path)
    s0 = np.asarray(td["model.layers.0.self_attn.slope_rate"])
    for i in LINEAR[1:]:
        td[f"model.layers.{i}.self_attn.slope_rate"] = s0.copy()
    ours = md.load_model(spec_path("minimax"), td, variant="tiny")
    pre, _ = ours_logits(ours, ids)
    assert rel_err(pre, ref[:12]) > 100 * TOL


def test_minimax_in_memory_state_dict_loads(minimax, tmp_path):
    """A torch state_dict saved as one file holds transformers 5's in-memory names
    (mlp.gate, fused mlp.experts.gate_up_proj [E, 2F, D]): the split mapping reads it."""
    import shutil

    from safetensors.torch import save_file

    model, path, ids, ref = minimax
    sd = {k: v.contiguous() for k, v in model.state_dict().items()}
    assert any(k.endswith("mlp.experts.gate_up_proj") for k in sd)
    save_file(sd, str(tmp_path / "model.safetensors"))
    shutil.copy(f"{path}/config.json", tmp_path / "config.json")
    ours = md.load_model(spec_path("minimax"), str(tmp_path), variant="tiny")
    pre, dec = ours_logits(ours, ids)
    assert rel_err(pre, ref[:12]) <= TOL and rel_err(dec, ref[12:]) <= TOL


def test_minimax_tied_output(tmp_path):
    """tie_word_embeddings: no lm_head in the checkpoint, the embedding stands in."""
    model = make_minimax(seed=3, tie_word_embeddings=True,
                         layer_types=["full_attention", "linear_attention"], num_hidden_layers=2)
    _, path, ids, ref = hf_case(model, tmp_path / "tied")
    assert "lm_head.weight" not in md.load_weights(path).keys()
    ours = md.load_model(spec_path("minimax"), path, variant="tiny")
    pre, dec = ours_logits(ours, ids)
    assert rel_err(pre, ref[:12]) <= TOL and rel_err(dec, ref[12:]) <= TOL


def test_minimax_sliding_window(tmp_path):
    """config.json's sliding_window limits the softmax layers' keys (window 5 over 16
    tokens, so it matters), the lightning layers stay unbounded."""
    model = make_minimax(seed=5, sliding_window=5,
                         layer_types=["full_attention", "linear_attention"] * 2)
    _, path, ids, ref = hf_case(model, tmp_path / "swa")
    ours = md.load_model(spec_path("minimax"), path, variant="tiny")
    assert ours.params["sliding_window"] == 5
    pre, dec = ours_logits(ours, ids)
    assert rel_err(pre, ref[:12]) <= TOL and rel_err(dec, ref[12:]) <= TOL
