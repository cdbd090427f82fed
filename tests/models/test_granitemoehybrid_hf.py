"""specs/granitemoehybrid.yaml against transformers' GraniteMoeHybridForCausalLM (Granite 4.0
hybrid; small random float32 configs, eager attention, the torch path of the Mamba-2 mixer).

Three seeded models, each built once per module and compared for a 12-token prompt and 6
decode steps through the KV caches of the attention layers and the conv / SSM states of
the Mamba-2 layers. Every multiplier is far from 1 (and the attention multiplier far from
1 / sqrt(head_dim)), so one applied wrongly, twice or not at all shows:

- ``rope``: 4 layers [mamba, attention, mamba, attention], RoPE, GQA 4 / 2, 4 experts of
  width 48, top-2, a shared MLP of width 80, untied output, one group of B / C;
- ``nope``: 3 layers [attention, mamba, mamba], position_embedding_type None (NoPE), MHA,
  top-1, a shared MLP of width 32, two groups of B / C, tied output, attention and Mamba
  projection biases on, conv bias off, other multipliers;
- ``dense``: hidden 32, num_local_experts 0 (the shared MLP alone, as Granite 4.0 micro),
  hidden_act gelu (shared MLP and conv), a clamping time_step_limit.

Negative controls: each kind of state reset after the prefill, RoPE switched the wrong
way, a multiplier left at 1, the shared MLP or the experts left out, and a perturbed
weight each give errors far above the tolerance.
"""

import json
import shutil

import numpy as np
import pytest

import maxdecl as md
from maxdecl.weights.for_spec import load_for_spec
from archhelp import (Stepper, decoder_errors, error_with_state_reset, hf_cases, load,
                      mamba2_dynamics)
from modelhelp import (TOL, assert_greedy_matches_hf, compare, hf_logits, hf_state, randomize,
                       rel_err, save_hf, spec_path, token_ids, with_hf_config)

pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

SPEC = "granitemoehybrid"
VOCAB = 128
N_PROMPT = 12
N_TOKENS = 18           # a prefill of 12, then 6 decode steps

BASE = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=48, shared_intermediate_size=80,
            num_hidden_layers=4, layer_types=["mamba", "attention", "mamba", "attention"],
            num_attention_heads=4, num_key_value_heads=2, num_local_experts=4,
            num_experts_per_tok=2, position_embedding_type="rope",
            mamba_n_heads=8, mamba_d_head="auto", mamba_n_groups=1, mamba_d_state=16,
            mamba_d_conv=4, mamba_expand=2, mamba_chunk_size=8, rms_norm_eps=1e-5,
            max_position_embeddings=64, embedding_multiplier=0.3, attention_multiplier=0.06,
            residual_multiplier=0.5, logits_scaling=3.0, tie_word_embeddings=False,
            attn_implementation="eager")

CASES = {
    "rope": dict(),
    "nope": dict(num_hidden_layers=3, layer_types=["attention", "mamba", "mamba"],
                 position_embedding_type=None, num_key_value_heads=4, num_experts_per_tok=1,
                 shared_intermediate_size=32, mamba_n_groups=2, tie_word_embeddings=True,
                 attention_bias=True, mamba_proj_bias=True, mamba_conv_bias=False,
                 embedding_multiplier=2.0, attention_multiplier=0.4, residual_multiplier=0.3,
                 logits_scaling=0.5),
    "dense": dict(hidden_size=32, num_hidden_layers=3, layer_types=["mamba", "attention", "mamba"],
                  num_local_experts=0, shared_intermediate_size=64, mamba_n_heads=4,
                  hidden_act="gelu", time_step_limit=(0.02, 0.1)),
}


def make_granitemoehybrid(seed=0, **kw):
    """A seeded random GraniteMoeHybridForCausalLM. ``randomize`` sets every 1-D parameter
    near 1; A_log and dt_bias are then drawn as Mamba-2 initialises them, so the SSM state
    carries information across many steps."""
    import torch

    torch.manual_seed(seed)
    cfg = transformers.GraniteMoeHybridConfig(**{**BASE, **kw})
    model = randomize(transformers.GraniteMoeHybridForCausalLM(cfg), seed)
    gen = torch.Generator().manual_seed(seed + 100)
    with torch.no_grad():
        for layer in model.model.layers:
            if layer.mamba is not None:
                mamba2_dynamics(layer.mamba, cfg.mamba_n_heads, gen)
        if cfg.tie_word_embeddings:      # a tied N(0, 1) table would dominate the logits
            model.model.embed_tokens.weight.mul_(0.1)
    return model.eval()


@pytest.fixture(scope="module")
def cases(tmp_path_factory):
    return hf_cases(make_granitemoehybrid, CASES, tmp_path_factory, "granitemoehybrid", VOCAB, N_TOKENS)


@pytest.fixture(scope="module")
def ours(cases):
    """md.load_model of each case (compiled once)."""
    return {name: md.load_model(spec_path(SPEC), c[1]) for name, c in cases.items()}


