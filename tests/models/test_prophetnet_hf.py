"""specs/prophetnet.yaml against transformers' ProphetNetForConditionalGeneration.

Two small seeded float32 ProphetNets (vocab 256):

- ``plain``: d_model 64, 2 encoder / 2 decoder layers, 4 heads each, GELU, ngram 2,
  32 buckets up to distance 128 (the released defaults), pad_token_id 0;
- ``wide``: d_model 48, 1 encoder layer of 4 heads, 2 decoder layers of 3 heads, ReLU,
  ngram 3 (exercises the order of ngram_embeddings' rows), 16 buckets up to distance
  32 (the log buckets are reached within the test lengths), pad_token_id 3 (positions
  start at 4), a source longer than the position table (clamped positions) and a
  decoder input of the longest length the position table allows.

The relative-position projection (a Linear whose name holds "embeddings", which
``randomize`` would draw N(0, 1)) is drawn N(0, 1 / d_model) like the other
projections, so its bias is of the size of the attention scores.

Each case compares, teacher-forced (enc_tokens and dec_tokens, transformers' input_ids
and decoder_input_ids, no padding): ``logits`` (the next-token logits, predict stream
0), ``logits_ngram`` (the further streams), the decoder's main and predict streams
(ProphetNetModel's last_hidden_state and last_hidden_state_ngram) and
``encoder_last_hidden_state``; and greedy generation (maxdecl's stateless decoding, no
KV cache) against transformers' greedy ``generate``.
"""

import math

import numpy as np
import pytest

import maxdecl as md
from modelhelp import randomize, rel_err, save_hf, spec_path

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

SPEC = spec_path("prophetnet")
VOCAB = 256
TOL = 1e-5                 # of max|ref|: float32 throughout

CASES = {
    "plain": dict(hidden_size=64, num_encoder_layers=2, num_decoder_layers=2,
                  num_encoder_attention_heads=4, num_decoder_attention_heads=4,
                  encoder_ffn_dim=128, decoder_ffn_dim=96, activation_function="gelu",
                  max_position_embeddings=64, ngram=2, num_buckets=32,
                  relative_max_distance=128, pad_token_id=0),
    "wide": dict(hidden_size=48, num_encoder_layers=1, num_decoder_layers=2,
                 num_encoder_attention_heads=4, num_decoder_attention_heads=3,
                 encoder_ffn_dim=96, decoder_ffn_dim=80, activation_function="relu",
                 max_position_embeddings=48, ngram=3, num_buckets=16,
                 relative_max_distance=32, pad_token_id=3),
}
# (source length, decoder length) per case
LENGTHS = {
    "plain": ((17, 24), (30, 5), (9, 1)),
    "wide": ((21, 13), (50, 7), (6, 43)),    # 50 > 48 positions; 43 = 48 - 2 - pad
}


def make_prophetnet(kind: str, seed: int = 0):
    torch.manual_seed(seed)
    cfg = transformers.ProphetNetConfig(vocab_size=VOCAB, attn_implementation="eager",
                                        **CASES[kind])
    model = randomize(transformers.ProphetNetForConditionalGeneration(cfg), seed)
    gen = torch.Generator().manual_seed(seed + 100)
    with torch.no_grad():
        for layer in model.prophetnet.decoder.layers:
            w = layer.self_attn.relative_pos_embeddings.weight
            w.copy_(torch.randn(w.shape, generator=gen) / math.sqrt(w.shape[-1]))
    return model


def sequences(kind: str):
    rng = np.random.default_rng(3)
    return [(rng.integers(0, VOCAB, s).astype(np.int64), rng.integers(0, VOCAB, t).astype(np.int64))
            for s, t in LENGTHS[kind]]


def hf_outputs(model, src, dec) -> dict:
    """transformers' outputs of one teacher-forced call, batch axis dropped."""
    ids, dids = torch.tensor(src[None]), torch.tensor(dec[None])
    n, t = model.config.ngram, dec.size
    with torch.no_grad():
        out = model(input_ids=ids, decoder_input_ids=dids, use_cache=False)
        base = model.prophetnet(input_ids=ids, decoder_input_ids=dids, use_cache=False)
    return {
        "logits": out.logits[0].numpy(),
        "logits_ngram": (out.logits_ngram[0].numpy() if out.logits_ngram is not None
                         else np.zeros((0, t, VOCAB), np.float32)),
        "last_hidden_state": base.last_hidden_state[0].numpy(),
        # [ngram * seq, dim] in transformers: stream after stream
        "last_hidden_state_ngram": base.last_hidden_state_ngram[0].numpy().reshape(n, t, -1),
        "encoder_last_hidden_state": out.encoder_last_hidden_state[0].numpy(),
    }


def ours_outputs(model, src, dec) -> dict:
    return {k: np.asarray(v) for k, v in zip(model.output_names, model(src, dec))}


@pytest.fixture(scope="module", params=list(CASES))
def case(request, tmp_path_factory):
    """(kind, HF model, its save_pretrained folder, (src, dec) pairs, reference outputs,
    the loaded maxdecl model, its outputs)."""
    kind = request.param
    model = make_prophetnet(kind)
    path = save_hf(model, tmp_path_factory.mktemp(f"prophetnet_{kind}") / "hf")
    seqs = sequences(kind)
    refs = [hf_outputs(model, s, d) for s, d in seqs]
    ours = md.load_model(SPEC, path)
    got = [ours_outputs(ours, s, d) for s, d in seqs]
    return kind, model, path, seqs, refs, ours, got


