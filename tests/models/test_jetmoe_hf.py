"""specs/jetmoe.yaml against transformers' JetMoeForCausalLM.

Small seeded float32 JetMoE models: every layer routes its attention (MoA: per-token
top-k query experts sharing one key/value projection, each expert with its own output
projection) and its MLP (top-k SwiGLU experts) with softmax-over-top-k routers, and both
add a shared bias after the gated sum. The main case has 4 experts, top-2, 2 kv heads of
16 (so 4 query heads per token) and a tied output; the second case is untied, top-3 of 5
experts, 3 kv heads of 8, a tanh GELU, RoPE base 500000 and a final-norm eps (0.05)
far from the block norms' fixed 1e-6 (transformers' JetMoeRMSNorm default: config.json's
rms_norm_eps reaches only model.norm).
"""

import numpy as np
import pytest

import maxdecl as md

from modelhelp import (assert_greedy_matches_hf, compare, hf_case, hf_logits, hf_params,
                       randomize, spec_path, tiny_model)

pytest.importorskip("torch")
pytest.importorskip("transformers")

TOL = 1e-5          # max|ours - ref| <= TOL * max|ref|
PROMPTS = [[3, 17, 42, 99, 5, 7, 64, 1, 200, 31], [8, 9, 120], [5, 60, 33, 2, 90, 11, 7]]
N_NEW = 6

BASE = dict(vocab_size=256, hidden_size=64, num_hidden_layers=2, num_key_value_heads=2,
            kv_channels=16, intermediate_size=64, num_local_experts=4, num_experts_per_tok=2,
            max_position_embeddings=64, rms_norm_eps=1e-6, activation_function="silu",
            tie_word_embeddings=True, bos_token_id=0, eos_token_id=0,
            attn_implementation="eager")
WIDE = dict(num_key_value_heads=3, kv_channels=8, intermediate_size=48, num_local_experts=5,
            num_experts_per_tok=3, rms_norm_eps=0.05, activation_function="gelu_pytorch_tanh",
            tie_word_embeddings=False, rope_parameters={"rope_type": "default",
                                                        "rope_theta": 500000.0})


def make_jetmoe(seed=0, **kw):
    """JetMoeForCausalLM with randomize's weights; the embedding scaled to 0.1 * N(0, 1)
    so the (tied) logits do not just echo each token's own row."""
    import torch
    import transformers

    torch.manual_seed(seed)
    cfg = {**BASE, **kw}
    model = randomize(transformers.JetMoeForCausalLM(transformers.JetMoeConfig(**cfg)), seed)
    with torch.no_grad():
        model.model.embed_tokens.weight.mul_(0.1)
    return model


@pytest.fixture(scope="module")
def jetmoe(tmp_path_factory):
    return hf_case(make_jetmoe(), tmp_path_factory.mktemp("jetmoe_hf"))


@pytest.fixture(scope="module")
def ours(jetmoe):
    return tiny_model("jetmoe", jetmoe[1])


@pytest.fixture(scope="module")
def wide(tmp_path_factory):
    return hf_case(make_jetmoe(seed=1, **WIDE), tmp_path_factory.mktemp("jetmoe_wide_hf"))


def _errors(name, model, ids, ref):
    pre, dec = compare(model, ref, ids)
    print(f"{name} vs HF: prefill {pre:.2e}, decode {dec:.2e} "
          f"(of max|ref| {np.abs(ref).max():.2f})")
    return pre, dec


def test_jetmoe_config_from_hf(jetmoe, wide):
    got = hf_params("jetmoe", jetmoe[1])[2]
    assert {k: got.get(k) for k in ("dim", "n_layers", "n_kv_heads", "head_dim", "ffn_dim",
                                   "n_expert", "top_k", "vocab", "context", "hidden_act")} == {
        "dim": 64, "n_layers": 2, "n_kv_heads": 2, "head_dim": 16, "ffn_dim": 64,
        "n_expert": 4, "top_k": 2, "vocab": 256, "context": 64, "hidden_act": "silu"}
    got = hf_params("jetmoe", wide[1])[2]
    assert (got["n_kv_heads"], got["head_dim"], got["n_expert"], got["top_k"]) == (3, 8, 5, 3)
    assert got["rope_theta"] == 500000.0 and got["norm_eps"] == pytest.approx(0.05)
    assert got["hidden_act"] == "gelu_pytorch_tanh"


def test_jetmoe_routes_to_several_experts(jetmoe):
    """The reference really mixes: across the prompt every router picks more than top_k
    distinct experts (else a wrong expert order could still pass)."""
    import torch

    model, _, ids, _ = jetmoe
    with torch.no_grad():
        out = model(torch.tensor([ids]), output_router_logits=True, use_cache=False)
    # one entry per router (MoA and MoE of each layer)
    assert len(out.router_logits) == 2 * model.config.num_hidden_layers
    for r in out.router_logits:
        chosen = r.topk(2, dim=-1).indices.unique()
        assert chosen.numel() > 2


def test_jetmoe_prefill_and_decode_match_hf(jetmoe, ours):
    """Logits of the 12-token prompt, then 4 tokens one at a time through the KV cache,
    against transformers' logits of the whole sequence."""
    _, _, ids, ref = jetmoe
    pre, dec = _errors("jetmoe", ours, ids, ref)
    assert pre <= TOL and dec <= TOL


