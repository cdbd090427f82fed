"""specs/bart.yaml against transformers' BartForConditionalGeneration.

Two small seeded float32 BARTs (vocab 96, d_model 64, 66-row position tables):

- ``plain``: 2 encoder / 1 decoder layers, 4 heads each, GELU, scale_embedding false;
- ``scaled``: 1 encoder / 3 decoder layers, 4 encoder and 2 decoder heads, other FFN
  widths, ReLU, scale_embedding true (token embeddings times sqrt(64) = 8).

final_logits_bias (a buffer, zeros at init) is randomized so that it matters. Each
case compares the teacher-forced logits (encoder ids and decoder ids, no padding) with
transformers', then the same logits computed through the decoder's self-attention KV
cache (a prefix, then one decoder token per step), other checkpoint layouts (BartModel
names without ``model.``, the tied tables saved under every name, no final_logits_bias)
and negative controls (offset, embedding scale, cross-attention input).
"""

import json
import os
import shutil

import numpy as np
import pytest

import maxdecl as md
from modelhelp import rel_err, save_hf, spec_path, with_hf_config

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

SPEC = spec_path("bart")
VOCAB = 96
TOL = 1e-5                 # of max|ref|: float32 throughout

CASES = {
    "plain": dict(encoder_layers=2, decoder_layers=1, encoder_attention_heads=4,
                  decoder_attention_heads=4, encoder_ffn_dim=128, decoder_ffn_dim=128,
                  activation_function="gelu", scale_embedding=False),
    "scaled": dict(encoder_layers=1, decoder_layers=3, encoder_attention_heads=4,
                   decoder_attention_heads=2, encoder_ffn_dim=96, decoder_ffn_dim=160,
                   activation_function="relu", scale_embedding=True),
}
# (encoder length, decoder length): a longer source, a longer target, one decoder token
LENGTHS = ((21, 9), (6, 13), (11, 1))


def make_bart(kind: str, seed: int = 0):
    from modelhelp import randomize

    torch.manual_seed(seed)
    cfg = transformers.BartConfig(vocab_size=VOCAB, d_model=64, max_position_embeddings=64,
                                  attn_implementation="eager", **CASES[kind])
    model = randomize(transformers.BartForConditionalGeneration(cfg), seed)
    gen = torch.Generator().manual_seed(seed + 100)
    with torch.no_grad():
        model.final_logits_bias.copy_(torch.randn(model.final_logits_bias.shape, generator=gen))
    return model


def sequences():
    rng = np.random.default_rng(3)
    return [(rng.integers(0, VOCAB, s).astype(np.int64), rng.integers(0, VOCAB, t).astype(np.int64))
            for s, t in LENGTHS]


def hf_logits(model, src, dec) -> np.ndarray:
    with torch.no_grad():
        out = model(input_ids=torch.tensor(src[None]), decoder_input_ids=torch.tensor(dec[None]),
                    use_cache=False)
    return out.logits[0].numpy()


def empty_caches(model) -> list:
    p = model.params
    return [np.zeros((2, 0, p["dec_heads"], p["dec_head_dim"]), np.float32)
            for _ in range(p["dec_layers"])]


def ours_logits(model, src, dec, caches=None, start: int = 0):
    """(logits [len(dec), vocab], new caches) of the spec's graph."""
    out = model(src, np.arange(src.size, dtype=np.int64), dec,
                np.arange(start, start + dec.size, dtype=np.int64),
                *(empty_caches(model) if caches is None else caches))
    return np.asarray(out[0]), list(out[1:])


def max_err(model, seqs, refs) -> float:
    return max(rel_err(ours_logits(model, s, d)[0], r) for (s, d), r in zip(seqs, refs))


@pytest.fixture(scope="module", params=list(CASES))
def case(request, tmp_path_factory):
    """(kind, HF model, its save_pretrained folder, (src, dec) pairs, reference logits,
    the loaded maxdecl model)."""
    kind = request.param
    model = make_bart(kind)
    path = save_hf(model, tmp_path_factory.mktemp(f"bart_{kind}") / "hf")
    seqs = sequences()
    refs = [hf_logits(model, s, d) for s, d in seqs]
    return kind, model, path, seqs, refs, md.load_model(SPEC, path)


def test_config_from_hf(case):
    kind, model, path, seqs, refs, ours = case
    c, p = CASES[kind], ours.params
    assert (p["vocab"], p["dim"], p["context"], p["n_pos"]) == (VOCAB, 64, 64, 66)
    assert (p["enc_layers"], p["dec_layers"]) == (c["encoder_layers"], c["decoder_layers"])
    assert (p["enc_heads"], p["dec_heads"]) == (c["encoder_attention_heads"],
                                                c["decoder_attention_heads"])
    assert (p["enc_ffn_dim"], p["dec_ffn_dim"]) == (c["encoder_ffn_dim"], c["decoder_ffn_dim"])
    assert p["activation"] == c["activation_function"]
    assert p["scale_embedding"] is c["scale_embedding"]
    assert p["embed_scale"] == (8.0 if c["scale_embedding"] else 1.0)
    assert ours.input_names[:4] == ["enc_tokens", "enc_positions", "dec_tokens", "dec_positions"]
    assert ours.output_names[0] == "logits"
    # the tied lm_head is not stored: output.weight is the shared table
    assert "lm_head.weight" not in md.load_weights(path).keys()
    assert "output.weight" not in ours.weights and "output.bias" in ours.weights


