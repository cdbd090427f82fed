"""specs/t5.yaml against transformers' T5ForConditionalGeneration.

Small seeded float32 T5s (vocab 120, 2 encoder layers):

- ``relu``: the original T5: ReLU feed-forward, 4 heads of 16 (inner 64 = d_model), 3
  decoder layers (num_decoder_layers != num_layers), 24 buckets / max_distance 30 (a
  40-token decoder input reaches the exact, logarithmic and saturated buckets of the
  decoder's unidirectional bias), tied lm_head with T5's d_model ** -0.5 rescaling;
- ``gated``: T5 v1.1 / flan-t5: gated GELU (gelu_new), 6 heads of 16 (inner 96 !=
  d_model 48), T5's 32 buckets / 128, tie_word_embeddings false: no rescaling. Saved by
  transformers 5, which ties lm_head to the shared table anyway (scale_decoder_outputs);
- ``untied``: the ``gated`` folder rewritten as transformers 4 saved T5 v1.1: an
  lm_head.weight of its own and tie_word_embeddings false, without
  scale_decoder_outputs, is_gated_act or dense_act_fn (transformers 5 loads it untied:
  that model is the reference).

Each case compares the teacher-forced logits (encoder ids and decoder ids, no padding)
with transformers', then the same logits computed step by step through the decoder
state (dec.key_positions and the self-attention KV caches), greedy decoding against
transformers' ``generate``, and negative controls (a perturbed weight, the output
scaling, the decoder state, the encoder ids).
"""

import json
import os
import shutil

import numpy as np
import pytest

import maxdecl as md
from modelhelp import randomize, rel_err, save_hf, spec_path, with_hf_config

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

SPEC = spec_path("t5")
VOCAB = 120
TOL = 1e-5                 # of max|ref| (modelhelp.TOL is 1e-3): float32 throughout

CONFIGS = {
    "relu": dict(d_model=64, d_kv=16, num_heads=4, d_ff=128, feed_forward_proj="relu",
                 num_layers=2, num_decoder_layers=3, relative_attention_num_buckets=24,
                 relative_attention_max_distance=30),
    "gated": dict(d_model=48, d_kv=16, num_heads=6, d_ff=96, feed_forward_proj="gated-gelu",
                  num_layers=2, relative_attention_num_buckets=32,
                  relative_attention_max_distance=128, tie_word_embeddings=False),
}
CASES = ("relu", "gated", "untied")
# (encoder length, decoder length): a long target, a short one, one decoder token
LENGTHS = ((21, 40), (6, 13), (11, 1))


def make_t5(kind: str, seed: int = 0):
    torch.manual_seed(seed)
    cfg = transformers.T5Config(vocab_size=VOCAB, layer_norm_epsilon=1e-6,
                                attn_implementation="eager", **CONFIGS[kind])
    model = randomize(transformers.T5ForConditionalGeneration(cfg), seed)
    with torch.no_grad():       # T5 does not scale q.k: keep the softmaxes soft
        for stack in (model.encoder, model.decoder):
            for block in stack.block:
                for layer in block.layer[:-1]:
                    attn = getattr(layer, "SelfAttention", None) or layer.EncDecAttention
                    attn.q.weight.mul_(cfg.d_kv ** -0.5)
            # a position bias that matters next to q.k
            stack.block[0].layer[0].SelfAttention.relative_attention_bias.weight.mul_(4.0)
    return model


def rewrite(src, dst, tensors=None, config=None) -> str:
    """A copy of the HF folder ``src`` at ``dst``, its tensors and config.json edited by
    the callables ``tensors(dict)`` and ``config(dict)`` (in place)."""
    from safetensors.numpy import load_file, save_file

    os.makedirs(dst, exist_ok=True)
    td = load_file(os.path.join(src, "model.safetensors"))
    if tensors:
        tensors(td)
    save_file(td, os.path.join(dst, "model.safetensors"), metadata={"format": "pt"})
    cfg = json.load(open(os.path.join(src, "config.json")))
    if config:
        config(cfg)
    json.dump(cfg, open(os.path.join(dst, "config.json"), "w"))
    return str(dst)


def add_lm_head(td):
    """An lm_head.weight of its own (T5 v1.1's untied output matrix)."""
    td["lm_head.weight"] = np.random.default_rng(5).standard_normal(
        td["shared.weight"].shape).astype(np.float32)


def transformers4_config(cfg):
    """config.json as google/t5-v1_1-* on the Hub has it: tie_word_embeddings false, no
    scale_decoder_outputs (transformers 5), no is_gated_act / dense_act_fn (derived from
    feed_forward_proj)."""
    cfg["tie_word_embeddings"] = False
    for key in ("scale_decoder_outputs", "is_gated_act", "dense_act_fn"):
        cfg.pop(key, None)


def sequences():
    rng = np.random.default_rng(3)
    return [(rng.integers(0, VOCAB, s).astype(np.int64), rng.integers(0, VOCAB, t).astype(np.int64))
            for s, t in LENGTHS]


