"""specs/granite.yaml against transformers' GraniteForCausalLM (and llama.cpp).

Small seeded float32 Granite models (dim 256, 2 layers, GQA 4/2, vocab 320, SwiGLU,
RMSNorm eps 1e-5, rope base 50000) whose four multipliers are far from 1 and from their
neutral values, so that a multiplier applied wrongly, twice or not at all shows:
embedding_multiplier 0.25, attention_multiplier 0.04 (1/sqrt(head_dim) would be 0.125),
residual_multiplier 2.5 (the blocks, not the embedding, dominate the residual stream, so the
attention scale moves the logits by more than half their range), logits_scaling 4.

- ``tied``: tie_word_embeddings (as Granite 3.x): the checkpoint has no lm_head.weight;
- ``untied``: its own lm_head.

The GGUF files are written as llama.cpp's converter (GraniteModel, a LlamaModel) writes
them: arch ``granite``, the q/k rows permuted to adjacent pairs, the multipliers under
granite.embedding_scale, granite.attention.scale, granite.residual_scale and
granite.logit_scale (each only when non-zero), no output.weight when tied.
"""

import numpy as np
import pytest

import maxdecl as md
from maxdecl.pipelines.model_loading import params_from_metadata

from modelhelp import (TOL, _add_tokenizer, _rope_theta, _write, assert_greedy_matches_hf,
                       assert_logits_match, compare, gguf_writer, hf_case, hf_logits, hf_params,
                       hf_state, llama_cpp_logits, llama_layer_tensors, randomize, spec_path,
                       tiny_model, with_hf_config)

pytest.importorskip("torch")
pytest.importorskip("transformers")

PROMPTS = [[3, 17, 42, 290, 5, 7, 64, 1], [8, 9, 300], [5, 60, 33, 2, 90, 11, 7]]
N_NEW = 6
TOL_LLAMA_CPP = 5e-3        # of max|ref|: llama.cpp keeps its KV cache in f16

MULT = dict(embedding_multiplier=0.25, attention_multiplier=0.04, residual_multiplier=2.5,
            logits_scaling=4.0)


def make_granite(seed=0, tied=True, **kw):
    """GraniteForCausalLM: dim 256, ffn 512, 2 layers, GQA 4/2, vocab 320, MULT."""
    import torch
    import transformers

    torch.manual_seed(seed)
    cfg = dict(vocab_size=320, hidden_size=256, intermediate_size=512, num_hidden_layers=2,
               num_attention_heads=4, num_key_value_heads=2, rms_norm_eps=1e-5,
               max_position_embeddings=64, rope_theta=50000.0, hidden_act="silu",
               tie_word_embeddings=tied, attn_implementation="eager", **MULT)
    cfg.update(kw)
    return randomize(transformers.GraniteForCausalLM(transformers.GraniteConfig(**cfg)), seed)


@pytest.fixture(scope="module")
def tied(tmp_path_factory):
    return hf_case(make_granite(), tmp_path_factory.mktemp("granite_tied"))


@pytest.fixture(scope="module")
def untied(tmp_path_factory):
    return hf_case(make_granite(seed=1, tied=False), tmp_path_factory.mktemp("granite_untied"))


@pytest.fixture(scope="module")
def ours_tied(tied):
    return tiny_model("granite", tied[1])


TINY = {"dim": 256, "n_layers": 2, "n_heads": 4, "n_kv_heads": 2, "ffn_dim": 512, "vocab": 320,
        "context": 64, "rope_theta": 50000.0, "rope_type": "none"}


# -- config ------------------------------------------------------------------------------

def test_granite_config_from_hf(tied):
    spec, meta, got = hf_params("granite", tied[1])
    assert {k: got.get(k) for k in TINY} == TINY
    assert got["norm_eps"] == pytest.approx(1e-5)
    assert {k: got[k] for k in MULT} == MULT

    # config.json without the multipliers: transformers' defaults (1.0), not the variant's
    bare = {k: v for k, v in meta.items() if k not in MULT}
    got = params_from_metadata(spec, bare)
    assert {k: got[k] for k in MULT} == dict.fromkeys(MULT, 1.0)

    # released Granite 3.x config.json files (transformers < 5): top-level rope_theta,
    # rope_scaling null
    old = {k: v for k, v in meta.items() if k != "rope_parameters"}
    got = params_from_metadata(spec, {**old, "rope_theta": 1e7, "rope_scaling": None})
    assert got["rope_theta"] == 1e7 and got["rope_type"] == "none"


