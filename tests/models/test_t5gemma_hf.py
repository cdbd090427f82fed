"""specs/t5gemma.yaml against transformers' T5GemmaForConditionalGeneration.

A small seeded float32 T5Gemma whose encoder and decoder differ in every size
(encoder: width 64, 2 layers, 4 heads of 16, 2 kv heads; decoder: width 48, 3 layers,
6 heads of 8, 2 kv heads), so the cross-attention reads the encoder's width.
Sliding window 4 on the "sliding_attention" layers (sources of 10 tokens and 10 new
tokens go past it), query_pre_attn_scalar 24 (not head_dim), attention soft cap 20,
final logit soft cap 15, RoPE theta 1000, Gemma's 1 + w RMSNorms, an output tied to
the decoder's embedding (save_pretrained writes no lm_head).
"""

import numpy as np
import pytest

import maxdecl as md

from modelhelp import hf_params, randomize, rel_err, save_hf, spec_path, with_hf_config

pytest.importorskip("torch")
pytest.importorskip("transformers")

TOL = 1e-5              # max|ours - ref| <= TOL * max|ref|
VOCAB = 256
N_NEW = 10
SRC_LEN, DEC_LEN = 10, 6
PAD_FROM = 6            # the second source is padded from here on

ENC = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
           num_attention_heads=4, num_key_value_heads=2, head_dim=16, sliding_window=4,
           query_pre_attn_scalar=24, attn_logit_softcapping=20.0,
           final_logit_softcapping=15.0, max_position_embeddings=64, rms_norm_eps=1e-6,
           rope_parameters={"rope_type": "default", "rope_theta": 1000.0})
DEC = dict(ENC, hidden_size=48, intermediate_size=96, num_hidden_layers=3,
           num_attention_heads=6, num_key_value_heads=2, head_dim=8)


def make_t5gemma(seed=0):
    """T5GemmaForConditionalGeneration with randomize's weights (norm gains near 0:
    the model scales by 1 + w). The embeddings are scaled down (encoder by
    1 / sqrt(width), decoder by 0.1 / sqrt(width)): the model multiplies them by
    sqrt(width), and with the tied output a token's own embedding would otherwise
    dominate its logits, so greedy decoding would repeat one token."""
    import torch
    import transformers

    torch.manual_seed(seed)
    cfg = transformers.T5GemmaConfig(encoder=ENC, decoder=DEC, vocab_size=VOCAB,
                                     attn_implementation="eager")
    model = randomize(transformers.T5GemmaForConditionalGeneration(cfg), seed,
                      norm_center=0.0)
    with torch.no_grad():
        model.model.encoder.embed_tokens.weight.mul_(ENC["hidden_size"] ** -0.5)
        model.model.decoder.embed_tokens.weight.mul_(0.1 * DEC["hidden_size"] ** -0.5)
    return model.eval()


def batch(seed=1):
    """(source ids [2, SRC_LEN], attention mask, decoder ids [2, DEC_LEN]): the second
    source padded (id 0, mask 0) from PAD_FROM on; ids >= 3 elsewhere (0 is pad, 2 the
    decoder start), the decoder ids starting with the decoder start."""
    rng = np.random.default_rng(seed)
    src = rng.integers(3, VOCAB, size=(2, SRC_LEN))
    mask = np.ones((2, SRC_LEN), np.int64)
    mask[1, PAD_FROM:] = 0
    src[1, PAD_FROM:] = 0
    dec = rng.integers(3, VOCAB, size=(2, DEC_LEN))
    dec[:, 0] = 2
    return src, mask, dec


@pytest.fixture(scope="module")
def t5gemma(tmp_path_factory):
    """(HF model, its folder, (src, mask, dec), HF outputs of the batch)."""
    import torch

    model = make_t5gemma()
    path = save_hf(model, tmp_path_factory.mktemp("t5gemma_hf"))
    src, mask, dec = batch()
    with torch.no_grad():
        out = model(input_ids=torch.tensor(src), attention_mask=torch.tensor(mask),
                    decoder_input_ids=torch.tensor(dec), output_hidden_states=True)
    ref = {"logits": out.logits.numpy(),
           "encoder_last_hidden_state": out.encoder_last_hidden_state.numpy(),
           "last_hidden_state": out.decoder_hidden_states[-1].numpy()}
    return model, path, (src, mask, dec), ref


