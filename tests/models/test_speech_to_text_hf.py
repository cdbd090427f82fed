"""specs/speech_to_text.yaml against transformers' Speech2TextForConditionalGeneration.

Two small seeded float32 Speech2Text models saved with ``save_pretrained`` (safetensors +
config.json), sizes other than the spec's tiny variant so that every size comes from
config.json:

- ``tied``: d_model 48, 2 + 2 layers, 4 encoder / 2 decoder heads, 2 conv layers (kernels
  5, 5; 32 channels) over 10 features, ReLU, scale_embedding off, pad 1, vocab 90,
  lm_head tied (not stored);
- ``untied``: d_model 40, 3 encoder + 2 decoder layers, 2 / 4 heads, 3 conv layers
  (kernels 3, 4, 5: an even one too; 20 channels) over 2 channels x 6 features, GELU,
  scale_embedding on (x sqrt(d_model)), pad 3, decoder_start 5, vocab 70, lm_head its own
  matrix.

Every parameter is random (LayerNorm gains and biases, conv biases). The decoder's token
table is scaled down (x 0.2), and the tied case uses seed 1: with N(0, 1) embeddings the
token's own embedding dominates and greedy decoding only repeats one token (checked in
test_greedy_decode_matches_hf_generate).

Each case compares the teacher-forced decoder logits with transformers' (source lengths
that differ, decoder ids with padding ids inside: fairseq's positions skip them), the same
logits through the decoder's self-attention KV cache, a greedy decode stepped through the
graph and ``model.generate`` from a features array with transformers' greedy ``generate``,
and negative controls.
"""

import numpy as np
import pytest

import maxdecl as md
from modelhelp import randomize, rel_err, save_hf, spec_path

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

SPEC = spec_path("speech_to_text")
TIGHT = 1e-5               # float32 throughout; the brief asks for 1e-4 of max|ref| or tighter
N_NEW = 8                  # greedy tokens

CASES = {
    "tied": dict(vocab_size=90, d_model=48, encoder_layers=2, decoder_layers=2,
                 encoder_attention_heads=4, decoder_attention_heads=2, encoder_ffn_dim=96,
                 decoder_ffn_dim=80, num_conv_layers=2, conv_kernel_sizes=[5, 5],
                 conv_channels=32, input_feat_per_channel=10, input_channels=1,
                 max_source_positions=40, max_target_positions=32,
                 activation_function="relu", scale_embedding=False, pad_token_id=1,
                 bos_token_id=0, eos_token_id=2, decoder_start_token_id=2,
                 tie_word_embeddings=True),
    "untied": dict(vocab_size=70, d_model=40, encoder_layers=3, decoder_layers=2,
                   encoder_attention_heads=2, decoder_attention_heads=4, encoder_ffn_dim=56,
                   decoder_ffn_dim=72, num_conv_layers=3, conv_kernel_sizes=[3, 4, 5],
                   conv_channels=20, input_feat_per_channel=6, input_channels=2,
                   max_source_positions=30, max_target_positions=24,
                   activation_function="gelu", scale_embedding=True, pad_token_id=3,
                   bos_token_id=0, eos_token_id=2, decoder_start_token_id=5,
                   tie_word_embeddings=False),
}


def n_feat(c) -> int:
    return c["input_feat_per_channel"] * c["input_channels"]


SEEDS = {"tied": 1, "untied": 0}
EMBED_SCALE = 0.2


def make_s2t(kind: str):
    seed = SEEDS[kind]
    torch.manual_seed(seed)
    cfg = transformers.Speech2TextConfig(**CASES[kind], attn_implementation="eager")
    model = randomize(transformers.Speech2TextForConditionalGeneration(cfg), seed)
    with torch.no_grad():
        for conv in model.model.encoder.conv.conv_layers:   # N(0, 1 / (C * K)): O(1) features
            conv.weight.copy_(conv.weight / conv.weight.shape[1] ** 0.5)
        model.model.decoder.embed_tokens.weight.mul_(EMBED_SCALE)
    if cfg.tie_word_embeddings:
        assert model.lm_head.weight.data_ptr() == model.model.decoder.embed_tokens.weight.data_ptr()
    return model


def hf_logits(model, feats, dec) -> np.ndarray:
    with torch.no_grad():
        out = model(input_features=torch.from_numpy(feats[None]),
                    decoder_input_ids=torch.from_numpy(np.asarray(dec, np.int64)[None]),
                    use_cache=False)
    return out.logits[0].numpy()


