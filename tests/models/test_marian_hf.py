"""specs/marian.yaml against transformers' MarianMTModel.

Two small seeded float32 Marians (d_model 64, 64 positions), saved with
``save_pretrained`` and loaded back by both sides (the sinusoidal position tables are
not saved: transformers recomputes them on load, the spec computes them in the graph):

- ``shared``: one shared table of 256 tokens (share_encoder_decoder_embeddings, tied
  lm_head: only ``model.shared.weight`` is saved), 2 encoder / 2 decoder layers, 4 / 2
  heads, swish, scale_embedding true (embeddings times 8);
- ``separate``: encoder vocabulary 300, decoder vocabulary 260
  (share_encoder_decoder_embeddings false, decoder_vocab_size), an untied lm_head,
  1 encoder / 3 decoder layers, 2 / 4 heads, GELU, scale_embedding false.

final_logits_bias (a buffer, zeros at init) is randomized so that it matters. Each case
compares the teacher-forced logits and the encoder's output with transformers', the
same logits through the decoder's KV cache, greedy generation, the sinusoidal table at
d_model 512 over 512 positions (opus-mt's sizes), and negative controls.
"""

import json
import os
import shutil

import numpy as np
import pytest

import maxdecl as md
from modelhelp import randomize, rel_err, save_hf, spec_path

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

SPEC = spec_path("marian")
TOL = 1e-5                 # of max|ref|: float32 throughout

CASES = {
    "shared": dict(vocab_size=256, encoder_layers=2, decoder_layers=2,
                   encoder_attention_heads=4, decoder_attention_heads=2,
                   encoder_ffn_dim=96, decoder_ffn_dim=128, activation_function="swish",
                   scale_embedding=True, pad_token_id=255, decoder_start_token_id=255),
    "separate": dict(vocab_size=300, decoder_vocab_size=260,
                     share_encoder_decoder_embeddings=False, tie_word_embeddings=False,
                     encoder_layers=1, decoder_layers=3, encoder_attention_heads=2,
                     decoder_attention_heads=4, encoder_ffn_dim=160, decoder_ffn_dim=96,
                     activation_function="gelu", scale_embedding=False,
                     pad_token_id=259, decoder_start_token_id=259),
}
# (encoder length, decoder length): a longer source, a longer target, one decoder
# token, and a source that reaches the last position of the 64-row table
LENGTHS = ((21, 9), (6, 13), (11, 1), (64, 5))


def make_marian(kind: str, seed: int = 0, **over):
    torch.manual_seed(seed)
    kw = dict(d_model=64, max_position_embeddings=64, eos_token_id=0,
              attn_implementation="eager", **CASES[kind])
    kw.update(over)
    model = randomize(transformers.MarianMTModel(transformers.MarianConfig(**kw)), seed)
    gen = torch.Generator().manual_seed(seed + 100)
    with torch.no_grad():
        model.final_logits_bias.copy_(torch.randn(model.final_logits_bias.shape, generator=gen))
    return model


def load_hf(path):
    """The saved model as a user gets it (``randomize`` also drew the frozen position
    tables; ``from_pretrained`` rebuilds them as sinusoids)."""
    return transformers.MarianMTModel.from_pretrained(str(path),
                                                      attn_implementation="eager").eval()


def sequences(enc_vocab: int, dec_vocab: int):
    rng = np.random.default_rng(3)
    return [(rng.integers(0, enc_vocab, s).astype(np.int64),
             rng.integers(0, dec_vocab, t).astype(np.int64)) for s, t in LENGTHS]


def hf_forward(model, src, dec):
    with torch.no_grad():
        out = model(input_ids=torch.tensor(src[None]), decoder_input_ids=torch.tensor(dec[None]),
                    use_cache=False)
    return out.logits[0].numpy(), out.encoder_last_hidden_state[0].numpy()


def empty_caches(model) -> list:
    p = model.params
    return [np.zeros((2, 0, p["dec_heads"], p["dec_head_dim"]), np.float32)
            for _ in range(p["dec_layers"])]


def ours_forward(model, src, dec, caches=None, start: int = 0, enc_start: int = 0) -> dict:
    """{output name: array} of one call of the spec's graph (every decoder row's logits)."""
    out = model(src, np.arange(enc_start, enc_start + src.size, dtype=np.int64), dec,
                np.arange(start, start + dec.size, dtype=np.int64),
                np.arange(dec.size, dtype=np.int64),
                *(empty_caches(model) if caches is None else caches))
    return dict(zip(model.output_names, (np.asarray(o) for o in out)))


def caches_of(model, got: dict) -> list:
    return [got[f"dec.blk.{i}.kv_cache"] for i in range(model.params["dec_layers"])]


def max_err(model, seqs, refs) -> float:
    return max(rel_err(ours_forward(model, s, d)["logits"], r[0]) for (s, d), r in zip(seqs, refs))


