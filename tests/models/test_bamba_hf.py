"""specs/bamba.yaml against transformers' BambaForCausalLM (small random float32
configs, eager attention, the torch path of the Mamba-2 mixer).

Three seeded models, each compared for a 12-token prompt and 6 decode steps through the
KV caches of the attention layers and the conv / SSM states of the Mamba-2 layers:

- ``a1``: 3 layers, attention at layer 1 only (GQA, 4 query heads over 2 kv heads),
  one group of B / C, untied output, no biases;
- ``g2``: 4 layers, attention at layers 0 and 3 (4 heads over 4 kv heads), two groups
  of B / C, the output tied to the embedding, attention, MLP and Mamba projection
  biases on and the conv bias off;
- ``ssm``: 2 layers, attn_layer_indices null (no attention at all), hidden 32, two
  groups, hidden_act gelu (MLP and conv), a clamping time_step_limit.

Negative controls: the states reset after the prefill, a full (not partial) rotary
embedding, the ``ssm`` checkpoint without its dt clamp and a perturbed weight each give
errors far above the tolerance.
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

BASE = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=96, num_hidden_layers=3,
            num_attention_heads=4, num_key_value_heads=2, attn_layer_indices=[1],
            mamba_n_heads=8, mamba_d_head="auto", mamba_n_groups=1, mamba_d_state=16,
            mamba_d_conv=4, mamba_expand=2, mamba_chunk_size=8, rms_norm_eps=1e-5,
            max_position_embeddings=128, tie_word_embeddings=False,
            attn_implementation="eager")

CASES = {
    "a1": dict(),
    "g2": dict(num_hidden_layers=4, attn_layer_indices=[0, 3], num_key_value_heads=4,
               mamba_n_groups=2, tie_word_embeddings=True, attention_bias=True, mlp_bias=True,
               mamba_proj_bias=True, mamba_conv_bias=False),
    "ssm": dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                attn_layer_indices=None, mamba_n_heads=4, mamba_n_groups=2, mamba_d_state=8,
                hidden_act="gelu", time_step_limit=(0.02, 0.1)),
}


def make_bamba(seed=0, **kw):
    """A seeded random BambaForCausalLM. ``randomize`` sets every 1-D parameter near 1;
    A_log and dt_bias are then drawn as Mamba-2 initialises them (A in [0.5, 4],
    softplus(dt_bias) in [0.01, 0.2]), so the SSM state carries information across
    many steps."""
    import torch

    torch.manual_seed(seed)
    cfg = transformers.BambaConfig(**{**BASE, **kw})
    model = randomize(transformers.BambaForCausalLM(cfg), seed)
    gen = torch.Generator().manual_seed(seed + 100)
    with torch.no_grad():
        for layer in model.model.layers:
            if hasattr(layer, "mamba"):
                h = cfg.mamba_n_heads
                mamba2_dynamics(layer.mamba, h, gen)
        if cfg.tie_word_embeddings:      # a tied N(0, 1) table would dominate the logits
            model.model.embed_tokens.weight.mul_(0.1)
    return model.eval()


@pytest.fixture(scope="module")
def cases(tmp_path_factory):
    return hf_cases(make_bamba, CASES, tmp_path_factory, "bamba", VOCAB, N_TOKENS)


def test_bamba_weights_and_params_from_hf(cases):
    model, path, _, _ = cases["a1"]
    td = md.load_weights(path, spec=spec_path("bamba"), variant="tiny")
    assert td.params["attn_layer_indices"] == [1]
    assert (td.params["ssm_heads"], td.params["ssm_head_dim"], td.params["n_groups"]) == (8, 16, 1)
    assert td.params["partial_rotary_factor"] == 0.5 and td.params["vocab"] == VOCAB
    assert "blk.1.attn_q.weight" in td and "blk.1.ssm_in.weight" not in td
    assert "blk.0.ssm_in.weight" in td and "blk.0.attn_q.weight" not in td
    mixer = model.model.layers[2].mamba
    np.testing.assert_allclose(td["blk.2.ssm_scan.a"], -np.exp(mixer.A_log.detach().numpy()),
                               rtol=1e-6)
    assert td["blk.0.ssm_conv1d.weight"].shape == (128 + 2 * 16, 4)
    assert "output.weight" in td                                      # untied

    g2 = md.load_weights(cases["g2"][1], spec=spec_path("bamba"), variant="tiny")
    assert g2.params["attn_layer_indices"] == [0, 3] and g2.params["n_groups"] == 2
    assert "output.weight" not in g2                                  # tied
    ssm = md.load_weights(cases["ssm"][1], spec=spec_path("bamba"), variant="tiny")
    assert ssm.params["attn_layer_indices"] == []                     # null: no attention
    assert (ssm.params["dt_min"], ssm.params["dt_max"]) == (0.02, 0.1)
    assert ssm.params["hidden_act"] == "gelu"


def test_bamba_state_names(cases):
    """Attention layers carry a KV cache, Mamba-2 layers a conv and an SSM state."""
    g, _ = load("bamba", cases["g2"][1])
    assert [v.name for v in g.inputs][3:] == [
        "blk.0.attn.kv_cache", "blk.1.ssm_conv1d.conv_state", "blk.1.ssm_scan.ssm_state",
        "blk.2.ssm_conv1d.conv_state", "blk.2.ssm_scan.ssm_state", "blk.3.attn.kv_cache"]


@pytest.mark.parametrize("name", list(CASES))
def test_bamba_prefill_and_decode_match_hf(cases, name):
    _, path, ids, ref = cases[name]
    model = md.load_model(spec_path("bamba"), path, variant="tiny")
    pre, dec = compare(model, ref, ids, n_prompt=N_PROMPT)
    print(f"bamba {name} vs HF: prefill {pre:.2e}, decode {dec:.2e} (of max|ref|)")
    assert pre <= TOL and dec <= TOL


def test_bamba_state_is_hf_state(cases):
    """After a prefill, the SSM, conv and KV states are transformers' cache."""
    import torch

    model, path, ids, _ = cases["g2"]
    with torch.no_grad():
        cache = model(torch.tensor([ids[:N_PROMPT]]), use_cache=True).cache
    g, td = load("bamba", path)
    s = Stepper(g, td)
    _, state = s.step(ids[:N_PROMPT], 0, s.initial_state())
    for i in (1, 2):                                                   # Mamba-2 layers
        ssm = cache.get_recurrent_state(i)[0].numpy()                 # [H, P, N]
        conv = cache.get_conv_state(i)[0].numpy()                     # [conv_dim, d_conv]
        assert rel_err(state[f"blk.{i}.ssm_scan.ssm_state"].reshape(ssm.shape), ssm) <= TOL
        assert rel_err(state[f"blk.{i}.ssm_conv1d.conv_state"], conv[:, 1:].T) <= TOL
    for i in (0, 3):                                                   # attention layers
        kv = state[f"blk.{i}.attn.kv_cache"]                          # [2, T, Hkv, D]
        layer = cache.layers[i]
        assert rel_err(kv[0], layer.keys[0].numpy().transpose(1, 0, 2)) <= TOL   # rotated keys
        assert rel_err(kv[1], layer.values[0].numpy().transpose(1, 0, 2)) <= TOL


