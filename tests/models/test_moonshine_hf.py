"""specs/moonshine.yaml against transformers' MoonshineForConditionalGeneration.

Two small seeded float32 Moonshines saved with ``save_pretrained`` (safetensors +
config.json), with sizes other than the spec's variants so that every size comes from
config.json:

- ``tied``: hidden 48, 2 + 2 layers, 4 heads (head_dim 12, 10 rotary dims from the default
  partial_rotary_factor 0.9), intermediate 80, vocab 100, GELU encoder MLP, SiLU-gated
  decoder MLP, no attention biases, proj_out tied (not stored);
- ``untied``: hidden 64, 3 + 2 layers, 2 heads (head_dim 32, partial_rotary_factor 0.75:
  24 rotary dims), rope_theta 20000, intermediate 96, vocab 90, gelu_new encoder MLP,
  GELU-gated decoder MLP, attention biases on q/k/v, tie_word_embeddings false,
  decoder_start_token_id 3.

Every parameter is random (LayerNorm gains, GroupNorm gain and bias, conv biases). The
conv2/conv3 filters are scaled by 1 / sqrt(in_channels) so the front end's features stay
O(1), the decoder's token table by 0.05 (tied) or 0.3 (untied) and the cross-attention
output projections by 0.3: otherwise greedy decoding repeats one token (a tied output with
N(0, 1) embeddings picks each position's own token; a cross-attention that reads the same
frames at every step dominates the residual stream).

Each case compares, for a batch of two waveforms of different lengths (the shorter one
zero-padded, with transformers' attention_mask), the teacher-forced decoder logits and the
encoder's last hidden state; the same logits through the decoder's KV caches; a greedy
decode stepped through the graph against transformers' ``generate``; and negative controls.
"""

import numpy as np
import pytest

import maxdecl as md
from modelhelp import randomize, rel_err, save_hf, spec_path

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

SPEC = spec_path("moonshine")
TIGHT = 1e-5               # float32 throughout: max|ours - ref| <= 1e-5 max|ref|
N_NEW = 6                  # greedy tokens
LENGTHS = (4000, 2500)     # samples: 9 encoder frames, 7 of them unpadded in the second
N_DEC = 7                  # teacher-forced decoder tokens

CASES = {
    "tied": dict(vocab_size=100, hidden_size=48, intermediate_size=80,
                 encoder_num_hidden_layers=2, decoder_num_hidden_layers=2,
                 encoder_num_attention_heads=4, decoder_num_attention_heads=4,
                 max_position_embeddings=64, tie_word_embeddings=True),
    "untied": dict(vocab_size=90, hidden_size=64, intermediate_size=96,
                   encoder_num_hidden_layers=3, decoder_num_hidden_layers=2,
                   encoder_num_attention_heads=2, decoder_num_attention_heads=2,
                   max_position_embeddings=48, encoder_hidden_act="gelu_new",
                   decoder_hidden_act="gelu", attention_bias=True,
                   rope_parameters={"rope_type": "default", "rope_theta": 20000.0,
                                    "partial_rotary_factor": 0.75},
                   decoder_start_token_id=3, tie_word_embeddings=False),
}


def make_moonshine(kind: str, seed: int = 0):
    torch.manual_seed(seed)
    cfg = transformers.MoonshineConfig(**CASES[kind], attn_implementation="eager")
    model = randomize(transformers.MoonshineForConditionalGeneration(cfg), seed)
    with torch.no_grad():
        enc = model.model.encoder
        for conv in (enc.conv2, enc.conv3):
            conv.weight.div_(conv.weight.shape[1] ** 0.5)
        # a small token table (tied: each position's own token would win the logits) and
        # a damped cross-attention output (the same encoder frames at every step would
        # pick one token): greedy decoding then gives varied ids that depend on the audio
        model.model.decoder.embed_tokens.weight.mul_(0.05 if cfg.tie_word_embeddings else 0.3)
        for layer in model.model.decoder.layers:
            layer.encoder_attn.o_proj.weight.mul_(0.3)
    return model


def audio_batch(seed: int = 1):
    """Two waveforms of LENGTHS, the shorter zero-padded: (audio [2, L], mask [2, L])."""
    rng = np.random.default_rng(seed)
    n = max(LENGTHS)
    audio = np.zeros((len(LENGTHS), n), np.float32)
    mask = np.zeros((len(LENGTHS), n), np.int64)
    for b, length in enumerate(LENGTHS):
        audio[b, :length] = 0.5 * rng.standard_normal(length)
        mask[b, :length] = 1
    return audio, mask


def empty_caches(model, batch: int) -> list:
    p = model.params
    return [np.zeros((2, batch, 0, p["dec_kv_heads"], p["dec_head_dim"]), np.float32)
            for _ in range(p["dec_layers"])]