def test_granite_resolved_scales(ours_tied):
    p = ours_tied.params
    assert p["emb_scale"] == 0.25 and p["res_scale"] == 2.5 and p["logit_div"] == 4.0
    assert p["attn_scale"] == pytest.approx(0.04)
    assert "output.weight" not in ours_tied.weights          # tied: the embedding stands in


def test_granite_refuses_what_it_does_not_model(tied):
    spec, meta, _ = hf_params("granite", tied[1])
    for bad, why in (({"hidden_act": "gelu"}, "hidden_act"),
                     ({"attention_bias": True}, "biases"),
                     ({"rope_parameters": {"rope_type": "linear", "factor": 2.0,
                                           "rope_theta": 1e4}}, "RoPE scaling linear"),
                     ({"rope_parameters": None, "rope_theta": 1e4,
                       "rope_scaling": {"type": "dynamic", "factor": 2.0}}, "RoPE scaling dynamic")):
        with pytest.raises(md.WeightsError, match=why):
            params_from_metadata(spec, {**meta, **bad})


# -- logits and generation ---------------------------------------------------------------

def test_granite_tied_prefill_and_decode_match_hf(tied, ours_tied):
    assert_logits_match("granite (tied)", ours_tied, tied[2], tied[3])


def test_granite_untied_prefill_and_decode_match_hf(untied):
    ours = tiny_model("granite", untied[1])
    assert "output.weight" in ours.weights
    assert_logits_match("granite (untied)", ours, untied[2], untied[3])


def test_granite_greedy_generate_matches_hf(tied, ours_tied):
    assert_greedy_matches_hf(tied[0], ours_tied, PROMPTS, N_NEW)


# -- negative controls: each multiplier matters --------------------------------------------

@pytest.mark.parametrize("key", sorted(MULT))
def test_granite_each_multiplier_matters(tied, key):
    """Reading one multiplier as 1.0 (attention: as the default 1/sqrt(head_dim)) gives
    other logits."""
    model, path, ids, ref = tied
    spec = with_hf_config(md.load_spec(spec_path("granite")), **{key: "{None}"})
    pre, dec = compare(md.load_model(spec, path, variant="tiny"), ref, ids)
    assert pre > 10 * TOL and dec > 10 * TOL


# -- GGUF --------------------------------------------------------------------------------