@pytest.mark.parametrize("name", ["a1", "g2"])
def test_bamba_greedy_matches_hf(cases, name):
    """Greedy ids of md.load_model's generate (alone and three prompts batched) equal
    transformers' generate (through its hybrid cache)."""
    model, path, ids, _ = cases[name]
    ours = md.load_model(spec_path("bamba"), path, variant="tiny")
    assert_greedy_matches_hf(model, ours, [ids[:7], ids[3:12], ids[:4]], 6)


@pytest.mark.parametrize("reset", ["ssm_state", "conv_state", "kv_cache"])
def test_bamba_states_matter(cases, reset):
    """Negative control: one decode step with one kind of state reset to empty diverges."""
    _, path, ids, ref = cases["a1"]
    g, td = load("bamba", path)
    err = error_with_state_reset(g, td, ref, ids, reset=reset, n_prompt=N_PROMPT)
    print(f"bamba a1 with {reset} reset: {err:.2e}")
    assert err > 100 * TOL


def test_bamba_partial_rotary_matters(cases):
    """Negative control: rotating every feature of each head (factor 1) diverges."""
    _, path, ids, ref = cases["a1"]
    spec = with_hf_config(md.load_spec(spec_path("bamba")), partial_rotary_factor=1.0)
    td = md.load_weights(path, spec=spec, variant="tiny")
    pre, _ = decoder_errors(md.build(spec, weights=td), td, ref, ids, n_prompt=N_PROMPT)
    assert pre > 100 * TOL


def test_bamba_clamp_matters(cases):
    """Negative control: the ssm checkpoint without its time_step_limit diverges."""
    _, path, ids, ref = cases["ssm"]
    spec = with_hf_config(md.load_spec(spec_path("bamba")), dt_min=0.0, dt_max=1e30)
    td = md.load_weights(path, spec=spec, variant="tiny")
    pre, _ = decoder_errors(md.build(spec, weights=td), td, ref, ids, n_prompt=N_PROMPT)
    assert pre > 100 * TOL


@pytest.mark.parametrize("key", ["blk.1.attn_v.weight", "blk.2.ssm_in.weight"])
def test_bamba_perturbed_weight_fails(cases, key):
    """Negative control: noise of a weight's own scale on one attention or one Mamba-2
    matrix gives a large error in the prompt and in the decode steps."""
    _, path, ids, ref = cases["a1"]
    g, td = load("bamba", path)
    w = np.asarray(td[key])
    td[key] = (w + np.random.default_rng(5).standard_normal(w.shape) * w.std()).astype(np.float32)
    pre, dec = decoder_errors(g, td, ref, ids, n_prompt=N_PROMPT)
    print(f"bamba a1 with {key} perturbed: prefill {pre:.2e}, decode {dec:.2e}")
    assert pre > 100 * TOL and dec > 100 * TOL


def test_bamba_refuses_rope_scaling(cases, tmp_path):
    """A RoPE scaling the spec does not model is refused with the spec's message."""
    src = cases["a1"][1]
    dst = tmp_path / "scaled"
    shutil.copytree(src, dst)
    cfg = json.loads((dst / "config.json").read_text())
    cfg["rope_parameters"] = {**cfg["rope_parameters"], "rope_type": "linear", "factor": 2.0}
    (dst / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(md.WeightsError, match="RoPE scaling linear is not modelled"):
        md.load_model(spec_path("bamba"), str(dst), variant="tiny")
