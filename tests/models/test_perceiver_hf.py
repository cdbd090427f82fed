"""specs/perceiver.yaml against transformers' PerceiverForMaskedLM (Perceiver IO).

Small seeded float32 models: byte embeddings plus learned positions, a latent array
read through one masked cross-attention layer (a batch of two byte sequences, the
second padded), a block of latent self-attention layers run ``num_blocks`` times with
shared weights, and the decoder's cross-attention whose queries are the trainable
position table (``max_position_embeddings`` rows): the logits are
``[batch, max_position_embeddings, vocab]`` whatever the input length. The encoder's
final latents (transformers' last ``hidden_states``) are compared too.

Two configurations: transformers' defaults for the channel counts (qk_channels and
v_channels null, cross_attention_shape_for_attention "kv", query residual on,
widening factors 3 and 2, two blocks), and explicit qk_channels / v_channels with
the "q" shape, no query residual, gelu_new and one block.
"""

import numpy as np
import pytest

import maxdecl as md

from modelhelp import hf_params, randomize, save_hf, spec_path

pytest.importorskip("torch")
pytest.importorskip("transformers")

TOL = 1e-5          # max|ours - ref| <= TOL * max|ref|
SEQ = 11            # padded length of the batch
LENGTHS = (11, 7)   # real bytes per sequence

BASE = dict(vocab_size=262, d_model=32, d_latents=48, num_latents=6, num_blocks=2,
            num_self_attends_per_block=2, num_self_attention_heads=4,
            num_cross_attention_heads=2, qk_channels=None, v_channels=None,
            cross_attention_shape_for_attention="kv", self_attention_widening_factor=2,
            cross_attention_widening_factor=3, use_query_residual=True, hidden_act="gelu",
            max_position_embeddings=16, attn_implementation="eager")
EXPLICIT = dict(BASE, qk_channels=24, v_channels=48, cross_attention_shape_for_attention="q",
                use_query_residual=False, hidden_act="gelu_new", num_blocks=1,
                self_attention_widening_factor=1, cross_attention_widening_factor=1)


def make_perceiver(seed=0, **kw):
    import torch
    import transformers

    torch.manual_seed(seed)
    return randomize(transformers.PerceiverForMaskedLM(transformers.PerceiverConfig(**kw)), seed)


def batch(seed=7, lengths=LENGTHS, seq=SEQ):
    """(byte ids [B, seq], attention_mask [B, seq]): padding (id 0) after each length."""
    rng = np.random.default_rng(seed)
    ids = rng.integers(6, 262, size=(len(lengths), seq)).astype(np.int64)
    mask = np.zeros_like(ids)
    for b, n in enumerate(lengths):
        mask[b, :n] = 1
        ids[b, n:] = 0
    return ids, mask


def hf_outputs(model, ids, mask):
    """(logits [B, P, vocab], the encoder's final latents [B, N, d_latents])."""
    import torch

    with torch.no_grad():
        out = model(inputs=torch.from_numpy(ids), attention_mask=torch.from_numpy(mask),
                    output_hidden_states=True)
    return out.logits.float().numpy(), out.hidden_states[-1].float().numpy()


def rel(ours, ref):
    ours, ref = np.asarray(ours, np.float64), np.asarray(ref, np.float64)
    assert ours.shape == ref.shape, (ours.shape, ref.shape)
    return float(np.abs(ours - ref).max() / np.abs(ref).max())


def run(model, ids, mask):
    got = dict(zip(model.output_names, model(ids, mask)))
    return got["logits"], got["last_hidden_state"]


def case(cfg, seed, folder):
    model = make_perceiver(seed=seed, **cfg)
    path = save_hf(model, folder)
    ids, mask = batch()
    return model, path, ids, mask, hf_outputs(model, ids, mask)


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    return case(BASE, 0, tmp_path_factory.mktemp("perceiver_base"))


@pytest.fixture(scope="module")
def explicit(tmp_path_factory):
    return case(EXPLICIT, 1, tmp_path_factory.mktemp("perceiver_explicit"))


@pytest.fixture(scope="module")
def ours(base):
    return md.load_model(spec_path("perceiver"), base[1], variant="tiny")


def test_perceiver_config_from_hf(base, explicit):
    got = hf_params("perceiver", base[1])[2]
    assert (got["vocab"], got["d_model"], got["d_latents"], got["n_latents"]) == (262, 32, 48, 6)
    assert (got["n_blocks"], got["n_self"], got["n_self_heads"], got["n_cross_heads"]) == (2, 2, 4, 2)
    assert got["context"] == 16
    assert got["qk_channels"] is None and got["v_channels"] is None
    got = hf_params("perceiver", explicit[1])[2]
    assert (got["qk_channels"], got["v_channels"], got["cross_shape"]) == (24, 48, "q")
    assert got["use_query_residual"] is False and got["hidden_act"] == "gelu_new"


def test_perceiver_derived_channels(ours, explicit):
    p = ours.params
    assert (p["enc_qk"], p["enc_v"], p["sa_qk"], p["sa_v"]) == (32, 32, 48, 48)   # "kv": d_model
    p = md.load_model(spec_path("perceiver"), explicit[1], variant="language-perceiver").params
    assert (p["enc_qk"], p["enc_v"], p["sa_qk"], p["sa_v"]) == (24, 48, 24, 48)
    assert (p["d_model"], p["n_blocks"], p["context"]) == (32, 1, 16)   # the file's, not the variant's


