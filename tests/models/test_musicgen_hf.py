"""specs/musicgen.yaml against transformers' MusicgenForCausalLM (the MusicGen decoder).

A small seeded float32 decoder: 3 codebooks (not the tiny variant's 2, so the sizes
come from config.json), each with its own embedding table of vocab + 1 rows (the last
is the pad / BOS id) and its own bias-free LM head; the embeddings are summed, a
sinusoidal position table (cos half first) is added, then pre-LayerNorm blocks with
bias-free attention and a GELU MLP. The input ids are transformers' (batch *
num_codebooks, seq) rows; logits come back as (batch * num_codebooks, seq, vocab).
The checkpoint also holds each layer's cross-attention (encoder_attn), which the
unconditional forward never runs: the spec drops it.
"""

import numpy as np
import pytest

import maxdecl as md

from modelhelp import N_DECODE, N_PROMPT, randomize, rel_err, save_hf, spec_path

pytest.importorskip("torch")
pytest.importorskip("transformers")

TOL = 1e-5              # max|ours - ref| <= TOL * max|ref|
BATCH = 2
N_FRAMES = N_PROMPT + N_DECODE
CFG = dict(vocab_size=256, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
           ffn_dim=128, num_codebooks=3, max_position_embeddings=64,
           activation_function="gelu", pad_token_id=256, bos_token_id=256)


def make_musicgen(seed=0, **kw):
    """MusicgenForCausalLM: dim 64, 2 layers, 4 heads, ffn 128, 3 codebooks of 256 ids."""
    import torch
    import transformers

    torch.manual_seed(seed)
    cfg = {**CFG, **kw, "attn_implementation": "eager"}
    config = transformers.MusicgenDecoderConfig(**cfg)
    return randomize(transformers.MusicgenForCausalLM(config), seed)


def frame_ids(cfg, batch=BATCH, n=N_FRAMES, seed=7) -> np.ndarray:
    """(batch * num_codebooks, n) ids: the BOS / pad id (vocab_size, the extra embedding
    row) first, as generation starts, then random codes (the pad id among them too)."""
    rng = np.random.default_rng(seed)
    ids = rng.integers(0, cfg.vocab_size, size=(batch * cfg.num_codebooks, n))
    ids[:, 0] = cfg.bos_token_id
    ids[0, 5] = cfg.pad_token_id
    return ids.astype(np.int64)


def hf_outputs(model, ids):
    """transformers' (logits, last hidden state) of one full forward, no cache."""
    import torch

    with torch.no_grad():
        t = torch.tensor(ids)
        logits = model(t, use_cache=False).logits.float().numpy()
        hidden = model.model(t, use_cache=False).last_hidden_state.float().numpy()
    return logits, hidden


@pytest.fixture(scope="module")
def musicgen(tmp_path_factory):
    """(HF model, its save_pretrained folder, ids, HF logits, HF last hidden state)."""
    model = make_musicgen()
    path = save_hf(model, tmp_path_factory.mktemp("musicgen_hf"))
    ids = frame_ids(model.config)
    return (model, path, ids, *hf_outputs(model, ids))


@pytest.fixture(scope="module")
def ours(musicgen):
    return md.load_model(spec_path("musicgen"), musicgen[1], variant="tiny")


def empty_caches(model, batch=BATCH):
    """Each layer's KV cache before the first step: [2, batch, 0, heads, head_dim]."""
    p = model.params
    return [np.zeros((2, batch, 0, p["n_heads"], p["head_dim"]), np.float32)
            for n in model.input_names if n.endswith("kv_cache")]


def run(model, ids, start, caches):
    """(logits, last hidden state, new caches) of one step of frames ``start`` onwards."""
    out = model(ids, np.arange(start, start + ids.shape[1], dtype=np.int64), *caches)
    return out[0], out[1], list(out[2:])


def test_musicgen_graph_interface(ours):
    assert ours.input_names == ["input_ids", "positions", "blk.0.kv_cache", "blk.1.kv_cache"]
    assert ours.output_names[:2] == ["logits", "last_hidden_state"]
    assert ours.output_names[2:] == ["blk.0.kv_cache", "blk.1.kv_cache"]


def test_musicgen_config_from_hf(musicgen, ours):
    got = md.load_weights(musicgen[1], spec=spec_path("musicgen")).params
    assert got == {"dim": 64, "n_layers": 2, "n_heads": 4, "ffn_dim": 128, "vocab": 256,
                   "n_codebooks": 3, "context": 64, "hidden_act": "gelu"}
    assert ours.params["head_dim"] == 16 and ours.params["embd_rows"] == 257
    # the stacked per-codebook tables and heads
    assert ours.weights["token_embd.weight"].shape == (3 * 257, 64)
    assert ours.weights["output.weight"].shape == (3 * 256, 64)


def test_musicgen_full_forward_matches_hf(musicgen, ours):
    """A batch of 2, (batch * 3 codebooks, 16) ids in one call: logits and the final
    hidden states."""
    _, _, ids, ref, ref_hidden = musicgen
    logits, hidden, caches = run(ours, ids, 0, empty_caches(ours))
    assert logits.shape == ref.shape == (BATCH * 3, N_FRAMES, 256)
    err, err_h = rel_err(logits, ref), rel_err(hidden, ref_hidden)
    print(f"musicgen full forward vs HF: logits {err:.2e}, last_hidden_state {err_h:.2e}")
    assert err <= TOL and err_h <= TOL
    assert caches[0].shape == (2, BATCH, N_FRAMES, 4, 16)


