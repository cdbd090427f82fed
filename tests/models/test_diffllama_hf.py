"""specs/diffllama.yaml against transformers' DiffLlamaForCausalLM / DiffLlamaModel.

A small seeded float32 DiffLlama: 3 layers (lambda_init 0.2, 0.356, 0.471: one per
layer), 8 query heads over 4 kv heads (grouped-query attention; each half of the kv
heads gives the values of one of the two attention calls), head_dim 16 with a width of
64 (the attention is 128 wide), the per-layer lambda vectors drawn so that lambda
differs per layer and matters, the weightless RMS "group norm" over each head pair's
2 * head_dim features, SwiGLU MLP, RoPE theta 50000.

Checked: the config read from config.json; prefill and KV-cache decode logits; a
left-padded batch of 2 sequences (attention_mask) against md's batched step, logits
and last hidden state; greedy generation (alone and batched) against transformers'
generate; a DiffLlamaModel checkpoint's last_hidden_state; tied embeddings with
attention biases; linear and llama3 RoPE scaling; unknown RoPE scalings refused.
"""

import numpy as np
import pytest

import maxdecl as md

from modelhelp import (hf_case, hf_logits, hf_params, ours_logits, randomize, rel_err,
                       save_hf, spec_path, tiny_model, assert_greedy_matches_hf)

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

TOL = 1e-5          # max|ours - ref| <= TOL * max|ref| (measured: 3.4e-6 at most)
PROMPTS = [[3, 17, 42, 99, 5, 7, 64, 1], [8, 9, 120], [5, 60, 33, 2, 90, 11, 7]]
N_NEW = 6
CFG = dict(vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=3,
           num_attention_heads=8, num_key_value_heads=4, head_dim=16,
           max_position_embeddings=128, rms_norm_eps=1e-5,
           rope_parameters={"rope_type": "default", "rope_theta": 50000.0},
           bos_token_id=1, eos_token_id=2, pad_token_id=0, attn_implementation="eager")


def make_diffllama(seed=0, lambda_std=0.3, **kw):
    """DiffLlamaForCausalLM with randomize's weights; the lambda vectors (1-D, which
    randomize would draw near 1, making exp(q . k) ~ e^16) are drawn N(0, lambda_std)."""
    torch.manual_seed(seed)
    cfg = {**CFG, **kw}
    model = randomize(transformers.DiffLlamaForCausalLM(transformers.DiffLlamaConfig(**cfg)),
                      seed)
    gen = torch.Generator().manual_seed(seed + 100)
    with torch.no_grad():
        for layer in model.model.layers:
            a = layer.self_attn
            for p in (a.lambda_q1, a.lambda_k1, a.lambda_q2, a.lambda_k2):
                p.copy_(lambda_std * torch.randn(p.shape, generator=gen))
    return model.eval()


def hf_lambda_full(model) -> list[float]:
    """transformers' lambda of each layer (exp(q1.k1) - exp(q2.k2) + lambda_init)."""
    out = []
    for layer in model.model.layers:
        a = layer.self_attn
        with torch.no_grad():
            out.append(float(torch.exp((a.lambda_q1 * a.lambda_k1).sum())
                             - torch.exp((a.lambda_q2 * a.lambda_k2).sum()) + a.lambda_init))
    return out


@pytest.fixture(scope="module")
def diffllama(tmp_path_factory):
    model = make_diffllama()
    return hf_case(model, tmp_path_factory.mktemp("diffllama_hf"))


@pytest.fixture(scope="module")
def ours(diffllama):
    return tiny_model("diffllama", diffllama[1])


def test_diffllama_config_from_hf(diffllama):
    model, path, _, _ = diffllama
    got = hf_params("diffllama", path)[2]
    assert (got["dim"], got["n_layers"], got["n_heads"], got["n_kv_heads"], got["head_dim"],
            got["ffn_dim"], got["vocab"], got["context"]) == (64, 3, 8, 4, 16, 128, 128, 128)
    assert got["rope_theta"] == pytest.approx(50000.0)
    assert got["rope_type"] == "default"
    assert got["norm_eps"] == pytest.approx(1e-5)
    assert got["hidden_act"] == "silu"


