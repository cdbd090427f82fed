"""specs/mamba2.yaml against transformers' Mamba2ForCausalLM (small random float32
configs, torch path): a prefill, then one token at a time through the conv and SSM
states; n_groups 1 and 2, a clamping time_step_limit, tied and untied heads, with and
without the projection and conv biases."""

import numpy as np
import pytest

import maxdecl as md
from archhelp import Stepper, decoder_errors, error_with_state_reset, load, mamba2_dynamics
from modelhelp import (TOL, assert_greedy_matches_hf, hf_logits, randomize, rel_err, save_hf,
                       spec_path, token_ids, with_hf_config)

pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

VOCAB = 300
N_PROMPT = 12
N_TOKENS = 18           # a prefill of 12, then 6 decode steps


def make_mamba2(seed=0, n_groups=1, tied=True, **kw):
    """A seeded random Mamba2ForCausalLM: hidden 64, 8 heads of 16, state 16, 2 layers.

    ``randomize`` sets every 1-D parameter near 1; A_log and dt_bias are then drawn as
    Mamba-2 initialises them (A in [0.5, 4], softplus(dt_bias) in [0.01, 0.2]), so the
    state decays slowly and carries information across many steps."""
    import torch

    torch.manual_seed(seed)
    cfg = transformers.Mamba2Config(vocab_size=VOCAB, hidden_size=64, expand=2, num_heads=8,
                                    head_dim=16, n_groups=n_groups, state_size=16,
                                    num_hidden_layers=2, conv_kernel=4, layer_norm_epsilon=1e-5,
                                    tie_word_embeddings=tied, **kw)
    model = randomize(transformers.Mamba2ForCausalLM(cfg), seed)
    gen = torch.Generator().manual_seed(seed + 100)
    with torch.no_grad():
        for layer in model.backbone.layers:
            mamba2_dynamics(layer.mixer, cfg.num_heads, gen)
    return model.eval()


CASES = {
    "g1": dict(n_groups=1),
    "g2": dict(n_groups=2),
    "g2-clamped": dict(n_groups=2, time_step_limit=(0.02, 0.1)),
    "g1-untied": dict(n_groups=1, tied=False),
    "g2-biases": dict(n_groups=2, use_bias=True, use_conv_bias=False),   # in/out_proj biases, no conv bias
}


@pytest.fixture(scope="module")
def cases(tmp_path_factory):
    out = {}
    for k, (name, kw) in enumerate(CASES.items()):
        model = make_mamba2(seed=k, **kw)
        path = save_hf(model, tmp_path_factory.mktemp(f"mamba2_{name}"))
        ids = token_ids(VOCAB, n=N_TOKENS, seed=7 + k)
        out[name] = (model, path, ids, hf_logits(model, ids))
    return out


def test_mamba2_weights_from_hf(cases):
    model, path, _, _ = cases["g2"]
    td = md.load_weights(path, spec=spec_path("mamba2"), variant="tiny")
    mixer = model.backbone.layers[1].mixer
    np.testing.assert_allclose(td["blk.1.ssm_a"], -np.exp(mixer.A_log.detach().numpy()),
                               rtol=1e-6)
    assert td["blk.0.ssm_conv1d.weight"].shape == (128 + 2 * 2 * 16, 4)
    assert td.params["n_groups"] == 2 and td.params["n_heads"] == 8
    assert td.params["vocab"] == VOCAB
    assert "output.weight" not in td                                  # tied
    assert "output.weight" in md.load_weights(cases["g1-untied"][1], spec=spec_path("mamba2"),
                                              variant="tiny")
    clamped = md.load_weights(cases["g2-clamped"][1], spec=spec_path("mamba2"), variant="tiny")
    assert (clamped.params["dt_min"], clamped.params["dt_max"]) == (0.02, 0.1)


@pytest.mark.parametrize("name", list(CASES))
def test_mamba2_prefill_and_decode_match_hf(cases, name):
    _, path, ids, ref = cases[name]
    g, td = load("mamba2", path)
    pre, dec = decoder_errors(g, td, ref, ids, n_prompt=N_PROMPT)
    print(f"mamba2 {name} vs HF: prefill {pre:.2e}, decode {dec:.2e} (of max|ref|)")
    assert pre <= TOL and dec <= TOL


def test_mamba2_state_is_hf_state(cases):
    """After a prefill, blk.N.ssm_state ([G, d_inner / G, N]) is transformers' recurrent
    state [H, P, N] and blk.N.conv_state its conv state's last d_conv - 1 rows."""
    import torch

    model, path, ids, _ = cases["g2"]
    with torch.no_grad():
        cache = model(torch.tensor([ids[:N_PROMPT]]), use_cache=True).cache
    g, td = load("mamba2", path)
    s = Stepper(g, td)
    _, state = s.step(ids[:N_PROMPT], 0, s.initial_state())
    for i in range(model.config.num_hidden_layers):
        ssm = cache.get_recurrent_state(i)[0].numpy()                # [H, P, N]
        conv = cache.get_conv_state(i)[0].numpy()                    # [conv_dim, d_conv]
        assert rel_err(state[f"blk.{i}.ssm_state"].reshape(ssm.shape), ssm) <= TOL
        assert rel_err(state[f"blk.{i}.conv_state"], conv[:, 1:].T) <= TOL


def test_mamba2_state_matters(cases):
    """Negative control: decoding with the states reset to zeros diverges."""
    _, path, ids, ref = cases["g2"]
    g, td = load("mamba2", path)
    assert error_with_state_reset(g, td, ref, ids, n_prompt=N_PROMPT) > 100 * TOL


def test_mamba2_clamp_matters(cases):
    """Negative control: the g2-clamped checkpoint without its time_step_limit diverges."""
    _, path, ids, ref = cases["g2-clamped"]
    spec = with_hf_config(md.load_spec(spec_path("mamba2")), dt_min=0.0, dt_max=1e30)
    td = md.load_weights(path, spec=spec, variant="tiny")
    pre, _ = decoder_errors(md.build(spec, weights=td), td, ref, ids, n_prompt=N_PROMPT)
    assert pre > 100 * TOL


@pytest.mark.parametrize("name", ["g1", "g2"])
def test_mamba2_greedy_matches_hf(cases, name):
    """Greedy ids of md.load_model's generate (alone and three prompts batched) equal
    transformers' generate (through its conv / SSM cache)."""
    model, path, ids, _ = cases[name]
    ours = md.load_model(spec_path("mamba2"), path, variant="tiny")
    assert_greedy_matches_hf(model, ours, [ids[:7], ids[3:12], ids[:4]], 8)
