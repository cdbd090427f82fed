"""specs/falcon_h1.yaml against transformers' FalconH1ForCausalLM (small random float32
configs, eager attention, the torch path of the Mamba-2 mixer).

Every config sets each muP multiplier (embedding, lm_head, attention in / out, key, SSM in
/ out, the five ssm_multipliers and the two mlp_multipliers) to a value other than 1.
Three seeded models, each compared for a 12-token prompt and 6 decode steps through the
KV caches and the conv / SSM states:

- ``plain``: 2 layers, GQA (4 heads over 2 kv heads), mamba_d_ssm null (expand *
  hidden), 8 Mamba heads, one group, mamba_rms_norm off, untied output, no biases;
- ``norm``: as ``plain`` with the gated RMSNorm on, normalised before the gate;
- ``g2``: 3 layers, head_dim 24 (not hidden / heads), 4 kv heads, mamba_d_ssm 96 (not
  expand * hidden), 6 Mamba heads in two groups, the gated RMSNorm on with the gate
  first, every projection bias on and the conv bias off, tied output, hidden_act gelu
  and a clamping time_step_limit.

Negative controls: each multiplier read as 1, the gate on the wrong side of the norm,
states reset after the prefill, and a perturbed weight each give errors far above the
tolerance.
"""

import json
import shutil

import numpy as np
import pytest

import maxdecl as md
from archhelp import (Stepper, decoder_errors, error_with_state_reset, hf_cases, load,
                      mamba2_dynamics)
from modelhelp import (TOL, assert_greedy_matches_hf, compare, hf_logits, randomize, rel_err,
                       save_hf, spec_path, token_ids, with_hf_config)

pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

VOCAB = 128
N_PROMPT = 12
N_TOKENS = 18           # a prefill of 12, then 6 decode steps
SPEC = spec_path("falcon_h1")

MULTIPLIERS = dict(embedding_multiplier=1.7, lm_head_multiplier=0.6,
                   attention_in_multiplier=1.3, attention_out_multiplier=0.7,
                   key_multiplier=0.5, ssm_in_multiplier=1.4, ssm_out_multiplier=0.8,
                   ssm_multipliers=[0.5, 1.5, 0.7, 1.3, 2.0], mlp_multipliers=[0.8, 1.2])

BASE = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
            num_attention_heads=4, num_key_value_heads=2, mamba_d_ssm=None, mamba_expand=2,
            mamba_n_heads=8, mamba_d_head="auto", mamba_n_groups=1, mamba_d_state=16,
            mamba_d_conv=4, mamba_chunk_size=8, mamba_rms_norm=False, rms_norm_eps=1e-5,
            max_position_embeddings=128, tie_word_embeddings=False,
            attn_implementation="eager", **MULTIPLIERS)

CASES = {
    "plain": dict(),
    "norm": dict(mamba_rms_norm=True, mamba_norm_before_gate=True),
    "g2": dict(num_hidden_layers=3, head_dim=24, num_key_value_heads=4, mamba_d_ssm=96,
               mamba_n_heads=6, mamba_n_groups=2, mamba_d_state=8, mamba_rms_norm=True,
               mamba_norm_before_gate=False, attention_bias=True, mlp_bias=True,
               mamba_proj_bias=True, projectors_bias=True, mamba_conv_bias=False,
               tie_word_embeddings=True, hidden_act="gelu", time_step_limit=(0.02, 0.15)),
}


def make_falcon_h1(seed=0, **kw):
    """A seeded random FalconH1ForCausalLM. ``randomize`` sets every 1-D parameter near
    1; A_log and dt_bias are then drawn as Mamba-2 initialises them (A in [0.5, 4],
    softplus(dt_bias) in [0.01, 0.2]), so the SSM state carries information across many
    steps."""
    import torch

    torch.manual_seed(seed)
    cfg = transformers.FalconH1Config(**{**BASE, **kw})
    model = randomize(transformers.FalconH1ForCausalLM(cfg), seed)
    gen = torch.Generator().manual_seed(seed + 100)
    with torch.no_grad():
        for layer in model.model.layers:
            h = cfg.mamba_n_heads
            mamba2_dynamics(layer.mamba, h, gen)
        if cfg.tie_word_embeddings:      # a tied N(0, 1) table would dominate the logits
            model.model.embed_tokens.weight.mul_(0.1)
    return model.eval()


