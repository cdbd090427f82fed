"""specs/qwen3_next.yaml against transformers' Qwen3NextForCausalLM / Qwen3NextModel.

A small seeded float32 Qwen3-Next: dim 64, 4 layers alternating gated DeltaNet (linear
attention) and gated full attention (layer_types), layer 2 a dense SwiGLU MLP
(mlp_only_layers) and the others a sparse MoE of 8 SwiGLU experts of width 32 (top-2,
renormalised) plus a shared expert of width 48 behind its sigmoid gate. Full attention:
4 query heads, 2 kv heads, head_dim 32 (not dim / heads), a sigmoid output gate from
q_proj, (1 + w) q/k RMSNorms, RoPE on the first quarter of each head (partial rotary
0.25). DeltaNet: 2 key heads of 16, 4 value heads of 24 (each key head serves two
value heads), a depthwise conv of kernel 4, A_log and dt_bias drawn where trained
checkpoints hold them. Checked: prefill logits and last hidden state, decode steps
through the state (KV caches, conv states, recurrent states; each state matters), a
prefill longer than transformers' chunk of 64, a repeated-token prompt of 100 and a
random prompt of 300 (the gated_delta_rule op), greedy ids against ``generate`` (one
prompt, and a list of prompts decoded together in batched steps), a second
configuration (no renormalisation, decoder_sparse_step 2, one value head per key head,
tied output, a config.json with full_attention_interval instead of layer_types), a
torch state_dict with fused experts, the dropped MTP head, and refused RoPE scaling.
"""

import json
import shutil

import numpy as np
import pytest

import maxdecl as md

from archhelp import TOL, Stepper, decoder_errors, error_with_state_reset, load, mamba2_dynamics
from modelhelp import (assert_greedy_matches_hf, hf_logits, randomize, rel_err, save_hf,
                       spec_path, token_ids)

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

ARCH = "qwen3_next"
PROMPTS = [[3, 17, 42, 199, 5, 7, 64, 1], [8, 9, 120], [250, 60, 33, 2, 90, 11, 7]]
N_NEW = 6
N_IDS = 16          # a prompt of 12 (N_PROMPT), then 4 decode steps
N_LONG = 80         # a prompt of 70 (two of transformers' 64-token chunks), 10 decode steps


def make_qwen3_next(seed=0, **kw):
    """Qwen3NextForCausalLM, the sizes of the spec's tiny variant unless ``kw`` says
    otherwise. Norm gains near 0 (the model computes x * (1 + w)) but the DeltaNet's
    gated norm near 1 (x * w); A_log and dt_bias as trained checkpoints hold them."""
    torch.manual_seed(seed)
    cfg = dict(vocab_size=256, hidden_size=64, intermediate_size=96, num_hidden_layers=4,
               num_attention_heads=4, num_key_value_heads=2, head_dim=32,
               max_position_embeddings=128, rms_norm_eps=1e-6,
               rope_parameters={"rope_type": "default", "rope_theta": 10000.0,
                                "partial_rotary_factor": 0.25},
               linear_conv_kernel_dim=4, linear_key_head_dim=16, linear_value_head_dim=24,
               linear_num_key_heads=2, linear_num_value_heads=4,
               num_experts=8, num_experts_per_tok=2, moe_intermediate_size=32,
               shared_expert_intermediate_size=48, norm_topk_prob=True,
               decoder_sparse_step=1, mlp_only_layers=[2],
               layer_types=["linear_attention", "full_attention"] * 2,
               tie_word_embeddings=False, attn_implementation="eager")
    cfg.update(kw)
    model = transformers.Qwen3NextForCausalLM(transformers.Qwen3NextConfig(**cfg))
    randomize(model, seed, norm_center=0.0)
    gen = torch.Generator().manual_seed(1000 + seed)
    with torch.no_grad():
        for layer in model.model.layers:
            if hasattr(layer, "linear_attn"):
                la = layer.linear_attn
                mamba2_dynamics(la, la.num_v_heads, gen)
                la.norm.weight.copy_(1.0 + 0.2 * torch.randn(la.head_v_dim, generator=gen))
    return model


