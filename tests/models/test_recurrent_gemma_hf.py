"""specs/recurrent_gemma.yaml against transformers' RecurrentGemmaForCausalLM (Griffin).

Two small seeded float32 models, 3 layers each, so both temporal block kinds appear:

- ``rra``: config.json's default ``block_types`` (recurrent, recurrent, attention),
  hidden 32, 4 query heads over 2 kv heads, window 5 (< the 12-token prompt), conv
  width 4, partial rotary 0.5, GELU-tanh, logits capped at 30, tied output;
- ``arr``: (attention, recurrent, recurrent), hidden 48, 6 query heads over 1 kv head,
  lru_width 96 != hidden (RG-LRU blocks of 16), window 3, conv width 3, partial rotary
  0.25 with rope_theta 500, q/k/v biases, exact GELU, logits capped at 10, untied head.

The RG-LRU's recurrent_param is drawn as transformers initialises it (a in [0.9,
0.999]: a long memory), the other weights by ``modelhelp.randomize`` (Gemma norms near
0, since transformers computes x * (1 + w)). Each case is compared with transformers
for a prompt and decode steps through the conv / RG-LRU states and the KV cache, in
chunks, through ``md.load_model`` and greedy generation (one prompt and a batch).
Negative controls: states reset, a perturbed or transposed weight, no window, the exact
sqrt(hidden) as embedding scale.
"""

import json
import math
import shutil

import numpy as np
import pytest

import maxdecl as md
from archhelp import TOL, Stepper, decoder_errors, error_with_state_reset, load
from modelhelp import (N_PROMPT, assert_greedy_matches_hf, compare, hf_case, randomize,
                       rel_err, save_hf, spec_path, with_hf_config)

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

SPEC = "recurrent_gemma"
PROMPTS = [[3, 17, 42, 9, 5, 7, 64, 1], [8, 9, 70], [5, 60, 33, 2, 11, 7]]
N_NEW = 6

CASES = {
    "rra": dict(vocab_size=96, hidden_size=32, intermediate_size=96, num_attention_heads=4,
                num_key_value_heads=2, attention_window_size=5, conv1d_width=4,
                tie_word_embeddings=True),
    "arr": dict(vocab_size=80, hidden_size=48, intermediate_size=160, num_attention_heads=6,
                num_key_value_heads=1, lru_width=96, attention_window_size=3, conv1d_width=3,
                logits_soft_cap=10.0, block_types=["attention", "recurrent", "recurrent"],
                attention_bias=True, tie_word_embeddings=False, hidden_activation="gelu",
                rope_parameters={"rope_type": "default", "rope_theta": 500.0,
                                 "partial_rotary_factor": 0.25}),
}
# the params the spec should read from each case's config.json
PARAMS = {
    "rra": dict(dim=32, n_layers=3, n_heads=4, n_kv_heads=2, ffn_dim=48, lru_width=32,
                vocab=96, window=5, conv_width=4, softcap=30.0, rope_theta=10000.0,
                partial_rotary=0.5, hidden_act="gelu_pytorch_tanh",
                block_types=["recurrent", "recurrent", "attention"]),
    "arr": dict(dim=48, n_layers=3, n_heads=6, n_kv_heads=1, ffn_dim=80, lru_width=96,
                vocab=80, window=3, conv_width=3, softcap=10.0, rope_theta=500.0,
                partial_rotary=0.25, hidden_act="gelu",
                block_types=["attention", "recurrent", "recurrent"]),
}
RECURRENT = {"rra": [0, 1], "arr": [1, 2]}        # layer indices of the recurrent blocks


def make_recurrent_gemma(seed=0, **kw):
    """RecurrentGemmaForCausalLM, 3 layers, eager attention, seeded weights."""
    torch.manual_seed(seed)
    cfg = dict(num_hidden_layers=3, rms_norm_eps=1e-6, pad_token_id=0, bos_token_id=2,
               eos_token_id=1, attn_implementation="eager")
    cfg.update(kw)
    model = randomize(transformers.RecurrentGemmaForCausalLM(
        transformers.RecurrentGemmaConfig(**cfg)), seed, norm_center=0.0)
    gen = torch.Generator().manual_seed(seed + 100)
    with torch.no_grad():
        for layer in model.model.layers:
            lru = getattr(layer.temporal_block, "rg_lru", None)
            if lru is not None:       # transformers' init: a^2 uniform in [0.81, 0.998]
                a2 = 0.81 + (0.998 - 0.81) * torch.rand(lru.recurrent_param.shape, generator=gen)
                lru.recurrent_param.copy_(torch.log(1.0 / torch.sqrt(a2) - 1.0))
        if cfg.get("tie_word_embeddings", True):
            model.model.embed_tokens.weight.mul_(0.1)   # a tied N(0, 1) table saturates the cap
    return model


_BUILT = {}


def _case(name, tmp_path_factory):
    """(name, model, HF folder, prompt ids, HF logits), built once per session."""
    if name not in _BUILT:
        model = make_recurrent_gemma(seed=list(CASES).index(name), **CASES[name])
        _BUILT[name] = (name, *hf_case(model, tmp_path_factory.mktemp(f"rgemma_{name}")))
    return _BUILT[name]


