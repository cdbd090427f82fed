"""specs/whisper.yaml against transformers' WhisperForConditionalGeneration.

Two small seeded float32 Whispers saved with ``save_pretrained`` (safetensors +
config.json), sizes other than the spec's tiny variant so that every size comes from
config.json:

- ``tied``: d_model 64, 2 + 2 layers, 4 encoder / 2 decoder heads, 16 mel bins, 24
  encoder positions, 32 decoder positions, GELU, vocab 100, proj_out tied (not stored);
- ``untied``: d_model 48, 2 + 2 layers, 2 encoder / 4 decoder heads, 12 mel bins, 16
  encoder positions, 20 decoder positions, gelu_new, vocab 80, tie_word_embeddings false
  (proj_out.weight stored, its own matrix), another decoder_start_token_id.

Every parameter is random (LayerNorm gains and biases, conv biases, both position
tables). The decoder's token table is scaled down (x 0.05): with a tied output and N(0, 1)
embeddings, each position's own token embedding dominates the logits and greedy decoding
only repeats the start token.

Each case compares the teacher-forced decoder logits with transformers', the same logits
through the decoder's self-attention KV cache (a prefix, then one token per step), a
greedy decode stepped through the graph with transformers' greedy ``generate``, and
negative controls (other features, zeroed weights, another activation, a dropped or
misplaced KV cache), and ``model.generate`` from a spectrogram (the encoder-decoder
convention with the array source ``enc_features``).
"""

import numpy as np
import pytest

import maxdecl as md
from modelhelp import TOL, randomize, rel_err, save_hf, spec_path, with_hf_config

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

SPEC = spec_path("whisper")
TIGHT = 1e-5               # float32 throughout: much tighter than TOL (1e-3 of max|ref|)
N_NEW = 8                  # greedy tokens

CASES = {
    "tied": dict(vocab_size=100, d_model=64, encoder_layers=2, decoder_layers=2,
                 encoder_attention_heads=4, decoder_attention_heads=2, encoder_ffn_dim=128,
                 decoder_ffn_dim=96, num_mel_bins=16, max_source_positions=24,
                 max_target_positions=32, activation_function="gelu",
                 decoder_start_token_id=4, tie_word_embeddings=True),
    "untied": dict(vocab_size=80, d_model=48, encoder_layers=2, decoder_layers=2,
                   encoder_attention_heads=2, decoder_attention_heads=4, encoder_ffn_dim=80,
                   decoder_ffn_dim=112, num_mel_bins=12, max_source_positions=16,
                   max_target_positions=20, activation_function="gelu_new",
                   decoder_start_token_id=7, tie_word_embeddings=False),
}
SPECIAL = dict(pad_token_id=1, bos_token_id=2, eos_token_id=3)


def make_whisper(kind: str, seed: int = 0):
    torch.manual_seed(seed)
    cfg = transformers.WhisperConfig(**CASES[kind], **SPECIAL, attn_implementation="eager")
    model = randomize(transformers.WhisperForConditionalGeneration(cfg), seed)
    with torch.no_grad():
        enc = model.get_encoder()
        for conv in (enc.conv1, enc.conv2):      # filters N(0, 1 / (C * K)): features O(1)
            conv.weight.copy_(conv.weight / conv.weight.shape[1] ** 0.5)
        model.model.decoder.embed_tokens.weight.mul_(0.05)
    if cfg.tie_word_embeddings:
        assert model.proj_out.weight.data_ptr() == model.model.decoder.embed_tokens.weight.data_ptr()
    return model


def hf_logits(model, feats, dec) -> np.ndarray:
    with torch.no_grad():
        out = model(input_features=torch.from_numpy(feats[None]),
                    decoder_input_ids=torch.from_numpy(dec[None]), use_cache=False)
    return out.logits[0].numpy()


def empty_caches(model) -> list:
    p = model.params
    return [np.zeros((2, 0, p["dec_heads"], p["dec_head_dim"]), np.float32)
            for _ in range(p["dec_layers"])]


def ours_logits(model, feats, dec, caches=None, start: int = 0):
    """(logits [len(dec), vocab], new caches) of one call of the spec's graph."""
    out = model(feats, np.asarray(dec, np.int64),
                np.arange(start, start + len(dec), dtype=np.int64),
                *(empty_caches(model) if caches is None else caches))
    return np.asarray(out[0]), list(out[1:])


def ours_greedy(model, feats, n_new: int) -> list:
    """Greedy ids after decoder_start, one decoder token per step through the KV caches."""
    logits, caches = ours_logits(model, feats, [model.params["decoder_start"]])
    ids = []
    for t in range(n_new):
        ids.append(int(np.argmax(logits[-1])))
        if len(ids) < n_new:
            logits, caches = ours_logits(model, feats, ids[-1:], caches, start=t + 1)
    return ids