def hf_last_hidden(model, ids) -> np.ndarray:
    with torch.no_grad():
        out = model.model(torch.tensor([list(ids)]), use_cache=False)
    return out.last_hidden_state[0].float().numpy()


def run_all(graph, weights, ids):
    """Every output of one step over all of ``ids`` from empty state, by name."""
    s = Stepper(graph, weights)
    ids = np.asarray(ids, np.int64)
    feed = {"tokens": ids, "positions": np.arange(ids.size), "logit_rows": np.arange(ids.size),
            **s.initial_state()}
    return dict(zip(s.outs, s.run(*(feed[n] for n in s.names))))


@pytest.fixture(scope="module")
def case(tmp_path_factory):
    """(HF model, its folder, ids, logits, last hidden state, long ids, their logits)."""
    model = make_qwen3_next()
    path = save_hf(model, tmp_path_factory.mktemp("qwen3_next_hf"))
    ids = token_ids(model.config.vocab_size, n=N_IDS)
    long_ids = token_ids(model.config.vocab_size, n=N_LONG, seed=11)
    return (model, path, ids, hf_logits(model, ids), hf_last_hidden(model, ids),
            long_ids, hf_logits(model, long_ids))


@pytest.fixture(scope="module")
def ours(case):
    return load(ARCH, case[1])


def test_qwen3_next_config_and_weights_from_hf(case, ours):
    model, path, *_ = case
    graph, td = ours
    p = md.load_model(spec_path(ARCH), td).params
    assert p["layer_types"] == ["linear_attention", "full_attention"] * 2
    assert (p["dim"], p["n_layers"], p["n_heads"], p["n_kv_heads"], p["head_dim"]) == (64, 4, 4, 2, 32)
    assert (p["rot_dim"], p["context"]) == (8, 128)
    assert (p["lin_k_heads"], p["lin_v_heads"], p["lin_k_dim"], p["lin_v_dim"]) == (2, 4, 16, 24)
    assert (p["n_expert"], p["n_expert_used"], p["expert_ffn_dim"], p["shexp_ffn_dim"]) == (8, 2, 32, 48)
    assert p["mlp_only_layers"] == [2] and p["norm_topk_prob"] is True
    sd = {k: v.detach().numpy() for k, v in model.state_dict().items()}
    w = {k: np.asarray(td[k]) for k in td.keys()}
    assert w["blk.0.moe.ffn_gate_exps.weight"].shape == (8, 32, 64)          # experts stacked
    assert w["blk.3.moe.ffn_down_exps.weight"].shape == (8, 64, 32)
    assert w["blk.2.mlp.ffn_gate.weight"].shape == (96, 64)                  # the dense layer
    assert "blk.2.moe.ffn_gate_inp.weight" not in w and "blk.1.mlp.ffn_gate.weight" not in w
    assert "blk.0.kv_cache" not in [v.name for v in graph.inputs]
    assert {"blk.0.conv_state", "blk.0.ssm_state", "blk.1.kv_cache"} <= {v.name for v in graph.inputs}
    la = "model.layers.0.linear_attn."
    np.testing.assert_allclose(w["blk.0.linear_attn.ssm_a.weight"], -np.exp(sd[la + "A_log"]), rtol=1e-6)
    np.testing.assert_array_equal(w["blk.0.linear_attn.ssm_conv1d.weight"], sd[la + "conv1d.weight"][:, 0])
    np.testing.assert_array_equal(w["blk.0.linear_attn.ssm_norm.weight"], sd[la + "norm.weight"])
    np.testing.assert_array_equal(w["blk.1.attn_norm.weight"],
                                  sd["model.layers.1.input_layernorm.weight"] + np.float32(1))
    np.testing.assert_array_equal(w["blk.1.self_attn.attn_q_norm.weight"],
                                  sd["model.layers.1.self_attn.q_norm.weight"] + np.float32(1))


