"""specs/mpt.yaml against transformers' MptForCausalLM (transformers 5).

Small seeded float32 MPTs saved with ``save_pretrained`` and loaded through the spec's
``formats.hf`` mapping:

* ``alibi``: 6 heads (not a power of two: MPT's interleaved ALiBi slopes), tied output,
  default softmax scale, no clamp;
* ``clip``: ``clip_qkv`` (the fused qkv clamped), an explicit ``softmax_scale``,
  ``no_bias: false`` (which transformers ignores: it builds no biases), another
  LayerNorm epsilon and an untied ``lm_head``.

Each is compared on a prompt's logits (a prefill, then decode steps through the KV
cache), on greedy generation (one prompt, and prompts of different lengths decoded as
one batch) and on a batched step against transformers' left-padded batch.
"""

import numpy as np
import pytest

import maxdecl as md

from modelhelp import (assert_greedy_matches_hf, compare, hf_logits, hf_params,
                       randomize, rel_err, save_hf, spec_path, token_ids, with_hf_config)

pytest.importorskip("torch")
pytest.importorskip("transformers")

TOL = 1e-5          # max|ours - ref| <= TOL * max|ref| (measured: about 1e-6)
VOCAB = 256
PROMPTS = [[3, 17, 42, 99, 5, 7, 64, 1, 200, 31], [8, 9, 120], [5, 60, 33, 2, 90, 11, 7]]
N_NEW = 8

CASES = {
    "alibi": dict(d_model=96, n_heads=6),
    "clip": dict(d_model=64, n_heads=4, no_bias=False, layer_norm_epsilon=1e-3,
                 tie_word_embeddings=False,
                 attn_config={"clip_qkv": 0.5, "softmax_scale": 0.3}),
}


def make_mpt(seed=0, d_model=64, n_heads=4, attn_config=None, **kw):
    """MptForCausalLM with 2 layers, 256 tokens and a 64-position context (max_seq_len).

    The embedding table is scaled to 0.1 * N(0, 1) so that the tied logits are not
    dominated by each token's own row (greedy decoding would repeat one token)."""
    import torch
    import transformers

    torch.manual_seed(seed)
    attn = {"alibi": True, "alibi_bias_max": 8, "clip_qkv": None, "qk_ln": False,
            "softmax_scale": None}
    attn.update(attn_config or {})
    cfg = dict(d_model=d_model, n_heads=n_heads, n_layers=2, expansion_ratio=4,
               vocab_size=VOCAB, max_seq_len=64, no_bias=True, layer_norm_epsilon=1e-5,
               attn_config=attn)
    cfg.update(kw)
    model = randomize(transformers.MptForCausalLM(transformers.MptConfig(**cfg)), seed)
    with torch.no_grad():
        model.transformer.wte.weight.mul_(0.1)
    return model


@pytest.fixture(scope="module")
def cases(tmp_path_factory):
    """name -> (HF model, its folder, prompt ids, HF logits of the ids)."""
    out = {}
    for k, (name, kw) in enumerate(CASES.items()):
        model = make_mpt(seed=k, **kw)
        path = save_hf(model, tmp_path_factory.mktemp(f"mpt_{name}"))
        ids = token_ids(VOCAB, seed=7 + k)
        out[name] = (model, path, ids, hf_logits(model, ids))
    return out


@pytest.fixture(scope="module")
def loaded(cases):
    """name -> the spec loaded on that case's folder (md.Model)."""
    return {name: md.load_model(spec_path("mpt"), c[1]) for name, c in cases.items()}


def test_mpt_config_from_hf(cases):
    got = hf_params("mpt", cases["alibi"][1])[2]
    assert (got["dim"], got["n_layers"], got["n_heads"], got["vocab"], got["context"]) == \
        (96, 2, 6, VOCAB, 64)
    assert got["norm_eps"] == pytest.approx(1e-5)
    assert got["clip_qkv"] is None and got["softmax_scale"] is None
    got = hf_params("mpt", cases["clip"][1])[2]
    assert (got["dim"], got["n_heads"]) == (64, 4)
    assert got["clip_qkv"] == pytest.approx(0.5)
    assert got["softmax_scale"] == pytest.approx(0.3)
    assert got["norm_eps"] == pytest.approx(1e-3)


def test_mpt_checkpoint_names(cases):
    """The tied case saves no lm_head (the spec's output falls back to wte); the untied
    one does, and neither holds a bias (transformers builds none, no_bias or not)."""
    tied = set(md.load_weights(cases["alibi"][1]).keys())
    untied = set(md.load_weights(cases["clip"][1]).keys())
    assert "lm_head.weight" not in tied and "lm_head.weight" in untied
    assert not any(k.endswith(".bias") for k in tied | untied)


@pytest.mark.parametrize("name", list(CASES))
def test_mpt_prefill_and_decode_match_hf(cases, loaded, name):
    model, path, ids, ref = cases[name]
    ours = loaded[name]
    pre, dec = compare(ours, ref, ids)
    full = rel_err(ours.logits(ids), ref)
    print(f"mpt[{name}] vs HF: prefill {pre:.2e}, decode {dec:.2e}, one call {full:.2e} "
          f"(of max|ref| {np.abs(ref).max():.2f})")
    assert pre <= TOL and dec <= TOL and full <= TOL