@pytest.fixture(scope="module")
def cases(tmp_path_factory):
    return hf_cases(make_falcon_h1, CASES, tmp_path_factory, "falcon_h1", VOCAB, N_TOKENS)


def test_falcon_h1_weights_and_params_from_hf(cases):
    model, path, _, _ = cases["plain"]
    td = md.load_weights(path, spec=SPEC, variant="tiny")
    p = td.params
    assert (p["d_inner"], p["ssm_heads"], p["ssm_head_dim"], p["n_groups"]) == (128, 8, 16, 1)
    assert p["ssm_rms_norm"] is False and p["vocab"] == VOCAB and p["head_dim"] == 16
    assert p["ssm_mults"] == MULTIPLIERS["ssm_multipliers"]
    assert p["mlp_mults"] == MULTIPLIERS["mlp_multipliers"]
    assert (p["embedding_mult"], p["lm_head_mult"], p["key_mult"]) == (1.7, 0.6, 0.5)
    assert "blk.0.ssm_norm.weight" not in td and "output.weight" in td      # untied
    mixer = model.model.layers[1].mamba
    np.testing.assert_allclose(td["blk.1.ssm_scan.a"], -np.exp(mixer.A_log.detach().numpy()),
                               rtol=1e-6)
    assert td["blk.0.ssm_conv1d.weight"].shape == (128 + 2 * 16, 4)

    g2 = md.load_weights(cases["g2"][1], spec=SPEC, variant="tiny")
    p = g2.params
    assert (p["d_inner"], p["ssm_heads"], p["ssm_head_dim"], p["n_groups"]) == (96, 6, 16, 2)
    assert p["head_dim"] == 24 and p["n_kv_heads"] == 4
    assert p["ssm_rms_norm"] is True and p["norm_before_gate"] is False
    assert (p["dt_min"], p["dt_max"]) == (0.02, 0.15) and p["hidden_act"] == "gelu"
    assert "blk.2.ssm_norm.weight" in g2 and "output.weight" not in g2     # tied
    assert "blk.0.ssm_out.bias" in g2 and "blk.0.ssm_conv1d.bias" not in g2


def test_falcon_h1_state_names(cases):
    """Every layer carries a KV cache, a conv state and an SSM state."""
    g, _ = load("falcon_h1", cases["plain"][1])
    assert [v.name for v in g.inputs][3:] == [
        f"blk.{i}.{s}" for i in range(2)
        for s in ("attn.kv_cache", "ssm_conv1d.conv_state", "ssm_scan.ssm_state")]


@pytest.mark.parametrize("name", list(CASES))
def test_falcon_h1_prefill_and_decode_match_hf(cases, name):
    _, path, ids, ref = cases[name]
    model = md.load_model(SPEC, path, variant="tiny")
    pre, dec = compare(model, ref, ids, n_prompt=N_PROMPT)
    print(f"falcon_h1 {name} vs HF: prefill {pre:.2e}, decode {dec:.2e} (of max|ref|)")
    assert pre <= TOL and dec <= TOL


def test_falcon_h1_state_is_hf_state(cases):
    """After a prefill, the SSM, conv and KV states are transformers' cache."""
    import torch

    model, path, ids, _ = cases["g2"]
    with torch.no_grad():
        cache = model(torch.tensor([ids[:N_PROMPT]]), use_cache=True).cache
    g, td = load("falcon_h1", path)
    s = Stepper(g, td)
    _, state = s.step(ids[:N_PROMPT], 0, s.initial_state())
    for i in range(3):
        ssm = cache.get_recurrent_state(i)[0].numpy()                 # [H, P, N]
        conv = cache.get_conv_state(i)[0].numpy()                     # [conv_dim, d_conv]
        assert rel_err(state[f"blk.{i}.ssm_scan.ssm_state"].reshape(ssm.shape), ssm) <= TOL
        assert rel_err(state[f"blk.{i}.ssm_conv1d.conv_state"], conv[:, 1:].T) <= TOL
        kv = state[f"blk.{i}.attn.kv_cache"]                          # [2, T, Hkv, D]
        layer = cache.layers[i]
        assert rel_err(kv[0], layer.keys[0].numpy().transpose(1, 0, 2)) <= TOL   # rotated, scaled keys
        assert rel_err(kv[1], layer.values[0].numpy().transpose(1, 0, 2)) <= TOL


