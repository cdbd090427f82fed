"""specs/mbart.yaml against transformers' MBartForConditionalGeneration.

Small seeded float32 mBART models: an encoder and a decoder of different depths, head
counts and FFN widths (so that no size is taken from the wrong stack), learned
positions read at position + 2, layernorm_embedding, pre-LN layers with a final
LayerNorm in each stack, scale_embedding, and final_logits_bias (a buffer, drawn here
so that its mapping matters). Two configurations: the usual one (scale_embedding, gelu,
output tied to ``model.shared``) and one without embedding scale, with relu and an
untied ``lm_head``.
"""

import numpy as np
import pytest

import maxdecl as md

from modelhelp import randomize, rel_err, save_hf, spec_path

pytest.importorskip("torch")
pytest.importorskip("transformers")

TOL = 1e-4            # max|ours - ref| <= TOL * max|ref|
SRC = [5, 17, 42, 99, 7, 64, 3, 11, 90, 23, 8]
DEC = [2, 8, 9, 120, 33, 4, 77, 60, 12, 101]
N_PREFILL = 4         # decoder tokens in the first step; the rest one at a time
SOURCES = [[5, 17, 42, 99, 7, 64, 3, 11, 90], [8, 9, 120], [33, 4, 77, 60, 12, 6]]
N_NEW = 8

CASES = {
    "base": dict(scale_embedding=True, activation_function="gelu", tie_word_embeddings=True),
    "untied": dict(scale_embedding=False, activation_function="relu", tie_word_embeddings=False),
}


def make_mbart(seed=0, **kw):
    """MBartForConditionalGeneration: d_model 64, encoder 2 layers x 4 heads (ffn 96),
    decoder 3 layers x 2 heads (ffn 160), vocab 128, 48 positions (50-row tables).

    The shared embedding is scaled by 0.1 (so that, after sqrt(64) = 8, tokens and
    positions weigh alike, and greedy decoding does not just repeat its input token);
    final_logits_bias (a buffer randomize leaves at zero) is drawn from 0.1 * N(0, 1)."""
    import torch
    import transformers

    torch.manual_seed(seed)
    cfg = dict(vocab_size=128, d_model=64, encoder_layers=2, decoder_layers=3,
               encoder_attention_heads=4, decoder_attention_heads=2, encoder_ffn_dim=96,
               decoder_ffn_dim=160, max_position_embeddings=48, decoder_start_token_id=2,
               pad_token_id=1, bos_token_id=0, eos_token_id=2, attn_implementation="eager")
    cfg.update(kw)
    model = randomize(transformers.MBartForConditionalGeneration(transformers.MBartConfig(**cfg)),
                      seed)
    gen = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        model.model.shared.weight.mul_(0.1)
        if not cfg["tie_word_embeddings"]:
            model.lm_head.weight.copy_(0.1 * torch.randn(model.lm_head.weight.shape, generator=gen))
        model.final_logits_bias.copy_(0.1 * torch.randn(model.final_logits_bias.shape,
                                                        generator=gen))
    return model


def hf_logits(model, src, dec):
    import torch

    with torch.no_grad():
        out = model(input_ids=torch.tensor([src]), attention_mask=torch.ones(1, len(src), dtype=torch.long),
                    decoder_input_ids=torch.tensor([dec]), use_cache=False)
    return out.logits[0].float().numpy()


def hf_greedy(model, src, n_new):
    """transformers' greedy ids after the decoder start token (no EOS stop, no forced EOS)."""
    import torch

    with torch.no_grad():
        out = model.generate(torch.tensor([src]), attention_mask=torch.ones(1, len(src), dtype=torch.long),
                             max_new_tokens=n_new, do_sample=False, num_beams=1, eos_token_id=None,
                             forced_eos_token_id=None, forced_bos_token_id=None, pad_token_id=1)
    return out[0, 1:].tolist()


@pytest.fixture(scope="module")
def cases(tmp_path_factory):
    """name -> (HF model, its save_pretrained folder, teacher-forced HF logits)."""
    out = {}
    for k, (name, kw) in enumerate(CASES.items()):
        model = make_mbart(seed=k, **kw)
        path = save_hf(model, tmp_path_factory.mktemp(f"mbart_{name}"))
        out[name] = (model, path, hf_logits(model, SRC, DEC))
    return out


@pytest.fixture(scope="module")
def loaded(cases):
    return {name: md.load_model(spec_path("mbart"), path, variant="tiny")
            for name, (_, path, _) in cases.items()}


