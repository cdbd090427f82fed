"""specs/fnet.yaml against transformers' FNetForMaskedLM and FNetModel.

Small seeded float32 FNets: word + token-type + position embeddings, LayerNorm and the
embedding projection, post-norm blocks whose token mixer is the real part of the 2-D
DFT over (seq, hidden) (torch.fft.fftn), gelu_new / gelu FFNs, the tanh pooler and the
masked-LM head (tied to the word embeddings: transformers 5 saves only
``cls.predictions.bias``; an untied case saves the decoder too). Batches of 2 sequences
of different content, no padding (FNet has no attention mask), with token types.
"""

import numpy as np
import pytest

import maxdecl as md

from modelhelp import named_outputs, randomize, rel_err, save_hf, spec_path

pytest.importorskip("torch")
pytest.importorskip("transformers")

TOL = 1e-4          # max|ours - ref| <= TOL * max|ref|
BATCH, SEQ = 2, 11
VOCAB = 96
TINY = dict(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2, intermediate_size=64,
            max_position_embeddings=40, type_vocab_size=4, layer_norm_eps=1e-12,
            hidden_act="gelu_new")


def make_fnet(cls_name="FNetForMaskedLM", seed=0, **kw):
    import torch
    import transformers

    torch.manual_seed(seed)
    cfg = dict(TINY)
    cfg.update(kw)
    cls = getattr(transformers, cls_name)
    return randomize(cls(transformers.FNetConfig(**cfg)), seed)


def batch_inputs(seed=11, seq=SEQ, n_types=4):
    """(ids, token types), each int64 [BATCH, seq]: random ids (row 1 differs from row
    0), a second segment from position 5 on (types 1 and, in row 1, 3)."""
    rng = np.random.default_rng(seed)
    ids = rng.integers(0, VOCAB, size=(BATCH, seq)).astype(np.int64)
    types = np.zeros((BATCH, seq), np.int64)
    types[0, 5:] = 1
    types[1, 5:] = n_types - 1
    assert not np.array_equal(ids[0], ids[1])
    return ids, types


def hf_outputs(model, ids, types) -> dict:
    """transformers' last hidden state and pooler output, and the MLM logits when the
    model has the head."""
    import torch

    t = {"input_ids": torch.from_numpy(ids), "token_type_ids": torch.from_numpy(types)}
    out = {}
    with torch.no_grad():
        if hasattr(model, "cls"):
            base = model.fnet(**t)
            out["logits"] = model(**t).logits.numpy()
        else:
            base = model(**t)
        out["last_hidden_state"] = base.last_hidden_state.numpy()
        out["pooler_output"] = base.pooler_output.numpy()
    return out


def check(name, ours, ref, keys):
    errs = {k: rel_err(ours[k], ref[k]) for k in keys}
    print(f"fnet {name}: " + ", ".join(f"{k} {e:.2e}" for k, e in errs.items()))
    assert all(e <= TOL for e in errs.values()), errs
    return errs


CASES = {
    "mlm": ("FNetForMaskedLM", {}),
    "untied": ("FNetForMaskedLM", dict(tie_word_embeddings=False, hidden_size=24,
                                       num_hidden_layers=3, hidden_act="gelu")),
    "base": ("FNetModel", dict(num_hidden_layers=3, intermediate_size=48)),
}


@pytest.fixture(scope="module")
def fnet(tmp_path_factory):
    """name -> (HF model, save_pretrained folder, maxdecl model), built once."""
    out = {}
    for k, (name, (cls, kw)) in enumerate(CASES.items()):
        model = make_fnet(cls, seed=k, **kw)
        path = save_hf(model, tmp_path_factory.mktemp(f"fnet_{name}"))
        out[name] = (model, path, md.load_model(spec_path("fnet"), path, variant="tiny"))
    return out


def test_fnet_config_from_hf(fnet):
    p = fnet["mlm"][2].params
    got = {k: p[k] for k in ("vocab", "dim", "n_layers", "ffn_dim", "context", "n_types",
                             "hidden_act", "mlm_head")}
    assert got == dict(vocab=VOCAB, dim=32, n_layers=2, ffn_dim=64, context=40, n_types=4,
                       hidden_act="gelu_new", mlm_head=1)
    assert p["norm_eps"] == pytest.approx(1e-12)
    u = fnet["untied"][2].params
    assert (u["dim"], u["n_layers"], u["hidden_act"]) == (24, 3, "gelu")
    b = fnet["base"][2].params
    assert (b["mlm_head"], b["n_layers"], b["ffn_dim"]) == (0, 3, 48)