def test_falcon_h1_greedy_matches_hf(cases):
    """Greedy ids of md.load_model's generate (alone and three prompts batched) equal
    transformers' generate (through its hybrid cache and its recurrent step)."""
    model, path, ids, _ = cases["norm"]
    ours = md.load_model(SPEC, path, variant="tiny")
    assert_greedy_matches_hf(model, ours, [ids[:7], ids[3:12], ids[:4]], 5)


# spec param -> its "off" value (what a spec that ignored the config key would use)
OFF = {"embedding_mult": 1.0, "lm_head_mult": 1.0, "attn_in_mult": 1.0, "attn_out_mult": 1.0,
       "key_mult": 1.0, "ssm_in_mult": 1.0, "ssm_out_mult": 1.0,
       "ssm_mults": "{[1.0, 1.0, 1.0, 1.0, 1.0]}", "mlp_mults": "{[1.0, 1.0]}"}


@pytest.mark.parametrize("param", list(OFF))
def test_falcon_h1_each_multiplier_matters(cases, param):
    """Negative control: reading one multiplier as 1 (ignoring config.json's value)
    diverges from transformers."""
    _, path, ids, ref = cases["g2"]
    spec = with_hf_config(md.load_spec(SPEC), **{param: OFF[param]})
    td = md.load_weights(path, spec=spec, variant="tiny")
    pre, dec = decoder_errors(md.build(spec, weights=td), td, ref, ids, n_prompt=N_PROMPT)
    print(f"falcon_h1 g2 with {param} = 1: prefill {pre:.2e}, decode {dec:.2e}")
    assert max(pre, dec) > 10 * TOL


@pytest.mark.parametrize("name", ["norm", "g2"])
def test_falcon_h1_norm_before_gate_matters(cases, name):
    """Negative control: the gate on the other side of the gated RMSNorm diverges."""
    _, path, ids, ref = cases[name]
    flipped = "{False}" if name == "norm" else "{True}"
    spec = with_hf_config(md.load_spec(SPEC), norm_before_gate=flipped)
    td = md.load_weights(path, spec=spec, variant="tiny")
    pre, _ = decoder_errors(md.build(spec, weights=td), td, ref, ids, n_prompt=N_PROMPT)
    print(f"falcon_h1 {name} with norm_before_gate flipped: prefill {pre:.2e}")
    assert pre > 10 * TOL


@pytest.mark.parametrize("reset", ["ssm_state", "conv_state", "kv_cache"])
def test_falcon_h1_states_matter(cases, reset):
    """Negative control: one decode step with one kind of state reset to empty diverges."""
    _, path, ids, ref = cases["plain"]
    g, td = load("falcon_h1", path)
    err = error_with_state_reset(g, td, ref, ids, reset=reset, n_prompt=N_PROMPT)
    print(f"falcon_h1 plain with {reset} reset: {err:.2e}")
    assert err > 10 * TOL


@pytest.mark.parametrize("key", ["blk.1.attn_k.weight", "blk.1.ssm_in.weight"])
def test_falcon_h1_perturbed_weight_fails(cases, key):
    """Negative control: noise of a weight's own scale on one attention or one Mamba-2
    matrix gives a large error in the prompt and in the decode steps."""
    _, path, ids, ref = cases["plain"]
    g, td = load("falcon_h1", path)
    w = np.asarray(td[key])
    td[key] = (w + np.random.default_rng(5).standard_normal(w.shape) * w.std()).astype(np.float32)
    pre, dec = decoder_errors(g, td, ref, ids, n_prompt=N_PROMPT)
    print(f"falcon_h1 plain with {key} perturbed: prefill {pre:.2e}, decode {dec:.2e}")
    assert pre > 100 * TOL and dec > 100 * TOL


def test_falcon_h1_refuses_rope_scaling(cases, tmp_path):
    """A RoPE scaling the spec does not model is refused with the spec's message."""
    dst = tmp_path / "scaled"
    shutil.copytree(cases["plain"][1], dst)
    cfg = json.loads((dst / "config.json").read_text())
    cfg["rope_parameters"] = {**cfg["rope_parameters"], "rope_type": "linear", "factor": 2.0}
    (dst / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(md.WeightsError, match="RoPE scaling linear is not modelled"):
        md.load_model(SPEC, str(dst), variant="tiny")