def granite_to_gguf(model, path, scales=True) -> str:
    """Write a GraniteForCausalLM as llama.cpp's converter (GraniteModel) does: LlamaModel's
    keys and permuted q/k rows, then the four multipliers under granite.* keys (``scales
    =False`` leaves out the three llama.cpp treats as optional: a file whose config had
    them at 0), no output.weight when the embeddings are tied."""
    import gguf

    cfg, sd = model.config, hf_state(model)
    nh = cfg.num_attention_heads
    w = gguf_writer(path, "granite", cfg)
    w.add_rope_freq_base(float(_rope_theta(cfg)))
    w.add_layer_norm_rms_eps(cfg.rms_norm_eps)
    w.add_file_type(gguf.LlamaFileType.ALL_F32)
    w.add_vocab_size(cfg.vocab_size)
    w.add_rope_dimension_count(cfg.hidden_size // nh)
    if scales:
        w.add_attention_scale(cfg.attention_multiplier)
        w.add_embedding_scale(cfg.embedding_multiplier)
        w.add_residual_scale(cfg.residual_multiplier)
    w.add_logit_scale(cfg.logits_scaling)
    _add_tokenizer(w, cfg.vocab_size)
    t = {"token_embd.weight": sd["model.embed_tokens.weight"], **llama_layer_tensors(sd, cfg)}
    _write(w, t)
    return str(path)


@pytest.fixture(scope="module")
def ggufs(tied, untied, tmp_path_factory):
    folder = tmp_path_factory.mktemp("granite_gguf")
    return {"tied": granite_to_gguf(tied[0], folder / "tied.gguf"),
            "untied": granite_to_gguf(untied[0], folder / "untied.gguf")}


@pytest.mark.parametrize("name", ["tied", "untied"])
def test_granite_gguf_matches_hf(name, tied, untied, ggufs):
    """The converter's GGUF: params from the granite.* keys, the HF model's logits."""
    model, _, ids, ref = {"tied": tied, "untied": untied}[name]
    got = hf_params("granite", ggufs[name])[2]
    assert {k: got.get(k) for k in TINY if k != "rope_type"} == \
        {k: v for k, v in TINY.items() if k != "rope_type"}       # no rope.scaling.type key
    assert {k: got[k] for k in MULT} == pytest.approx(MULT)
    ours = md.load_model(spec_path("granite"), ggufs[name], variant="tiny")
    assert ("output.weight" in ours.weights) is (name == "untied")
    pre, dec = compare(ours, ref, ids)
    assert pre <= TOL and dec <= TOL


def test_granite_gguf_refusals(ggufs):
    """GGUF keys the spec does not model fail the load (RoPE scaling, no-RoPE granite)."""
    spec = md.load_spec(spec_path("granite"))
    meta = dict(md.load_weights(ggufs["tied"]).metadata)
    for key, value, why in (("granite.rope.scaling.type", "linear", "RoPE scaling linear"),
                            ("granite.rope.scaling.finetuned", False, "without RoPE")):
        with pytest.raises(md.WeightsError, match=why):
            params_from_metadata(spec, {**meta, key: value})


def test_granite_gguf_without_optional_scales_uses_llama_cpp_defaults(tied, tmp_path):
    """A GGUF without embedding_scale, residual_scale and attention.scale (the converter
    skips zeros) runs them as llama.cpp does: no embedding or residual scaling, attention
    scaled by 1/sqrt(head_dim); the HF model with those values gives the same logits."""
    import torch

    model = tied[0]
    plain = make_granite(embedding_multiplier=1.0, residual_multiplier=1.0,
                         attention_multiplier=64 ** -0.5)
    with torch.no_grad():
        plain.load_state_dict(model.state_dict())
    path = granite_to_gguf(plain, tmp_path / "plain.gguf", scales=False)
    ours = md.load_model(spec_path("granite"), path, variant="tiny")
    assert ours.params["emb_scale"] == 1.0 and ours.params["res_scale"] == 1.0
    assert ours.params["attn_scale"] == pytest.approx(0.125)
    ids = tied[2]
    ref = hf_logits(plain, ids)
    pre, dec = compare(ours, ref, ids)
    assert pre <= TOL and dec <= TOL
    try:                                         # llama.cpp reads the file the same way
        import llama_cpp
    except ImportError:
        return
    theirs = llama_cpp_logits(llama_cpp, path, ids)
    assert np.abs(theirs - ref).max() <= TOL_LLAMA_CPP * float(np.abs(ref).max())


def test_granite_export_round_trip(tied, ggufs, tmp_path):
    """``maxdecl export`` of the HF checkpoint writes the converter's tensors and the
    granite.* multipliers."""
    import gguf

    from maxdecl.cli import main

    out = tmp_path / "exported.gguf"
    assert main(["export", str(tied[1]), "--spec", spec_path("granite"), "--variant", "tiny",
                 "-o", str(out)]) == 0
    exported, converted = md.load_weights(str(out)), md.load_weights(ggufs["tied"])
    assert sorted(exported.keys()) == sorted(converted.keys())
    for name in converted.keys():
        np.testing.assert_array_equal(np.asarray(exported[name]), np.asarray(converted[name]))
    fields = gguf.GGUFReader(str(out)).fields
    for key, hf_key in (("granite.embedding_scale", "embedding_multiplier"),
                        ("granite.attention.scale", "attention_multiplier"),
                        ("granite.residual_scale", "residual_multiplier"),
                        ("granite.logit_scale", "logits_scaling")):
        assert float(fields[key].contents()) == pytest.approx(MULT[hf_key]), key
    assert fields["general.architecture"].contents() == "granite"


@pytest.mark.parametrize("name", ["tied", "untied"])
def test_llama_cpp_runs_the_granite_gguf_with_the_reference_logits(name, tied, untied, ggufs):
    """llama.cpp itself (llama-cpp-python; skipped without it) runs the GGUF with the
    transformers model's logits, and maxdecl reads the same file."""
    llama_cpp = pytest.importorskip("llama_cpp")
    model, _, ids, ref = {"tied": tied, "untied": untied}[name]
    theirs = llama_cpp_logits(llama_cpp, ggufs[name], ids)
    ours = np.asarray(md.load_model(spec_path("granite"), ggufs[name], variant="tiny").logits(ids))
    scale = float(np.abs(ref).max())
    print(f"granite ({name}): llama.cpp vs HF {np.abs(theirs - ref).max() / scale:.2e}, "
          f"maxdecl vs HF {np.abs(ours - ref).max() / scale:.2e} (of max|ref|)")
    assert np.abs(theirs - ref).max() <= TOL_LLAMA_CPP * scale
    assert np.abs(ours - ref).max() <= 1e-5 * scale