def hf_greedy(model, feats, n_new: int) -> list:
    """transformers' greedy generate: decoder_start, then ``n_new`` ids (no EOS stop)."""
    with torch.no_grad():
        out = model.generate(input_features=torch.from_numpy(feats[None]), max_new_tokens=n_new,
                             do_sample=False, num_beams=1, eos_token_id=None,
                             pad_token_id=model.config.pad_token_id, use_cache=True)
    return out[0].tolist()


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


@pytest.fixture(scope="module", params=list(CASES))
def case(request, tmp_path_factory):
    """(kind, HF model, its folder, [(features, decoder ids)], reference logits, the
    loaded maxdecl model)."""
    kind = request.param
    model = make_s2t(kind)
    path = save_hf(model, tmp_path_factory.mktemp(f"s2t_{kind}") / "hf")
    c = CASES[kind]
    rng = np.random.default_rng(1)
    pad, vocab = c["pad_token_id"], c["vocab_size"]
    feats = [rng.standard_normal((n, n_feat(c))).astype(np.float32) for n in (37, 24)]
    no_pad = [t for t in range(vocab) if t != pad]
    with_pads = rng.choice(no_pad, 10)
    with_pads[[3, 4, 8]] = pad                      # fairseq positions skip padding ids
    # a few decoder ids (no padding id), one id, ids with padding ids, the whole context
    seqs = [(feats[0], rng.choice(no_pad, 9)),
            (feats[1], rng.choice(no_pad, 1)),
            (feats[1], with_pads),
            (feats[0], rng.choice(no_pad, c["max_target_positions"]))]
    refs = [hf_logits(model, f, d) for f, d in seqs]
    return kind, model, path, seqs, refs, md.load_model(SPEC, path)


def test_config_from_hf(case):
    kind, model, path, seqs, refs, ours = case
    c, p = CASES[kind], ours.params
    assert {k: p[k] for k in ("vocab", "dim", "enc_layers", "dec_layers", "enc_heads",
                              "dec_heads", "enc_ffn_dim", "dec_ffn_dim", "n_conv",
                              "conv_kernels", "conv_channels", "n_feat", "context",
                              "activation_function", "pad", "decoder_start",
                              "scale_embedding")} == {
        "vocab": c["vocab_size"], "dim": c["d_model"], "enc_layers": c["encoder_layers"],
        "dec_layers": c["decoder_layers"], "enc_heads": c["encoder_attention_heads"],
        "dec_heads": c["decoder_attention_heads"], "enc_ffn_dim": c["encoder_ffn_dim"],
        "dec_ffn_dim": c["decoder_ffn_dim"], "n_conv": c["num_conv_layers"],
        "conv_kernels": c["conv_kernel_sizes"], "conv_channels": c["conv_channels"],
        "n_feat": n_feat(c), "context": c["max_target_positions"],
        "activation_function": c["activation_function"], "pad": c["pad_token_id"],
        "decoder_start": c["decoder_start_token_id"], "scale_embedding": c["scale_embedding"]}
    assert ours.input_names == ["enc_features", "dec_tokens", "dec_positions"] + [
        f"dec.blk.{i}.kv_cache" for i in range(c["decoder_layers"])]
    assert ours.output_names[0] == "logits"
    stored = set(md.load_weights(path).keys())
    if c["tie_word_embeddings"]:      # lm_head is the decoder's token table, not stored
        assert "lm_head.weight" not in stored and "output.weight" not in ours.weights
    else:
        assert "lm_head.weight" in stored and "output.weight" in ours.weights
    # every checkpoint tensor is taken (the load would fail otherwise) and nothing more
    assert len(ours.weights.keys()) == len(stored)


def test_logits_match_hf(case):
    """Teacher-forced logits: the conv subsampler with GLU, the sinusoidal positions of
    encoder and decoder (padding ids included), pre-LN layers, cross-attention, the head."""
    kind, model, path, seqs, refs, ours = case
    errs = [rel_err(ours_logits(ours, f, d)[0], r) for (f, d), r in zip(seqs, refs)]
    print(f"speech_to_text {kind} vs HF: logits " + ", ".join(f"{e:.1e}" for e in errs))
    assert max(errs) <= TIGHT