@pytest.fixture(scope="module", params=list(CASES))
def case(request, tmp_path_factory):
    """(kind, HF model as loaded back, its save_pretrained folder, (src, dec) pairs,
    reference (logits, encoder output) per pair, the loaded maxdecl model)."""
    kind = request.param
    path = save_hf(make_marian(kind), tmp_path_factory.mktemp(f"marian_{kind}") / "hf")
    model = load_hf(path)
    seqs = sequences(model.config.vocab_size, model.config.decoder_vocab_size)
    refs = [hf_forward(model, s, d) for s, d in seqs]
    return kind, model, path, seqs, refs, md.load_model(SPEC, path)


def test_config_from_hf(case):
    kind, model, path, seqs, refs, ours = case
    c, p = model.config, ours.params
    assert (p["dim"], p["context"]) == (64, 64)
    assert (p["vocab"], p["dec_vocab"]) == ((256, 256) if kind == "shared" else (300, 260))
    assert (p["enc_layers"], p["dec_layers"]) == (c.encoder_layers, c.decoder_layers)
    assert (p["enc_heads"], p["dec_heads"]) == (c.encoder_attention_heads,
                                                c.decoder_attention_heads)
    assert (p["enc_ffn_dim"], p["dec_ffn_dim"]) == (c.encoder_ffn_dim, c.decoder_ffn_dim)
    assert p["activation"] == c.activation_function
    assert p["scale_embedding"] is c.scale_embedding
    assert p["embed_scale"] == (8.0 if c.scale_embedding else 1.0)
    assert p["decoder_start"] == c.decoder_start_token_id
    assert ours.input_names[:5] == ["enc_tokens", "enc_positions", "dec_tokens",
                                    "dec_positions", "logit_rows"]
    assert ours.output_names[:2] == ["logits", "encoder_last_hidden_state"]
    names = md.load_weights(path).keys()
    assert not any("embed_positions" in k for k in names)       # not saved: computed
    if kind == "shared":      # one table saved, read by the encoder, decoder and head
        assert "lm_head.weight" not in names and "model.shared.weight" in names
        assert "enc.token_embd.weight" not in ours.weights
        assert "output.weight" not in ours.weights
    else:                     # two tables and an untied head
        assert ours.weights["enc.token_embd.weight"].shape == (300, 64)
        assert ours.weights["token_embd.weight"].shape == (260, 64)
        assert ours.weights["output.weight"].shape == (260, 64)
    assert ours.weights["output.bias"].shape == (p["dec_vocab"],)


def test_logits_match_hf(case):
    kind, model, path, seqs, refs, ours = case
    errs, enc_errs = [], []
    for (s, d), (ref, ref_enc) in zip(seqs, refs):
        got = ours_forward(ours, s, d)
        errs.append(rel_err(got["logits"], ref))
        enc_errs.append(rel_err(got["encoder_last_hidden_state"], ref_enc))
    print(f"marian {kind} vs HF: logits {max(errs):.2e} "
          f"({', '.join(f'{e:.1e}' for e in errs)}), encoder {max(enc_errs):.2e}")
    assert max(errs) <= TOL and max(enc_errs) <= TOL


def test_kv_cache_decode_matches_hf(case):
    """The decoder's self-attention through dec.blk.N.kv_cache: a 4-token prefix, then
    the rest one token per step (same source each step) give the teacher-forced logits."""
    kind, model, path, seqs, refs, ours = case
    (src, dec), (ref, _) = seqs[1], refs[1]
    n = 4
    got = ours_forward(ours, src, dec[:n])
    caches = caches_of(ours, got)
    assert [c.shape for c in caches] == [(2, n, ours.params["dec_heads"],
                                          ours.params["dec_head_dim"])] * len(caches)
    rows = [got["logits"]]
    for t in range(n, dec.size):
        got = ours_forward(ours, src, dec[t:t + 1], caches, start=t)
        caches = caches_of(ours, got)
        rows.append(got["logits"])
    err = rel_err(np.concatenate(rows), ref)
    print(f"marian {kind} vs HF: prefix + cached decode {err:.2e}")
    assert err <= TOL


def test_generate_matches_hf_greedy(case):
    """model.generate: the source as the prompt, the decoder from decoder_start (Marian's
    pad id) through its KV caches; transformers' greedy generate (no forced EOS, no
    early stop) gives the same ids."""
    kind, model, path, seqs, _, ours = case
    src = seqs[0][0]
    start = model.config.decoder_start_token_id
    assert ours.encoder_decoder and ours.params["decoder_start"] == start
    with torch.no_grad():
        want = model.generate(torch.tensor(src[None]), max_new_tokens=10, do_sample=False,
                              num_beams=1, decoder_start_token_id=start, eos_token_id=None,
                              forced_bos_token_id=None, forced_eos_token_id=None,
                              bad_words_ids=None, pad_token_id=start, min_length=0,
                              no_repeat_ngram_size=0, use_cache=True)[0].tolist()
    assert want[0] == start
    got = ours.generate([int(t) for t in src], 10, temperature=0).ids
    print(f"marian {kind}: greedy {got}")
    assert got == want[1:]


# -- the sinusoidal positions ------------------------------------------------------------