def test_perceiver_masked_lm_matches_hf(base, ours):
    """Padded batch of two: logits [2, 16, 262] and the final latents [2, 6, 48]."""
    _, _, ids, mask, (ref_logits, ref_hidden) = base
    logits, hidden = run(ours, ids, mask)
    e_logits, e_hidden = rel(logits, ref_logits), rel(hidden, ref_hidden)
    print(f"perceiver vs HF: logits {e_logits:.2e}, last_hidden_state {e_hidden:.2e} (of max|ref|)")
    assert logits.shape == (2, 16, 262)
    assert e_logits <= TOL and e_hidden <= TOL


def test_perceiver_explicit_channels_match_hf(explicit):
    """qk_channels 24, v_channels 48, the "q" shape, no query residual, gelu_new."""
    _, path, ids, mask, (ref_logits, ref_hidden) = explicit
    model = md.load_model(spec_path("perceiver"), path, variant="tiny")
    logits, hidden = run(model, ids, mask)
    e_logits, e_hidden = rel(logits, ref_logits), rel(hidden, ref_hidden)
    print(f"perceiver (explicit) vs HF: logits {e_logits:.2e}, last_hidden_state {e_hidden:.2e}")
    assert e_logits <= TOL and e_hidden <= TOL


def test_perceiver_other_batch_and_length(base, ours):
    """The batch and length are symbolic: one unpadded sequence of 5 bytes."""
    model = base[0]
    ids, mask = batch(seed=3, lengths=(5,), seq=5)
    ref_logits, ref_hidden = hf_outputs(model, ids, mask)
    logits, hidden = run(ours, ids, mask)
    assert rel(logits, ref_logits) <= TOL and rel(hidden, ref_hidden) <= TOL


def test_perceiver_padding_is_masked(base, ours):
    """The padded bytes of the second sequence are not read: other ids there change
    nothing; and the mask matters (all ones moves the second sequence's logits)."""
    _, _, ids, mask, (ref_logits, _) = base
    other = ids.copy()
    other[1, LENGTHS[1]:] = 100
    logits, _ = run(ours, other, mask)
    assert rel(logits, ref_logits) <= TOL
    unmasked, _ = run(ours, ids, np.ones_like(mask))
    assert rel(unmasked[1], ref_logits[1]) > 100 * TOL
    assert rel(unmasked[0], ref_logits[0]) <= TOL         # the unpadded one is unchanged


def test_perceiver_all_padding_row_matches_hf(base, ours):
    """A sequence that is all padding: transformers' finfo.min mask averages every input
    byte (not zeros, not NaN); the spec's additive mask does the same."""
    model = base[0]
    ids, mask = batch(seed=11, lengths=(9, 0), seq=9)
    ref_logits, ref_hidden = hf_outputs(model, ids, mask)
    logits, hidden = run(ours, ids, mask)
    assert np.isfinite(ref_logits).all()
    assert rel(logits, ref_logits) <= TOL and rel(hidden, ref_hidden) <= TOL


def test_perceiver_blocks_share_weights(ours):
    """num_blocks 2 runs the 2 self-attention layers twice (4 attention nodes beside the
    decoder's) over one set of weights."""
    ops = [n.op for n in ours.graph.nodes]
    assert ops.count("masked_attention") == 1                  # the encoder's cross-attention
    assert ops.count("attention") == 2 * 2 + 1                 # self-attention, decoder
    assert not any(k.startswith("encoder.self_attends.2") for k in ours.weights.keys())


def test_perceiver_checkpoint_without_prefix_loads(base):
    """The checkpoint's names under the spec's short names (no ``perceiver.``, as a bare
    PerceiverModel saves its encoder) load too: ``hf.prefixes``."""
    _, path, ids, mask, (ref_logits, _) = base
    td = md.load_weights(path)
    names = list(td.keys())
    assert any(k.startswith("perceiver.") for k in names)
    for k in names:
        if k.startswith("perceiver."):
            td[k.removeprefix("perceiver.")] = np.asarray(td[k])
            del td[k]
    ours = md.load_model(spec_path("perceiver"), td, variant="tiny")
    logits, _ = run(ours, ids, mask)
    assert rel(logits, ref_logits) <= TOL


def test_perceiver_base_model_matches_hf(tmp_path):
    """A bare PerceiverModel (no preprocessor, no decoder): float inputs [B, seq, d_model]
    with padding through the encoder, compared on last_hidden_state."""
    import torch
    import transformers

    torch.manual_seed(2)
    cfg = transformers.PerceiverConfig(**BASE)
    model = randomize(transformers.PerceiverModel(cfg), 2)
    path = save_hf(model, tmp_path / "base_model")
    _, mask = batch()
    x = np.random.default_rng(5).standard_normal((2, SEQ, 32)).astype(np.float32)
    with torch.no_grad():
        ref = model(inputs=torch.from_numpy(x),
                    attention_mask=torch.from_numpy(mask)).last_hidden_state.numpy()
    ours = md.load_model(spec_path("perceiver"), path, variant="tiny")
    assert ours.input_names == ["inputs", "attention_mask"]
    assert ours.output_names == ["last_hidden_state"]
    (hidden,) = ours(x, mask)
    err = rel(hidden, ref)
    print(f"perceiver (PerceiverModel) vs HF: last_hidden_state {err:.2e}")
    assert err <= TOL


def test_perceiver_other_heads_are_refused(tmp_path):
    """PerceiverForSequenceClassification's decoder is not modelled: refused by name."""
    import transformers

    model = transformers.PerceiverForSequenceClassification(
        transformers.PerceiverConfig(**dict(BASE, num_labels=3)))
    path = save_hf(model, tmp_path / "cls")
    with pytest.raises(md.WeightsError, match="PerceiverForSequenceClassification"):
        md.load_model(spec_path("perceiver"), path, variant="tiny")