def hf_greedy(model, feats, n_new: int) -> list:
    """transformers' generic greedy generate (GenerationMixin; Whisper's own generate adds
    its task / language / timestamp logic): decoder_start, then ``n_new`` ids."""
    with torch.no_grad():
        out = transformers.GenerationMixin.generate(
            model, input_features=torch.from_numpy(feats[None]), max_new_tokens=n_new,
            do_sample=False, num_beams=1, decoder_start_token_id=model.config.decoder_start_token_id,
            eos_token_id=None, pad_token_id=1, begin_suppress_tokens=None, suppress_tokens=None,
            forced_decoder_ids=None, use_cache=True)
    return out[0].tolist()


@pytest.fixture(scope="module", params=list(CASES))
def case(request, tmp_path_factory):
    """(kind, HF model, its folder, [(features, decoder ids)], reference logits, the
    loaded maxdecl model)."""
    kind = request.param
    model = make_whisper(kind)
    path = save_hf(model, tmp_path_factory.mktemp(f"whisper_{kind}") / "hf")
    c = CASES[kind]
    rng = np.random.default_rng(1)
    feats = [rng.standard_normal((c["num_mel_bins"], 2 * c["max_source_positions"]))
             .astype(np.float32) for _ in range(2)]
    # a few decoder ids, one id, and the whole decoder position table
    seqs = [(feats[0], rng.integers(0, c["vocab_size"], 9)),
            (feats[1], rng.integers(0, c["vocab_size"], 1)),
            (feats[1], rng.integers(0, c["vocab_size"], c["max_target_positions"]))]
    refs = [hf_logits(model, f, d) for f, d in seqs]
    return kind, model, path, seqs, refs, md.load_model(SPEC, path)


def test_config_from_hf(case):
    kind, model, path, seqs, refs, ours = case
    c, p = CASES[kind], ours.params
    assert {k: p[k] for k in ("vocab", "dim", "enc_layers", "dec_layers", "enc_heads",
                              "dec_heads", "enc_ffn_dim", "dec_ffn_dim", "n_mels", "n_ctx",
                              "context", "activation_function", "decoder_start")} == {
        "vocab": c["vocab_size"], "dim": c["d_model"], "enc_layers": c["encoder_layers"],
        "dec_layers": c["decoder_layers"], "enc_heads": c["encoder_attention_heads"],
        "dec_heads": c["decoder_attention_heads"], "enc_ffn_dim": c["encoder_ffn_dim"],
        "dec_ffn_dim": c["decoder_ffn_dim"], "n_mels": c["num_mel_bins"],
        "n_ctx": c["max_source_positions"], "context": c["max_target_positions"],
        "activation_function": c["activation_function"],
        "decoder_start": c["decoder_start_token_id"]}
    assert p["frames"] == 2 * c["max_source_positions"]
    assert ours.input_names == ["enc_features", "dec_tokens", "dec_positions"] + [
        f"dec.blk.{i}.kv_cache" for i in range(c["decoder_layers"])]
    assert ours.output_names[0] == "logits"
    stored = set(md.load_weights(path).keys())
    if c["tie_word_embeddings"]:      # proj_out is the decoder's token table, not stored
        assert "proj_out.weight" not in stored and "output.weight" not in ours.weights
    else:
        assert "proj_out.weight" in stored and "output.weight" in ours.weights
    # every checkpoint tensor is taken (the load would fail otherwise) and nothing more
    assert len(ours.weights.keys()) == len(stored)


def test_logits_match_hf(case):
    kind, model, path, seqs, refs, ours = case
    errs = [rel_err(ours_logits(ours, f, d)[0], r) for (f, d), r in zip(seqs, refs)]
    print(f"whisper {kind} vs HF: logits " + ", ".join(f"{e:.1e}" for e in errs))
    assert max(errs) <= TOL
    assert max(errs) <= TIGHT


def test_kv_cache_decode_matches_hf(case):
    """The decoder's self-attention through dec.blk.N.kv_cache: a 4-token prefix, then the
    rest one token per step (the same features each step) give the teacher-forced logits."""
    kind, model, path, seqs, refs, ours = case
    (feats, dec), ref = seqs[0], refs[0]
    n = 4
    logits, caches = ours_logits(ours, feats, dec[:n])
    p = ours.params
    assert [c.shape for c in caches] == [(2, n, p["dec_heads"], p["dec_head_dim"])] * len(caches)
    rows = [logits]
    for t in range(n, dec.size):
        step, caches = ours_logits(ours, feats, dec[t:t + 1], caches, start=t)
        rows.append(step)
    err = rel_err(np.concatenate(rows), ref)
    print(f"whisper {kind} vs HF: prefix + cached decode {err:.2e}")
    assert err <= TOL and err <= TIGHT