def hf_logits(model, src, dec) -> np.ndarray:
    with torch.no_grad():
        out = model(input_ids=torch.tensor(src[None]), decoder_input_ids=torch.tensor(dec[None]),
                    use_cache=False)
    return out.logits[0].numpy()


def empty_state(model) -> dict:
    """The decoder state of a first step: every ``past`` dim 0."""
    return {v.name: np.zeros([d if isinstance(d, int) else 0 for d in v.type.shape],
                             v.type.dtype.numpy)
            for v in model.graph.inputs if v.name in model.output_names}


def ours_step(model, src, dec, state=None, start: int = 0):
    """(logits [len(dec), vocab], new state) of one call of the spec's graph."""
    feed = {"enc_tokens": src, "enc_positions": np.arange(src.size, dtype=np.int64),
            "dec_tokens": dec, "dec_positions": np.arange(start, start + dec.size, dtype=np.int64),
            **(empty_state(model) if state is None else state)}
    got = dict(zip(model.output_names, model(*(feed[n] for n in model.input_names))))
    return np.asarray(got["logits"]), {n: got[n] for n in feed if n in got}


def max_err(model, seqs, refs) -> float:
    return max(rel_err(ours_step(model, s, d)[0], r) for (s, d), r in zip(seqs, refs))


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    """kind -> (HF reference model, its folder): each built and saved once."""
    out = {}
    for kind in CONFIGS:
        model = make_t5(kind)
        out[kind] = model, save_hf(model, tmp_path_factory.mktemp(f"t5_{kind}") / "hf")
    path = rewrite(out["gated"][1], tmp_path_factory.mktemp("t5_untied") / "hf",
                   tensors=add_lm_head, config=transformers4_config)
    out["untied"] = transformers.T5ForConditionalGeneration.from_pretrained(path).eval(), path
    return out


@pytest.fixture(scope="module", params=CASES)
def case(request, folders):
    """(kind, HF model, folder, (src, dec) pairs, reference logits, loaded maxdecl model)."""
    kind = request.param
    model, path = folders[kind]
    seqs = sequences()
    refs = [hf_logits(model, s, d) for s, d in seqs]
    return kind, model, path, seqs, refs, md.load_model(SPEC, path)


