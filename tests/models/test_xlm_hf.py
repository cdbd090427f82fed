"""specs/xlm.yaml against transformers' XLMWithLMHeadModel and XLMModel.

Small seeded float32 XLMs (dim 64, 2 layers, 4 heads, vocab 256, 64 positions), run on
a batch of two sequences, the second right-padded with pad_index and masked out by
attention_mask. Cases:

- ``lang_sin``: 3 languages with language embeddings (``langs`` input) and the fixed
  sinusoidal position table (sinusoidal_embeddings=True), GELU, tied LM head;
- ``learned``: one language (no lang_embeddings), learned positions, ReLU
  (gelu_activation=False), an untied LM head (pred_layer.proj.weight saved);
- ``causal``: causal=True (triangular mask, transformers ignores the padding for keys);
- ``base``: a headless XLMModel checkpoint (no ``transformer.`` prefix, no pred_layer).

Every position is compared, the padded ones included (their hidden state is zero, their
logits the head's bias).
"""

import numpy as np
import pytest

import maxdecl as md

from modelhelp import randomize, rel_err, save_hf, spec_path

pytest.importorskip("torch")
pytest.importorskip("transformers")

TOL = 1e-5          # max|ours - ref| <= TOL * max|ref|
VOCAB, DIM, PAD = 256, 64, 2
SEQ, LENGTHS = 10, (10, 6)

CASES = {
    "lang_sin": dict(n_langs=3, use_lang_emb=True, sinusoidal_embeddings=True),
    "learned": dict(n_langs=1, gelu_activation=False, tie_word_embeddings=False),
    "causal": dict(n_langs=2, use_lang_emb=True, causal=True),
}


def make_xlm(seed=0, head=True, **kw):
    import torch
    import transformers
    from transformers.models.xlm.modeling_xlm import create_sinusoidal_embeddings

    torch.manual_seed(seed)
    cfg = dict(vocab_size=VOCAB, emb_dim=DIM, n_layers=2, n_heads=4, max_position_embeddings=64,
               layer_norm_eps=1e-12, dropout=0.0, attention_dropout=0.0, pad_token_id=PAD,
               attn_implementation="eager")
    cfg.update(kw)
    config = transformers.XLMConfig(**cfg)
    cls = transformers.XLMWithLMHeadModel if head else transformers.XLMModel
    model = randomize(cls(config), seed)
    base = model.transformer if head else model
    if config.sinusoidal_embeddings:          # randomize drew the fixed table too: put it back
        with torch.no_grad():
            table = create_sinusoidal_embeddings(
                64, DIM, out=torch.empty_like(base.position_embeddings.weight))
            base.position_embeddings.weight.copy_(table)
    return model


def batch_inputs(n_langs: int, seed: int):
    rng = np.random.default_rng(seed)
    tokens = rng.integers(3, VOCAB, size=(2, SEQ)).astype(np.int64)
    mask = np.zeros((2, SEQ), np.int64)
    for b, n in enumerate(LENGTHS):
        mask[b, :n] = 1
        tokens[b, n:] = PAD
    langs = rng.integers(0, n_langs, size=(2, SEQ)).astype(np.int64)
    return tokens, mask, langs


def hf_outputs(model, tokens, mask, langs, use_langs: bool) -> dict:
    import torch

    kw = dict(input_ids=torch.tensor(tokens), attention_mask=torch.tensor(mask))
    if use_langs:
        kw["langs"] = torch.tensor(langs)
    with torch.no_grad():
        if hasattr(model, "pred_layer"):
            hidden = model.transformer(**kw).last_hidden_state
            logits = model(**kw).logits
            return {"logits": logits.numpy(), "last_hidden_state": hidden.numpy()}
        return {"last_hidden_state": model(**kw).last_hidden_state.numpy()}


def ours_outputs(path, tokens, mask, langs):
    td = md.load_weights(path, spec=spec_path("xlm"), variant="tiny")
    g = md.build(spec_path("xlm"), weights=td)
    feed = {"tokens": tokens, "attention_mask": mask, "langs": langs}
    outs = md.compile(g, td)(*(feed[v.name] for v in g.inputs))
    return dict(zip(g.output_names, outs)), td