def test_kv_cache_decode_matches_hf(case):
    """A 4-token prefix, then the rest one token per step through dec.blk.N.kv_cache (the
    same features each step), gives the teacher-forced logits."""
    kind, model, path, seqs, refs, ours = case
    for (feats, dec), ref in ((seqs[0], refs[0]), (seqs[3], refs[3])):
        n = 4
        logits, caches = ours_logits(ours, feats, dec[:n])
        p = ours.params
        assert [c.shape for c in caches] == [(2, n, p["dec_heads"], p["dec_head_dim"])] * len(caches)
        rows = [logits]
        for t in range(n, dec.size):
            step, caches = ours_logits(ours, feats, dec[t:t + 1], caches, start=t)
            rows.append(step)
        err = rel_err(np.concatenate(rows), ref)
        print(f"speech_to_text {kind} vs HF: prefix + cached decode of {dec.size} ids {err:.2e}")
        assert err <= TIGHT


def test_greedy_decode_matches_hf_generate(case):
    """A greedy decode through the graph (decoder_start from config.json, then one token
    a step through the KV caches) gives transformers' greedy ids for each features array."""
    kind, model, path, seqs, refs, ours = case
    got = []
    for feats in (seqs[0][0], seqs[1][0]):
        want = hf_greedy(model, feats, N_NEW)
        assert want[0] == model.config.decoder_start_token_id and len(want) == N_NEW + 1
        ids = ours_greedy(ours, feats, N_NEW)
        print(f"speech_to_text {kind}: greedy {ids}")
        assert ids == want[1:]
        got.append(ids)
    assert len(set(got[0])) > 1                  # not one token repeated: the test has teeth
    assert got[0] != got[1]                      # the source matters


def test_generate_takes_features_array(case):
    """``model.generate`` with the array source ``enc_features`` (the encoder-decoder
    convention): transformers' greedy ids, alone and for a list of sources."""
    kind, model, path, seqs, refs, ours = case
    f0, f1 = seqs[0][0], seqs[1][0]
    want0, want1 = hf_greedy(model, f0, N_NEW)[1:], hf_greedy(model, f1, N_NEW)[1:]
    assert ours.encoder_decoder
    assert ours.generate(f0, N_NEW, temperature=0).ids == want0
    both = ours.generate([f0, f1], N_NEW, temperature=0)
    assert [o.ids for o in both] == [want0, want1]


# -- negative controls --------------------------------------------------------------------

def test_features_matter(case):
    """Other features (another length too) give other logits, and transformers agrees."""
    kind, model, path, seqs, refs, ours = case
    (feats, dec), ref = seqs[0], refs[0]
    other = seqs[1][0]
    got = ours_logits(ours, other, dec)[0]
    assert rel_err(got, ref) > 100 * TIGHT
    assert rel_err(got, hf_logits(model, other, dec)) <= TIGHT


@pytest.mark.parametrize("key", ["enc.conv.0.bias", "enc.conv.1.weight",
                                 "enc.blk.1.attn.attn_q.bias", "enc.output_norm.bias",
                                 "dec.blk.1.cross.attn_v.weight", "dec.blk.0.ln_cross.bias"])
def test_zeroed_weight_fails(case, key):
    """Each of these weights is read: zeroing it moves the logits."""
    kind, model, path, seqs, refs, ours = case
    td = md.load_weights(str(path), spec=SPEC)
    td[key] = np.zeros_like(np.asarray(td[key]))
    (feats, dec), ref = seqs[0], refs[0]
    assert rel_err(ours_logits(md.load_model(SPEC, td), feats, dec)[0], ref) > 100 * TIGHT


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
    assert rel_err(dropped, ref[n:n + 1]) > 100 * TIGHT
    moved = ours_logits(ours, feats, dec[n:n + 1], caches, start=0)[0]
    assert rel_err(moved, ref[n:n + 1]) > 100 * TIGHT


def hf_incremental_logits(model, feats, dec) -> np.ndarray:
    """transformers' logits with its own cache, one decoder id per call (its positions
    count the cache's length, padding ids included, unlike a teacher-forced call)."""
    rows, cache = [], None
    with torch.no_grad():
        for t in range(len(dec)):
            out = model(input_features=torch.from_numpy(feats[None]),
                        decoder_input_ids=torch.tensor([[int(dec[t])]]), cache=cache,
                        use_cache=True)
            cache = out.cache
            rows.append(out.logits[0, -1].numpy())
    return np.stack(rows)


