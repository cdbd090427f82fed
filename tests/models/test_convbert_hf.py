"""specs/convbert.yaml against transformers' ConvBertForMaskedLM / ConvBertModel.

Small seeded float32 ConvBERTs, run on a batch of two sequences, the second padded
(attention_mask 0 on its last four tokens), with token types. The main case has
every ConvBERT part switched on: head_ratio 2 (4 heads -> 2 attention heads of half
width plus 2 span-based dynamic convolution heads), conv_kernel_size 5, grouped FFN
linears (num_groups 2), and embedding_size 48 != hidden_size 64 (embeddings_project).
A second case takes the other branches: plain FFN linears (num_groups 1), no
embedding projection, head_ratio larger than the head count (one head), gelu_new in
the FFN (the generator head keeps exact GELU) and an untied output matrix.
"""

import numpy as np
import pytest

import maxdecl as md

from modelhelp import named_outputs, randomize, rel_err, save_hf, spec_path

pytest.importorskip("torch")
pytest.importorskip("transformers")

TOL = 3e-5          # max|ours - ref| <= TOL * max|ref| (measured: under 4e-6)
SEQ = 10
PAD_FROM = 6        # the second sequence is 6 tokens, padded to 10


def make_convbert(seed=0, **kw):
    """ConvBertForMaskedLM, seeded. ``randomize`` scales a matrix by its last axis,
    which is not the fan-in of the separable conv's pointwise filter [A, C, 1] nor of
    the grouped linears [G, in / G, out / G]: those are drawn again N(0, 1 / fan_in),
    and the pointwise bias [A, 1] (2-D, so drawn as a matrix) as a bias, 0.1 N(0, 1)."""
    import torch
    import transformers

    torch.manual_seed(seed)
    cfg = dict(vocab_size=128, hidden_size=64, embedding_size=48, num_hidden_layers=2,
               num_attention_heads=4, head_ratio=2, conv_kernel_size=5, num_groups=2,
               intermediate_size=128, max_position_embeddings=64, type_vocab_size=2,
               layer_norm_eps=1e-12, hidden_act="gelu", pad_token_id=1)
    cfg.update(kw)
    model = randomize(transformers.ConvBertForMaskedLM(transformers.ConvBertConfig(**cfg)), seed)
    gen = torch.Generator().manual_seed(seed + 100)
    with torch.no_grad():
        for name, p in sorted(model.named_parameters()):
            if name.endswith("pointwise.weight"):
                p.copy_(torch.randn(p.shape, generator=gen) / p.shape[1] ** 0.5)
            elif name.endswith("key_conv_attn_layer.bias"):
                p.copy_(0.1 * torch.randn(p.shape, generator=gen))
            elif p.ndim == 3 and name.endswith("dense.weight"):      # GroupedLinearLayer
                p.copy_(torch.randn(p.shape, generator=gen) / p.shape[1] ** 0.5)
    return model.eval()


