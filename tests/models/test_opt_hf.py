"""specs/opt.yaml against transformers' OPTForCausalLM.

Two small seeded float32 OPTs (vocab 96, hidden 256, 4 heads, 2 layers, ffn 512, 64
positions): one as OPT-125m ... OPT-66B (LayerNorm before each sublayer, a final
norm, token embedding as wide as the model) and one as OPT-350m (LayerNorm after each
residual add, no final norm, a 128-wide token embedding brought to the model width by
project_in and back by project_out). Both have learned positions looked up at
position + 2, q/k/v/out projections with biases, the query scaled by head_dim ** -0.5,
a ReLU MLP with biases and the output tied to the token embedding (so the checkpoint
has no lm_head.weight). llama.cpp has no OPT architecture: there is no GGUF test.
"""

import json
import os
import shutil

import numpy as np
import pytest

import maxdecl as md

from modelhelp import (TOL, assert_greedy_matches_hf, assert_logits_match, compare, hf_case,
                       hf_logits, hf_params, hf_state, randomize, spec_path, tiny_model,
                       token_ids, with_hf_config)

pytest.importorskip("torch")
pytest.importorskip("transformers")

PROMPTS = [[3, 17, 42, 91, 5, 7, 64, 1], [8, 9, 80], [5, 60, 33, 2, 90, 11, 7]]
N_NEW = 6
TINY_OPT = {"dim": 256, "n_layers": 2, "n_heads": 4, "ffn_dim": 512, "vocab": 96, "context": 64}


def make_opt(seed=0, **kw):
    """OPTForCausalLM: hidden 256, 2 layers, 4 heads, ffn 512, vocab 96, 64 positions.

    The tied token table is scaled to 0.1 * N(0, 1): with N(0, 1) rows each token's own
    embedding dominates its logits and greedy decoding only repeats the last token."""
    import torch
    import transformers

    torch.manual_seed(seed)
    cfg = dict(vocab_size=96, hidden_size=256, num_attention_heads=4, num_hidden_layers=2,
               ffn_dim=512, max_position_embeddings=64, attn_implementation="eager")
    cfg.update(kw)
    model = randomize(transformers.OPTForCausalLM(transformers.OPTConfig(**cfg)), seed)
    with torch.no_grad():
        model.model.decoder.embed_tokens.weight.mul_(0.1)
    return model


@pytest.fixture(scope="module")
def opt(tmp_path_factory):
    """Pre-LN, as OPT-125m and the larger ones."""
    return hf_case(make_opt(), tmp_path_factory.mktemp("opt_hf"))


@pytest.fixture(scope="module")
def opt350(tmp_path_factory):
    """OPT-350m's layout: post-LN, no final norm, word_embed_proj_dim 128 < hidden 256."""
    model = make_opt(seed=1, do_layer_norm_before=False, word_embed_proj_dim=128)
    return hf_case(model, tmp_path_factory.mktemp("opt350_hf"))


@pytest.fixture(scope="module")
def ours(opt):
    return tiny_model("opt", opt[1])


@pytest.fixture(scope="module")
def ours350(opt350):
    return tiny_model("opt", opt350[1])


# -- hyperparameters ----------------------------------------------------------------------

def test_opt_config_from_hf(opt):
    got = hf_params("opt", opt[1])[2]
    assert {k: got[k] for k in TINY_OPT} == TINY_OPT
    assert got["embed_dim"] == 256 and got["norm_before"] is True
    assert got["remove_final_norm"] is False and got["activation"] == "relu"
    assert got["enable_bias"] is True and got["norm_affine"] is True


def test_opt350_config_from_hf(opt350, ours350):
    got = hf_params("opt", opt350[1])[2]
    assert {k: got[k] for k in TINY_OPT} == TINY_OPT
    assert got["embed_dim"] == 128 and got["norm_before"] is False
    p = ours350.params                                  # derived from those
    assert p["has_proj"] and not p["has_final_norm"] and p["n_pos"] == 66
    assert p["q_scale"] == pytest.approx(64 ** -0.5)
    names = md.load_weights(opt350[1]).keys()
    assert "model.decoder.project_in.weight" in names
    assert not any(k.startswith(("lm_head", "model.decoder.final_layer_norm")) for k in names)