def test_padding_ids_in_decoder(case):
    """fairseq's positions skip padding ids within one call ((cumsum(tok != pad) + past) *
    (tok != pad) + pad, the padding row zeros): a teacher-forced call with padding ids
    matches transformers' (test_logits_match_hf), and one id per step through the KV
    cache matches transformers' own cached steps, which differ from the teacher-forced
    logits after the first padding id."""
    kind, model, path, seqs, refs, ours = case
    (feats, dec), ref = seqs[2], refs[2]
    hf_steps = hf_incremental_logits(model, feats, dec)
    assert rel_err(hf_steps, ref) > 100 * TIGHT           # the two really differ
    assert rel_err(hf_steps[:3], ref[:3]) <= TIGHT         # before the first padding id
    rows, caches = [], None
    for t in range(dec.size):
        step, caches = ours_logits(ours, feats, dec[t:t + 1], caches, start=t)
        rows.append(step[-1])
    err = rel_err(np.stack(rows), hf_steps)
    print(f"speech_to_text {kind} vs HF: cached steps over padding ids {err:.2e}")
    assert err <= TIGHT


def test_pad_zero_and_odd_width(tmp_path):
    """pad_token_id 0 (transformers then gives every encoder frame the zero padding row of
    the position table) and an odd d_model (the table's zero last column), head widths 15
    and 9, one conv layer."""
    cfg = dict(vocab_size=60, d_model=45, encoder_layers=1, decoder_layers=1,
               encoder_attention_heads=3, decoder_attention_heads=5, encoder_ffn_dim=32,
               decoder_ffn_dim=24, num_conv_layers=1, conv_kernel_sizes=[3], conv_channels=16,
               input_feat_per_channel=8, input_channels=1, max_source_positions=20,
               max_target_positions=16, activation_function="relu", scale_embedding=True,
               pad_token_id=0, bos_token_id=1, eos_token_id=2, decoder_start_token_id=2,
               tie_word_embeddings=True)
    torch.manual_seed(3)
    model = randomize(transformers.Speech2TextForConditionalGeneration(
        transformers.Speech2TextConfig(**cfg, attn_implementation="eager")), 3)
    path = save_hf(model, tmp_path / "hf")
    ours = md.load_model(SPEC, path)
    assert ours.params["pad"] == 0 and ours.params["enc_pos_on"] == 0.0
    rng = np.random.default_rng(2)
    feats = rng.standard_normal((19, 8)).astype(np.float32)
    dec = np.array([2, 5, 0, 7, 9, 0, 11], np.int64)
    err = rel_err(ours_logits(ours, feats, dec)[0], hf_logits(model, feats, dec))
    print(f"speech_to_text pad 0, d_model 45 vs HF: logits {err:.2e}")
    assert err <= TIGHT


@pytest.mark.parametrize("key, value, why", [
    ("pad_token_id", None, "padding index"),
    ("conv_kernel_sizes", [5], "1 entries for .* conv layers"),
])
def test_unsupported_configs_are_refused(case, key, value, why):
    """A null pad_token_id (transformers' positions need one) and a kernel list that does
    not fit num_conv_layers fail the load with the spec's message."""
    kind, model, path, seqs, refs, ours = case
    td = md.load_weights(str(path))
    td.metadata[key] = value
    with pytest.raises(md.WeightsError, match=why):
        md.load_model(SPEC, td)


def test_long_source_and_context(tmp_path):
    """The sinusoidal tables far out: 6400 frames (1600 encoder positions) and 1024 decoder
    ids, d_model 256 (128 frequencies), the conv filters scaled down so that the positions
    carry the encoder's input. transformers computes the tables in float32; the spec's
    frequencies are rounded as torch's (a float32 exp in the graph would be off by an ulp
    for about half of them: 7e-6 here instead of 6e-7)."""
    cfg = dict(vocab_size=60, d_model=256, encoder_layers=1, decoder_layers=1,
               encoder_attention_heads=4, decoder_attention_heads=4, encoder_ffn_dim=64,
               decoder_ffn_dim=64, num_conv_layers=2, conv_kernel_sizes=[5, 5],
               conv_channels=32, input_feat_per_channel=8, max_source_positions=2000,
               max_target_positions=1100, scale_embedding=False)
    torch.manual_seed(0)
    model = randomize(transformers.Speech2TextForConditionalGeneration(
        transformers.Speech2TextConfig(**cfg, attn_implementation="eager")), 0)
    with torch.no_grad():
        model.model.decoder.embed_tokens.weight.mul_(0.05)
        for conv in model.model.encoder.conv.conv_layers:
            conv.weight.mul_(0.01)
    path = save_hf(model, tmp_path / "hf")
    rng = np.random.default_rng(0)
    feats = rng.standard_normal((6400, 8)).astype(np.float32)
    dec = rng.integers(2, 60, 1024)
    err = rel_err(ours_logits(md.load_model(SPEC, path), feats, dec)[0],
                  hf_logits(model, feats, dec))
    print(f"speech_to_text 1600 encoder / 1024 decoder positions vs HF: logits {err:.2e}")
    assert err <= TIGHT
