"""specs/xglm.yaml against transformers' XGLMForCausalLM.

A small seeded float32 XGLM (vocab 256, d_model 256, 4 heads, 2 layers, ffn 512, 64
positions): sinusoidal positions computed at position + 2 (fairseq's layout, the sines
of every frequency then the cosines), token embeddings scaled by sqrt(d_model),
pre-LN blocks with biases on every projection and norm, the query scaled by
head_dim ** -0.5, a GELU MLP, a final LayerNorm and the output tied to the token table
(save_pretrained stores no lm_head.weight). llama.cpp has no XGLM: there is no GGUF test.
"""

import dataclasses
import json
import shutil

import numpy as np
import pytest

import maxdecl as md

from modelhelp import (TOL, assert_greedy_matches_hf, assert_logits_match, compare, hf_case,
                       hf_logits, hf_params, randomize, spec_path, tiny_model,
                       token_ids, with_hf_config)

pytest.importorskip("torch")
pytest.importorskip("transformers")

PROMPTS = [[3, 17, 42, 191, 5, 7, 64, 250], [8, 9, 80], [5, 160, 33, 2, 90, 211, 7]]
N_NEW = 6
TINY_XGLM = {"dim": 256, "n_layers": 2, "n_heads": 4, "ffn_dim": 512, "vocab": 256,
             "context": 64}


def make_xglm(seed=0, **kw):
    """XGLMForCausalLM: d_model 256, 2 layers, 4 heads, ffn 512, vocab 256, 64 positions.

    The token table is scaled to 0.1 * N(0, 1) (then x sqrt(256) = 16 in the forward):
    with N(0, 1) rows the scaled embedding (std 16) swamps the positions (|pe| <= 1)."""
    import torch
    import transformers

    torch.manual_seed(seed)
    cfg = dict(vocab_size=256, d_model=256, attention_heads=4, num_layers=2, ffn_dim=512,
               max_position_embeddings=64, dropout=0.0, attention_dropout=0.0,
               attn_implementation="eager")
    cfg.update(kw)
    model = randomize(transformers.XGLMForCausalLM(transformers.XGLMConfig(**cfg)), seed)
    with torch.no_grad():
        model.model.embed_tokens.weight.mul_(0.1)
    return model


@pytest.fixture(scope="module")
def xglm(tmp_path_factory):
    return hf_case(make_xglm(), tmp_path_factory.mktemp("xglm_hf"))


@pytest.fixture(scope="module")
def ours(xglm):
    return tiny_model("xglm", xglm[1])


# -- hyperparameters ----------------------------------------------------------------------

def test_xglm_config_from_hf(xglm, ours):
    got = hf_params("xglm", xglm[1])[2]
    assert {k: got[k] for k in TINY_XGLM} == TINY_XGLM
    assert got["activation"] == "gelu" and got["scale_embedding"] is True
    assert got["pad_token_id"] == 1
    p = ours.params
    assert p["embed_scale"] == pytest.approx(16.0) and p["q_scale"] == pytest.approx(64 ** -0.5)
    names = md.load_weights(xglm[1]).keys()
    assert not any(k.startswith("lm_head") or "embed_positions" in k for k in names)


# -- the computed position table -------------------------------------------------------

def _position_table(path, n: int) -> np.ndarray:
    """The spec's position rows ``pe`` for positions 0 .. n - 1 (one graph run of the
    spec with ``pe`` added to its outputs)."""
    spec = md.load_spec(spec_path("xglm"))
    spec = dataclasses.replace(spec, outputs=spec.outputs + (("pe", spec.outputs[0][1]),))
    model = md.load_model(spec, path, variant="tiny")
    assert model.output_names[:2] == ["logits", "pe"]
    p = model.params
    caches = [np.zeros((2, 0, p["n_heads"], p["head_dim"]), np.float32)] * p["n_layers"]
    outs = model(np.zeros(n, np.int64), np.arange(n, dtype=np.int64),
                 np.array([n - 1], np.int64), *caches)
    return np.asarray(outs[1])


@pytest.mark.parametrize("pad", [1, 5])
def test_xglm_position_table_matches_hf(xglm, tmp_path, pad):
    """sin | cos halves at position + 2 with tensor2tensor's log(10000) / (half - 1),
    the row pad_token_id zeroed (pad 5: position 3), against transformers' table."""
    import torch
    from transformers.models.xglm.modeling_xglm import XGLMSinusoidalPositionalEmbedding

    path = xglm[1]
    if pad != 1:
        path = tmp_path / "pad"
        shutil.copytree(xglm[1], path)
        cfg = json.loads((path / "config.json").read_text())
        cfg["pad_token_id"] = pad
        (path / "config.json").write_text(json.dumps(cfg))
    n = 64
    with torch.no_grad():
        want = XGLMSinusoidalPositionalEmbedding(n, 256, pad)(torch.arange(n)[None])[0].numpy()
    got = _position_table(path, n)
    assert got.shape == (n, 256)
    assert np.abs(got - want).max() <= 1e-5
    assert (np.abs(got[pad - 2]).max() == 0) == (pad >= 2)