def test_qwen3_next_prefill_logits_and_last_hidden_state(case, ours):
    _, _, ids, ref, ref_hidden, _, _ = case
    out = run_all(*ours, ids[:N_IDS])
    err_logits = rel_err(out["logits"], ref)
    err_hidden = rel_err(out["last_hidden_state"], ref_hidden)
    print(f"qwen3_next vs HF: logits {err_logits:.2e}, last hidden state {err_hidden:.2e} "
          f"(of max|ref|)")
    assert err_logits <= TOL and err_hidden <= TOL


def test_qwen3_next_decode_through_state_matches_hf(case, ours):
    """A prefill of 12 tokens, then 4 tokens one at a time through the KV caches, the
    conv states and the recurrent states, against one forward over all 16."""
    _, _, ids, ref, *_ = case
    pre, dec = decoder_errors(*ours, ref, ids)
    print(f"qwen3_next prefill {pre:.2e}, decode {dec:.2e} (of max|ref|)")
    assert pre <= TOL and dec <= TOL


def test_qwen3_next_long_prefill_matches_hf(case, ours):
    """70 prompt tokens (transformers runs two chunks of 64; the spec one step of the
    recurrence), then 10 decode steps."""
    *_, long_ids, long_ref = case
    pre, dec = decoder_errors(*ours, long_ref, long_ids, n_prompt=70)
    print(f"qwen3_next long prompt: prefill {pre:.2e}, decode {dec:.2e} (of max|ref|)")
    assert pre <= TOL and dec <= TOL


def test_qwen3_next_multi_token_steps_after_state(case, ours):
    """Steps of 8, 5 and 3 tokens: a step of several tokens that starts from a carried
    recurrent state, conv state and KV cache (chunked prefill)."""
    _, _, ids, ref, *_ = case
    s = Stepper(*ours)
    state, got, start = s.initial_state(), [], 0
    for n in (8, 5, 3):
        lg, state = s.step(ids[start:start + n], start, state)
        got.append(lg)
        start += n
    err = rel_err(np.concatenate(got), ref)
    print(f"qwen3_next steps of 8, 5, 3 tokens: {err:.2e} (of max|ref|)")
    assert err <= TOL


def test_qwen3_next_repetitive_long_prompt_matches_hf(case, ours):
    """A prompt of one token 100 times (every key the same): what the model must do for
    any prompt within its context."""
    model, *_ = case
    ids = [5] * 104
    pre, dec = decoder_errors(*ours, hf_logits(model, ids), ids, n_prompt=100)
    print(f"qwen3_next repeated-token prompt: prefill {pre:.2e}, decode {dec:.2e}")
    assert pre <= TOL and dec <= TOL


def test_qwen3_next_random_300_token_prompt_matches_hf(tmp_path):
    """A 300-token random prompt (five of transformers' 64-token chunks) in one prefill
    step, then 6 decode steps; context raised to 512 for it."""
    model = make_qwen3_next(max_position_embeddings=512)
    path = save_hf(model, tmp_path / "hf")
    ids = token_ids(model.config.vocab_size, n=306, seed=13)
    pre, dec = decoder_errors(*load(ARCH, path), hf_logits(model, ids), ids, n_prompt=300)
    print(f"qwen3_next 300-token random prompt: prefill {pre:.2e}, decode {dec:.2e}")
    assert pre <= TOL and dec <= TOL


def test_qwen3_next_chunked_long_repetitive_prompt(case, ours):
    """One token 60 times, then 51 random tokens, fed in steps of 37 (each starting from
    the carried recurrent, conv and KV states), matches one transformers forward."""
    model, *_ = case
    ids = [5] * 60 + token_ids(256, n=51, seed=17)
    ref = hf_logits(model, ids)
    s = Stepper(*ours)
    state, got, start = s.initial_state(), [], 0
    while start < len(ids):
        lg, state = s.step(ids[start:start + 37], start, state)
        got.append(lg)
        start += 37
    err = rel_err(np.concatenate(got), ref)
    print(f"qwen3_next 111 tokens in steps of 37: {err:.2e} (of max|ref|)")
    assert err <= TOL