@pytest.fixture(scope="module")
def cases(tmp_path_factory):
    """name -> (HF model, checkpoint dir, (tokens, mask, langs), HF outputs)."""
    out = {}
    for k, (name, kw) in enumerate(CASES.items()):
        model = make_xlm(seed=k, **kw)
        path = save_hf(model, tmp_path_factory.mktemp(f"xlm_{name}"))
        inputs = batch_inputs(model.config.n_langs, seed=7 + k)
        use_langs = model.config.n_langs > 1
        out[name] = (model, path, inputs, hf_outputs(model, *inputs, use_langs))
    model = make_xlm(seed=5, head=False, n_langs=2)
    path = save_hf(model, tmp_path_factory.mktemp("xlm_base"))
    inputs = batch_inputs(2, seed=12)
    out["base"] = (model, path, inputs, hf_outputs(model, *inputs, True))
    return out


def check(name, got, ref):
    for key, want in ref.items():
        err = rel_err(got[key], want)
        print(f"xlm {name} {key}: rel err {err:.2e} (max|ref| {np.abs(want).max():.2f})")
        assert err <= TOL, (name, key, err)


@pytest.mark.parametrize("name", list(CASES) + ["base"])
def test_xlm_matches_hf(cases, name):
    model, path, inputs, ref = cases[name]
    got, _ = ours_outputs(path, *inputs)
    check(name, got, ref)
    if "logits" not in ref:
        assert "logits" not in got                  # headless XLMModel: no head, no logits


def test_xlm_config_from_hf(cases):
    _, path, _, _ = cases["lang_sin"]
    p = md.load_weights(path, spec=spec_path("xlm"), variant="tiny").params
    assert (p["dim"], p["n_layers"], p["n_heads"], p["vocab"], p["context"]) == (DIM, 2, 4, VOCAB, 64)
    assert p["n_langs"] == 3 and p["norm_eps"] == pytest.approx(1e-12)
    _, path, _, _ = cases["learned"]
    p = md.load_weights(path, spec=spec_path("xlm"), variant="tiny").params
    assert p["n_langs"] == 1 and p["gelu_activation"] is False


def test_xlm_sinusoidal_table_is_the_checkpoints(cases):
    """The sinusoidal case really runs the fixed table (not random learned rows)."""
    from transformers.models.xlm.modeling_xlm import create_sinusoidal_embeddings
    import torch

    _, path, _, _ = cases["lang_sin"]
    td = md.load_weights(path, spec=spec_path("xlm"), variant="tiny")
    want = create_sinusoidal_embeddings(64, DIM, out=torch.empty(64, DIM)).numpy()
    np.testing.assert_array_equal(np.asarray(td["position_embd.weight"]), want)


def test_xlm_langs_matter(cases):
    """Negative control: other language ids change the outputs (the langs input is read)."""
    _, path, (tokens, mask, langs), ref = cases["lang_sin"]
    got, _ = ours_outputs(path, tokens, mask, (langs + 1) % 3)
    assert rel_err(got["logits"], ref["logits"]) > 100 * TOL


def test_xlm_padding_mask_matters(cases):
    """Negative control: an all-ones mask (padding attended) changes the padded row."""
    _, path, (tokens, mask, langs), ref = cases["lang_sin"]
    got, _ = ours_outputs(path, tokens, np.ones_like(mask), langs)
    assert rel_err(got["last_hidden_state"][1, :LENGTHS[1]],
                   ref["last_hidden_state"][1, :LENGTHS[1]]) > 100 * TOL


def test_xlm_output_order_and_untied_head(cases):
    """logits first (a language model's convention); the untied case reads its own
    pred_layer.proj.weight, the tied one the embedding table."""
    _, path, inputs, _ = cases["learned"]
    got, td = ours_outputs(path, *inputs)
    assert list(got) == ["logits", "last_hidden_state"]
    assert "output.weight" in td.keys()
    _, path, _, _ = cases["lang_sin"]
    td = md.load_weights(path, spec=spec_path("xlm"), variant="tiny")
    assert "output.weight" not in td.keys()


def test_xlm_causal_left_padding_matches_hf(cases):
    """causal=True: transformers masks keys by position only, so with left padding the
    real tokens still attend to the pads (the spec's logical_or with causal)."""
    model, path, (tokens, mask, langs), _ = cases["causal"]
    tokens, mask = tokens[:, ::-1].copy(), mask[:, ::-1].copy()
    ref = hf_outputs(model, tokens, mask, langs, True)
    got, _ = ours_outputs(path, tokens, mask, langs)
    check("causal-left", got, ref)