# -- logits and generation ----------------------------------------------------------------

def test_xglm_prefill_and_decode_match_hf(xglm, ours):
    model, path, ids, ref = xglm
    assert_logits_match("xglm", ours, ids, ref)


def test_xglm_long_prefill_and_many_decode_steps(xglm, ours):
    """40 prompt tokens, then 20 decode steps through the KV cache (positions up to 61
    of the 64: the sinusoid's larger angles)."""
    model = xglm[0]
    ids = token_ids(256, n=60, seed=11)
    ref = hf_logits(model, ids)
    pre, dec = compare(ours, ref, ids, n_prompt=40)
    print(f"xglm long vs HF: prefill {pre:.2e}, decode {dec:.2e}")
    assert pre <= TOL and dec <= TOL


def test_xglm_greedy_generate_matches_hf(xglm, ours):
    """(A tiny random tied model settles on one token: the embedding it reads back is
    the row it scores; the untied model below gives varied ids.)"""
    assert_greedy_matches_hf(xglm[0], ours, PROMPTS, N_NEW)


def test_xglm_stops_at_the_position_table(ours):
    with pytest.raises(md.InputError, match="context of 64"):
        ours.generate(list(range(60)), 8)


def test_xglm_unscaled_relu_and_pad_row_match_hf(tmp_path):
    """scale_embedding false, activation_function relu and pad_token_id 5 (the position
    table's row 5, position 3, is zeroed by transformers): all read from config.json."""
    model = make_xglm(seed=1, scale_embedding=False, activation_function="relu",
                      pad_token_id=5)
    _, path, ids, ref = hf_case(model, tmp_path)
    got = hf_params("xglm", path)[2]
    assert got["scale_embedding"] is False and got["activation"] == "relu"
    assert got["pad_token_id"] == 5
    pre, dec = compare(tiny_model("xglm", path), ref, ids)
    assert pre <= TOL and dec <= TOL


def test_xglm_untied_lm_head_matches_hf(tmp_path):
    """tie_word_embeddings false: the checkpoint stores lm_head.weight, which the spec
    reads instead of the token table; its greedy ids vary (not one repeated token)."""
    import torch

    model = make_xglm(seed=2, tie_word_embeddings=False)
    with torch.no_grad():
        model.lm_head.weight.mul_(0.1)
    _, path, ids, ref = hf_case(model, tmp_path)
    assert "lm_head.weight" in md.load_weights(path).keys()
    ours = tiny_model("xglm", path)
    assert_logits_match("xglm untied", ours, ids, ref)
    assert_greedy_matches_hf(model, ours, PROMPTS, N_NEW)
    assert len(set(ours.generate(PROMPTS[0], N_NEW, temperature=0).ids)) > 3


# -- negative controls --------------------------------------------------------------------

def _controlled(case, **config):
    model, path, ids, ref = case
    spec = with_hf_config(md.load_spec(spec_path("xglm")), **config)
    return compare(md.load_model(spec, path, variant="tiny"), ref, ids)


def test_xglm_position_offset_matters(xglm):
    pre, dec = _controlled(xglm, pos_offset="{0}")
    assert pre > 10 * TOL and dec > 10 * TOL


def test_xglm_embed_scale_matters(xglm):
    pre, dec = _controlled(xglm, scale_embedding="{False}")
    assert pre > 10 * TOL and dec > 10 * TOL


def test_xglm_frequency_denominator_matters(xglm):
    """tensor2tensor's log(10000) / (half - 1), not log(10000) / half: a small change of
    every frequency (twice the tolerance here; the table test above is the sharp one)."""
    pre, dec = _controlled(xglm, freq_step="{log(10000) / 128}")   # half_dim 128
    assert pre > TOL and dec > TOL


def test_xglm_pad_row_matters(xglm):
    """pad_token_id 4 zeroes position 2's row (transformers' padding_idx)."""
    pre, dec = _controlled(xglm, pad_token_id="{4}")
    assert pre > 10 * TOL and dec > TOL


def test_xglm_config_json_is_read(xglm, tmp_path):
    model, path, ids, ref = xglm
    dst = tmp_path / "relu"
    shutil.copytree(path, dst)
    cfg = json.loads((dst / "config.json").read_text())
    cfg["activation_function"] = "relu"
    (dst / "config.json").write_text(json.dumps(cfg))
    assert tiny_model("xglm", dst).params["activation"] == "relu"


def test_xglm_refuses_odd_d_model(xglm):
    """An odd d_model pads transformers' position table with a zero column: refused."""
    td = md.load_weights(xglm[1])
    td.metadata["d_model"] = 255
    with pytest.raises(md.errors.WeightsError, match="odd d_model"):
        md.load_model(spec_path("xglm"), td, variant="tiny")