@pytest.mark.parametrize("state", ["ssm_state", "conv_state", "kv_cache"])
def test_qwen3_next_every_state_matters(case, ours, state):
    """Negative control: a decode step with one kind of state reset to empty is wrong."""
    _, _, ids, ref, *_ = case
    err = error_with_state_reset(*ours, ref, ids, reset=state)
    print(f"qwen3_next decode with {state} reset: {err:.2e}")
    assert err > 100 * TOL


def test_qwen3_next_greedy_generate_matches_hf(case):
    """``generate`` of one prompt (greedy) gives transformers' ids (its cached decode:
    the recurrent delta rule and conv update)."""
    model = case[0]
    ours = md.load_model(spec_path(ARCH), case[1], variant="tiny")
    for p in PROMPTS:
        want = model.generate(torch.tensor([p]), max_new_tokens=N_NEW, do_sample=False,
                              eos_token_id=None, pad_token_id=0)[0, len(p):].tolist()
        assert ours.generate(p, N_NEW, temperature=0).ids == want


def test_qwen3_next_batched_greedy_generate_matches_hf(case):
    """A list of prompts of different lengths decoded together (rows=: one recurrent,
    conv and KV state per sequence) gives transformers' greedy ids for each prompt."""
    model = case[0]
    ours = md.load_model(spec_path(ARCH), case[1], variant="tiny")
    assert_greedy_matches_hf(model, ours, PROMPTS, N_NEW)
    long_prompts = [[5] * 40, token_ids(256, n=33, seed=21), [9, 4]]
    assert_greedy_matches_hf(model, ours, long_prompts, N_NEW)


def test_qwen3_next_batched_step_logits_match_hf(case, ours):
    """One batched prefill step of three prompts (rows=[8, 3, 7]) and one batched decode
    step: every sequence's logits match transformers' forward of that sequence alone."""
    model = case[0]
    graph, td = ours
    s = Stepper(graph, td)
    run = md.compile(graph, td)
    nxt = [77, 150, 4]
    refs = [hf_logits(model, p + [t]) for p, t in zip(PROMPTS, nxt)]
    init = s.initial_state()
    tokens = np.concatenate([np.asarray(p, np.int64) for p in PROMPTS])
    positions = np.concatenate([np.arange(len(p), dtype=np.int64) for p in PROMPTS])
    feed = {"tokens": tokens, "positions": positions,
            "logit_rows": np.arange(tokens.size, dtype=np.int64),
            **{n: md.PerSequence([init[n]] * len(PROMPTS)) for n in s.state_names}}
    res = dict(zip(s.outs, run(*(feed[n] for n in s.names), rows=[len(p) for p in PROMPTS])))
    pre = np.split(np.asarray(res["logits"]), np.cumsum([len(p) for p in PROMPTS])[:-1])
    feed = {"tokens": np.asarray(nxt, np.int64),
            "positions": np.asarray([len(p) for p in PROMPTS], np.int64),
            "logit_rows": np.arange(len(PROMPTS), dtype=np.int64),
            **{n: res[n] for n in s.state_names}}
    res = dict(zip(s.outs, run(*(feed[n] for n in s.names), rows=[1] * len(PROMPTS))))
    dec = np.asarray(res["logits"])
    errs = [rel_err(pre[b], refs[b][:-1]) for b in range(len(PROMPTS))]
    errs += [rel_err(dec[b], refs[b][-1]) for b in range(len(PROMPTS))]
    print(f"qwen3_next batched prefill/decode: max {max(errs):.2e} (of max|ref|)")
    assert max(errs) <= TOL