def test_greedy_decode_matches_hf_generate(case):
    """A greedy decode through the graph (decoder_start from config.json, then one token
    a step through the KV caches) gives transformers' greedy ids for each spectrogram."""
    kind, model, path, seqs, refs, ours = case
    got = []
    for feats in (seqs[0][0], seqs[1][0]):
        want = hf_greedy(model, feats, N_NEW)
        assert want[0] == model.config.decoder_start_token_id
        ids = ours_greedy(ours, feats, N_NEW)
        print(f"whisper {kind}: greedy {ids}")
        assert ids == want[1:]
        got.append(ids)
    assert len(set(got[0])) > 1                  # not one token repeated: the test has teeth


# -- negative controls --------------------------------------------------------------------

def test_features_matter(case):
    """The logits depend on the spectrogram (the encoder and cross-attention are wired):
    other features give other logits, and transformers agrees with them."""
    kind, model, path, seqs, refs, ours = case
    (feats, dec), ref = seqs[0], refs[0]
    other = seqs[1][0]
    got = ours_logits(ours, other, dec)[0]
    assert rel_err(got, ref) > 100 * TOL
    assert rel_err(got, hf_logits(model, other, dec)) <= TIGHT


@pytest.mark.parametrize("key", ["enc.position_embd.weight", "enc.conv1.bias",
                                 "enc.blk.1.attn_q.bias", "dec.position_embd.weight",
                                 "dec.blk.1.cross_attn_k.weight", "dec.blk.0.ln_cross.bias"])
def test_zeroed_weight_fails(case, key):
    """Each of these weights is read: zeroing it moves the logits past TOL."""
    kind, model, path, seqs, refs, ours = case
    td = md.load_weights(str(path), spec=SPEC)
    td[key] = np.zeros_like(np.asarray(td[key]))
    (feats, dec), ref = seqs[0], refs[0]
    assert rel_err(ours_logits(md.load_model(SPEC, td), feats, dec)[0], ref) > 10 * TOL


def test_activation_is_read(case):
    """The MLP activation comes from config.json: quick_gelu instead moves the logits."""
    kind, model, path, seqs, refs, ours = case
    spec = with_hf_config(md.load_spec(SPEC), activation_function="{'quick_gelu'}")
    m = md.load_model(spec, md.load_weights(str(path)))
    assert m.params["activation_function"] == "quick_gelu"
    (feats, dec), ref = seqs[0], refs[0]
    assert rel_err(ours_logits(m, feats, dec)[0], ref) > TOL


def test_kv_cache_matters(case):
    """One decode step after a prefix with the caches dropped, or at the wrong position,
    gives other logits than the teacher-forced ones."""
    kind, model, path, seqs, refs, ours = case
    (feats, dec), ref = seqs[0], refs[0]
    n = 5
    _, caches = ours_logits(ours, feats, dec[:n])
    good = ours_logits(ours, feats, dec[n:n + 1], caches, start=n)[0]
    assert rel_err(good, ref[n:n + 1]) <= TIGHT
    dropped = ours_logits(ours, feats, dec[n:n + 1], None, start=n)[0]
    assert rel_err(dropped, ref[n:n + 1]) > 10 * TOL
    moved = ours_logits(ours, feats, dec[n:n + 1], caches, start=0)[0]
    assert rel_err(moved, ref[n:n + 1]) > 10 * TOL


def test_wrong_number_of_frames_is_refused(case):
    """transformers requires exactly 2 * max_source_positions frames; so does the spec."""
    kind, model, path, seqs, refs, ours = case
    feats, dec = seqs[0]
    with pytest.raises(md.MaxdeclError, match="features"):
        ours_logits(ours, feats[:, :-2], dec)


# -- model.generate --------------------------------------------------------------------------

def test_generate_takes_audio_features(case):
    kind, model, path, seqs, refs, ours = case
    feats = seqs[0][0]
    want = hf_greedy(model, feats, N_NEW)[1:]
    assert ours.encoder_decoder
    assert ours.generate(feats, N_NEW, temperature=0).ids == want
    both = ours.generate([feats, seqs[1][0]], N_NEW, temperature=0)
    assert both[0].ids == want and len(both[1].ids) == N_NEW
    with pytest.raises(md.InputError, match="source is an array"):
        ours.generate([1, 2, 3], N_NEW)