def _with_config(src, dst, **changes):
    """A copy of the HF folder ``src`` whose config.json has ``changes``."""
    shutil.copytree(src, dst)
    cfg = json.loads((dst / "config.json").read_text())
    cfg.update(changes)
    (dst / "config.json").write_text(json.dumps(cfg))
    return dst


# -- config and weights ------------------------------------------------------------------

def test_granitemoehybrid_params_and_weights_from_hf(cases, ours):
    model, path, _, _ = cases["rope"]
    p = ours["rope"].params
    assert p["attn_layers"] == [0, 1, 0, 1] and p["use_rope"] is True
    assert (p["n_expert"], p["n_expert_used"], p["ffn_dim"], p["shared_ffn_dim"]) == (4, 2, 48, 80)
    assert (p["ssm_heads"], p["ssm_head_dim"], p["n_groups"], p["d_state"]) == (8, 16, 1, 16)
    assert (p["embedding_multiplier"], p["residual_multiplier"], p["logits_scaling"]) == (0.3, 0.5, 3.0)
    assert p["attention_multiplier"] == pytest.approx(0.06)
    assert (p["dt_min"], p["dt_max"]) == (0.0, 1e30)
    w = ours["rope"].weights
    assert "blk.1.attn_q.weight" in w and "blk.1.ssm_in.weight" not in w
    assert "blk.0.ssm_in.weight" in w and "blk.0.attn_q.weight" not in w
    assert "output.weight" in w                                        # untied
    sd = hf_state(model)
    gate_up = next(v for k, v in sd.items() if k.startswith("model.layers.2.block_sparse_moe")
                   and ("input_linear" in k or "gate_up_proj" in k))
    assert gate_up.shape == (4, 96, 64)                                # [E, 2F, D]: gate, then up
    np.testing.assert_array_equal(w["blk.2.ffn_gate_exps.weight"], gate_up[:, :48])
    np.testing.assert_array_equal(w["blk.2.ffn_up_exps.weight"], gate_up[:, 48:])
    shared = sd["model.layers.3.shared_mlp.input_linear.weight"]      # [2S, D]
    np.testing.assert_array_equal(w["blk.3.ffn_gate_shexp.weight"], shared[:80])
    np.testing.assert_array_equal(w["blk.3.ffn_up_shexp.weight"], shared[80:])
    np.testing.assert_allclose(w["blk.0.ssm_scan.a"],
                               -np.exp(model.model.layers[0].mamba.A_log.detach().numpy()), rtol=1e-6)

    nope = ours["nope"].params
    assert nope["use_rope"] is False and nope["attn_layers"] == [1, 0, 0]
    assert "output.weight" not in ours["nope"].weights                 # tied
    dense = ours["dense"]
    assert dense.params["n_expert"] == 0 and dense.params["hidden_act"] == "gelu"
    assert (dense.params["dt_min"], dense.params["dt_max"]) == (0.02, 0.1)
    assert not any("exps" in k or "ffn_gate_inp" in k for k in dense.weights)


def test_granitemoehybrid_state_names(cases):
    """Attention layers carry a KV cache, Mamba-2 layers a conv and an SSM state."""
    g, _ = load(SPEC, cases["rope"][1])
    assert [v.name for v in g.inputs][3:] == [
        "blk.0.ssm_conv1d.conv_state", "blk.0.ssm_scan.ssm_state", "blk.1.attn.kv_cache",
        "blk.2.ssm_conv1d.conv_state", "blk.2.ssm_scan.ssm_state", "blk.3.attn.kv_cache"]


def test_granitemoehybrid_legacy_layer_names(cases, tmp_path):
    """The released checkpoints' layer_types ("mamba" / "attention", as transformers 4
    wrote them) load the same layers as transformers 5's names."""
    _, path, ids, ref = cases["rope"]
    dst = _with_config(path, tmp_path / "legacy",
                       layer_types=["mamba", "attention", "mamba", "attention"])
    model = md.load_model(spec_path(SPEC), str(dst))
    assert model.params["attn_layers"] == [0, 1, 0, 1]
    pre, dec = compare(model, ref, ids, n_prompt=N_PROMPT)
    assert pre <= TOL and dec <= TOL


# -- logits and states -------------------------------------------------------------------

@pytest.mark.parametrize("name", list(CASES))
def test_granitemoehybrid_prefill_and_decode_match_hf(cases, ours, name):
    _, _, ids, ref = cases[name]
    pre, dec = compare(ours[name], ref, ids, n_prompt=N_PROMPT)
    print(f"granitemoehybrid {name} vs HF: prefill {pre:.2e}, decode {dec:.2e} (of max|ref|)")
    assert pre <= TOL and dec <= TOL