def ours_call(run, model, audio, mask, dec, caches=None, start: int = 0) -> dict:
    """{output name: array} of one call of the graph (``run``: a compiled callable)."""
    dec = np.asarray(dec, np.int64)
    out = run(audio, mask, dec, np.arange(start, start + dec.shape[1], dtype=np.int64),
              *(empty_caches(model, dec.shape[0]) if caches is None else caches))
    return dict(zip(model.output_names, out))


def caches_of(model, got: dict) -> list:
    return [got[n] for n in model.output_names if n.endswith("kv_cache")]


@pytest.fixture(scope="module", params=list(CASES))
def case(request, tmp_path_factory):
    """(kind, HF model, its folder, audio, mask, decoder ids, HF output, the loaded model)."""
    kind = request.param
    model = make_moonshine(kind)
    path = save_hf(model, tmp_path_factory.mktemp(f"moonshine_{kind}") / "hf")
    audio, mask = audio_batch()
    dec = np.random.default_rng(2).integers(0, CASES[kind]["vocab_size"], (2, N_DEC))
    with torch.no_grad():
        ref = model(input_values=torch.from_numpy(audio), attention_mask=torch.from_numpy(mask),
                    decoder_input_ids=torch.from_numpy(dec), use_cache=False)
    return kind, model, path, audio, mask, dec, ref, md.load_model(SPEC, path)


def test_config_from_hf(case):
    kind, model, path, audio, mask, dec, ref, ours = case
    c, p = model.config, ours.params
    rp = c.rope_parameters
    assert {k: p[k] for k in ("vocab", "dim", "ffn_dim", "enc_layers", "dec_layers",
                              "enc_heads", "dec_heads", "enc_kv_heads", "dec_kv_heads",
                              "enc_act", "dec_act", "context", "rope_theta",
                              "partial_rotary_factor", "decoder_start")} == {
        "vocab": c.vocab_size, "dim": c.hidden_size, "ffn_dim": c.intermediate_size,
        "enc_layers": c.encoder_num_hidden_layers, "dec_layers": c.decoder_num_hidden_layers,
        "enc_heads": c.encoder_num_attention_heads, "dec_heads": c.decoder_num_attention_heads,
        "enc_kv_heads": c.encoder_num_key_value_heads,
        "dec_kv_heads": c.decoder_num_key_value_heads,
        "enc_act": c.encoder_hidden_act, "dec_act": c.decoder_hidden_act,
        "context": c.max_position_embeddings, "rope_theta": rp["rope_theta"],
        "partial_rotary_factor": rp["partial_rotary_factor"],
        "decoder_start": c.decoder_start_token_id}
    head_dim = c.hidden_size // c.encoder_num_attention_heads
    assert p["enc_rot_dim"] == int(head_dim * rp["partial_rotary_factor"])
    assert ours.input_names == ["enc_audio", "enc_mask", "dec_tokens", "dec_positions"] + [
        f"dec.blk.{i}.kv_cache" for i in range(c.decoder_num_hidden_layers)]
    assert ours.output_names[:2] == ["logits", "last_hidden_state"]
    stored = set(md.load_weights(path).keys())
    if c.tie_word_embeddings:      # proj_out is the decoder's token table, not stored
        assert "proj_out.weight" not in stored and "output.weight" not in ours.weights
    else:
        assert "proj_out.weight" in stored and "output.weight" in ours.weights
    # every checkpoint tensor is bound (the load would fail otherwise) and nothing more
    assert len(ours.weights.keys()) == len(stored)


def test_batch_logits_match_hf(case):
    """Decoder logits for two waveforms of different lengths (the shorter padded and
    masked) in one batch."""
    kind, model, path, audio, mask, dec, ref, ours = case
    got = ours_call(ours.compiled, ours, audio, mask, dec)
    want = ref.logits.numpy()
    errs = [rel_err(got["logits"][b], want[b]) for b in range(2)]
    print(f"moonshine {kind} vs HF: batch logits {errs[0]:.1e}, {errs[1]:.1e}")
    assert max(errs) <= TIGHT


def test_encoder_last_hidden_state_matches_hf(case):
    kind, model, path, audio, mask, dec, ref, ours = case
    got = ours_call(ours.compiled, ours, audio, mask, dec)["last_hidden_state"]
    want = ref.encoder_last_hidden_state.numpy()
    assert got.shape == want.shape == (2, 9, model.config.hidden_size)
    errs = [rel_err(got[b], want[b]) for b in range(2)]
    print(f"moonshine {kind} vs HF: encoder last_hidden_state {errs[0]:.1e}, {errs[1]:.1e}")
    assert max(errs) <= TIGHT