@pytest.fixture(scope="module")
def ours(t5gemma):
    return md.load_model(spec_path("t5gemma"), t5gemma[1], variant="tiny")


def empty_caches(model, n_batch=2) -> dict:
    return {v.name: np.zeros((2, n_batch, 0, *v.type.shape[3:]), np.float32)
            for v in model.graph.inputs if v.name.endswith("kv_cache")}


def run(model, src, mask, dec, start=0, caches=None, rows=None) -> dict:
    """{output: array} of one call: decoder ids ``dec`` at positions start.., every row's
    logits unless ``rows``."""
    feed = {"enc_tokens": np.asarray(src, np.int64), "enc_mask": np.asarray(mask, np.int64),
            "dec_tokens": np.asarray(dec, np.int64),
            "dec_positions": np.arange(start, start + dec.shape[1], dtype=np.int64),
            "logit_rows": np.arange(dec.shape[1], dtype=np.int64) if rows is None else rows,
            **(caches if caches is not None else empty_caches(model, len(src)))}
    return dict(zip(model.output_names, model(*(feed[n] for n in model.input_names))))


def test_t5gemma_config_from_hf(t5gemma):
    got = hf_params("t5gemma", t5gemma[1])[2]
    assert {k: got[k] for k in ("enc_dim", "enc_ffn", "enc_layers", "enc_heads",
                                "enc_kv_heads", "enc_head_dim")} == {
        "enc_dim": 64, "enc_ffn": 128, "enc_layers": 2, "enc_heads": 4, "enc_kv_heads": 2,
        "enc_head_dim": 16}
    assert {k: got[k] for k in ("dec_dim", "dec_ffn", "dec_layers", "dec_heads",
                                "dec_kv_heads", "dec_head_dim")} == {
        "dec_dim": 48, "dec_ffn": 96, "dec_layers": 3, "dec_heads": 6, "dec_kv_heads": 2,
        "dec_head_dim": 8}
    assert (got["vocab"], got["dec_vocab"], got["decoder_start"], got["context"]) == (
        256, 256, 2, 64)
    assert (got["enc_qpas"], got["enc_window"], got["dec_window"]) == (24, 4, 4)
    assert got["enc_softcap"] == got["dec_softcap"] == pytest.approx(20.0)
    assert got["dec_final_softcap"] == pytest.approx(15.0)
    assert got["enc_theta"] == got["dec_theta"] == pytest.approx(1000.0)
    assert got["dec_layer_types"] == ["sliding_attention", "full_attention",
                                      "sliding_attention"]
    assert got["enc_act"] == "gelu_pytorch_tanh"


def test_t5gemma_encoder_last_hidden_state_matches_hf(t5gemma, ours):
    """The encoder over a padded batch of two sources: every position, padded ones too
    (their queries still see the real keys in transformers)."""
    _, _, (src, mask, dec), ref = t5gemma
    got = run(ours, src, mask, dec)["encoder_last_hidden_state"]
    err = rel_err(got, ref["encoder_last_hidden_state"])
    print(f"t5gemma encoder last_hidden_state vs HF: {err:.2e} of max|ref|")
    assert err <= TOL


def test_t5gemma_decoder_logits_padded_source_match_hf(t5gemma, ours):
    """Teacher-forced decoder logits and final hidden state for the padded batch."""
    _, _, (src, mask, dec), ref = t5gemma
    out = run(ours, src, mask, dec)
    err = rel_err(out["logits"], ref["logits"])
    hid = rel_err(out["last_hidden_state"], ref["last_hidden_state"])
    print(f"t5gemma logits vs HF: {err:.2e}, decoder last_hidden_state {hid:.2e} of max|ref|")
    assert err <= TOL and hid <= TOL


