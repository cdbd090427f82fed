"""specs/pegasus.yaml against transformers' PegasusForConditionalGeneration.

A small seeded float32 Pegasus: d_model 64, 2 encoder and 3 decoder layers with
different head counts (4 and 8) and FFN widths (128 and 96), scale_embedding (tokens
times sqrt(64)), ReLU, fixed sinusoidal positions (computed in the graph; the
checkpoint's frozen tables are dropped) and a random final_logits_bias; the output
tied to the shared embedding (as released checkpoints) or, in a second case, untied
(four separate tables). Compared: teacher-forced decoder logits, a decoder prefill then
one token at a time through the self-attention KV cache, and greedy generation
against transformers' generate. (A random tied model decodes one token over and over,
its own embedding winning the tied logits; the untied case gives varied greedy ids.)
"""

import numpy as np
import pytest

import maxdecl as md

from modelhelp import hf_params, randomize, rel_err, save_hf, spec_path

pytest.importorskip("torch")
pytest.importorskip("transformers")

TOL = 1e-4                      # max|ours - ref| <= TOL * max|ref|
VOCAB = 128
SRC = [5, 17, 42, 99, 3, 7, 64, 120, 11, 2, 77]           # encoder ids (no pad, no eos)
DEC = [0, 31, 8, 90, 14, 55, 6, 101, 23]                  # decoder ids, from decoder_start 0
N_PREFILL = 4
PROMPTS = [[3, 17, 42, 99, 5, 7, 64, 1], [8, 9, 120], [5, 60, 33, 2, 90, 11, 7, 44, 12]]
N_NEW = 6


def make_pegasus(seed=0, **kw):
    """PegasusForConditionalGeneration with seeded weights.

    ``randomize`` draws every parameter, the frozen sinusoidal tables included, so
    those are rebuilt after it; the shared embedding is scaled by 0.1 (times
    sqrt(d_model) = 8 it stays O(1), next to the positions), and final_logits_bias, a
    buffer randomize does not touch, gets 0.1 * N(0, 1) so that it matters."""
    import torch
    import transformers

    torch.manual_seed(seed)
    cfg = dict(vocab_size=VOCAB, d_model=64, encoder_layers=2, decoder_layers=3,
               encoder_attention_heads=4, decoder_attention_heads=8, encoder_ffn_dim=128,
               decoder_ffn_dim=96, max_position_embeddings=64, activation_function="relu",
               scale_embedding=True, pad_token_id=0, eos_token_id=1, decoder_start_token_id=0,
               forced_eos_token_id=1, dropout=0.0, attn_implementation="eager")
    cfg.update(kw)
    model = randomize(transformers.PegasusForConditionalGeneration(
        transformers.PegasusConfig(**cfg)), seed)
    gen = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        model.model.shared.weight.mul_(0.1)
        if not model.config.tie_word_embeddings:
            model.lm_head.weight.copy_(0.1 * torch.randn(model.lm_head.weight.shape, generator=gen))
        for emb in (model.model.encoder.embed_positions, model.model.decoder.embed_positions):
            emb.weight.copy_(emb.create_weight())
        model.final_logits_bias.copy_(0.1 * torch.randn(model.final_logits_bias.shape, generator=gen))
    return model.eval()


def hf_dec_logits(model, src, dec):
    """Teacher-forced decoder logits [len(dec), vocab] of transformers."""
    import torch

    with torch.no_grad():
        out = model(input_ids=torch.tensor([src]), decoder_input_ids=torch.tensor([dec]),
                    use_cache=False)
    return out.logits[0].float().numpy()


def empty_state(ours) -> dict:
    """Each state input (the decoder's KV caches) at its start: symbolic dims 0."""
    outs = set(ours.output_names)
    return {v.name: np.zeros(tuple(0 if isinstance(d, str) else d for d in v.type.shape),
                             v.type.dtype.numpy)
            for v in ours.graph.inputs if v.name in outs}