def test_logits_match_hf(case):
    kind, model, path, seqs, refs, ours = case
    errs = [rel_err(ours_logits(ours, s, d)[0], r) for (s, d), r in zip(seqs, refs)]
    print(f"bart {kind} vs HF: logits {max(errs):.2e} ({', '.join(f'{e:.1e}' for e in errs)})")
    assert max(errs) <= TOL


def test_kv_cache_decode_matches_hf(case):
    """The decoder's self-attention through dec.blk.N.kv_cache: a 4-token prefix, then
    the rest one token per step (same encoder ids each step) give the teacher-forced
    logits."""
    kind, model, path, seqs, refs, ours = case
    (src, dec), ref = seqs[1], refs[1]
    n = 4
    logits, caches = ours_logits(ours, src, dec[:n])
    assert [c.shape for c in caches] == [(2, n, ours.params["dec_heads"],
                                          ours.params["dec_head_dim"])] * len(caches)
    rows = [logits]
    for t in range(n, dec.size):
        step, caches = ours_logits(ours, src, dec[t:t + 1], caches, start=t)
        rows.append(step)
    got = np.concatenate(rows)
    err = rel_err(got, ref)
    print(f"bart {kind} vs HF: prefix + cached decode {err:.2e}")
    assert err <= TOL


# -- checkpoint layouts -------------------------------------------------------------------

def _rewrite(src, dst, rename, drop=(), extra=None) -> str:
    """A copy of the HF folder ``src`` at ``dst`` with its tensors renamed / dropped."""
    from safetensors.numpy import save_file

    td = md.load_weights(src)
    tensors = {rename(k): np.ascontiguousarray(np.asarray(td[k])) for k in td.keys()
               if k not in drop}
    tensors.update(extra or {})
    os.makedirs(dst, exist_ok=True)
    shutil.copy(os.path.join(src, "config.json"), dst)
    save_file(tensors, os.path.join(dst, "model.safetensors"))
    return str(dst)


def test_other_checkpoint_layouts(case, tmp_path):
    """Names without ``model.`` (as BartModel / older uploads), with the shared table
    also saved as encoder/decoder embed_tokens and lm_head (older checkpoints), give the
    same logits; a checkpoint without final_logits_bias reads it as zeros."""
    kind, model, path, seqs, refs, ours = case
    shared = np.asarray(md.load_weights(path)["model.shared.weight"])
    old = _rewrite(path, tmp_path / "old", lambda k: k.removeprefix("model."),
                   extra={"encoder.embed_tokens.weight": shared.copy(),
                          "decoder.embed_tokens.weight": shared.copy(),
                          "lm_head.weight": shared.copy()})
    m = md.load_model(SPEC, old)
    assert "output.weight" in m.weights
    assert max_err(m, seqs, refs) <= TOL

    nobias = _rewrite(path, tmp_path / "nobias", lambda k: k, drop=("final_logits_bias",))
    saved = model.final_logits_bias.clone()
    with torch.no_grad():
        model.final_logits_bias.zero_()
    try:
        zero_refs = [hf_logits(model, s, d) for s, d in seqs]
    finally:
        with torch.no_grad():
            model.final_logits_bias.copy_(saved)
    m = md.load_model(SPEC, nobias)
    assert "output.bias" not in m.weights
    assert max_err(m, seqs, zero_refs) <= TOL
    assert max_err(m, seqs, refs) > 100 * TOL          # the bias mattered


# -- negative controls --------------------------------------------------------------------

def test_position_offset_matters(case):
    """Positions looked up without BART's offset of 2: other logits."""
    kind, model, path, seqs, refs, ours = case
    spec = with_hf_config(md.load_spec(SPEC), pos_offset="{0}",
                          context="{max_position_embeddings + 2}")
    assert max_err(md.load_model(spec, path), seqs[:1], refs[:1]) > 100 * TOL


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
    got = ours_logits(m, src, dec)[0]
    assert rel_err(got, refs[0]) > 100 * TOL
    other = transformers.BartForConditionalGeneration.from_pretrained(str(dst)).eval()
    assert rel_err(got, hf_logits(other, src, dec)) <= TOL


def test_source_matters(case):
    """The logits depend on the encoder ids (cross-attention is wired)."""
    kind, model, path, seqs, refs, ours = case
    src, dec = seqs[0]
    other = (src + 1) % VOCAB
    assert rel_err(ours_logits(ours, other, dec)[0], refs[0]) > 100 * TOL
    assert rel_err(ours_logits(ours, other, dec)[0], hf_logits(model, other, dec)) <= TOL


def test_generate_matches_hf_greedy(case):
    """model.generate drives the encoder-decoder: the source as the prompt, the decoder
    from decoder_start (config.json's decoder_start_token_id) through its KV caches;
    transformers' greedy generate (no forced BOS/EOS, no early stop) gives the same ids."""
    kind, model, path, seqs, _, ours = case
    src = seqs[0][0]
    start = model.config.decoder_start_token_id
    assert ours.encoder_decoder and ours.params["decoder_start"] == start
    with torch.no_grad():
        want = model.generate(torch.tensor(src[None]), max_new_tokens=8, do_sample=False,
                              num_beams=1, decoder_start_token_id=start, eos_token_id=None,
                              forced_bos_token_id=None, forced_eos_token_id=None,
                              pad_token_id=1, min_length=0, no_repeat_ngram_size=0,
                              use_cache=True)[0].tolist()
    assert want[0] == start
    assert ours.generate([int(t) for t in src], 8, temperature=0).ids == want[1:]
