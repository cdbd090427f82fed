"""specs/led.yaml against transformers' LEDForConditionalGeneration.

Two small seeded float32 LEDs (vocab 256, d_model 64, encoder positions 64, decoder
positions 32), every source longer than the attention window (and not a multiple of
it, so transformers pads it internally):

- ``tied``: 2 encoder / 2 decoder layers, 4 heads each, windows [6, 12] (one-sided 3
  and 6), GELU, output tied to the shared table;
- ``untied``: 3 encoder / 1 decoder layers, 2 encoder and 4 decoder heads, windows
  [12, 4, 6], other FFN widths, ReLU, an lm_head of its own.

final_logits_bias (a buffer, zeros at init) is randomized so that it matters. The
references pass global_attention_mask with the first source token global (LED's
documented use), which the spec's default (``global_tokens: 1``) computes in the graph;
variant ``tiny_mask`` takes transformers' global_attention_mask as the graph input
``enc_global_mask`` instead (other global positions, none at all). Checked: teacher
forced logits and the encoder's last hidden state, the decoder through its KV cache,
greedy generate against transformers' generate, and negative controls (the window,
the global tokens, the global projections and the source matter).
"""

import numpy as np
import pytest

import maxdecl as md
from modelhelp import randomize, rel_err, save_hf, spec_path, with_hf_config

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

SPEC = spec_path("led")
VOCAB = 256
TOL = 1e-5                 # of max|ref|: float32 throughout

CASES = {
    "tied": dict(encoder_layers=2, decoder_layers=2, encoder_attention_heads=4,
                 decoder_attention_heads=4, encoder_ffn_dim=128, decoder_ffn_dim=128,
                 attention_window=[6, 12], activation_function="gelu",
                 tie_word_embeddings=True),
    "untied": dict(encoder_layers=3, decoder_layers=1, encoder_attention_heads=2,
                   decoder_attention_heads=4, encoder_ffn_dim=96, decoder_ffn_dim=160,
                   attention_window=[12, 4, 6], activation_function="relu",
                   tie_word_embeddings=False),
}
# (source length, decoder length): every source longer than the widest window (12)
# (transformers needs each layer's window to divide the widest: it pads to that)
LENGTHS = ((21, 9), (37, 5), (15, 1))


def make_led(kind: str, seed: int = 0):
    torch.manual_seed(seed)
    cfg = transformers.LEDConfig(vocab_size=VOCAB, d_model=64,
                                 max_encoder_position_embeddings=64,
                                 max_decoder_position_embeddings=32,
                                 attn_implementation="eager", **CASES[kind])
    model = randomize(transformers.LEDForConditionalGeneration(cfg), seed)
    gen = torch.Generator().manual_seed(seed + 100)
    with torch.no_grad():
        model.final_logits_bias.copy_(torch.randn(model.final_logits_bias.shape, generator=gen))
    return model


def first_global(n: int) -> np.ndarray:
    g = np.zeros(n, np.int64)
    g[0] = 1
    return g


def sequences():
    rng = np.random.default_rng(3)
    return [(rng.integers(0, VOCAB, s).astype(np.int64), rng.integers(0, VOCAB, t).astype(np.int64))
            for s, t in LENGTHS]


def hf_forward(model, src, dec, glob=None):
    """(logits [len(dec), vocab], encoder_last_hidden_state [len(src), dim])."""
    kw = {} if glob is None else {"global_attention_mask": torch.tensor(glob[None])}
    with torch.no_grad():
        out = model(input_ids=torch.tensor(src[None]), decoder_input_ids=torch.tensor(dec[None]),
                    use_cache=False, **kw)
    return out.logits[0].numpy(), out.encoder_last_hidden_state[0].numpy()


def empty_caches(model) -> list:
    p = model.params
    return [np.zeros((2, 0, p["dec_heads"], p["dec_head_dim"]), np.float32)
            for _ in range(p["dec_layers"])]


def ours_forward(model, src, dec, caches=None, start: int = 0, glob=None):
    """(logits, encoder output, new caches) of the spec's graph; ``glob`` is the
    enc_global_mask input of variant tiny_mask."""
    extra = [] if glob is None else [glob]
    out = model(src, np.arange(src.size, dtype=np.int64), dec,
                np.arange(start, start + dec.size, dtype=np.int64), *extra,
                *(empty_caches(model) if caches is None else caches))
    return np.asarray(out[0]), np.asarray(out[1]), list(out[2:])