def _errors(case, name: str) -> list[float]:
    kind, model, path, seqs, refs, ours, got = case
    errs = [rel_err(g[name], r[name]) for g, r in zip(got, refs)]
    print(f"prophetnet {kind} {name}: {max(errs):.2e} ({', '.join(f'{e:.1e}' for e in errs)})")
    return errs


def test_config_from_hf(case):
    kind, model, path, seqs, refs, ours, got = case
    c, p = CASES[kind], ours.params
    assert (p["vocab"], p["dim"], p["n_pos"]) == (VOCAB, c["hidden_size"],
                                                  c["max_position_embeddings"])
    assert (p["enc_layers"], p["dec_layers"]) == (c["num_encoder_layers"], c["num_decoder_layers"])
    assert (p["enc_heads"], p["dec_heads"]) == (c["num_encoder_attention_heads"],
                                                c["num_decoder_attention_heads"])
    assert (p["enc_ffn_dim"], p["dec_ffn_dim"]) == (c["encoder_ffn_dim"], c["decoder_ffn_dim"])
    assert (p["ngram"], p["num_buckets"], p["max_distance"]) == (
        c["ngram"], c["num_buckets"], c["relative_max_distance"])
    assert p["pad"] == c["pad_token_id"] and p["activation"] == c["activation_function"]
    assert p["context"] == c["max_position_embeddings"] - 2 - c["pad_token_id"]
    assert ours.input_names == ["enc_tokens", "dec_tokens"]
    assert p["decoder_start"] == model.config.decoder_start_token_id
    assert ours.output_names[0] == "logits"
    # tied: one table serves the encoder, the decoder and the output
    assert "output.weight" not in ours.weights and "enc_token_embd.weight" not in ours.weights


def test_encoder_last_hidden_state_matches_hf(case):
    assert max(_errors(case, "encoder_last_hidden_state")) <= TOL


def test_logits_match_hf(case):
    """``logits``: transformers' next-token logits (predict stream 0)."""
    assert max(_errors(case, "logits")) <= TOL


def test_logits_ngram_match_hf(case):
    """``logits_ngram``: the 2nd, 3rd, ... next-token logits (predict streams 1..)."""
    kind, got = case[0], case[-1]
    assert all(g["logits_ngram"].shape[0] == CASES[kind]["ngram"] - 1 for g in got)
    assert max(_errors(case, "logits_ngram")) <= TOL


def test_decoder_streams_match_hf(case):
    """The decoder's main stream and its predict streams after the last layer."""
    assert max(_errors(case, "last_hidden_state")) <= TOL
    assert max(_errors(case, "last_hidden_state_ngram")) <= TOL


def test_source_and_position_matter(case):
    """Negative controls: other source ids change the logits (cross-attention is wired,
    and transformers agrees); the predict streams differ from each other."""
    kind, model, path, seqs, refs, ours, got = case
    src, dec = seqs[0]
    other = (src + 1) % VOCAB
    mine = ours_outputs(ours, other, dec)
    assert rel_err(mine["logits"], refs[0]["logits"]) > 100 * TOL
    assert rel_err(mine["logits"], hf_outputs(model, other, dec)["logits"]) <= TOL
    assert rel_err(got[0]["logits_ngram"][0], got[0]["logits"]) > 100 * TOL


GEN_TOKENS = 8


def test_generate_matches_hf_greedy(case):
    """model.generate drives the encoder-decoder without a KV cache (every step reruns
    the decoder over all its tokens): the source as the prompt, the decoder from
    decoder_start (config.json's decoder_start_token_id). transformers' greedy generate
    without its cache (use_cache=False), with no EOS stop, forced tokens, minimum length
    or repeat ban, gives the same ids, for two sources of each case (those within
    ``context``). transformers' cached ProphetNet decoding is not compared: in
    transformers 5.24 it drifts from its own uncached decoding (``plain``) or raises an
    IndexError in cache_utils (``wide``)."""
    kind, model, path, seqs, refs, ours, got = case
    start = model.config.decoder_start_token_id
    assert ours.encoder_decoder and ours.params["decoder_start"] == start
    sources = [s for s, _ in seqs if s.size <= ours.params["context"]][:2]
    assert len(sources) == 2
    for src in sources:
        with torch.no_grad():
            want = model.generate(torch.tensor(src[None]), max_new_tokens=GEN_TOKENS,
                                  do_sample=False, num_beams=1,
                                  decoder_start_token_id=start, eos_token_id=None,
                                  forced_bos_token_id=None, forced_eos_token_id=None,
                                  pad_token_id=model.config.pad_token_id, min_length=0,
                                  no_repeat_ngram_size=0, use_cache=False)[0].tolist()
        assert want[0] == start and len(want) == 1 + GEN_TOKENS
        mine = ours.generate([int(t) for t in src], GEN_TOKENS, temperature=0).ids
        print(f"prophetnet {kind} (src {src.size}): greedy {mine}")
        assert mine == want[1:]
