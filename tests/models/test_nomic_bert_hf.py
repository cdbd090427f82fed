"""specs/nomic_bert.yaml against transformers' NomicBertModel.

Small seeded float32 models (eager attention): a post-norm BERT encoder with rotary
positions (rotate-half) in bidirectional attention, no q/k/v/o biases, a gated MLP
act(gate) * up, word plus token-type embeddings. A padded batch of two sequences (the
second right-padded) is compared on last_hidden_state and on the mean over the
attention mask (nomic-embed-text's mean pooling). Two configurations: the defaults
(silu, theta 1000, eps 1e-12, head_dim = hidden / heads) and one that changes every
option the config has (gelu, theta 10000, eps 1e-5, head_dim 24 != hidden / heads,
three token types, three layers). save_pretrained writes the original nomic names
(Wqkv fused, fc11 / fc12 / fc2, norm1 / norm2, emb_ln); a torch state_dict of the
in-memory names and a NomicBertForMaskedLM checkpoint (nomic_bert. prefix) load too.
"""

import numpy as np
import pytest

import maxdecl as md

from modelhelp import hf_params, randomize, rel_err, save_hf, spec_path

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

TOL = 1e-5          # max|ours - ref| <= TOL * max|ref|
VOCAB = 300
LENGTHS = (11, 7)   # the second sequence right-padded to the first's length
PAD = 0

CASES = {
    "default": dict(),
    "options": dict(hidden_act="gelu", head_dim=24, num_hidden_layers=3, type_vocab_size=3,
                    layer_norm_eps=1e-5, rope_parameters={"rope_type": "default",
                                                          "rope_theta": 10000.0}),
}


def make_config(**kw):
    cfg = dict(vocab_size=VOCAB, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
               intermediate_size=128, max_position_embeddings=64, type_vocab_size=2,
               pad_token_id=PAD, attn_implementation="eager")
    cfg.update(kw)
    return transformers.NomicBertConfig(**cfg)