def test_fnet_output_names(fnet):
    assert list(fnet["mlm"][2].output_names) == ["logits", "last_hidden_state",
                                                  "pooler_output"]
    assert list(fnet["base"][2].output_names) == ["last_hidden_state", "pooler_output"]
    assert list(fnet["mlm"][2].input_names) == ["tokens", "token_type_ids"]


def test_fnet_tied_head(fnet):
    assert "output.weight" not in fnet["mlm"][2].weights.keys()     # token_embd stands in
    assert "output.weight" in fnet["untied"][2].weights.keys()


@pytest.mark.parametrize("case", ["mlm", "untied"])
def test_fnet_mlm_matches_hf(fnet, case):
    model, _, ours = fnet[case]
    ids, types = batch_inputs()
    ref = hf_outputs(model, ids, types)
    got = named_outputs(ours, ids, types)
    assert got["logits"].shape == (BATCH, SEQ, VOCAB)
    check(case, got, ref, ["logits", "last_hidden_state", "pooler_output"])


@pytest.mark.parametrize("seq", [1, 8, 16, 40])
def test_fnet_base_matches_hf(fnet, seq):
    """The base model's last hidden state and pooler at several lengths (the sequence
    DFT matrices follow the length; 40 is the whole position table)."""
    model, _, ours = fnet["base"]
    ids, types = batch_inputs(seed=12, seq=seq)
    ref = hf_outputs(model, ids, types)
    got = named_outputs(ours, ids, types)
    assert got["last_hidden_state"].shape == (BATCH, seq, 32)
    check(f"base seq {seq}", got, ref, ["last_hidden_state", "pooler_output"])


def test_fnet_mixes_across_positions(fnet):
    """Negative control: changing one token changes every position's output (the
    Fourier mixer is global), as in transformers."""
    model, _, ours = fnet["mlm"]
    ids, types = batch_inputs()
    ids2 = ids.copy()
    ids2[0, -1] = (ids2[0, -1] + 1) % VOCAB
    a = named_outputs(ours, ids, types)["last_hidden_state"]
    b = named_outputs(ours, ids2, types)["last_hidden_state"]
    assert np.all(np.abs(a[0] - b[0]).max(axis=-1) > 1e-3)
    np.testing.assert_array_equal(a[1], b[1])          # the other sequence is untouched
    ref = hf_outputs(model, ids2, types)
    check("one token changed", {"last_hidden_state": b}, ref, ["last_hidden_state"])


def test_fnet_token_types_matter(fnet):
    """Negative control: all-zero token types move the output far off."""
    model, _, ours = fnet["mlm"]
    ids, types = batch_inputs()
    ref = hf_outputs(model, ids, types)
    got = named_outputs(ours, ids, np.zeros_like(types))
    assert rel_err(got["logits"], ref["logits"]) > 100 * TOL


def test_fnet_pretraining_checkpoint_matches_hf(tmp_path):
    """FNetForPreTraining (google/fnet-base's class): its NSP head is dropped, the MLM
    logits, hidden state and pooler match."""
    import torch

    model = make_fnet("FNetForPreTraining", seed=5)
    ours = md.load_model(spec_path("fnet"), save_hf(model, tmp_path / "pt"), variant="tiny")
    ids, types = batch_inputs(seed=13)
    t = {"input_ids": torch.from_numpy(ids), "token_type_ids": torch.from_numpy(types)}
    with torch.no_grad():
        base = model.fnet(**t)
        ref = {"logits": model(**t).prediction_logits.numpy(),
               "last_hidden_state": base.last_hidden_state.numpy(),
               "pooler_output": base.pooler_output.numpy()}
    check("pretraining", named_outputs(ours, ids, types), ref,
          ["logits", "last_hidden_state", "pooler_output"])


def test_fnet_unknown_head_refused(fnet):
    _, path, _ = fnet["base"]
    td = md.load_weights(path)
    td.metadata["architectures"] = ["FNetForSequenceClassification"]
    with pytest.raises(md.WeightsError, match="not modelled"):
        md.load_model(spec_path("fnet"), td, variant="tiny")


def test_fnet_tiny_runs_on_random_weights():
    ours = md.load_model(spec_path("fnet"), md.random_weights(spec_path("fnet")),
                         variant="tiny")
    ids, types = batch_inputs()
    got = named_outputs(ours, ids, types)
    assert got["logits"].shape == (BATCH, SEQ, 256)
    assert np.isfinite(got["logits"]).all()