def test_positions_at_opus_mt_size(tmp_path):
    """d_model 512 over a 512-row table (opus-mt's sizes; one layer each, a small
    vocabulary): a 512-token source and a 512-token target reach every position, where
    a float32 sin(p * f) would lose digits; the spec combines float64 tables by angle
    addition."""
    torch.manual_seed(1)
    cfg = transformers.MarianConfig(
        vocab_size=256, d_model=512, max_position_embeddings=512, encoder_layers=1,
        decoder_layers=1, encoder_attention_heads=8, decoder_attention_heads=8,
        encoder_ffn_dim=256, decoder_ffn_dim=256, activation_function="swish",
        scale_embedding=True, pad_token_id=255, decoder_start_token_id=255, eos_token_id=0,
        attn_implementation="eager")
    model = randomize(transformers.MarianMTModel(cfg), 1)
    path = save_hf(model, tmp_path / "hf")
    model = load_hf(path)
    table = model.model.encoder.embed_positions.weight.detach().numpy()
    rng = np.random.default_rng(5)
    src, dec = rng.integers(0, 256, 512), rng.integers(0, 256, 512)
    ref, ref_enc = hf_forward(model, src, dec)
    ours = md.load_model(SPEC, path)
    assert ours.params["pos_block"] * ours.params["pos_blocks"] >= 512
    got = ours_forward(ours, src, dec)
    err, enc_err = rel_err(got["logits"], ref), rel_err(got["encoder_last_hidden_state"], ref_enc)
    print(f"marian d_model 512 x 512 positions vs HF: logits {err:.2e}, encoder {enc_err:.2e}")
    assert err <= TOL and enc_err <= TOL
    # the reference really holds the sinusoids (randomize drew the frozen table too;
    # from_pretrained rebuilt it), so the agreement above is about them
    pos = np.arange(512)[:, None] / 10000 ** (2 * np.arange(256) / 512)
    assert np.allclose(table, np.concatenate([np.sin(pos), np.cos(pos)], axis=1), atol=1e-6)


def test_positions_matter(case):
    """Encoder positions shifted by one: other logits (the table is read)."""
    kind, model, path, seqs, refs, ours = case
    (src, dec), (ref, _) = seqs[0], refs[0]
    assert rel_err(ours_forward(ours, src, dec, enc_start=1)["logits"], ref) > 100 * TOL
    assert rel_err(ours_forward(ours, src, dec, start=1)["logits"], ref) > 100 * TOL


# -- config and checkpoint layouts --------------------------------------------------------

def test_scale_embedding_is_read(case, tmp_path):
    """The same weights with scale_embedding flipped in config.json: other logits, and
    transformers agrees with them."""
    kind, model, path, seqs, refs, ours = case
    dst = tmp_path / "flipped"
    shutil.copytree(path, dst)
    cfg = json.loads((dst / "config.json").read_text())
    cfg["scale_embedding"] = not cfg["scale_embedding"]
    (dst / "config.json").write_text(json.dumps(cfg))
    m = md.load_model(SPEC, str(dst))
    assert m.params["scale_embedding"] is cfg["scale_embedding"]
    src, dec = seqs[0]
    got = ours_forward(m, src, dec)["logits"]
    assert rel_err(got, refs[0][0]) > 100 * TOL
    assert rel_err(got, hf_forward(load_hf(dst), src, dec)[0]) <= TOL


def test_older_checkpoint_layout(case, tmp_path):
    """An older upload's names: without ``model.``, every table saved (shared, encoder and
    decoder embed_tokens, lm_head) and the sinusoidal tables too: the same logits. Without
    final_logits_bias: the bias reads as zeros (and it mattered)."""
    from safetensors.numpy import save_file

    kind, model, path, seqs, refs, ours = case
    sd = {k: v.detach().numpy().copy() for k, v in model.state_dict().items()}
    old = {k.removeprefix("model."): v for k, v in sd.items()}
    if kind == "shared":
        for k in ("encoder.embed_tokens.weight", "decoder.embed_tokens.weight",
                  "lm_head.weight"):
            old[k] = sd["model.shared.weight"].copy()
    assert "encoder.embed_positions.weight" in old
    dst = tmp_path / "old"
    dst.mkdir()
    shutil.copy(os.path.join(path, "config.json"), dst)
    save_file(old, str(dst / "model.safetensors"))
    m = md.load_model(SPEC, str(dst))
    assert "output.weight" in m.weights
    assert max_err(m, seqs, refs) <= TOL

    del old["final_logits_bias"]
    save_file(old, str(dst / "model.safetensors"))
    m = md.load_model(SPEC, str(dst))
    assert "output.bias" not in m.weights
    saved = model.final_logits_bias.clone()
    with torch.no_grad():
        model.final_logits_bias.zero_()
    try:
        zero_refs = [hf_forward(model, s, d) for s, d in seqs]
    finally:
        with torch.no_grad():
            model.final_logits_bias.copy_(saved)
    assert max_err(m, seqs, zero_refs) <= TOL
    assert max_err(m, seqs, refs) > 100 * TOL