@pytest.fixture(scope="module", params=list(CASES))
def case(request, tmp_path_factory):
    return _case(request.param, tmp_path_factory)


@pytest.fixture(scope="module")
def rra(tmp_path_factory):
    return _case("rra", tmp_path_factory)


@pytest.fixture(scope="module")
def loaded(case):
    """(graph, weights) of the spec on the case's folder, built once per case."""
    return load(SPEC, case[2], variant="2b")


def test_params_weights_and_state(case, loaded):
    name, model, path, _, _ = case
    g, td = loaded
    assert {k: td.params.get(k) for k in PARAMS[name]} == PARAMS[name]
    sd = {k: v.detach().numpy() for k, v in model.state_dict().items()}
    # Gemma norms: 1 + w; depthwise conv filters squeezed; recurrent_param kept raw
    np.testing.assert_array_equal(td["blk.0.attn_norm.weight"],
                                  1.0 + sd["model.layers.0.temporal_pre_norm.weight"])
    np.testing.assert_array_equal(td["output_norm.weight"], 1.0 + sd["model.final_norm.weight"])
    r = RECURRENT[name][0]
    lru = PARAMS[name]["lru_width"]
    assert td[f"blk.{r}.rg_conv1d.weight"].shape == (lru, PARAMS[name]["conv_width"])
    np.testing.assert_array_equal(
        td[f"blk.{r}.rg_lru.recurrent_param"],
        sd[f"model.layers.{r}.temporal_block.rg_lru.recurrent_param"])
    assert ("output.weight" in td) == (not model.config.tie_word_embeddings)
    assert ("blk.0.attn_q.bias" in td) == model.config.attention_bias
    # the states: a KV cache on attention layers, conv + RG-LRU states on recurrent ones
    states = {v.name for v in g.inputs} & set(g.output_names)
    want = set()
    for i in range(3):
        if i in RECURRENT[name]:
            want |= {f"blk.{i}.rg_conv1d.conv_state", f"blk.{i}.rg_lru.lru_state"}
        else:
            want.add(f"blk.{i}.attn.kv_cache")
    assert states == want
    # transformers multiplies the embeddings by a bfloat16 sqrt(hidden_size)
    scale = torch.tensor(model.config.hidden_size ** 0.5, dtype=torch.bfloat16).float().item()
    assert md.load_model(spec_path(SPEC), path).params["embed_scale"] == scale


def test_prefill_and_decode_match_hf(case, loaded):
    """A 12-token prefill (longer than the window), then one token at a time."""
    name, _, _, ids, ref = case
    g, td = loaded
    pre, dec = decoder_errors(g, td, ref, ids)
    print(f"recurrent_gemma {name} vs HF: prefill {pre:.2e}, decode {dec:.2e} (of max|ref|)")
    assert pre <= TOL and dec <= TOL


def test_chunked_prefill_matches_hf(case, loaded):
    """Prefill in chunks of 5, 4 and 3 tokens: the conv and RG-LRU states and the KV
    cache carry over between multi-token steps (the window reaching back across them)."""
    _, _, _, ids, ref = case
    g, td = loaded
    s = Stepper(g, td)
    state, got, start = s.initial_state(), [], 0
    for n in (5, 4, 3, 1, 1, 1, 1):
        lg, state = s.step(ids[start:start + n], start, state)
        got.append(lg)
        start += n
    assert rel_err(np.concatenate(got), ref) <= TOL


def test_decode_matches_hf_cache(case, loaded):
    """Our decode steps against transformers' own: its prefill, then one token at a time
    through its DynamicCache and the recurrent states its blocks hold."""
    _, model, _, ids, _ = case
    g, td = loaded
    with torch.no_grad():
        cache = transformers.DynamicCache(config=model.config)
        model._setup_cache(model.config, 1, "cpu", torch.float32)
        want = [model(torch.tensor([ids[:N_PROMPT]]), cache=cache, use_cache=True).logits[0]]
        for pos in range(N_PROMPT, len(ids)):
            want.append(model(torch.tensor([[ids[pos]]]), cache=cache, use_cache=True,
                              position_ids=torch.tensor([[pos]])).logits[0])
    want = torch.cat(want).numpy()
    s = Stepper(g, td)
    got, state = s.step(ids[:N_PROMPT], 0, s.initial_state())
    got = [got]
    for pos in range(N_PROMPT, len(ids)):
        lg, state = s.step([ids[pos]], pos, state)
        got.append(lg)
    assert rel_err(np.concatenate(got), want) <= TOL


def test_load_model_and_greedy_generation(case):
    """``md.load_model`` (the default variant, sized by config.json) gives transformers'
    logits, and greedy generation its ids, one prompt alone and three batched."""
    _, model, path, ids, ref = case
    ours = md.load_model(spec_path(SPEC), path)
    pre, dec = compare(ours, ref, ids)
    assert pre <= TOL and dec <= TOL
    assert_greedy_matches_hf(model, ours, PROMPTS, N_NEW)


