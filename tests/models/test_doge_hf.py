"""specs/doge.yaml against transformers' DogeForCausalLM.

Three small seeded float32 Doge models (dim 64, 2 layers, 4 query heads over 2 kv
heads, head_dim 16, vocab 256, 64 positions), eager attention:

- ``dense``: the SwiGLU MLP, no biases, untied head, keep_window_size 2048 (the
  dynamic mask is a per-key additive bias, never a top-k cut at these lengths);
- ``moe``: the cross-domain MoE (16 single-neuron experts, 4 product keys a half, 4
  chosen, norm_topk_prob), biases on every projection, tied output;
- ``window``: keep_window_size 5 and sliding_window 7 on a 12-token prompt, so the
  dynamic mask's top-k cut and the sliding window both decide which keys are seen.

``randomize`` leaves every 1-D weight at 1 + 0.2 N(0, 1), the residual gains
(input_residual, post_attention_residual) included; the dynamic-mask decay ``A``
(zeros at init, which makes the bias a constant the softmax ignores) is drawn in
[-2.5, -0.5] so it matters. The tied model's embedding table is scaled by 0.1 (as
test_gpt2_hf.py does) so that greedy decoding does not repeat one token.

transformers' CDMoE router views the [tokens, 2K] logits as [2, tokens, K], which mixes
neighbouring tokens in a forward over several tokens (its own comment: routing is not
causal in a full forward pass; token-by-token generation is unaffected). A prompt's
logits then depend on the whole prompt, and decoding through the cache differs from
one forward over prompt + new tokens. The spec reproduces transformers exactly, so the
MoE model is compared with transformers run the same way: the prompt alone, then one
token at a time through transformers' cache.
"""

import copy
import json
import shutil

import numpy as np
import pytest

import maxdecl as md

from modelhelp import (N_PROMPT, compare, hf_case, hf_logits, hf_params, ours_logits, randomize,
                       rel_err, spec_path, tiny_model)

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

TOL = 1e-5          # max|ours - ref| <= TOL * max|ref| (measured: about 5e-7)
PROMPTS = [[3, 17, 42, 99, 5, 7, 64, 1, 200, 31, 18, 250], [8, 9, 120], [5, 60, 33, 2, 90, 11, 7]]
N_NEW = 6


def make_doge(seed=0, **kw):
    torch.manual_seed(seed)
    cfg = dict(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
               num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
               rms_norm_eps=1e-6, attn_implementation="eager")
    cfg.update(kw)
    model = randomize(transformers.DogeForCausalLM(transformers.DogeConfig(**cfg)), seed)
    gen = torch.Generator().manual_seed(seed + 100)
    with torch.no_grad():
        for layer in model.model.layers:
            a = layer.self_attn.A
            a.copy_(-0.5 - 2.0 * torch.rand(a.shape, generator=gen))
        if cfg.get("tie_word_embeddings"):
            # as test_gpt2_hf: a tied N(0, 1) table makes each token's own embedding
            # dominate its logits, and greedy decoding repeats one token
            model.model.embed_tokens.weight.mul_(0.1)
    return model


MOE = dict(is_moe=True, num_experts=16, num_experts_per_tok=4, norm_topk_prob=True,
           attention_bias=True, mlp_bias=True, tie_word_embeddings=True)
WINDOW = dict(keep_window_size=5, sliding_window=7)


def hf_stepwise(model, ids, n_prompt=N_PROMPT):
    """transformers' logits as generation computes them: the prompt in one forward
    (every position), then each later token alone through its cache."""
    with torch.no_grad():
        out = model(torch.tensor([ids[:n_prompt]]), use_cache=True)
        cache, rows = out.cache, [out.logits[0].numpy()]
        for t in ids[n_prompt:]:
            out = model(torch.tensor([[t]]), cache=cache, use_cache=True)
            cache = out.cache
            rows.append(out.logits[0].numpy())
    return np.concatenate(rows)


@pytest.fixture(scope="module")
def dense(tmp_path_factory):
    return hf_case(make_doge(seed=0), tmp_path_factory.mktemp("doge_dense"))


@pytest.fixture(scope="module")
def moe(tmp_path_factory):
    return hf_case(make_doge(seed=1, **MOE), tmp_path_factory.mktemp("doge_moe"))


@pytest.fixture(scope="module")
def window(tmp_path_factory):
    return hf_case(make_doge(seed=2, **WINDOW), tmp_path_factory.mktemp("doge_window"))


@pytest.fixture(scope="module")
def ours_dense(dense):
    return tiny_model("doge", dense[1])