def test_opt_config_without_word_embed_proj_dim(opt):
    """Older config.json files may lack word_embed_proj_dim (or hold null): the token
    embedding is then as wide as the model, as OPTConfig defaults it."""
    from maxdecl.pipelines.model_loading import params_from_metadata

    spec, meta, _ = hf_params("opt", opt[1])
    meta = {**meta, "hidden_size": 768}
    assert params_from_metadata(spec, {**meta, "word_embed_proj_dim": 512})["embed_dim"] == 512
    assert params_from_metadata(spec, {**meta, "word_embed_proj_dim": None})["embed_dim"] == 768
    old = {k: v for k, v in meta.items() if k != "word_embed_proj_dim"}
    assert params_from_metadata(spec, old)["embed_dim"] == 768


def test_opt_2022_config_keys(opt):
    """Meta's config.json files (transformers 4.21) lack enable_bias,
    layer_norm_elementwise_affine and _remove_final_layer_norm: the variant's values
    (true, true, false: OPTConfig's defaults) stand in and the logits still match."""
    model, path, ids, ref = opt
    td = md.load_weights(path)
    for key in ("enable_bias", "layer_norm_elementwise_affine", "_remove_final_layer_norm"):
        del td.metadata[key]
    ours = md.load_model(spec_path("opt"), td, variant="125m")
    assert ours.params["enable_bias"] and not ours.params["remove_final_norm"]
    assert ours.params["dim"] == 256                    # the rest from config.json
    pre, dec = compare(ours, ref, ids)
    assert pre <= TOL and dec <= TOL


def test_opt_refuses_other_activations(opt):
    td = md.load_weights(opt[1])
    td.metadata["activation_function"] = "gelu"
    with pytest.raises(md.errors.WeightsError, match="activation_function gelu"):
        md.load_model(spec_path("opt"), td, variant="tiny")


# -- logits and generation ----------------------------------------------------------------

def test_opt_prefill_and_decode_match_hf(opt, ours):
    model, path, ids, ref = opt
    assert_logits_match("opt", ours, ids, ref)


def test_opt350_prefill_and_decode_match_hf(opt350, ours350):
    model, path, ids, ref = opt350
    assert_logits_match("opt-350m-like", ours350, ids, ref)


def test_opt_greedy_generate_matches_hf(opt, ours):
    assert_greedy_matches_hf(opt[0], ours, PROMPTS, N_NEW)


def test_opt350_greedy_generate_matches_hf(opt350, ours350):
    assert_greedy_matches_hf(opt350[0], ours350, PROMPTS, N_NEW)


def test_opt350_prompt_lookup_matches_greedy(ours350):
    """Prompt lookup decoding (drafts checked through the KV cache) gives plain greedy's
    ids on a prompt that repeats itself."""
    prompt = [5, 60, 33, 2, 90, 11, 7, 5, 60, 33, 2, 90]
    want = ours350.generate(prompt, 10, temperature=0).ids
    assert ours350.generate(prompt, 10, temperature=0, lookup=4).ids == want


def test_opt_stops_at_the_position_table(ours):
    """max_position_embeddings positions (the table has 2 more rows, for the offset):
    a prompt plus new tokens past them is an InputError."""
    with pytest.raises(md.InputError, match="context of 64"):
        ours.generate(list(range(60)), 8)


def test_opt_without_biases_or_norm_gains_matches_hf(tmp_path):
    """enable_bias false, layer_norm_elementwise_affine false and
    _remove_final_layer_norm true: the checkpoint has no biases, no norm weights and no
    final norm; the spec's absent: stand-ins (0 biases, unit gains) and the final-norm
    switch give transformers' logits."""
    model = make_opt(seed=2, enable_bias=False, layer_norm_elementwise_affine=False,
                     _remove_final_layer_norm=True)
    _, path, ids, ref = hf_case(model, tmp_path)
    assert not any(k.endswith(".bias") or "layer_norm" in k for k in md.load_weights(path).keys())
    got = hf_params("opt", path)[2]
    assert not got["enable_bias"] and not got["norm_affine"] and got["remove_final_norm"]
    ours = tiny_model("opt", path)
    assert not ours.params["has_final_norm"]
    pre, dec = compare(ours, ref, ids)
    assert pre <= TOL and dec <= TOL


# -- checkpoint layouts -------------------------------------------------------------------

def _write_checkpoint(src, dst, rename, extra=None):
    """A copy of the HF directory ``src`` at ``dst`` with its tensors renamed."""
    from safetensors.numpy import save_file

    td = md.load_weights(src)
    tensors = {rename(k): np.ascontiguousarray(np.asarray(td[k])) for k in td.keys()}
    tensors.update(extra or {})
    os.makedirs(dst, exist_ok=True)
    shutil.copy(os.path.join(src, "config.json"), dst)
    save_file(tensors, os.path.join(dst, "model.safetensors"))
    return str(dst)