def test_diffllama_reference_exercises_every_part(diffllama):
    """The reference model has what the test means to cover: GQA with more than one
    kv head per half, a lambda_init per layer, and lambdas far from each other."""
    model = diffllama[0]
    a = model.model.layers[0].self_attn
    assert a.num_key_value_groups == 2 and model.config.num_key_value_heads == 4
    inits = [layer.self_attn.lambda_init for layer in model.model.layers]
    assert inits == pytest.approx([0.8 - 0.6 * np.exp(-0.3 * i) for i in range(3)])
    lam = hf_lambda_full(model)
    assert min(abs(x - y) for i, x in enumerate(lam) for y in lam[i + 1:]) > 0.05, lam


def test_diffllama_lambda_init_and_group_norm_matter(diffllama):
    """Negative controls on the reference: one lambda_init for every layer, or no group
    norm, moves the logits far past TOL, so the comparisons above see both."""
    import copy

    model, _, ids, ref = diffllama
    same_init = copy.deepcopy(model)
    for layer in same_init.model.layers:
        layer.self_attn.lambda_init = same_init.model.layers[0].self_attn.lambda_init
    no_norm = copy.deepcopy(model)
    for layer in no_norm.model.layers:
        layer.self_attn.groupnorm = torch.nn.Identity()
    assert rel_err(hf_logits(same_init, ids), ref) > 100 * TOL
    assert rel_err(hf_logits(no_norm, ids), ref) > 100 * TOL


def test_diffllama_prefill_and_decode_match_hf(diffllama, ours):
    model, path, ids, ref = diffllama
    pre, dec = ours_logits(ours, ids)
    e_pre, e_dec = rel_err(pre, ref[:len(pre)]), rel_err(dec, ref[len(pre):])
    print(f"diffllama vs HF: prefill {e_pre:.2e}, decode {e_dec:.2e} (of max|ref|)")
    assert e_pre <= TOL and e_dec <= TOL


def _empty(v):
    """A state input's first value: its symbolic dims (past) 0."""
    return np.zeros([d if isinstance(d, int) else 0 for d in v.type.shape], v.type.dtype.numpy)


def _padded_batch(vocab):
    """Two prompts (13 and 8 tokens), the second left-padded with id 0 to 13."""
    rng = np.random.default_rng(11)
    a = [int(t) for t in rng.integers(3, vocab, size=13)]
    b = [int(t) for t in rng.integers(3, vocab, size=8)]
    n = len(a)
    ids = np.array([a, [0] * (n - len(b)) + b], np.int64)
    mask = np.array([[1] * n, [0] * (n - len(b)) + [1] * len(b)], np.int64)
    return [a, b], ids, mask


@pytest.mark.parametrize("hf_positions", ["from_mask", "default"])
def test_diffllama_left_padded_batch_matches_hf(diffllama, ours, hf_positions):
    """transformers on a left-padded [2, 13] batch with its attention_mask against md's
    batched step (``rows=``: the two sequences' real tokens one after the other, one KV
    cache each), at every real token: logits and DiffLlamaModel's last_hidden_state.

    ``from_mask``: position ids counted over the real tokens, as transformers' generate
    gives them (cumsum(mask) - 1); ``default``: transformers' default arange, so the
    padded row's real tokens start at position 5 (md is fed the same positions)."""
    model = diffllama[0]
    seqs, ids, mask = _padded_batch(model.config.vocab_size)
    n = ids.shape[1]
    t_ids, t_mask = torch.tensor(ids), torch.tensor(mask)
    kw = {}
    if hf_positions == "from_mask":
        kw["position_ids"] = (t_mask.cumsum(-1) - 1).clamp(min=0)
    with torch.no_grad():
        ref_logits = model(t_ids, attention_mask=t_mask, use_cache=False, **kw).logits.numpy()
        ref_hidden = model.model(t_ids, attention_mask=t_mask, use_cache=False,
                                 **kw).last_hidden_state.numpy()

    tokens = np.concatenate([np.asarray(s, np.int64) for s in seqs])
    pos = []
    for s in seqs:
        start = 0 if hf_positions == "from_mask" else n - len(s)
        pos.append(np.arange(start, start + len(s), dtype=np.int64))
    positions = np.concatenate(pos)
    feed = {"tokens": tokens, "positions": positions,
            "logit_rows": np.arange(tokens.size, dtype=np.int64)}
    # each KV cache: empty, one per sequence
    args = [feed[v.name] if v.name in feed else md.PerSequence([_empty(v) for _ in seqs])
            for v in ours.graph.inputs]
    out = dict(zip(ours.graph.output_names, ours.compiled(*args, rows=[len(s) for s in seqs])))
    logits, hidden = np.asarray(out["logits"]), np.asarray(out["last_hidden_state"])

    want_l = np.concatenate([ref_logits[r, n - len(s):] for r, s in enumerate(seqs)])
    want_h = np.concatenate([ref_hidden[r, n - len(s):] for r, s in enumerate(seqs)])
    e_l, e_h = rel_err(logits, want_l), rel_err(hidden, want_h)
    print(f"diffllama padded batch ({hf_positions}) vs HF: logits {e_l:.2e}, "
          f"last_hidden_state {e_h:.2e} (of max|ref|)")
    assert e_l <= TOL and e_h <= TOL
    if hf_positions == "default":
        # the padding mattered: transformers without the mask lets the padded row's
        # tokens see the pads. (Not with position ids that restart at 0: transformers 5
        # then reads the row as packed sequences and masks the pads by itself.)
        with torch.no_grad():
            unmasked = model(t_ids, use_cache=False).logits.numpy()
        assert rel_err(unmasked[1, n - len(seqs[1]):], want_l[len(seqs[0]):]) > 100 * TOL