@pytest.fixture(scope="module", params=list(CASES))
def case(request, tmp_path_factory):
    """(kind, HF model, its save_pretrained folder, (src, dec) pairs, reference
    (logits, encoder output) with the first source token global, the loaded model)."""
    kind = request.param
    model = make_led(kind)
    path = save_hf(model, tmp_path_factory.mktemp(f"led_{kind}") / "hf")
    seqs = sequences()
    refs = [hf_forward(model, s, d, first_global(s.size)) for s, d in seqs]
    return kind, model, path, seqs, refs, md.load_model(SPEC, path)


def max_err(model, seqs, refs) -> float:
    return max(rel_err(ours_forward(model, s, d)[0], r[0]) for (s, d), r in zip(seqs, refs))


def test_config_from_hf(case):
    kind, model, path, seqs, refs, ours = case
    c, p = CASES[kind], ours.params
    assert (p["vocab"], p["dim"], p["enc_ctx"], p["dec_ctx"], p["context"]) == (VOCAB, 64, 64, 32, 64)
    assert (p["enc_layers"], p["dec_layers"]) == (c["encoder_layers"], c["decoder_layers"])
    assert (p["enc_heads"], p["dec_heads"]) == (c["encoder_attention_heads"],
                                                c["decoder_attention_heads"])
    assert (p["enc_ffn_dim"], p["dec_ffn_dim"]) == (c["encoder_ffn_dim"], c["decoder_ffn_dim"])
    assert p["windows"] == c["attention_window"]
    assert p["activation"] == c["activation_function"]
    assert p["decoder_start"] == model.config.decoder_start_token_id
    assert ours.encoder_decoder
    assert ours.input_names[:4] == ["enc_tokens", "enc_positions", "dec_tokens", "dec_positions"]
    assert ours.output_names[:2] == ["logits", "encoder_last_hidden_state"]
    # tied: only led.shared is saved and serves all three; untied: transformers 5 keeps
    # an encoder table, a decoder table and lm_head of their own
    untied = not c["tie_word_embeddings"]
    assert ("output.weight" in ours.weights) is untied
    assert ("enc.tok_embd.weight" in ours.weights) is untied
    assert "output.bias" in ours.weights


def test_logits_match_hf(case):
    """Teacher forcing over sources longer than the window, first token global: the
    logits and the encoder's last hidden state."""
    kind, model, path, seqs, refs, ours = case
    errs, enc_errs = [], []
    for (src, dec), (ref, enc_ref) in zip(seqs, refs):
        logits, enc, _ = ours_forward(ours, src, dec)
        errs.append(rel_err(logits, ref))
        enc_errs.append(rel_err(enc, enc_ref))
    print(f"led {kind} vs HF: logits {max(errs):.2e}, encoder {max(enc_errs):.2e}")
    assert max(errs) <= TOL and max(enc_errs) <= TOL


def test_global_mask_input_matches_hf(case):
    """Variant tiny_mask: transformers' global_attention_mask as a graph input, with
    several global tokens (first, middle, last) and with none (transformers' default)."""
    kind, model, path, seqs, refs, ours = case
    m = md.load_model(SPEC, path, variant="tiny_mask")
    assert "enc_global_mask" in m.input_names
    (src, dec) = seqs[1]
    many = np.zeros(src.size, np.int64)
    many[[0, 9, 17, src.size - 1]] = 1
    none = np.zeros(src.size, np.int64)
    errs = []
    for glob in (first_global(src.size), many, none):
        ref, enc_ref = hf_forward(model, src, dec, glob)
        logits, enc, _ = ours_forward(m, src, dec, glob=glob)
        errs += [rel_err(logits, ref), rel_err(enc, enc_ref)]
    print(f"led {kind} vs HF, global mask input: {max(errs):.2e}")
    assert max(errs) <= TOL