def run(ours, src, dec, start=0, state=None):
    """(logits of every position of ``dec`` at ``start``..., the new state)."""
    src, dec = np.asarray(src, np.int64), np.asarray(dec, np.int64)
    feed = {"enc_tokens": src, "enc_positions": np.arange(src.size, dtype=np.int64),
            "dec_tokens": dec, "dec_positions": np.arange(start, start + dec.size, dtype=np.int64),
            **(state if state is not None else empty_state(ours))}
    got = dict(zip(ours.output_names, ours(*(feed[n] for n in ours.input_names))))
    return np.asarray(got["logits"]), {n: got[n] for n in empty_state(ours)}


CASES = {"tied": {}, "untied": {"tie_word_embeddings": False}}


@pytest.fixture(scope="module", params=list(CASES))
def pegasus(request, tmp_path_factory):
    """(HF model, its save_pretrained folder, teacher-forced HF logits) of each case:
    ``tied`` as the released checkpoints (shared table, no lm_head stored); ``untied``
    (tie_word_embeddings false: transformers 5 then keeps four tables, shared,
    encoder.embed_tokens, decoder.embed_tokens and lm_head, and saves each)."""
    model = make_pegasus(seed=3 if request.param == "untied" else 0, **CASES[request.param])
    path = save_hf(model, tmp_path_factory.mktemp(f"pegasus_{request.param}"))
    return model, path, hf_dec_logits(model, SRC, DEC)


@pytest.fixture(scope="module")
def ours(pegasus):
    return md.load_model(spec_path("pegasus"), pegasus[1], variant="tiny")


def test_pegasus_config_from_hf(pegasus):
    got = hf_params("pegasus", pegasus[1])[2]
    assert (got["dim"], got["enc_layers"], got["dec_layers"], got["vocab"]) == (64, 2, 3, VOCAB)
    assert (got["enc_heads"], got["dec_heads"]) == (4, 8)
    assert (got["enc_ffn_dim"], got["dec_ffn_dim"]) == (128, 96)
    assert got["context"] == 64
    assert got["act"] == "relu" and got["scale_embedding"] is True
    assert got["decoder_start"] == 0


def test_pegasus_checkpoint_layout(pegasus, ours):
    """The checkpoint holds what the spec maps: frozen sinusoidal tables (dropped, the
    graph computes them), final_logits_bias [1, vocab]; lm_head and the encoder's and
    decoder's own tables only when untied (else the spec's stand-in is shared)."""
    model = pegasus[0]
    keys = set(md.load_weights(pegasus[1]).keys())
    assert {"model.encoder.embed_positions.weight", "model.decoder.embed_positions.weight",
            "final_logits_bias", "model.shared.weight"} <= keys
    own = {"lm_head.weight", "model.encoder.embed_tokens.weight",
           "model.decoder.embed_tokens.weight"}
    spec_names = {"output.weight", "enc_embd.weight", "dec_embd.weight"}
    if model.config.tie_word_embeddings:
        assert not own & keys
        assert not spec_names & set(ours.weights.keys())
    else:
        assert own <= keys
        assert spec_names <= set(ours.weights.keys())


def test_pegasus_teacher_forced_logits_match_hf(pegasus, ours):
    _, _, ref = pegasus
    got, _ = run(ours, SRC, DEC)
    err = rel_err(got, ref)
    print(f"pegasus teacher-forced logits vs HF: {err:.2e} of max|ref| {np.abs(ref).max():.2f}")
    assert err <= TOL


