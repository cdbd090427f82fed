"""specs/mpnet.yaml against transformers' MPNetForMaskedLM and MPNetModel.

A small seeded float32 MPNet: post-norm encoder, learned absolute positions computed
from the tokens (pad id 1 sits at position 1, the others count up from 2), a bucketed
relative position bias shared by all layers (32 buckets, max distance 128), a masked-LM
head tied to the word embeddings, and MPNetModel's tanh pooler. Padded batches go
through ``attention_mask``. The FFN uses gelu_new and the norms eps 1e-6 (not the
defaults), so a config key the spec failed to read would show.
"""

import numpy as np
import pytest

import maxdecl as md

from modelhelp import hf_params, randomize, rel_err, save_hf, spec_path

pytest.importorskip("torch")
pytest.importorskip("transformers")

TOL = 1e-5           # max|ours - ref| <= TOL * max|ref| (measured: about 6e-7)
VOCAB = 100
CONFIG = dict(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
              intermediate_size=64, max_position_embeddings=160, hidden_act="gelu_new",
              layer_norm_eps=1e-6, relative_attention_num_buckets=32,
              attn_implementation="eager")


def make_mpnet(cls_name="MPNetForMaskedLM", seed=0, **kw):
    """A seeded MPNet of ``CONFIG``; the relative bias table drawn N(0, 1) so that a
    wrong bucket shows in the outputs."""
    import torch
    import transformers

    torch.manual_seed(seed)
    cfg = transformers.MPNetConfig(**{**CONFIG, **kw})
    model = randomize(getattr(transformers, cls_name)(cfg), seed)
    base = getattr(model, "mpnet", model)
    gen = torch.Generator().manual_seed(seed + 100)
    with torch.no_grad():
        table = base.encoder.relative_attention_bias.weight
        table.copy_(torch.randn(table.shape, generator=gen))
    return model


def batch(seed=3, lengths=(24, 17, 9), seq=24, pad_ones=True):
    """(tokens, attention_mask) int64 [len(lengths), seq]: random ids (some of them 1,
    the pad id, inside the real tokens too), rows right-padded with 1 and mask 0."""
    rng = np.random.default_rng(seed)
    tokens = rng.integers(0, VOCAB, size=(len(lengths), seq)).astype(np.int64)
    tokens[0, [3, 11]] = 1                      # pad ids inside a sequence: position 1
    mask = np.zeros_like(tokens)
    for r, n in enumerate(lengths):
        mask[r, :n] = 1
        if pad_ones:
            tokens[r, n:] = 1
    return tokens, mask


def hf_forward(model, tokens, mask=None) -> dict:
    import torch

    with torch.no_grad():
        out = model(torch.from_numpy(tokens),
                    attention_mask=None if mask is None else torch.from_numpy(mask))
    res = {}
    if getattr(out, "logits", None) is not None:
        res["logits"] = out.logits.numpy()
    if getattr(out, "pooler_output", None) is not None:
        res["pooler_output"] = out.pooler_output.numpy()
    if getattr(out, "last_hidden_state", None) is not None:
        res["last_hidden_state"] = out.last_hidden_state.numpy()
    return res


def hf_hidden(model, tokens, mask=None) -> np.ndarray:
    """The encoder's last hidden state of an MPNetForMaskedLM."""
    import torch

    with torch.no_grad():
        out = model.mpnet(torch.from_numpy(tokens),
                          attention_mask=None if mask is None else torch.from_numpy(mask))
    return out.last_hidden_state.numpy()


def ours_forward(model, tokens, mask=None) -> dict:
    if mask is None:
        mask = np.ones_like(tokens)
    return dict(zip(model.output_names, model(tokens, mask)))


@pytest.fixture(scope="module")
def mlm(tmp_path_factory):
    model = make_mpnet()
    return model, save_hf(model, tmp_path_factory.mktemp("mpnet_mlm"))


@pytest.fixture(scope="module")
def ours(mlm):
    return md.load_model(spec_path("mpnet"), mlm[1], variant="tiny")


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    model = make_mpnet("MPNetModel", seed=1)
    return model, save_hf(model, tmp_path_factory.mktemp("mpnet_base"))


def test_mpnet_config_from_hf(mlm):
    got = hf_params("mpnet", mlm[1])[2]
    assert (got["dim"], got["n_layers"], got["n_heads"], got["ffn_dim"], got["vocab"]) == \
        (32, 2, 4, 64, VOCAB)
    assert (got["n_pos"], got["n_buckets"], got["hidden_act"]) == (160, 32, "gelu_new")
    assert got["norm_eps"] == pytest.approx(1e-6)
    assert got["lm_head"] is True and got["pooler"] is False


def test_mpnet_output_names_and_tied_head(ours):
    assert list(ours.output_names) == ["logits", "last_hidden_state"]
    assert list(ours.input_names) == ["tokens", "attention_mask"]
    assert ours.params["context"] == 160 - 2
    assert "output.weight" not in ours.weights          # tied: the embedding stands in
    assert "output.bias" in ours.weights