def batch(seed: int, n_types: int):
    """tokens, attention_mask, token_type_ids [2, max(LENGTHS)] int64, right-padded."""
    rng = np.random.default_rng(seed)
    n = max(LENGTHS)
    tokens = np.full((len(LENGTHS), n), PAD, np.int64)
    mask = np.zeros((len(LENGTHS), n), np.int64)
    types = np.zeros((len(LENGTHS), n), np.int64)
    for b, length in enumerate(LENGTHS):
        tokens[b, :length] = rng.integers(1, VOCAB, size=length)
        mask[b, :length] = 1
        types[b, length // 2:length] = rng.integers(0, n_types, size=length - length // 2)
    return tokens, mask, types


def hf_outputs(model, tokens, mask, types):
    """(last_hidden_state [B, S, D], masked mean [B, D]) of the HF model."""
    with torch.no_grad():
        out = model(input_ids=torch.from_numpy(tokens), attention_mask=torch.from_numpy(mask),
                    token_type_ids=torch.from_numpy(types))
    h = out.last_hidden_state
    m = torch.from_numpy(mask).unsqueeze(-1).to(h.dtype)
    pooled = (h * m).sum(1) / m.sum(1).clamp(min=1e-9)
    return h.numpy(), pooled.numpy()


@pytest.fixture(scope="module", params=list(CASES))
def case(request, tmp_path_factory):
    """(name, HF model, its save_pretrained folder, inputs, reference outputs)."""
    name = request.param
    k = list(CASES).index(name)
    torch.manual_seed(k)
    model = randomize(transformers.NomicBertModel(make_config(**CASES[name])), seed=k)
    path = save_hf(model, tmp_path_factory.mktemp(f"nomic_bert_{name}"))
    inputs = batch(7 + k, model.config.type_vocab_size)
    return name, model, path, inputs, hf_outputs(model, *inputs)


def ours_outputs(path_or_td, inputs):
    model = md.load_model(spec_path("nomic_bert"), path_or_td, variant="tiny")
    assert model.output_names[:2] == ["last_hidden_state", "mean_pooled"]
    assert model.input_names == ["tokens", "attention_mask", "token_type_ids"]
    h, pooled = model(*inputs)[:2]
    return np.asarray(h), np.asarray(pooled)


def test_nomic_bert_config_from_hf(case):
    name, model, path, _, _ = case
    got = hf_params("nomic_bert", path)[2]
    cfg = model.config
    assert (got["dim"], got["n_layers"], got["n_heads"], got["ffn_dim"], got["vocab"]) == (
        64, cfg.num_hidden_layers, 4, 128, VOCAB)
    assert got["n_types"] == cfg.type_vocab_size
    assert got["norm_eps"] == pytest.approx(cfg.layer_norm_eps)
    assert got["rope_theta"] == pytest.approx(cfg.rope_parameters["rope_theta"])
    assert got["hidden_act"] == cfg.hidden_act
    loaded = md.load_model(spec_path("nomic_bert"), path, variant="tiny")
    assert loaded.params["head_dim"] == cfg.head_dim


def test_nomic_bert_hidden_states_and_mean_pooling_match_hf(case):
    name, model, path, inputs, (ref_h, ref_pooled) = case
    h, pooled = ours_outputs(path, inputs)
    assert h.shape == ref_h.shape and pooled.shape == ref_pooled.shape
    # every position, padded ones included (they attend to the real tokens only)
    err_h, err_p = rel_err(h, ref_h), rel_err(pooled, ref_pooled)
    print(f"{name}: last_hidden_state {err_h:.2e}, mean_pooled {err_p:.2e}")
    assert err_h <= TOL and err_p <= TOL
    # the real tokens of each sequence alone: padding changes nothing
    tokens, mask, types = inputs
    for b, length in enumerate(LENGTHS):
        one = tuple(a[b:b + 1, :length] for a in inputs)
        h1, p1 = ours_outputs(path, one)
        assert rel_err(h1[0], ref_h[b, :length]) <= TOL
        assert rel_err(p1[0], ref_pooled[b]) <= TOL


def test_nomic_bert_padding_mask_matters(case):
    """Negative control: an all-ones mask lets the short sequence see its padding."""
    name, model, path, inputs, (ref_h, ref_pooled) = case
    tokens, mask, types = inputs
    h, _ = ours_outputs(path, (tokens, np.ones_like(mask), types))
    short = LENGTHS[1]
    assert rel_err(h[1, :short], ref_h[1, :short]) > 100 * TOL


def test_nomic_bert_rotary_matters(case):
    """Negative control: permuting the tokens is not a permutation of the outputs
    (rotary positions make the encoder order-aware)."""
    name, model, path, inputs, (ref_h, _) = case
    tokens, mask, types = inputs
    n = LENGTHS[0]
    perm = np.arange(n)[::-1].copy()
    h, _ = ours_outputs(path, (tokens[:1, perm], mask[:1, perm], types[:1, perm]))
    assert rel_err(h[0, perm], ref_h[0]) > 100 * TOL


def test_nomic_bert_state_dict_names_load(case, tmp_path):
    """A torch state_dict saved as one file holds the in-memory names (q_proj, k_proj,
    v_proj apart, up_proj, post_attention_layernorm, embeddings.LayerNorm)."""
    from safetensors.torch import save_file

    name, model, path, inputs, (ref_h, ref_pooled) = case
    sd = {k: v.contiguous() for k, v in model.state_dict().items()}
    assert any(".self_attn.q_proj." in k for k in sd)
    td = md.load_weights(path)                     # config.json from the HF folder
    file = tmp_path / "model.safetensors"
    save_file(sd, str(file))
    raw = md.load_weights(str(file))
    for k in list(td.keys()):
        del td[k]
    for k in raw.keys():
        td[k] = raw[k]
    h, pooled = ours_outputs(td, inputs)
    assert rel_err(h, ref_h) <= TOL and rel_err(pooled, ref_pooled) <= TOL


def test_nomic_bert_masked_lm_checkpoint_loads_encoder(case, tmp_path):
    """A NomicBertForMaskedLM checkpoint (nomic_bert. prefix, cls head) gives the
    encoder's outputs: the prefix is stripped and the head dropped."""
    name, model, path, inputs, _ = case
    mlm = transformers.NomicBertForMaskedLM(model.config)
    mlm.nomic_bert.load_state_dict(model.state_dict())
    mlm.eval()
    ref_h, ref_pooled = hf_outputs(mlm.nomic_bert, *inputs)
    p = save_hf(mlm, tmp_path / "mlm")
    h, pooled = ours_outputs(p, inputs)
    assert rel_err(h, ref_h) <= TOL and rel_err(pooled, ref_pooled) <= TOL


def test_nomic_bert_refuses_scaled_rope(tmp_path):
    """A scaled RoPE (rope_type other than default) is refused, not run wrong."""
    cfg = make_config(rope_parameters={"rope_type": "linear", "rope_theta": 1000.0,
                                       "factor": 2.0})
    m = transformers.NomicBertModel(cfg)
    p = save_hf(m, tmp_path / "linear")
    with pytest.raises(md.WeightsError, match="RoPE scaling linear"):
        md.load_model(spec_path("nomic_bert"), p, variant="tiny")