def test_granitemoehybrid_state_is_hf_state(cases):
    """After a prefill, the SSM, conv and KV states are transformers' cache."""
    import torch

    model, path, ids, _ = cases["rope"]
    with torch.no_grad():
        cache = model(torch.tensor([ids[:N_PROMPT]]), use_cache=True).cache
    g, td = load(SPEC, path)
    s = Stepper(g, td)
    _, state = s.step(ids[:N_PROMPT], 0, s.initial_state())
    for i in (0, 2):                                                   # Mamba-2 layers
        ssm = cache.get_recurrent_state(i)[0].numpy()                 # [H, P, N]
        conv = cache.get_conv_state(i)[0].numpy()                     # [conv_dim, d_conv]
        assert rel_err(state[f"blk.{i}.ssm_scan.ssm_state"].reshape(ssm.shape), ssm) <= TOL
        assert rel_err(state[f"blk.{i}.ssm_conv1d.conv_state"], conv[:, 1:].T) <= TOL
    for i in (1, 3):                                                   # attention layers
        kv = state[f"blk.{i}.attn.kv_cache"]                          # [2, T, Hkv, D]
        layer = cache.layers[i]
        assert rel_err(kv[0], layer.keys[0].numpy().transpose(1, 0, 2)) <= TOL   # rotated keys
        assert rel_err(kv[1], layer.values[0].numpy().transpose(1, 0, 2)) <= TOL


def test_granitemoehybrid_greedy_matches_hf(cases, ours):
    """Greedy ids of generate (alone and three prompts batched) equal transformers'."""
    model, _, ids, _ = cases["rope"]
    assert_greedy_matches_hf(model, ours["rope"], [ids[:7], ids[3:12], ids[:4]], 5)


# -- negative controls -------------------------------------------------------------------

@pytest.mark.parametrize("reset", ["ssm_state", "conv_state", "kv_cache"])
def test_granitemoehybrid_states_matter(cases, reset):
    """One decode step with one kind of state reset to empty diverges."""
    _, path, ids, ref = cases["rope"]
    g, td = load(SPEC, path)
    err = error_with_state_reset(g, td, ref, ids, reset=reset, n_prompt=N_PROMPT)
    print(f"granitemoehybrid rope with {reset} reset: {err:.2e}")
    assert err > 100 * TOL


@pytest.mark.parametrize("name, change", [
    ("rope", {"use_rope": "{False}"}),                  # RoPE left out
    ("nope", {"use_rope": "{True}"}),                   # RoPE where there is none
    ("rope", {"residual_multiplier": 1.0}),
    ("rope", {"embedding_multiplier": 1.0}),
    ("nope", {"attention_multiplier": "{1 / 4}"}),      # 1 / sqrt(head_dim), not the multiplier
    ("nope", {"logits_scaling": 1.0}),
    ("rope", {"n_expert": 0}),                          # the experts left out
    ("rope", {"n_expert_used": 1}),                     # top-1 instead of top-2
])
def test_granitemoehybrid_config_matters(cases, name, change):
    """Each switch and multiplier read from config.json, set otherwise, diverges."""
    _, path, ids, ref = cases[name]
    spec = with_hf_config(md.load_spec(spec_path(SPEC)), **change)
    raw = md.load_weights(path)
    if change.get("n_expert") == 0:           # the checkpoint's expert tensors cannot map
        for k in [k for k in raw if "block_sparse_moe" in k]:
            del raw[k]
    td = load_for_spec(raw, spec)
    pre, _ = decoder_errors(md.build(spec, weights=td), td, ref, ids, n_prompt=N_PROMPT)
    print(f"granitemoehybrid {name} with {change}: {pre:.2e}")
    assert pre > 100 * TOL


@pytest.mark.parametrize("key", ["blk.1.attn_v.weight", "blk.2.ssm_in.weight",
                                 "blk.0.ffn_down_shexp.weight", "blk.3.ffn_up_exps.weight"])
def test_granitemoehybrid_perturbed_weight_fails(cases, key):
    """Noise of a weight's own scale on one attention, Mamba-2, shared-MLP or expert matrix
    gives a large error in the prompt and in the decode steps."""
    _, path, ids, ref = cases["rope"]
    g, td = load(SPEC, path)
    w = np.asarray(td[key])
    td[key] = (w + np.random.default_rng(5).standard_normal(w.shape) * w.std()).astype(np.float32)
    pre, dec = decoder_errors(g, td, ref, ids, n_prompt=N_PROMPT)
    print(f"granitemoehybrid rope with {key} perturbed: prefill {pre:.2e}, decode {dec:.2e}")
    assert pre > 100 * TOL and dec > 100 * TOL


# -- refusals ----------------------------------------------------------------------------

@pytest.mark.parametrize("change, why", [
    ({"rope_parameters": {"rope_type": "linear", "factor": 2.0, "rope_theta": 10000.0}},
     "RoPE scaling linear is not modelled"),
    ({"layer_types": ["mamba", "attention", "mamba"]}, "layer_types has 3 entries for 4 layers"),
    ({"layer_types": ["mamba", "sliding_attention", "mamba", "attention"]}, "only attention"),
])
def test_granitemoehybrid_refuses_what_it_does_not_model(cases, tmp_path, change, why):
    dst = _with_config(cases["rope"][1], tmp_path / "bad", **change)
    with pytest.raises(md.WeightsError, match=why):
        md.load_model(spec_path(SPEC), str(dst))