def test_opt_meta_checkpoint_names(opt350, tmp_path):
    """Meta's uploads (facebook/opt-*) hold OPTModel's names, ``decoder.*`` without
    ``model.``, and no lm_head.weight."""
    model, path, ids, ref = opt350
    meta = _write_checkpoint(path, tmp_path / "meta", lambda k: k.removeprefix("model."))
    assert "decoder.project_out.weight" in md.load_weights(meta).keys()
    pre, dec = compare(tiny_model("opt", meta), ref, ids)
    assert pre <= TOL and dec <= TOL


def test_opt_checkpoint_with_lm_head(opt, tmp_path):
    """A checkpoint that stores the tied lm_head.weight (a copy of the token table)
    gives the same logits."""
    model, path, ids, ref = opt
    table = hf_state(model)["model.decoder.embed_tokens.weight"]
    full = _write_checkpoint(path, tmp_path / "full", lambda k: k,
                             {"lm_head.weight": table.copy()})
    pre, dec = compare(tiny_model("opt", full), ref, ids)
    assert pre <= TOL and dec <= TOL


def test_opt_f16_checkpoint_loads(tmp_path):
    """float16, as Meta's checkpoints are stored: the logits are transformers' on the
    same float16 weights (computed in float32)."""
    model = make_opt().half()
    model.save_pretrained(tmp_path, safe_serialization=True)
    ours = tiny_model("opt", tmp_path)
    assert np.asarray(ours.weights["blk.0.attn_q.weight"]).dtype == np.float16
    ids = token_ids(model.config.vocab_size)
    pre, dec = compare(ours, hf_logits(model.float(), ids), ids)
    assert pre <= TOL and dec <= TOL


def test_opt350_bf16_checkpoint_loads(tmp_path):
    """bf16 (as many fine-tunes on the Hub): matrices and tables stay packed bf16,
    norm weights and biases become float32 (exactly); the logits are transformers' on
    the same bf16 weights."""
    import torch

    model = make_opt(seed=1, do_layer_norm_before=False, word_embed_proj_dim=128)
    model = model.to(torch.bfloat16)
    model.save_pretrained(tmp_path, safe_serialization=True)
    ours = tiny_model("opt", tmp_path)
    w = ours.weights
    assert w["project_in.weight"].encoding == "bf16" and w["token_embd.weight"].encoding == "bf16"
    assert w["blk.0.attn_norm.weight"].dtype == np.float32
    assert w["blk.0.ffn_up.bias"].dtype == np.float32
    ids = token_ids(model.config.vocab_size)
    pre, dec = compare(ours, hf_logits(model.float(), ids), ids)
    assert pre <= TOL and dec <= TOL


# -- negative controls --------------------------------------------------------------------

def _controlled(case, **config):
    model, path, ids, ref = case
    spec = with_hf_config(md.load_spec(spec_path("opt")), **config)
    return compare(md.load_model(spec, path, variant="tiny"), ref, ids)


def test_opt_position_offset_matters(opt):
    """Looked up at position (the same 66-row table, no offset of 2): other logits."""
    pre, dec = _controlled(opt, pos_offset="{0}", context="{max_position_embeddings + 2}")
    assert pre > 10 * TOL and dec > 10 * TOL


def test_opt_query_scale_matters(opt):
    """Without the head_dim ** -0.5 on the query (the attention op's scale is 1)."""
    pre, dec = _controlled(opt, q_scale=1.0)
    assert pre > 10 * TOL and dec > 10 * TOL


def test_opt350_norm_placement_matters(opt350):
    """OPT-350m's weights run pre-LN (do_layer_norm_before ignored): other logits."""
    pre, dec = _controlled(opt350, norm_before="{True}")
    assert pre > 10 * TOL and dec > 10 * TOL


def test_opt_final_norm_matters(opt):
    """The pre-LN model without its final norm (as if _remove_final_layer_norm)."""
    pre, dec = _controlled(opt, remove_final_norm="{True}")
    assert pre > 10 * TOL and dec > 10 * TOL


def test_opt_config_json_is_read(opt, tmp_path):
    """The spec follows config.json, not the variant: the same weights with
    do_layer_norm_before false in config.json run post-LN (other logits)."""
    model, path, ids, ref = opt
    dst = tmp_path / "postln"
    shutil.copytree(path, dst)
    cfg = json.loads((dst / "config.json").read_text())
    cfg["do_layer_norm_before"] = False
    (dst / "config.json").write_text(json.dumps(cfg))
    assert tiny_model("opt", dst).params["norm_before"] is False
