"""specs/rwkv.yaml against transformers' RwkvForCausalLM (small random configs, float32):
a prefill, then one token at a time through the token-shift and WKV states."""

import numpy as np
import pytest

import maxdecl as md
from archhelp import TOL, Stepper, decoder_errors, load
from modelhelp import N_PROMPT, hf_case, hf_logits, randomize, rel_err, save_hf, token_ids

pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")


def make_rwkv(seed=0, tied=False, n_layers=3, rescale_every=1, key_scale=1.0):
    """Three layers with rescale_every 1 (x halved after every layer, layer i's outputs
    scaled by 2^-i: leaving the rescaling out of the spec costs ~1.5e-4 through the
    LayerNorm epsilons, far above TOL; with rescale_every 2 only ~1e-5), time_decay
    spread so that channels decay slowly and fast,
    mix factors in [0, 1]. ``key_scale`` multiplies the key projections (large keys
    test the stabilised exponentials)."""
    import torch

    torch.manual_seed(seed)
    cfg = transformers.RwkvConfig(vocab_size=80, hidden_size=64, num_hidden_layers=n_layers,
                                  attention_hidden_size=64, intermediate_size=128,
                                  context_length=64, layer_norm_epsilon=1e-5,
                                  rescale_every=rescale_every, tie_word_embeddings=tied)
    model = randomize(transformers.RwkvForCausalLM(cfg), seed)
    gen = torch.Generator().manual_seed(seed + 100)
    with torch.no_grad():
        for blk in model.rwkv.blocks:
            att, ffn = blk.attention, blk.feed_forward
            att.time_decay.copy_(torch.linspace(-4.0, 3.0, 64)[torch.randperm(64, generator=gen)])
            att.time_first.copy_(torch.randn(64, generator=gen))
            for p in (att.time_mix_key, att.time_mix_value, att.time_mix_receptance,
                      ffn.time_mix_key, ffn.time_mix_receptance):
                p.copy_(torch.rand(p.shape, generator=gen))
            att.key.weight.mul_(key_scale)
    return model


@pytest.fixture(scope="module")
def rwkv(tmp_path_factory):
    # saved before any forward: an eval-mode forward divides the rescaled weights in place
    return hf_case(make_rwkv(), tmp_path_factory.mktemp("rwkv_hf"))


def hf_state(model, ids):
    """transformers' five state tensors [hidden, layers] after running ``ids``."""
    import torch

    with torch.no_grad():
        out = model(torch.tensor([list(ids)]), use_cache=True)
    return [s[0].numpy() for s in out.state]


def test_rwkv_weights_from_hf(rwkv):
    model, path, _, _ = rwkv
    td = md.load_weights(path, spec="specs/rwkv.yaml", variant="tiny")
    td_ = model.rwkv.blocks[1].attention.time_decay.detach().numpy()
    np.testing.assert_allclose(td["blk.1.time_mix_decay"], -np.exp(td_), rtol=1e-6)
    assert td["blk.0.time_mix_lerp_k"].shape == (1, 64)
    assert td.params["n_layers"] == 3 and td.params["rescale_every"] == 1
    assert td.params["ffn_dim"] == 128 and td.params["vocab"] == 80


def test_rwkv_prefill_and_decode_match_hf(rwkv):
    _, path, ids, ref = rwkv
    g, td = load("rwkv", path)
    pre, dec = decoder_errors(g, td, ref, ids)
    print(f"rwkv vs HF: prefill {pre:.2e}, decode {dec:.2e} (of max|ref|)")
    assert pre <= TOL and dec <= TOL


def test_rwkv_state_is_hfs(rwkv):
    """After a prefill the five states are transformers' (the WKV triple in its scaled
    form), and a second prompt chunk on top of the state gives HF's logits."""
    model, path, ids, ref = rwkv
    g, td = load("rwkv", path)
    s = Stepper(g, td)
    _, state = s.step(ids[:7], 0, s.initial_state())
    hf = hf_state(model, ids[:7])
    names = ["ffn_shift", "att_shift", "wkv_num", "wkv_den", "wkv_max"]
    for i in range(3):
        for k, name in enumerate(names):
            ours = np.asarray(state[f"blk.{i}.{name}"]).reshape(-1)
            np.testing.assert_allclose(ours, hf[k][:, i], rtol=1e-4, atol=1e-5,
                                       err_msg=f"blk.{i}.{name}")
    lg, state = s.step(ids[7:N_PROMPT], 7, state)             # a second chunk of 5
    assert rel_err(lg, ref[7:N_PROMPT]) <= TOL
    lg, _ = s.step([ids[N_PROMPT]], N_PROMPT, state)
    assert rel_err(lg[-1], ref[N_PROMPT]) <= TOL


def test_rwkv_state_matters(rwkv):
    """Negative control: decoding with the states reset to zeros diverges."""
    _, path, ids, ref = rwkv
    g, td = load("rwkv", path)
    s = Stepper(g, td)
    lg, _ = s.step([ids[N_PROMPT]], N_PROMPT, s.initial_state())
    assert rel_err(lg[-1], ref[N_PROMPT]) > 100 * TOL


def test_rwkv_tied_large_keys(tmp_path):
    """A tied head, rescale_every 2, and keys up to ~|19| (a layer-0 channel spreads
    over ~34): the scaled exponentials keep prefill and decode at HF's logits."""
    model = make_rwkv(seed=2, tied=True, n_layers=3, rescale_every=2, key_scale=8.0)
    path = save_hf(model, tmp_path / "hf")
    ids = token_ids(model.config.vocab_size, seed=3)
    g, td = load("rwkv", path)
    assert "output.weight" not in td
    pre, dec = decoder_errors(g, td, hf_logits(model, ids), ids)
    print(f"rwkv (tied, large keys) vs HF: prefill {pre:.2e}, decode {dec:.2e}")
    assert pre <= TOL and dec <= TOL


def test_rwkv_huge_keys_token_by_token(tmp_path):
    """Keys up to ~|67|, spread over ~107 in a channel (e^k near e^67): one token
    per step is HF's arithmetic, and stays finite and at HF's logits. (A prefill of
    several tokens with such a spread underflows to 0/0: see specs/rwkv.yaml.)"""
    model = make_rwkv(seed=2, n_layers=2, rescale_every=0, key_scale=40.0)
    path = save_hf(model, tmp_path / "hf")
    ids = token_ids(model.config.vocab_size, n=8, seed=3)
    ref = hf_logits(model, ids)
    g, td = load("rwkv", path)
    s = Stepper(g, td)
    state, got = s.initial_state(), []
    for pos, tok in enumerate(ids):
        lg, state = s.step([tok], pos, state)
        got.append(lg[-1])
    assert np.isfinite(got).all()
    assert rel_err(np.stack(got), ref) <= TOL