@pytest.fixture(scope="module")
def ours_moe(moe):
    return tiny_model("doge", moe[1])


@pytest.fixture(scope="module")
def ours_window(window):
    return tiny_model("doge", window[1])


# -- config ---------------------------------------------------------------------------

def test_doge_config_from_hf(dense, moe, window):
    got = hf_params("doge", dense[1])[2]
    assert {k: got[k] for k in ("dim", "n_layers", "n_heads", "n_kv_heads", "head_dim",
                                "ffn_dim", "vocab", "context")} == {
        "dim": 64, "n_layers": 2, "n_heads": 4, "n_kv_heads": 2, "head_dim": 16,
        "ffn_dim": 128, "vocab": 256, "context": 64}
    assert got["keep_window"] == 2048 and got["sliding_window"] == 0
    assert got["is_moe"] is False and got["attn_bias"] is False
    assert got["norm_eps"] == pytest.approx(1e-6)
    assert got["rope_theta"] == pytest.approx(10000.0)
    got = hf_params("doge", moe[1])[2]
    assert got["is_moe"] is True and got["attn_bias"] is True and got["mlp_bias"] is True
    assert (got["n_expert"], got["n_expert_used"], got["norm_topk_prob"]) == (16, 4, True)
    got = hf_params("doge", window[1])[2]
    assert (got["keep_window"], got["sliding_window"]) == (5, 7)


def test_doge_params_pick_the_attention_path(ours_dense, ours_window, ours_moe):
    """keep_window_size >= context: plain attention with the bias folded into the keys;
    keep_window_size < context: the top-k window as a masked_attention mask."""
    ops = lambda m: {n.op for n in m.graph.nodes}                      # noqa: E731
    assert "attention" in ops(ours_dense) and "masked_attention" not in ops(ours_dense)
    assert "masked_attention" in ops(ours_window) and "attention" not in ops(ours_window)
    assert ours_moe.params["n_keys"] == 4
    assert "output.weight" not in ours_moe.weights              # tied: token_embd stands in
    assert "output.weight" in ours_dense.weights


# -- dense: dynamic mask attention, residual gains ---------------------------------------

def test_doge_dense_prefill_and_decode_match_hf(dense, ours_dense):
    model, path, ids, ref = dense
    pre, dec = compare(ours_dense, ref, ids)
    print(f"doge dense vs HF: prefill {pre:.2e}, decode {dec:.2e} (of max|ref|)")
    assert pre <= TOL and dec <= TOL


def test_doge_dense_decode_matches_hf_cache(dense, ours_dense):
    """Against transformers' own cached decoding too (the same numbers as its full
    forward for the dense model)."""
    model, _, ids, ref = dense
    step = hf_stepwise(model, ids)
    assert rel_err(step, ref) <= TOL
    pre, dec = ours_logits(ours_dense, ids)
    assert rel_err(np.concatenate([pre, dec]), step) <= TOL


def test_doge_dense_greedy_generate_matches_hf(dense, ours_dense):
    model = dense[0]
    want = [hf_generate(model, p) for p in PROMPTS]
    assert ours_dense.generate(PROMPTS[0], N_NEW, temperature=0).ids == want[0]
    assert [o.ids for o in ours_dense.generate(PROMPTS, N_NEW, temperature=0)] == want


def hf_generate(model, prompt):
    out = model.generate(torch.tensor([prompt]), max_new_tokens=N_NEW, do_sample=False,
                         eos_token_id=None, pad_token_id=0)
    return out[0, len(prompt):].tolist()


def test_doge_dynamic_mask_matters(dense, ours_dense):
    """Negative controls: with A = 0 the per-key bias is one constant (exp(0) = 1) that
    the softmax ignores; transformers' logits then move far, and so do ours when the
    checkpoint's A is zeroed, so the match above tests the mask."""
    model, path, ids, ref = dense
    flat = copy.deepcopy(model)
    with torch.no_grad():
        for layer in flat.model.layers:
            layer.self_attn.A.zero_()
    assert rel_err(hf_logits(flat, ids), ref) > 100 * TOL
    td = md.load_weights(path)
    for i in range(2):
        td[f"model.layers.{i}.self_attn.A"] = np.zeros(2, np.float32)
    pre, dec = compare(md.load_model(spec_path("doge"), td, variant="tiny"), ref, ids)
    assert pre > 100 * TOL and dec > 100 * TOL