@pytest.mark.parametrize("name", list(CASES))
def test_mpt_greedy_generate_matches_hf(cases, loaded, name):
    """One prompt, then three prompts of different lengths decoded together."""
    assert_greedy_matches_hf(cases[name][0], loaded[name], PROMPTS, N_NEW)


@pytest.mark.parametrize("name", list(CASES))
def test_mpt_batched_step_matches_hf_padded_batch(cases, loaded, name):
    """One batched prefill step (``rows=``) of prompts of different lengths against
    transformers' forward of the same prompts left-padded into one batch with an
    attention mask, every real position compared."""
    import torch

    model = cases[name][0]
    ours = loaded[name]
    lengths = [len(p) for p in PROMPTS]
    width = max(lengths)
    ids = torch.tensor([[0] * (width - n) + p for p, n in zip(PROMPTS, lengths)])
    mask = torch.tensor([[0] * (width - n) + [1] * n for n in lengths])
    with torch.no_grad():
        ref = model(ids, attention_mask=mask, use_cache=False).logits.float().numpy()
    ref = np.concatenate([ref[b, width - n:] for b, n in enumerate(lengths)])

    g = ours.graph
    run = md.compile(g, ours.weights)
    total = sum(lengths)
    feed = {"tokens": np.concatenate([np.asarray(p, np.int64) for p in PROMPTS]),
            "positions": np.concatenate([np.arange(n, dtype=np.int64) for n in lengths]),
            "logit_rows": np.arange(total, dtype=np.int64)}
    args = []
    for v in g.inputs:
        if v.name in feed:
            args.append(feed[v.name])
        else:                                   # a KV cache: empty, one per sequence
            empty = np.zeros([d if isinstance(d, int) else 0 for d in v.type.shape],
                             v.type.dtype.numpy)
            args.append(md.PerSequence([empty.copy() for _ in PROMPTS]))
    logits = np.asarray(run(*args, rows=lengths)[0])
    err = rel_err(logits, ref)
    print(f"mpt[{name}] batched step vs HF padded batch: {err:.2e}")
    assert err <= TOL


def test_mpt_clip_qkv_matters(cases):
    """Negative control: the clip case read without its clamp is far off."""
    model, path, ids, ref = cases["clip"]
    spec = with_hf_config(md.load_spec(spec_path("mpt")), clip_qkv="{None}")
    pre, dec = compare(md.load_model(spec, path), ref, ids)
    assert pre > 10 * TOL and dec > 10 * TOL


def test_mpt_alibi_slopes_matter(cases):
    """Negative control: BLOOM-style slopes of another max bias are far off (the
    spec's slopes, not the causal mask alone, carry the positions)."""
    model, path, ids, ref = cases["alibi"]
    spec = with_hf_config(md.load_spec(spec_path("mpt")), max_alibi_bias=4.0)
    pre, dec = compare(md.load_model(spec, path), ref, ids)
    assert pre > 10 * TOL and dec > 10 * TOL


def test_mpt_base_model_checkpoint_loads(cases, tmp_path):
    """An MptModel checkpoint (names without transformer., no lm_head) loads through
    hf.prefixes and gives the tied logits."""
    model, _, ids, ref = cases["alibi"]
    path = save_hf(model.transformer, tmp_path / "base")
    keys = set(md.load_weights(path).keys())
    assert "wte.weight" in keys and not any(k.startswith("transformer.") for k in keys)
    pre, dec = compare(md.load_model(spec_path("mpt"), path), ref, ids)
    assert pre <= TOL and dec <= TOL


def test_mpt_checkpoint_with_biases(cases, tmp_path):
    """A MosaicML checkpoint with ``no_bias: false`` holds biases on every projection and
    LayerNorm; the spec adds them (its optional biases), against the same torch modules
    given those biases. (transformers 5 itself builds no biases and would drop them.)"""
    import copy

    import torch

    model = copy.deepcopy(cases["clip"][0])
    gen = torch.Generator().manual_seed(11)
    mods = [model.transformer.norm_f]
    for blk in model.transformer.blocks:
        mods += [blk.norm_1, blk.norm_2, blk.attn.Wqkv, blk.attn.out_proj, blk.ffn.up_proj,
                 blk.ffn.down_proj]
    for m in mods:
        rows = m.weight.shape[0]
        m.bias = torch.nn.Parameter(0.1 * torch.randn(rows, generator=gen))
    ids = cases["clip"][2]
    ref = hf_logits(model, ids)
    assert rel_err(ref, cases["clip"][3]) > 10 * TOL          # the biases matter
    path = save_hf(model, tmp_path / "biased")
    assert "transformer.blocks.0.attn.Wqkv.bias" in md.load_weights(path).keys()
    pre, dec = compare(md.load_model(spec_path("mpt"), path), ref, ids)
    assert pre <= TOL and dec <= TOL


def test_mpt_stops_at_max_seq_len(loaded):
    """transformers' ALiBi table has max_seq_len columns: a prompt plus new tokens past
    it is an InputError."""
    with pytest.raises(md.InputError, match="context of 64"):
        loaded["alibi"].generate(list(range(60)), 8, temperature=0)