def empty(v):
    """A state's first value: its symbolic dims (past) 0."""
    return np.zeros([d if isinstance(d, int) else 0 for d in v.type.shape], v.type.dtype.numpy)


def run_steps(model, src, dec, n_prefill):
    """Decoder logits [len(dec), vocab]: a step of the first ``n_prefill`` tokens, then
    one token at a time through the self-attention KV caches."""
    g = model.graph
    names = [v.name for v in g.inputs]
    state = {}
    rows, start = [], 0
    chunks = [dec[:n_prefill]] + [[t] for t in dec[n_prefill:]]
    for chunk in chunks:
        feed = {"enc_tokens": np.asarray(src, np.int64),
                "dec_tokens": np.asarray(chunk, np.int64),
                "dec_positions": np.arange(start, start + len(chunk), dtype=np.int64),
                "logit_rows": np.arange(len(chunk), dtype=np.int64)}
        args = [feed[n] if n in feed else state.get(n, empty(v)) for n, v in zip(names, g.inputs)]
        outs = model(*args)
        got = dict(zip(model.output_names, outs))
        rows.append(np.asarray(got["logits"]))
        state = {n: got[n] for n in names if n in got}
        start += len(chunk)
    return np.concatenate(rows)


def test_mbart_config_from_hf(cases, loaded):
    """Every size comes from config.json, each stack its own."""
    for name, model in loaded.items():
        p = model.params
        assert (p["dim"], p["vocab"], p["context"]) == (64, 128, 48)
        assert (p["n_enc_layers"], p["n_enc_heads"], p["enc_ffn_dim"]) == (2, 4, 96)
        assert (p["n_dec_layers"], p["n_dec_heads"], p["dec_ffn_dim"]) == (3, 2, 160)
        assert p["decoder_start"] == 2
        assert p["embed_scale"] == (8.0 if name == "base" else 1.0)
        assert p["hidden_act"] == CASES[name]["activation_function"]
        assert model.weights["dec.pos_embd.weight"].shape == (50, 64)   # 48 + the offset 2


def test_mbart_output_weights_bound(cases, loaded):
    """The tied case reads model.shared everywhere; the untied one (transformers 5 then
    saves and uses separate encoder, decoder and output tables) reads each its own."""
    for part in ("dec.token_embd.weight", "output.weight"):
        assert part not in loaded["base"].weights
        assert part in loaded["untied"].weights
    hf = cases["untied"][0].model
    np.testing.assert_array_equal(np.asarray(loaded["untied"].weights["enc.token_embd.weight"]),
                                  hf.encoder.embed_tokens.weight.detach().numpy())
    for name, (hf, _, _) in cases.items():
        np.testing.assert_array_equal(np.asarray(loaded[name].weights["output.bias"]).reshape(-1),
                                      hf.final_logits_bias.numpy().reshape(-1))


@pytest.mark.parametrize("name", list(CASES))
def test_mbart_teacher_forced_logits_match_hf(cases, loaded, name):
    """One call over the whole decoder sequence."""
    _, _, ref = cases[name]
    got = run_steps(loaded[name], SRC, DEC, len(DEC))
    err = rel_err(got, ref)
    print(f"mbart[{name}] teacher-forced: {err:.2e} of max|ref| {np.abs(ref).max():.2f}")
    assert err <= TOL


@pytest.mark.parametrize("name", list(CASES))
def test_mbart_kv_cache_decode_matches_hf(cases, loaded, name):
    """A prefill of N_PREFILL decoder tokens, then one token at a time through the caches."""
    _, _, ref = cases[name]
    got = run_steps(loaded[name], SRC, DEC, N_PREFILL)
    pre, dec = rel_err(got[:N_PREFILL], ref[:N_PREFILL]), rel_err(got[N_PREFILL:], ref[N_PREFILL:])
    print(f"mbart[{name}] prefill {pre:.2e}, decode {dec:.2e}")
    assert pre <= TOL and dec <= TOL


@pytest.mark.parametrize("name", list(CASES))
def test_mbart_greedy_generate_matches_hf(cases, loaded, name):
    """model.generate (greedy, from decoder_start) gives transformers' generate ids, one
    source at a time and for a list of sources."""
    hf = cases[name][0]
    want = [hf_greedy(hf, s, N_NEW) for s in SOURCES]
    print(f"mbart[{name}] greedy: {want}")
    ours = loaded[name]
    assert ours.generate(SOURCES[0], N_NEW, temperature=0).ids == want[0]
    assert [o.ids for o in ours.generate(SOURCES, N_NEW, temperature=0)] == want