def test_jetmoe_untied_wide_case_matches_hf(wide):
    """Untied lm_head, top-3 of 5 experts, 3 kv heads (9 query heads), gelu_pytorch_tanh,
    RoPE base 500000, final-norm eps 0.05 against the blocks' 1e-6."""
    model, path, ids, ref = wide
    assert "lm_head.weight" in md.load_weights(path).keys()
    ours = tiny_model("jetmoe", path)
    pre, dec = _errors("jetmoe wide", ours, ids, ref)
    assert pre <= TOL and dec <= TOL


def test_jetmoe_greedy_generate_matches_hf(jetmoe, ours):
    """Greedy ids of transformers' generate, for one prompt and for three prompts of
    different lengths decoded together (a batched step, one KV cache per sequence)."""
    assert_greedy_matches_hf(jetmoe[0], ours, PROMPTS, N_NEW)
    want = ours.generate(PROMPTS[1], N_NEW, temperature=0).ids
    assert len(set(want)) > 1                       # not one repeated token


def test_jetmoe_batched_prompts_match_hf(jetmoe):
    """Three prompts of different lengths in one batched prefill (rows=), then one batched
    decode step, against transformers' logits of each sequence alone."""
    model = jetmoe[0]
    td = md.load_weights(jetmoe[1], spec=spec_path("jetmoe"), variant="tiny")
    g = md.build(spec_path("jetmoe"), weights=td)
    run = md.compile(g, td)
    names = [v.name for v in g.inputs]
    outs = list(g.output_names)
    states = [n for n in names if n in outs]
    empty = {v.name: np.zeros([d if isinstance(d, int) else 0 for d in v.type.shape],
                              v.type.dtype.numpy) for v in g.inputs if v.name in states}
    rows = [len(p) for p in PROMPTS]
    feed = {"tokens": np.concatenate([np.asarray(p, np.int64) for p in PROMPTS]),
            "positions": np.concatenate([np.arange(n, dtype=np.int64) for n in rows]),
            "logit_rows": np.arange(sum(rows), dtype=np.int64),
            **{n: md.PerSequence([empty[n]] * len(PROMPTS)) for n in states}}
    got = dict(zip(outs, run(*(feed[n] for n in names), rows=rows)))
    starts = np.cumsum([0] + rows)
    errs = []
    for b, p in enumerate(PROMPTS):
        errs.append(_rel(got["logits"][starts[b]:starts[b + 1]], hf_logits(model, p)))
    # one more token per sequence, all in one step through the per-sequence caches
    nxt = [int(np.argmax(got["logits"][starts[b + 1] - 1])) for b in range(len(PROMPTS))]
    feed = {"tokens": np.asarray(nxt, np.int64), "positions": np.asarray(rows, np.int64),
            "logit_rows": np.arange(len(PROMPTS), dtype=np.int64),
            **{n: got[n] for n in states}}
    got2 = dict(zip(outs, run(*(feed[n] for n in names), rows=[1] * len(PROMPTS))))
    for b, p in enumerate(PROMPTS):
        errs.append(_rel(got2["logits"][b], hf_logits(model, p + [nxt[b]])[-1]))
    print("jetmoe batched vs HF:", " ".join(f"{e:.2e}" for e in errs))
    assert max(errs) <= TOL


def _rel(ours, ref):
    ours, ref = np.asarray(ours, np.float64), np.asarray(ref, np.float64)
    assert ours.shape == ref.shape, (ours.shape, ref.shape)
    return float(np.abs(ours - ref).max() / np.abs(ref).max())


# (what the spec says, what a plausible misreading would say instead)
CONTROLS = {
    # transformers' `repeat` of the kv heads (query head j * n_kv + h reads kv head h),
    # not `repeat_interleave`: without the kv-major reordering heads read the wrong kv
    "head_order": ("perm: [0, 2, 1, 3]", "perm: [0, 1, 2, 3]"),
    # the block norms keep JetMoeRMSNorm's 1e-6 whatever rms_norm_eps says
    "block_norm_eps": ('epsilon: "{block_norm_eps}"', 'epsilon: "{norm_eps}"'),
    # model.norm does read rms_norm_eps
    "final_norm_eps": ('epsilon: "{norm_eps}"', 'epsilon: "{block_norm_eps}"'),
}


@pytest.mark.parametrize("control", sorted(CONTROLS))
def test_jetmoe_negative_controls(wide, tmp_path, control):
    """Negative controls on the wide case (eps 0.05): the spec with one detail changed
    to its plausible misreading is far off, so each detail is really tested."""
    _, path, ids, ref = wide
    good, bad = CONTROLS[control]
    text = open(spec_path("jetmoe")).read()
    assert good in text
    wrong_spec = tmp_path / f"jetmoe_{control}.yaml"
    wrong_spec.write_text(text.replace(good, bad))
    wrong = md.load_model(str(wrong_spec), path, variant="tiny")
    pre, dec = compare(wrong, ref, ids)
    assert pre > 100 * TOL and dec > 100 * TOL


def test_jetmoe_refuses_rope_scaling(jetmoe):
    """A checkpoint with a RoPE scaling the spec does not model is refused on load."""
    td = md.load_weights(jetmoe[1])
    td.metadata["rope_parameters"] = {"rope_type": "linear", "rope_theta": 10000.0,
                                      "factor": 2.0}
    with pytest.raises(md.WeightsError, match="RoPE scaling linear"):
        md.load_model(spec_path("jetmoe"), td, variant="tiny")