def test_headless_moonshine_model_loads(case, tmp_path):
    """A MoonshineModel checkpoint (no ``model.`` prefix, no proj_out) loads through
    ``hf.prefixes`` and gives the same encoder output."""
    kind, model, path, audio, mask, dec, ref, ours = case
    base = save_hf(model.model, tmp_path / "base")
    m = md.load_model(SPEC, base)
    assert "output.weight" not in m.weights
    got = ours_call(m.compiled, m, audio, mask, dec)["last_hidden_state"]
    assert rel_err(got, ref.encoder_last_hidden_state.numpy()) <= TIGHT


def test_kv_cache_decode_matches_hf(case):
    """A 3-token prefix, then one token per step through dec.blk.N.kv_cache, give the
    teacher-forced logits of the batch."""
    kind, model, path, audio, mask, dec, ref, ours = case
    run = ours.compiled.fixed(["enc_audio", "enc_mask"])
    n = 3
    got = ours_call(run, ours, audio, mask, dec[:, :n])
    rows, caches = [got["logits"]], caches_of(ours, got)
    p = ours.params
    assert [c.shape for c in caches] == [(2, 2, n, p["dec_kv_heads"], p["dec_head_dim"])] * len(caches)
    for t in range(n, N_DEC):
        got = ours_call(run, ours, audio, mask, dec[:, t:t + 1], caches, start=t)
        rows.append(got["logits"])
        caches = caches_of(ours, got)
    err = rel_err(np.concatenate(rows, axis=1), ref.logits.numpy())
    print(f"moonshine {kind} vs HF: prefix + cached decode {err:.1e}")
    assert err <= TIGHT


def hf_greedy(model, audio, mask, n_new: int) -> list:
    with torch.no_grad():
        out = model.generate(input_values=torch.from_numpy(audio[None]),
                             attention_mask=torch.from_numpy(mask[None]),
                             max_new_tokens=n_new, do_sample=False, num_beams=1,
                             eos_token_id=None, pad_token_id=0)
    return out[0].tolist()


def ours_greedy(ours, audio, mask, n_new: int) -> list:
    """Greedy ids after decoder_start, one token per step through the KV caches; the
    encoder runs once (``fixed``)."""
    run = ours.compiled.fixed(["enc_audio", "enc_mask"])
    a, m = audio[None], mask[None]
    got = ours_call(run, ours, a, m, [[ours.params["decoder_start"]]])
    ids = []
    for t in range(n_new):
        ids.append(int(np.argmax(got["logits"][0, -1])))
        if len(ids) < n_new:
            got = ours_call(run, ours, a, m, [ids[-1:]], caches_of(ours, got), start=t + 1)
    return ids


@pytest.mark.parametrize("row", [0, 1])
def test_greedy_decode_matches_hf_generate(case, row):
    """Greedy decoding from one waveform (row 1: padded, with its mask) gives
    transformers' greedy ids."""
    kind, model, path, audio, mask, dec, ref, ours = case
    want = hf_greedy(model, audio[row], mask[row], N_NEW)
    assert want[0] == model.config.decoder_start_token_id
    got = ours_greedy(ours, audio[row], mask[row], N_NEW)
    print(f"moonshine {kind} row {row}: greedy {got}")
    assert got == want[1:]
    assert len(set(got)) > 1                  # not one token repeated: the test has teeth


def test_model_generate_from_audio(case):
    kind, model, path, audio, mask, dec, ref, ours = case
    want = hf_greedy(model, audio[0], mask[0], N_NEW)[1:]
    assert ours.generate(audio[:1], N_NEW, temperature=0).ids == want


# -- negative controls ---------------------------------------------------------------------

def test_padding_mask_matters(case):
    """With an all-ones mask the padded row's logits move away from transformers' masked
    ones (the mask is read by the encoder and the cross-attention), and match
    transformers run without a mask."""
    kind, model, path, audio, mask, dec, ref, ours = case
    ones = np.ones_like(mask)
    got = ours_call(ours.compiled, ours, audio, ones, dec)["logits"]
    assert rel_err(got[1], ref.logits.numpy()[1]) > 100 * TIGHT
    with torch.no_grad():
        unmasked = model(input_values=torch.from_numpy(audio),
                         decoder_input_ids=torch.from_numpy(dec), use_cache=False).logits
    assert rel_err(got, unmasked.numpy()) <= TIGHT


@pytest.mark.parametrize("key", ["enc.conv_norm.bias", "enc.blk.1.attn_k.weight",
                                 "dec.blk.1.cross_k.weight", "dec.blk.0.cross_norm.weight"])
def test_zeroed_weight_fails(case, key):
    """Each of these weights is read: zeroing it moves the logits."""
    kind, model, path, audio, mask, dec, ref, ours = case
    td = md.load_weights(str(path), spec=SPEC)
    td[key] = np.zeros_like(np.asarray(td[key]))
    m = md.load_model(SPEC, td)
    got = ours_call(m.compiled, m, audio, mask, dec)["logits"]
    assert rel_err(got, ref.logits.numpy()) > 100 * TIGHT