def test_doge_residual_gains_matter(dense):
    """Negative control: the residual gains set back to ones move the logits far."""
    model, path, ids, ref = dense
    td = md.load_weights(path)
    for i in range(2):
        for name in ("input_residual", "post_attention_residual"):
            td[f"model.layers.{i}.{name}"] = np.ones(64, np.float32)
    pre, dec = compare(md.load_model(spec_path("doge"), td, variant="tiny"), ref, ids)
    assert pre > 100 * TOL and dec > 100 * TOL


# -- the cross-domain MoE ------------------------------------------------------------------

def test_doge_moe_prefill_and_decode_match_hf(moe, ours_moe):
    """The prompt against transformers' forward over the prompt alone (its routing
    mixes the prompt's tokens), each later token against its cached decoding."""
    model, path, ids, ref = moe
    step = hf_stepwise(model, ids)
    pre, dec = ours_logits(ours_moe, ids)
    e_pre, e_dec = rel_err(pre, step[:N_PROMPT]), rel_err(dec, step[N_PROMPT:])
    print(f"doge moe vs HF: prefill {e_pre:.2e}, decode {e_dec:.2e} (of max|ref|)")
    assert e_pre <= TOL and e_dec <= TOL
    # transformers' routing is not causal over a prompt: its full forward differs
    assert rel_err(step, ref) > 100 * TOL


def test_doge_moe_greedy_generate_matches_hf(moe, ours_moe):
    model = moe[0]
    for p in PROMPTS:
        assert ours_moe.generate(p, N_NEW, temperature=0).ids == hf_generate(model, p)


def test_doge_moe_batched_generate_matches_alone(moe, ours_moe):
    model = moe[0]
    want = [hf_generate(model, p) for p in PROMPTS]
    assert [o.ids for o in ours_moe.generate(PROMPTS, N_NEW, temperature=0)] == want


def test_doge_moe_experts_matter(moe):
    """Negative control: zeroed up_embed rows (the routed experts' outputs) move the
    logits far, so the match above tests the routing."""
    model, path, ids, _ = moe
    step = hf_stepwise(model, ids)
    td = md.load_weights(path)
    for i in range(2):
        td[f"model.layers.{i}.mlp.up_embed.weight"] = np.zeros((16, 64), np.float32)
    pre, dec = ours_logits(md.load_model(spec_path("doge"), td, variant="tiny"), ids)
    assert rel_err(pre, step[:N_PROMPT]) > 100 * TOL
    assert rel_err(dec, step[N_PROMPT:]) > 100 * TOL


# -- keep_window_size < context: the dynamic top-k window, with a sliding window ---------

def test_doge_window_prefill_and_decode_match_hf(window, ours_window):
    model, path, ids, ref = window
    pre, dec = compare(ours_window, ref, ids)
    print(f"doge window vs HF: prefill {pre:.2e}, decode {dec:.2e} (of max|ref|)")
    assert pre <= TOL and dec <= TOL
    step = hf_stepwise(model, ids)
    p, d = ours_logits(ours_window, ids)
    assert rel_err(np.concatenate([p, d]), step) <= TOL


def test_doge_window_matters(window):
    """Negative controls: the same weights without the top-k cut (keep_window_size
    2048), or without the sliding window, give transformers logits far from these."""
    model, _, ids, ref = window
    for change in ({"keep_window_size": 2048}, {"sliding_window": None}):
        other = copy.deepcopy(model)
        for k, v in change.items():
            setattr(other.config, k, v)
            for layer in other.model.layers:
                if k == "keep_window_size":
                    layer.self_attn.keep_window_size = v
        assert rel_err(hf_logits(other, ids), ref) > 100 * TOL, change


def test_doge_window_greedy_generate_matches_hf(window, ours_window):
    model = window[0]
    want = [hf_generate(model, p) for p in PROMPTS]
    assert ours_window.generate(PROMPTS[0], N_NEW, temperature=0).ids == want[0]
    assert [o.ids for o in ours_window.generate(PROMPTS, N_NEW, temperature=0)] == want


# -- checkpoints the spec refuses ----------------------------------------------------------

def test_doge_refuses_rope_scaling(dense, tmp_path):
    path = tmp_path / "scaled"
    shutil.copytree(dense[1], path)
    cfg = json.loads((path / "config.json").read_text())
    cfg["rope_parameters"] = {"rope_type": "linear", "rope_theta": 10000.0, "factor": 2.0}
    (path / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(md.WeightsError, match="RoPE scaling linear is not modelled"):
        md.load_model(spec_path("doge"), str(path), variant="tiny")