def test_decoder_buckets_cover_exact_log_and_far():
    """The 40-token decoder input reaches every kind of unidirectional bucket
    (transformers' own function) in the ``relu`` case; the encoder's 21 tokens reach
    exact and logarithmic bidirectional ones."""
    from transformers.models.t5.modeling_t5 import T5Attention

    nb = CONFIGS["relu"]["relative_attention_num_buckets"]
    far = CONFIGS["relu"]["relative_attention_max_distance"]
    n = LENGTHS[0][1]
    rel = torch.arange(n)[None, :] - torch.arange(n)[:, None]
    b = T5Attention._relative_position_bucket(rel, False, nb, far).numpy()
    assert (b < nb // 2).any() and ((b >= nb // 2) & (b < nb - 1)).any() and (b == nb - 1).any()
    n = LENGTHS[0][0]
    rel = torch.arange(n)[None, :] - torch.arange(n)[:, None]
    b = T5Attention._relative_position_bucket(rel, True, nb, far).numpy() % (nb // 2)
    assert (b < nb // 4).any() and (b >= nb // 4).any()


def test_config_from_hf(case):
    kind, model, path, seqs, refs, ours = case
    c, p = model.config, ours.params
    assert (p["vocab"], p["dim"], p["head_dim"], p["n_heads"], p["ffn_dim"]) == (
        VOCAB, c.d_model, c.d_kv, c.num_heads, c.d_ff)
    assert (p["enc_layers"], p["dec_layers"]) == (c.num_layers, c.num_decoder_layers)
    assert (p["n_buckets"], p["max_distance"]) == (c.relative_attention_num_buckets,
                                                   c.relative_attention_max_distance)
    assert p["gated"] is (kind != "relu")
    assert p["ffn_act"] == ("relu" if kind == "relu" else "gelu_new")
    assert p["scale_out"] is (kind == "relu") is c.scale_decoder_outputs
    assert ours.input_names[:4] == ["enc_tokens", "enc_positions", "dec_tokens", "dec_positions"]
    assert ours.output_names[0] == "logits"
    assert ("output.weight" in ours.weights) is (kind == "untied")
    assert ("enc.blk.0.ffn_gate.weight" in ours.weights) is (kind != "relu")
    assert "dec.blk.0.attn_rel_b.weight" in ours.weights
    assert "dec.blk.1.attn_rel_b.weight" not in ours.weights


def test_logits_match_hf(case):
    kind, model, path, seqs, refs, ours = case
    errs = [rel_err(ours_step(ours, s, d)[0], r) for (s, d), r in zip(seqs, refs)]
    print(f"t5 {kind} vs HF: logits {max(errs):.2e} ({', '.join(f'{e:.1e}' for e in errs)})")
    assert max(errs) <= TOL


def test_decoder_state_steps_match_hf(case):
    """A 4-token prefix, a 3-token chunk, then one token per step (same encoder ids each
    step), fed the state each step returned, give the teacher-forced logits."""
    kind, model, path, seqs, refs, ours = case
    (src, dec), ref = seqs[0], refs[0]
    p = ours.params
    logits, state = ours_step(ours, src, dec[:4])
    assert state["dec.key_positions"].tolist() == [0, 1, 2, 3]
    assert state["dec.blk.0.kv_cache"].shape == (2, 4, p["n_heads"], p["head_dim"])
    rows, t = [logits], 4
    for n in [3] + [1] * (dec.size - 7):
        step, state = ours_step(ours, src, dec[t:t + n], state, start=t)
        rows.append(step)
        t += n
    err = rel_err(np.concatenate(rows), ref)
    print(f"t5 {kind} vs HF: prefix + stepped decode {err:.2e}")
    assert err <= TOL
    assert state["dec.key_positions"].tolist() == list(range(dec.size))


def test_greedy_decode_matches_generate(case):
    """Greedy decoding through the decoder state gives transformers' generate ids
    (transformers' own cache is off: with num_decoder_layers != num_layers its
    EncoderDecoderCache raises IndexError in cache_utils)."""
    kind, model, path, seqs, refs, ours = case
    src = seqs[1][0]
    start = 0                   # T5's decoder start: the pad id
    with torch.no_grad():
        want = model.generate(torch.tensor(src[None]), max_new_tokens=10, do_sample=False,
                              decoder_start_token_id=start, eos_token_id=None,
                              pad_token_id=0, min_length=0, use_cache=False)[0].tolist()
    got, state, ids = [start], None, np.array([start], np.int64)
    for t in range(10):
        logits, state = ours_step(ours, src, ids, state, start=t)
        ids = np.array([int(np.argmax(logits[-1]))], np.int64)
        got.append(int(ids[0]))
    assert got == want
    # model.generate drives the encoder-decoder itself: the source as the prompt, the
    # decoder from the spec's decoder_start (config.json's decoder_start_token_id)
    assert ours.encoder_decoder and ours.params["decoder_start"] == start
    out = ours.generate([int(t) for t in src], 10, temperature=0)
    assert out.ids == want[1:] and out.prompt_tokens == len(src)
    both = ours.generate([[int(t) for t in src], [int(t) for t in seqs[0][0]]], 10,
                         temperature=0)
    assert both[0].ids == want[1:]


# -- negative controls --------------------------------------------------------------------

def test_perturbed_weight_fails(case, tmp_path):
    """The decoder's relative-bias table (read once, used by every decoder layer)
    perturbed on disk: large errors."""
    kind, model, path, seqs, refs, ours = case
    name = "decoder.block.0.layer.0.SelfAttention.relative_attention_bias.weight"

    def perturb(td):
        td[name] = td[name] + np.random.default_rng(1).standard_normal(td[name].shape).astype(np.float32)

    bad = md.load_model(SPEC, rewrite(path, tmp_path / "bad", tensors=perturb))
    assert max_err(bad, seqs[:2], refs[:2]) > 100 * TOL


def test_output_scaling_matters(case):
    """The d_model ** -0.5 rescaling read the other way round: other logits."""
    kind, model, path, seqs, refs, ours = case
    flipped = "{False}" if kind == "relu" else "{True}"
    m = md.load_model(with_hf_config(md.load_spec(SPEC), scale_out=flipped), path)
    assert m.params["scale_out"] is (kind != "relu")
    assert max_err(m, seqs[:1], refs[:1]) > 100 * TOL


def test_decoder_state_matters(case):
    """One decode step after a 12-token prefix, with the state tampered with: the key
    positions shifted (the relative bias moves) or the KV caches zeroed: wrong logits."""
    kind, model, path, seqs, refs, ours = case
    (src, dec), ref = seqs[0], refs[0]
    _, state = ours_step(ours, src, dec[:12])
    step, _ = ours_step(ours, src, dec[12:13], state, start=12)
    assert rel_err(step[0], ref[12]) <= TOL
    shifted = {**state, "dec.key_positions": state["dec.key_positions"] + 5}
    zeroed = {n: np.zeros_like(v) if n.endswith("kv_cache") else v for n, v in state.items()}
    for bad in (shifted, zeroed):
        step, _ = ours_step(ours, src, dec[12:13], bad, start=12)
        assert rel_err(step[0], ref[12]) > 100 * TOL


def test_source_matters(case):
    """The logits depend on the encoder ids (cross-attention is wired), as transformers'."""
    kind, model, path, seqs, refs, ours = case
    src, dec = seqs[0]
    other = (src + 1) % VOCAB
    got = ours_step(ours, other, dec)[0]
    assert rel_err(got, refs[0]) > 100 * TOL
    assert rel_err(got, hf_logits(model, other, dec)) <= TOL