def test_kv_cache_decode_matches_hf(case):
    """The decoder's self-attention through dec.blk.N.kv_cache: a 3-token prefix, then
    one token per step (same source each step) give the teacher-forced logits."""
    kind, model, path, seqs, refs, ours = case
    (src, dec), (ref, _) = seqs[0], refs[0]
    n = 3
    logits, _, caches = ours_forward(ours, src, dec[:n])
    assert [c.shape for c in caches] == [(2, n, ours.params["dec_heads"],
                                          ours.params["dec_head_dim"])] * len(caches)
    rows = [logits]
    for t in range(n, dec.size):
        step, _, caches = ours_forward(ours, src, dec[t:t + 1], caches, start=t)
        rows.append(step)
    err = rel_err(np.concatenate(rows), ref)
    print(f"led {kind} vs HF: prefix + cached decode {err:.2e}")
    assert err <= TOL


def test_generate_matches_hf_greedy(case):
    """model.generate: the source as the prompt (first token global), the decoder from
    decoder_start through its KV caches; transformers' greedy generate with the same
    global_attention_mask (no forced BOS/EOS, no early stop) gives the same ids."""
    kind, model, path, seqs, _, ours = case
    n_new = 10
    for src, _ in seqs[:2]:
        start = model.config.decoder_start_token_id
        with torch.no_grad():
            want = model.generate(torch.tensor(src[None]),
                                  global_attention_mask=torch.tensor(first_global(src.size)[None]),
                                  max_new_tokens=n_new, do_sample=False, num_beams=1,
                                  decoder_start_token_id=start, eos_token_id=None,
                                  forced_bos_token_id=None, forced_eos_token_id=None,
                                  pad_token_id=model.config.pad_token_id, min_length=0,
                                  no_repeat_ngram_size=0, use_cache=True)[0].tolist()
        assert want[0] == start
        got = ours.generate([int(t) for t in src], n_new, temperature=0).ids
        print(f"led {kind} generate: {got}")
        assert got == want[1:]


# -- negative controls --------------------------------------------------------------------

def test_window_matters(case):
    """The same weights read with a window as wide as the source: other logits."""
    kind, model, path, seqs, refs, ours = case
    n = len(CASES[kind]["attention_window"])
    spec = with_hf_config(md.load_spec(SPEC), attention_window=f"{{[128] * {n}}}")
    assert max_err(md.load_model(spec, path), seqs[:1], refs[:1]) > 100 * TOL


def test_global_tokens_matter(case):
    """Without the global first token (and with the global projections zeroed) the
    logits differ, so both the global key column and the global queries are wired."""
    kind, model, path, seqs, refs, ours = case
    (src, dec), (ref, _) = seqs[0], refs[0]
    m = md.load_model(SPEC, path, variant="tiny_mask")
    assert rel_err(ours_forward(m, src, dec, glob=np.zeros(src.size, np.int64))[0], ref) > 100 * TOL
    # the global queries' own projections matter to transformers (so matching its logits
    # means the spec reads them): query_global zeroed in the first layer changes them
    layer = model.led.encoder.layers[0].self_attn.longformer_self_attn
    saved = layer.query_global.weight.clone()
    with torch.no_grad():
        layer.query_global.weight.zero_()
    try:
        zero_ref = hf_forward(model, src, dec, first_global(src.size))[0]
    finally:
        with torch.no_grad():
            layer.query_global.weight.copy_(saved)
    assert rel_err(zero_ref, ref) > 100 * TOL


def test_source_matters(case):
    """The logits depend on the encoder ids (cross-attention is wired)."""
    kind, model, path, seqs, refs, ours = case
    src, dec = seqs[0]
    other = (src + 1) % VOCAB
    got = ours_forward(ours, other, dec)[0]
    assert rel_err(got, refs[0][0]) > 100 * TOL
    assert rel_err(got, hf_forward(model, other, dec, first_global(src.size))[0]) <= TOL


def test_decoder_position_past_table_fails_cleanly(case):
    """A decoder position past max_decoder_position_embeddings stops with the spec's
    message instead of reading past the table."""
    kind, model, path, seqs, refs, ours = case
    src, dec = seqs[2]
    with pytest.raises(md.GraphError, match="max_decoder_position_embeddings"):
        ours_forward(ours, src, dec, start=ours.params["dec_ctx"])