def test_qwen3_next_second_configuration(tmp_path):
    """norm_topk_prob false, decoder_sparse_step 2 (layer 1 sparse, 0 and 2 dense), one
    value head per key head (dk == dv), tied output, every third layer full attention
    given as the released config.json gives it (full_attention_interval, no
    layer_types); and the shared expert's gate matters (negative control)."""
    model = make_qwen3_next(seed=3, num_hidden_layers=3, layer_types=None,
                            full_attention_interval=3, norm_topk_prob=False,
                            decoder_sparse_step=2, mlp_only_layers=[],
                            linear_num_value_heads=2, linear_value_head_dim=16,
                            tie_word_embeddings=True)
    assert model.config.layer_types == ["linear_attention", "linear_attention", "full_attention"]
    path = save_hf(model, tmp_path / "hf")
    config_json = tmp_path / "hf" / "config.json"
    cfg = json.loads(config_json.read_text())
    del cfg["layer_types"]
    cfg["full_attention_interval"] = 3
    config_json.write_text(json.dumps(cfg))
    ids = token_ids(model.config.vocab_size, n=N_IDS, seed=5)
    ref = hf_logits(model, ids)
    graph, td = load(ARCH, path)
    got = md.load_model(spec_path(ARCH), td).params
    assert got["layer_types"] == ["linear_attention", "linear_attention", "full_attention"]
    assert got["norm_topk_prob"] is False and got["decoder_sparse_step"] == 2
    assert "output.weight" not in td.keys()                        # tied: the embedding
    assert "blk.1.moe.ffn_gate_inp.weight" in td.keys() and "blk.0.mlp.ffn_gate.weight" in td.keys()
    pre, dec = decoder_errors(graph, td, ref, ids)
    print(f"qwen3_next (second configuration) prefill {pre:.2e}, decode {dec:.2e}")
    assert pre <= TOL and dec <= TOL
    raw = md.load_weights(path)
    raw["model.layers.1.mlp.shared_expert_gate.weight"] = np.zeros((1, 64), np.float32)
    ours0 = md.load_model(spec_path(ARCH), raw)
    pre0 = rel_err(np.asarray(ours0.logits(ids)), ref)
    assert pre0 > 100 * TOL


def test_qwen3_next_torch_state_dict_with_fused_experts(case, tmp_path):
    """A torch state_dict saved as one file holds transformers 5's in-memory names
    (experts.gate_up_proj [E, 2F, D], experts.down_proj [E, D, F]); with no config.json
    the tiny variant gives the sizes (the test model's)."""
    from safetensors.torch import save_file

    model, _, ids, ref, *_ = case
    sd = {k: v.detach().contiguous() for k, v in model.state_dict().items()}
    assert "model.layers.0.mlp.experts.gate_up_proj" in sd
    path = tmp_path / "state_dict.safetensors"
    save_file(sd, str(path))
    ours = md.load_model(spec_path(ARCH), str(path), variant="tiny")
    assert rel_err(np.asarray(ours.logits(ids)), ref) <= TOL


def test_qwen3_next_drops_mtp_head(case, tmp_path):
    """The released checkpoints carry a multi-token-prediction head (``mtp.*``) that
    transformers ignores; so does the spec."""
    from safetensors.numpy import save_file

    _, path, ids, ref, *_ = case
    dst = tmp_path / "hf"
    shutil.copytree(path, dst)
    save_file({"mtp.fc.weight": np.ones((64, 128), np.float32),
               "mtp.layers.0.input_layernorm.weight": np.ones(64, np.float32)},
              str(dst / "mtp.safetensors"))
    ours = md.load_model(spec_path(ARCH), str(dst), variant="tiny")
    assert rel_err(np.asarray(ours.logits(ids)), ref) <= TOL


def test_qwen3_next_refuses_rope_scaling(case, tmp_path):
    dst = tmp_path / "hf"
    shutil.copytree(case[1], dst)
    cfg = json.loads((dst / "config.json").read_text())
    cfg["rope_parameters"] = {**cfg["rope_parameters"], "rope_type": "yarn", "factor": 4.0}
    (dst / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(md.WeightsError, match="RoPE scaling yarn"):
        md.load_model(spec_path(ARCH), str(dst), variant="tiny")