def batch_inputs(vocab: int, seed: int = 7):
    """(tokens, attention_mask, token_type_ids), int64 [2, SEQ]: the second row padded
    (pad id 1) from PAD_FROM on."""
    rng = np.random.default_rng(seed)
    tokens = rng.integers(2, vocab, size=(2, SEQ)).astype(np.int64)
    mask = np.ones((2, SEQ), np.int64)
    mask[1, PAD_FROM:] = 0
    tokens[1, PAD_FROM:] = 1
    types = np.zeros((2, SEQ), np.int64)
    types[:, SEQ // 2:] = 1
    types[1, PAD_FROM:] = 0
    return tokens, mask, types


def hf_outputs(model, inputs) -> dict:
    """transformers' masked-LM logits and the encoder's last hidden state."""
    import torch

    tokens, mask, types = (torch.from_numpy(a) for a in inputs)
    with torch.no_grad():
        out = model(input_ids=tokens, attention_mask=mask, token_type_ids=types,
                    output_hidden_states=True)
        base = model.convbert(input_ids=tokens, attention_mask=mask, token_type_ids=types)
    assert torch.equal(out.hidden_states[-1], base.last_hidden_state)
    return {"logits": out.logits.numpy(), "last_hidden_state": base.last_hidden_state.numpy()}


CASES = {
    "grouped": {},
    "plain": dict(num_groups=1, embedding_size=64, num_attention_heads=2, head_ratio=4,
                  hidden_act="gelu_new", tie_word_embeddings=False),
}


@pytest.fixture(scope="module")
def cases(tmp_path_factory):
    """name -> (HF model, its save_pretrained folder, inputs, reference outputs)."""
    out = {}
    for k, (name, kw) in enumerate(CASES.items()):
        model = make_convbert(seed=k, **kw)
        path = save_hf(model, tmp_path_factory.mktemp(f"convbert_{name}"))
        inputs = batch_inputs(model.config.vocab_size, seed=7 + k)
        out[name] = (model, path, inputs, hf_outputs(model, inputs))
    return out


@pytest.fixture(scope="module")
def ours(cases):
    return {name: md.load_model(spec_path("convbert"), c[1], variant="tiny")
            for name, c in cases.items()}


def errors(model, inputs, ref) -> dict:
    got = named_outputs(model, *inputs)
    return {k: rel_err(got[k], ref[k]) for k in ref if k in got}


def test_convbert_config_from_hf(ours):
    p = ours["grouped"].params
    assert (p["dim"], p["embd_dim"], p["n_layers"], p["n_heads"], p["vocab"]) == (64, 48, 2, 4, 128)
    assert (p["n_attn_heads"], p["head_dim"], p["attn_dim"]) == (2, 16, 32)
    assert (p["conv_kernel"], p["n_groups"], p["has_proj"], p["has_head"]) == (5, 2, True, True)
    assert p["norm_eps"] == pytest.approx(1e-12)
    q = ours["plain"].params
    assert (q["n_attn_heads"], q["head_dim"], q["n_groups"], q["has_proj"]) == (1, 32, 1, False)
    assert q["hidden_act"] == "gelu_new"
    assert "output.weight" in ours["plain"].weights          # untied: its own matrix
    assert "output.weight" not in ours["grouped"].weights    # tied: the embedding table


def test_convbert_grouped_matches_hf(cases, ours):
    """Dynamic convolution heads, grouped FFN and embedding projection: masked-LM
    logits and last hidden state of a padded batch."""
    model, path, inputs, ref = cases["grouped"]
    assert ours["grouped"].output_names[:2] == ["logits", "last_hidden_state"]
    err = errors(ours["grouped"], inputs, ref)
    print("convbert grouped vs HF:", {k: f"{v:.2e}" for k, v in err.items()})
    assert set(err) == {"logits", "last_hidden_state"}
    assert max(err.values()) <= TOL


def test_convbert_plain_matches_hf(cases, ours):
    """num_groups 1, no projection, one head (head_ratio > heads), untied output."""
    model, path, inputs, ref = cases["plain"]
    err = errors(ours["plain"], inputs, ref)
    print("convbert plain vs HF:", {k: f"{v:.2e}" for k, v in err.items()})
    assert set(err) == {"logits", "last_hidden_state"}
    assert max(err.values()) <= TOL


def test_convbert_base_model_checkpoint_matches_hf(cases, tmp_path):
    """A ConvBertModel checkpoint (no convbert. prefix, no head) gives the last hidden
    state only."""
    model, _, inputs, ref = cases["grouped"]
    path = save_hf(model.convbert, tmp_path / "base")
    keys = set(md.load_weights(path).keys())
    assert "embeddings.word_embeddings.weight" in keys
    assert not any(k.startswith("convbert.") for k in keys)
    base = md.load_model(spec_path("convbert"), path, variant="tiny")
    assert base.output_names == ["last_hidden_state"]
    err = errors(base, inputs, ref)
    print("convbert base model vs HF:", {k: f"{v:.2e}" for k, v in err.items()})
    assert set(err) == {"last_hidden_state"} and err["last_hidden_state"] <= TOL


def test_convbert_padding_mask_matters(cases, ours):
    """Negative control: without the mask the padded sequence's tokens see the padding
    (the first, unpadded sequence is unchanged)."""
    model, _, (tokens, mask, types), ref = cases["grouped"]
    got = named_outputs(ours["grouped"], tokens, np.ones_like(mask), types)
    assert rel_err(got["logits"][0], ref["logits"][0]) <= TOL
    assert rel_err(got["logits"][1, :PAD_FROM], ref["logits"][1, :PAD_FROM]) > 100 * TOL


def test_convbert_dynamic_conv_matters(cases):
    """Negative control: zeroing the conv-kernel projection (every tap weighted 1 / K)
    changes the outputs, so the predicted kernels are really used."""
    model, path, inputs, ref = cases["grouped"]
    td = md.load_weights(path)
    for i in range(2):
        name = f"convbert.encoder.layer.{i}.attention.self.conv_kernel_layer.weight"
        td[name] = np.zeros_like(np.asarray(td[name]))
    err = errors(md.load_model(spec_path("convbert"), td, variant="tiny"), inputs, ref)
    assert err["logits"] > 100 * TOL


def test_convbert_refuses_other_heads(tmp_path):
    """A checkpoint with a head the spec does not model fails with the spec's reason."""
    import transformers

    cfg = transformers.ConvBertConfig(vocab_size=128, hidden_size=64, embedding_size=48,
                                      num_hidden_layers=1, num_attention_heads=4,
                                      intermediate_size=128, max_position_embeddings=64,
                                      conv_kernel_size=5, num_groups=2)
    path = save_hf(transformers.ConvBertForTokenClassification(cfg).eval(), tmp_path / "tok")
    with pytest.raises(md.WeightsError, match="ConvBertForTokenClassification's head is not modelled"):
        md.load_model(spec_path("convbert"), path, variant="tiny")