def test_pegasus_kv_cache_decode_matches_hf(pegasus, ours):
    """A decoder prefill of N_PREFILL tokens, then one token at a time through the KV
    caches (the encoder rerun each step, as generate does)."""
    _, _, ref = pegasus
    pre, state = run(ours, SRC, DEC[:N_PREFILL])
    dec = []
    for pos in range(N_PREFILL, len(DEC)):
        lg, state = run(ours, SRC, DEC[pos:pos + 1], start=pos, state=state)
        dec.append(lg[-1])
    e_pre, e_dec = rel_err(pre, ref[:N_PREFILL]), rel_err(np.stack(dec), ref[N_PREFILL:])
    print(f"pegasus vs HF: prefill {e_pre:.2e}, decode {e_dec:.2e}")
    assert e_pre <= TOL and e_dec <= TOL


def test_pegasus_greedy_generate_matches_hf(pegasus, ours):
    """``ours.generate`` (greedy, from decoder_start) gives transformers' greedy ids,
    one source at a time and for a list of sources."""
    import torch

    model = pegasus[0]
    want = []
    for p in PROMPTS:
        out = model.generate(torch.tensor([p]), max_new_tokens=N_NEW, min_new_tokens=0,
                             do_sample=False, num_beams=1, eos_token_id=None,
                             forced_eos_token_id=None, pad_token_id=0,
                             decoder_start_token_id=0)
        assert out[0, 0].item() == 0                       # decoder_start
        want.append(out[0, 1:].tolist())
    assert len(set(map(tuple, want))) > 1                  # the source matters
    if not model.config.tie_word_embeddings:               # and the decoder's own tokens
        assert all(len(set(w)) > 2 for w in want), want
    assert ours.generate(PROMPTS[0], N_NEW, temperature=0).ids == want[0]
    assert [o.ids for o in ours.generate(PROMPTS, N_NEW, temperature=0)] == want


def test_pegasus_final_logits_bias_matters(pegasus):
    """Negative control: without final_logits_bias (its absent: 0.0 stand-in, as a
    checkpoint that lacks it) the logits are off."""
    _, path, ref = pegasus
    td = md.load_weights(path)
    del td["final_logits_bias"]
    ours = md.load_model(spec_path("pegasus"), td, variant="tiny")
    got, _ = run(ours, SRC, DEC)
    assert rel_err(got, ref) > 10 * TOL


def test_pegasus_base_model_names_load(pegasus, tmp_path):
    """A PegasusModel checkpoint (names without model., no head) loads through
    hf.prefixes; its logits are the tied projection of the decoder output."""
    import torch

    model = pegasus[0]
    if not model.config.tie_word_embeddings:
        pytest.skip("PegasusModel has no lm_head: the tied case covers it")
    path = save_hf(model.model, tmp_path / "base")
    keys = set(md.load_weights(path).keys())
    assert "shared.weight" in keys and not any(k.startswith("model.") for k in keys)
    ours = md.load_model(spec_path("pegasus"), path, variant="tiny")
    with torch.no_grad():
        h = model.model(input_ids=torch.tensor([SRC]), decoder_input_ids=torch.tensor([DEC]),
                        use_cache=False).last_hidden_state[0]
        ref = (h @ model.model.shared.weight.T).numpy()
    got, _ = run(ours, SRC, DEC)
    assert rel_err(got, ref) <= TOL


def test_pegasus_context_limits_the_decoder(ours):
    """max_position_embeddings bounds the decoder's positions: more new tokens than
    that is an InputError (transformers would index past its position table)."""
    with pytest.raises(md.InputError, match="context of 64"):
        ours.generate(PROMPTS[0], 70, temperature=0)


def test_pegasus_long_source_generates(pegasus, ours):
    """The encoder's positions and the decoder's are apart: a 60-token source with 8 new
    tokens fits a context of 64."""
    import torch

    src = [int(t) for t in np.random.default_rng(5).integers(2, VOCAB, size=60)]
    want = pegasus[0].generate(torch.tensor([src]), max_new_tokens=8, do_sample=False,
                               num_beams=1, eos_token_id=None, forced_eos_token_id=None,
                               pad_token_id=0)[0, 1:].tolist()
    assert ours.generate(src, 8, temperature=0).ids == want