def test_diffllama_greedy_generate_matches_hf(diffllama, ours):
    assert_greedy_matches_hf(diffllama[0], ours, PROMPTS, N_NEW)


def test_diffllama_base_model_last_hidden_state_matches_hf(diffllama, tmp_path):
    """A DiffLlamaModel checkpoint (no model. prefix, no lm_head) loads too; its
    last_hidden_state is transformers'."""
    model, _, ids, _ = diffllama
    path = save_hf(model.model, tmp_path / "base")
    keys = set(md.load_weights(path).keys())
    assert "embed_tokens.weight" in keys and "lm_head.weight" not in keys
    base = md.load_model(spec_path("diffllama"), path, variant="tiny")
    with torch.no_grad():
        ref = model.model(torch.tensor([ids]), use_cache=False).last_hidden_state[0].numpy()
    feed = {"tokens": np.asarray(ids, np.int64), "positions": np.arange(len(ids)),
            "logit_rows": np.arange(len(ids))}
    args = [feed[v.name] if v.name in feed else _empty(v) for v in base.graph.inputs]
    out = dict(zip(base.output_names, base(*args)))
    err = rel_err(out["last_hidden_state"], ref)
    print(f"DiffLlamaModel last_hidden_state vs HF: {err:.2e}")
    assert err <= TOL


@pytest.mark.parametrize("name,kw", [
    ("tied_bias", dict(tie_word_embeddings=True, attention_bias=True)),
    ("rope_linear", dict(rope_parameters={"rope_type": "linear", "rope_theta": 10000.0,
                                          "factor": 4.0})),
    ("rope_llama3", dict(rope_parameters={
        "rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0, "low_freq_factor": 1.0,
        "high_freq_factor": 4.0, "original_max_position_embeddings": 16})),
])
def test_diffllama_other_configs_match_hf(tmp_path, name, kw):
    """Tied output and attention biases; linear and llama3 RoPE scaling (with positions
    past the original context of 16)."""
    model = make_diffllama(seed=3, **kw)
    path = save_hf(model, tmp_path / name)
    ids = [int(t) for t in np.random.default_rng(5).integers(0, 128, size=40)]
    ref = hf_logits(model, ids)
    ours = tiny_model("diffllama", path)
    if kw.get("tie_word_embeddings"):
        assert "output.weight" not in ours.weights
        assert "blk.0.attn_q.bias" in ours.weights
    pre, dec = ours_logits(ours, ids, n_prompt=30)
    e_pre, e_dec = rel_err(pre, ref[:30]), rel_err(dec, ref[30:])
    print(f"diffllama {name} vs HF: prefill {e_pre:.2e}, decode {e_dec:.2e}")
    assert e_pre <= TOL and e_dec <= TOL


def test_diffllama_refuses_unmodelled_rope(diffllama):
    """A RoPE scaling the spec does not model (dynamic NTK) is refused when it loads."""
    td = md.load_weights(diffllama[1])
    td.metadata["rope_parameters"] = {"rope_type": "dynamic", "rope_theta": 10000.0,
                                      "factor": 2.0}
    with pytest.raises(md.WeightsError, match="RoPE scaling dynamic is not modelled"):
        md.load_model(spec_path("diffllama"), td, variant="tiny")