def test_position_reset_matches_hf(tmp_path):
    """Positions restarting at 0 inside one sequence: transformers' RG-LRU resets its
    state there (a_t = 0, no sqrt(1 - a^2) scaling); the conv state carries over. An
    all-recurrent model, so attention's masking of packed sequences plays no part."""
    model = make_recurrent_gemma(seed=5, vocab_size=64, hidden_size=32, intermediate_size=64,
                                 num_attention_heads=4, num_hidden_layers=2,
                                 block_types=["recurrent"])
    path = save_hf(model, tmp_path / "hf")
    ids, pos = list(range(3, 15)), list(range(6)) * 2
    with torch.no_grad():
        ref = model(torch.tensor([ids]), position_ids=torch.tensor([pos]),
                    use_cache=False).logits[0].numpy()
        plain = model(torch.tensor([ids]), use_cache=False).logits[0].numpy()
    s = Stepper(*load(SPEC, path))
    got = dict(zip(s.outs, s.run(*({"tokens": np.array(ids), "positions": np.array(pos),
                                    "logit_rows": np.arange(len(ids)),
                                    **s.initial_state()}[n] for n in s.names))))["logits"]
    assert rel_err(got, ref) <= TOL
    assert rel_err(plain, ref) > 100 * TOL             # the reset matters


def test_old_config_layout(rra, tmp_path):
    """A transformers 4 config.json (rope_theta and partial_rotary_factor at the top, no
    rope_parameters, lru_width null) reads the same params."""
    _, _, path, _, _ = rra
    old = tmp_path / "old"
    shutil.copytree(path, old)
    cfg = json.loads((old / "config.json").read_text())
    rp = cfg.pop("rope_parameters")
    cfg.update(rope_theta=rp["rope_theta"], partial_rotary_factor=rp["partial_rotary_factor"],
               lru_width=None)
    (old / "config.json").write_text(json.dumps(cfg))
    td = md.load_weights(str(old), spec=spec_path(SPEC), variant="tiny")
    assert {k: td.params.get(k) for k in ("rope_theta", "partial_rotary", "lru_width")} == {
        "rope_theta": 10000.0, "partial_rotary": 0.5, "lru_width": 32}


def test_refuses_rope_scaling(rra, tmp_path):
    _, _, path, _, _ = rra
    bad = tmp_path / "bad"
    shutil.copytree(path, bad)
    cfg = json.loads((bad / "config.json").read_text())
    cfg["rope_parameters"]["rope_type"] = "linear"
    (bad / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(md.WeightsError, match="RoPE scaling linear is not modelled"):
        md.load_weights(str(bad), spec=spec_path(SPEC))


# -- negative controls: each shows the comparison can fail --------------------------------

@pytest.mark.parametrize("state", ["conv_state", "lru_state", "kv_cache"])
def test_each_state_matters(rra, state):
    """One decode step after the prefill with one kind of state set back to zeros."""
    _, _, path, ids, ref = rra
    g, td = load(SPEC, path)
    assert error_with_state_reset(g, td, ref, ids, reset=state) > 100 * TOL


def test_perturbed_recurrent_param_fails(rra):
    _, _, path, ids, ref = rra
    g, td = load(SPEC, path)
    k = "blk.1.rg_lru.recurrent_param"
    w = np.asarray(td[k])
    td[k] = (w + 0.5 * np.random.default_rng(5).standard_normal(w.shape)).astype(np.float32)
    pre, dec = decoder_errors(g, td, ref, ids)
    assert min(pre, dec) > 100 * TOL


def test_transposed_gate_fails(rra):
    """transformers' gates are u @ W per head (baddbmm), not W @ u: W transposed fails."""
    _, _, path, ids, ref = rra
    g, td = load(SPEC, path)
    k = "blk.0.rg_gate_a.weight"
    td[k] = np.ascontiguousarray(np.swapaxes(np.asarray(td[k]), 1, 2))
    pre, dec = decoder_errors(g, td, ref, ids)
    assert min(pre, dec) > 100 * TOL


def test_window_matters(rra):
    """Without the window (attention_window_size read as 1000) the 12-token prompt
    attends too far back."""
    _, _, path, ids, ref = rra
    spec = with_hf_config(md.load_spec(spec_path(SPEC)), window=1000)
    td = md.load_weights(path, spec=spec)
    pre, dec = decoder_errors(md.build(spec, weights=td), td, ref, ids)
    assert min(pre, dec) > 100 * TOL


def test_exact_embed_scale_fails(rra):
    """sqrt(32) = 5.65685 instead of transformers' bfloat16 5.65625 is off by 1e-4,
    which the comparison (TOL 1e-5 of max|ref|) sees."""
    _, _, path, ids, ref = rra
    spec = with_hf_config(md.load_spec(spec_path(SPEC)), embed_scale=f"{{{math.sqrt(32)!r}}}")
    td = md.load_weights(path, spec=spec)
    pre, dec = decoder_errors(md.build(spec, weights=td), td, ref, ids)
    print(f"exact sqrt(dim): prefill {pre:.2e}, decode {dec:.2e}")
    assert max(pre, dec) > 3 * TOL