def test_mpnet_mlm_logits_and_hidden_no_mask(mlm, ours):
    model, _ = mlm
    tokens, _ = batch(lengths=(24, 24, 24))
    ref = hf_forward(model, tokens)
    got = ours_forward(ours, tokens)
    e_logits = rel_err(got["logits"], ref["logits"])
    e_hidden = rel_err(got["last_hidden_state"], hf_hidden(model, tokens))
    print(f"mpnet mlm, no mask: logits {e_logits:.2e}, last hidden {e_hidden:.2e}")
    assert e_logits <= TOL and e_hidden <= TOL


def test_mpnet_mlm_logits_and_hidden_padded(mlm, ours):
    """Right-padded rows (pad id 1, mask 0) of three lengths; every position compared,
    the padded ones included (their queries still see the real keys)."""
    model, _ = mlm
    tokens, mask = batch()
    ref = hf_forward(model, tokens, mask)
    got = ours_forward(ours, tokens, mask)
    e_logits = rel_err(got["logits"], ref["logits"])
    e_hidden = rel_err(got["last_hidden_state"], hf_hidden(model, tokens, mask))
    print(f"mpnet mlm, padded: logits {e_logits:.2e}, last hidden {e_hidden:.2e}")
    assert e_logits <= TOL and e_hidden <= TOL
    # the mask matters: without it the real rows change
    unmasked = ours_forward(ours, tokens)
    assert rel_err(unmasked["logits"][1, :17], ref["logits"][1, :17]) > 100 * TOL


def test_mpnet_mask_on_non_pad_tokens(mlm, ours):
    """Masked positions that hold ordinary ids (not 1) still count in the positions, as
    in transformers."""
    model, _ = mlm
    tokens, mask = batch(seed=5, pad_ones=False)
    ref = hf_forward(model, tokens, mask)
    got = ours_forward(ours, tokens, mask)
    e = rel_err(got["logits"], ref["logits"])
    print(f"mpnet mlm, mask on ordinary ids: logits {e:.2e}")
    assert e <= TOL


def test_mpnet_long_sequence_far_buckets(mlm, ours):
    """150 tokens: distances past max_distance (128) take the last log bucket."""
    model, _ = mlm
    tokens, mask = batch(seed=9, lengths=(150, 131), seq=150)
    ref = hf_forward(model, tokens, mask)
    got = ours_forward(ours, tokens, mask)
    e_logits = rel_err(got["logits"], ref["logits"])
    e_hidden = rel_err(got["last_hidden_state"], hf_hidden(model, tokens, mask))
    print(f"mpnet mlm, 150 tokens: logits {e_logits:.2e}, last hidden {e_hidden:.2e}")
    assert e_logits <= TOL and e_hidden <= TOL


def test_mpnet_relative_bias_matters(mlm):
    """Negative control: with the bias table zeroed the logits are far off."""
    model, path = mlm
    td = md.load_weights(path)
    name = "mpnet.encoder.relative_attention_bias.weight"
    td[name] = np.zeros_like(np.asarray(td[name]))
    wrong = md.load_model(spec_path("mpnet"), td, variant="tiny")
    tokens, mask = batch()
    ref = hf_forward(model, tokens, mask)
    assert rel_err(ours_forward(wrong, tokens, mask)["logits"], ref["logits"]) > 100 * TOL


def test_mpnet_base_model_with_pooler(base):
    """An MPNetModel checkpoint (names without mpnet., a pooler, no LM head)."""
    model, path = base
    ours = md.load_model(spec_path("mpnet"), path, variant="tiny")
    assert list(ours.output_names) == ["last_hidden_state", "pooler_output"]
    for tokens, mask in [batch(lengths=(24, 24, 24)), batch()]:
        ref = hf_forward(model, tokens, mask)
        got = ours_forward(ours, tokens, mask)
        e_hidden = rel_err(got["last_hidden_state"], ref["last_hidden_state"])
        e_pool = rel_err(got["pooler_output"], ref["pooler_output"])
        print(f"mpnet base: last hidden {e_hidden:.2e}, pooler {e_pool:.2e}")
        assert e_hidden <= TOL and e_pool <= TOL


def test_mpnet_untied_head(tmp_path):
    """tie_word_embeddings false: the checkpoint stores lm_head.decoder.weight, used."""
    model = make_mpnet(seed=2, tie_word_embeddings=False)
    assert model.lm_head.decoder.weight.data_ptr() != \
        model.mpnet.embeddings.word_embeddings.weight.data_ptr()
    path = save_hf(model, tmp_path / "untied")
    ours = md.load_model(spec_path("mpnet"), path, variant="tiny")
    assert "output.weight" in ours.weights
    tokens, mask = batch()
    e = rel_err(ours_forward(ours, tokens, mask)["logits"], hf_forward(model, tokens, mask)["logits"])
    print(f"mpnet untied head: logits {e:.2e}")
    assert e <= TOL


def test_mpnet_refuses_fewer_than_32_buckets(mlm):
    """transformers buckets into 32 whatever relative_attention_num_buckets says."""
    td = md.load_weights(mlm[1])
    td.metadata["relative_attention_num_buckets"] = 16
    with pytest.raises(md.WeightsError, match="relative_attention_num_buckets 16"):
        md.load_model(spec_path("mpnet"), td, variant="tiny")