def test_musicgen_kv_cache_decode_matches_full_forward(musicgen, ours):
    """A prefill of N_PROMPT frames, then one frame at a time through the KV caches,
    gives transformers' logits of the whole sequence in one forward."""
    _, _, ids, ref, _ = musicgen
    pre, _, caches = run(ours, ids[:, :N_PROMPT], 0, empty_caches(ours))
    dec = []
    for t in range(N_PROMPT, N_FRAMES):
        lg, _, caches = run(ours, ids[:, t:t + 1], t, caches)
        dec.append(lg)
    dec = np.concatenate(dec, axis=1)
    e_pre, e_dec = rel_err(pre, ref[:, :N_PROMPT]), rel_err(dec, ref[:, N_PROMPT:])
    print(f"musicgen vs HF: prefill {e_pre:.2e}, decode {e_dec:.2e} (of max|ref|)")
    assert e_pre <= TOL and e_dec <= TOL
    assert caches[1].shape == (2, BATCH, N_FRAMES, 4, 16)


def test_musicgen_hf_cached_decode_agrees(musicgen, ours):
    """transformers' own incremental decoding (DynamicCache) and ours agree step by step."""
    import torch

    model, _, ids, _, _ = musicgen
    with torch.no_grad():
        out = model(torch.tensor(ids[:, :N_PROMPT]), use_cache=True)
        cache, want = out.cache, []
        for t in range(N_PROMPT, N_FRAMES):
            out = model(torch.tensor(ids[:, t:t + 1]), cache=cache, use_cache=True)
            cache = out.cache
            want.append(out.logits.float().numpy())
    _, _, caches = run(ours, ids[:, :N_PROMPT], 0, empty_caches(ours))
    for k, t in enumerate(range(N_PROMPT, N_FRAMES)):
        lg, _, caches = run(ours, ids[:, t:t + 1], t, caches)
        assert rel_err(lg, want[k]) <= TOL


def test_musicgen_each_sequence_alone(musicgen, ours):
    """Sequence b of the batch is rows b * K .. b * K + K - 1 of the ids and logits: run
    alone (batch 1) it gives the same logits as in the batch."""
    _, _, ids, ref, _ = musicgen
    for b in range(BATCH):
        rows = slice(3 * b, 3 * b + 3)
        lg, _, _ = run(ours, ids[rows], 0, empty_caches(ours, batch=1))
        assert rel_err(lg, ref[rows]) <= TOL


def test_musicgen_codebook_order_matters(musicgen):
    """Negative control: the first two codebooks' embedding tables swapped in the
    checkpoint (same shapes) put the logits far off."""
    _, path, ids, ref, _ = musicgen
    td = md.load_weights(path)
    a, b = "model.decoder.embed_tokens.0.weight", "model.decoder.embed_tokens.1.weight"
    td[a], td[b] = td[b], td[a]
    model = md.load_model(spec_path("musicgen"), td, variant="tiny")
    logits, _, _ = run(model, ids, 0, empty_caches(model))
    assert rel_err(logits, ref) > 100 * TOL


def test_musicgen_positions_matter(musicgen, ours):
    """Negative control: the same frames at positions shifted by one are far off (the
    sinusoidal table is read at the positions given)."""
    _, _, ids, ref, _ = musicgen
    logits, _, _ = run(ours, ids, 1, empty_caches(ours))
    assert rel_err(logits, ref) > 100 * TOL


def test_musicgen_is_not_a_generic_language_model(ours):
    """K tokens a step (and the delay pattern) do not fit the generic generate loop: it
    says so and points at model(*inputs)."""
    with pytest.raises(md.InputError, match="not a language model"):
        ours.generate([1, 2, 3], 2, temperature=0)


def test_musicgen_other_config_matches_hf(tmp_path):
    """config.json drives every size: an odd width (63: the position table gets a zero
    column), 3 heads, 4 codebooks and relu, none of them the tiny variant's."""
    model = make_musicgen(seed=1, hidden_size=63, num_attention_heads=3, num_codebooks=4,
                          activation_function="relu")
    path = save_hf(model, tmp_path / "musicgen_odd")
    ids = frame_ids(model.config, seed=8)
    ref, ref_hidden = hf_outputs(model, ids)
    ours = md.load_model(spec_path("musicgen"), path, variant="tiny")
    assert (ours.params["dim"], ours.params["n_codebooks"], ours.params["hidden_act"]) == \
        (63, 4, "relu")
    logits, hidden, _ = run(ours, ids, 0, empty_caches(ours))
    assert logits.shape == (BATCH * 4, N_FRAMES, 256)
    assert rel_err(logits, ref) <= TOL and rel_err(hidden, ref_hidden) <= TOL


def test_musicgen_id_past_its_table_is_refused(musicgen, ours):
    """An id past a codebook's vocab + 1 rows fails (as torch's embedding does) instead of
    reading the next codebook's table from the stacked one."""
    ids = musicgen[2].copy()
    ids[0, 3] = 257
    with pytest.raises(md.GraphError, match="outside 0..vocab"):
        run(ours, ids, 0, empty_caches(ours))