def test_mbart_decoder_prompt_matches_hf_forced_bos_and_prefix(cases, loaded):
    """``decoder_prompt`` = transformers' ``forced_bos_token_id`` (mBART-50's target
    language: the first token after decoder_start) and a ``decoder_input_ids`` prefix:
    the same ids after it, and the prompt is not in ``out.ids``."""
    import torch

    hf, ours = cases["base"][0], loaded["base"]
    src = SOURCES[0]
    mask = torch.ones(1, len(src), dtype=torch.long)
    with torch.no_grad():
        forced = hf.generate(torch.tensor([src]), attention_mask=mask, max_new_tokens=N_NEW + 1,
                             do_sample=False, num_beams=1, eos_token_id=None,
                             forced_eos_token_id=None, forced_bos_token_id=77, pad_token_id=1)
        prefixed = hf.generate(torch.tensor([src]), attention_mask=mask,
                               decoder_input_ids=torch.tensor([[2, 77, 30]]), max_new_tokens=N_NEW,
                               do_sample=False, num_beams=1, eos_token_id=None,
                               forced_eos_token_id=None, forced_bos_token_id=None, pad_token_id=1)
    assert forced[0, 1].item() == 77
    want = forced[0, 2:].tolist()
    assert want != hf_greedy(hf, src, N_NEW)          # the forced token changes what follows
    assert ours.generate(src, N_NEW, temperature=0, decoder_prompt=[77]).ids == want
    assert ours.generate(src, N_NEW, temperature=0,
                         decoder_prompt=[77, 30]).ids == prefixed[0, 3:].tolist()


def test_mbart_decoder_prompt_is_checked(loaded):
    """A decoder_prompt is token ids in the vocabulary, within the decoder's context, and
    only for encoder-decoders."""
    ours = loaded["base"]
    with pytest.raises(md.InputError, match="decoder_prompt token 0 is 500"):
        ours.generate(SOURCES[0], 2, decoder_prompt=[500])
    with pytest.raises(md.InputError, match="decoder's context of 48"):
        ours.generate(SOURCES[0], 40, decoder_prompt=[5] * 10)
    with pytest.raises(md.InputError, match="decoder_prompt is an empty list"):
        ours.generate(SOURCES[0], 2, decoder_prompt=[])


def test_mbart_generation_depends_on_the_source(cases):
    """The reference is not degenerate: different sources decode differently, and not
    as one repeated token."""
    hf = cases["base"][0]
    want = [hf_greedy(hf, s, N_NEW) for s in SOURCES]
    assert len({tuple(w) for w in want}) > 1
    assert all(len(set(w)) > 1 for w in want)


def test_mbart_position_offset_matters(cases):
    """Negative control: position tables shifted by two rows (read at + 4) are far off."""
    _, path, ref = cases["base"]
    td = md.load_weights(path)
    for stack in ("encoder", "decoder"):
        name = f"model.{stack}.embed_positions.weight"
        t = np.asarray(td[name])
        td[name] = np.ascontiguousarray(np.concatenate([t[2:], t[:2]]))
    ours = md.load_model(spec_path("mbart"), td, variant="tiny")
    assert rel_err(run_steps(ours, SRC, DEC, len(DEC)), ref) > 100 * TOL


def test_mbart_checkpoint_with_every_tied_copy_loads(cases):
    """Older (transformers 4) mBART checkpoints on the Hub save the tied table four times
    (model.shared, encoder and decoder embed_tokens, lm_head): the same logits."""
    _, path, ref = cases["base"]
    td = md.load_weights(path)
    shared = np.asarray(td["model.shared.weight"])
    for name in ("model.encoder.embed_tokens.weight", "model.decoder.embed_tokens.weight",
                 "lm_head.weight"):
        td[name] = shared.copy()
    ours = md.load_model(spec_path("mbart"), td, variant="tiny")
    assert rel_err(run_steps(ours, SRC, DEC, N_PREFILL), ref) <= TOL


def test_mbart_stops_at_the_position_tables(loaded):
    """Learned positions end at max_position_embeddings (48): a longer source, or more
    new tokens, is an InputError, not an index past the table."""
    with pytest.raises(md.InputError, match="encoder's context of 48"):
        loaded["base"].generate([5] * 60, 2, temperature=0)
    with pytest.raises(md.InputError, match="decoder's context of 48"):
        loaded["base"].generate([5] * 10, 60, temperature=0)