def test_t5gemma_kv_cache_decode_matches_hf(t5gemma, ours):
    """A prefill of 2 decoder tokens, then one token a step through the self-attention
    KV caches (past the window of 4), against the teacher-forced HF logits."""
    _, _, (src, mask, dec), ref = t5gemma
    out = run(ours, src, mask, dec[:, :2])
    caches = {n: out[n] for n in empty_caches(ours)}
    got = [out["logits"]]
    for pos in range(2, DEC_LEN):
        out = run(ours, src, mask, dec[:, pos:pos + 1], start=pos, caches=caches)
        caches = {n: out[n] for n in caches}
        got.append(out["logits"])
    assert caches["dec.blk.0.kv_cache"].shape == (2, 2, DEC_LEN, 2, 8)
    err = rel_err(np.concatenate(got, axis=1), ref["logits"])
    print(f"t5gemma KV-cache decode vs HF: {err:.2e} of max|ref|")
    assert err <= TOL


def test_t5gemma_padding_mask_matters(t5gemma, ours):
    """Negative control: the padded source read with a mask of all ones is far off."""
    _, _, (src, mask, dec), ref = t5gemma
    out = run(ours, src, np.ones_like(mask), dec)
    assert rel_err(out["logits"][1], ref["logits"][1]) > 100 * TOL
    assert rel_err(out["logits"][0], ref["logits"][0]) <= TOL       # the unpadded one


@pytest.mark.parametrize("key", ["enc_window", "dec_window"])
def test_t5gemma_sliding_window_matters(t5gemma, key):
    """Negative control: without the encoder's (two-sided) or the decoder's (causal)
    sliding window the logits are far off."""
    _, path, (src, mask, dec), ref = t5gemma
    spec = with_hf_config(md.load_spec(spec_path("t5gemma")), **{key: "{0}"})
    off = md.load_model(spec, path, variant="tiny")
    assert rel_err(run(off, src, mask, dec)["logits"], ref["logits"]) > 100 * TOL


def test_t5gemma_greedy_generate_matches_hf(t5gemma, ours):
    """maxdecl's greedy generate (decoder_start from config.json, the encoder once, the
    decoder through its KV caches and the cross-attention over the encoder's output)
    gives transformers' greedy ids, for each source alone and for the three together."""
    import torch

    model = t5gemma[0]
    rng = np.random.default_rng(5)
    prompts = [[int(t) for t in rng.integers(3, VOCAB, size=n)] for n in (11, 5, 8)]
    want = []
    for p in prompts:
        with torch.no_grad():
            out = model.generate(torch.tensor([p]), max_new_tokens=N_NEW, do_sample=False,
                                 eos_token_id=None)
        assert out[0, 0] == 2                                   # decoder_start
        want.append(out[0, 1:].tolist())
    assert len({tuple(w) for w in want}) == 3 and any(len(set(w)) > 2 for w in want)
    assert ours.generate(prompts[0], N_NEW, temperature=0).ids == want[0]
    assert [o.ids for o in ours.generate(prompts, N_NEW, temperature=0)] == want


def test_t5gemma_base_model_checkpoint_matches_hf(t5gemma, tmp_path):
    """A T5GemmaModel checkpoint (names without model., no lm_head) loads: its encoder
    and decoder hidden states match T5GemmaModel's."""
    import torch

    model, _, (src, mask, dec), _ = t5gemma
    path = save_hf(model.model, tmp_path / "base")
    keys = set(md.load_weights(path).keys())
    assert "encoder.embed_tokens.weight" in keys and not any(k.startswith("model.") for k in keys)
    with torch.no_grad():
        out = model.model(input_ids=torch.tensor(src), attention_mask=torch.tensor(mask),
                          decoder_input_ids=torch.tensor(dec))
    base = md.load_model(spec_path("t5gemma"), path, variant="tiny")
    got = run(base, src, mask, dec)
    assert rel_err(got["encoder_last_hidden_state"],
                   out.encoder_last_hidden_state.numpy()) <= TOL
    assert rel_err(got["last_hidden_state"], out.last_hidden_state.numpy()) <= TOL


def test_t5gemma_refuses_scaled_rope(t5gemma, tmp_path):
    """A checkpoint with a RoPE scaling other than the default is refused by name."""
    import json
    import shutil

    path = shutil.copytree(t5gemma[1], tmp_path / "linear_rope")
    cfg = json.loads((path / "config.json").read_text())
    cfg["decoder"]["rope_parameters"] = {"rope_type": "linear", "rope_theta": 1000.0,
                                         "factor": 2.0}
    (path / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(md.WeightsError, match="RoPE scaling default / linear"):
        md.load_model(spec_path("t5gemma"), path, variant="tiny")
