"""specs/llama3.yaml (and specs/tinystories.yaml) against transformers' LlamaForCausalLM.

A small seeded float32 Llama with grouped-query attention (4 query heads, 2 kv
heads), rope_theta 500000, SwiGLU and RMSNorm is saved with ``save_pretrained``
and loaded by maxdecl from the directory: hyperparameters from config.json, names
and the q/k row permutation from the spec's ``formats.hf``.
"""

import numpy as np
import pytest

import maxdecl as md
from maxdecl.pipelines.model_loading import params_from_metadata

from modelhelp import (TOL, compare, hf_case, hf_logits, make_llama, save_hf, spec_path, token_ids,
                       without_hf_transforms)

pytest.importorskip("torch")
pytest.importorskip("transformers")


@pytest.fixture(scope="module")
def llama(tmp_path_factory):
    model = make_llama(seed=0)
    return hf_case(model, tmp_path_factory.mktemp("llama_hf"))


def test_llama3_config_from_hf(llama):
    model, path, _, _ = llama
    ours = md.load_model(spec_path("llama3"), path, variant="tiny")
    shapes = {w: tuple(v.shape) for w, v in ours.weights.items()}
    assert shapes["token_embd.weight"] == (96, 256)           # vocab, dim from config.json
    assert shapes["blk.1.attn_k.weight"] == (128, 256)        # n_kv_heads 2 * head_dim 64
    assert shapes["blk.0.ffn_gate.weight"] == (512, 256)
    assert "blk.2.attn_q.weight" not in shapes                 # n_layers 2
    meta = md.load_weights(path).metadata
    got = params_from_metadata(md.load_spec(spec_path("llama3")), meta)
    assert got["rope_theta"] == 500000.0
    assert got["n_kv_heads"] == 2 and got["n_heads"] == 4
    assert got["norm_eps"] == pytest.approx(1e-5)


def test_llama3_prefill_and_decode_match_hf(llama):
    model, path, ids, ref = llama
    ours = md.load_model(spec_path("llama3"), path, variant="tiny")
    pre, dec = compare(ours, ref, ids)
    print(f"llama3 vs HF: prefill {pre:.2e}, decode {dec:.2e} (of max|ref|)")
    assert pre <= TOL and dec <= TOL


def test_llama3_loads_weights_mapped_beforehand(llama):
    """md.load_model takes a TensorDict already mapped by md.load_weights(path, spec=...)
    as it is (the mapping is not applied twice), with the params read then; one mapped
    for another spec is refused."""
    model, path, ids, ref = llama
    td = md.load_weights(path, spec=spec_path("llama3"))
    assert td.mapped_for == "llama3" and "blk.0.attn_q.weight" in td
    assert td.copy().mapped_for == "llama3"
    ours = md.load_model(spec_path("llama3"), td, variant="tiny")
    assert ours.params["n_kv_heads"] == 2
    pre, dec = compare(ours, ref, ids)
    assert pre <= TOL and dec <= TOL
    with pytest.raises(md.WeightsError, match="mapped for spec 'llama3', not 'qwen2'"):
        md.load_model(spec_path("qwen2"), td)


def test_llama3_without_qk_permutation_fails(llama):
    """Negative control: without permute_qk, maxdecl's adjacent-pair rope on HF's
    half-split q/k rows gives clearly different logits."""
    model, path, ids, ref = llama
    spec = without_hf_transforms(md.load_spec(spec_path("llama3")))
    ours = md.load_model(spec, path, variant="tiny")
    pre, dec = compare(ours, ref, ids)
    assert pre > 30 * TOL and dec > 30 * TOL


def test_llama3_rope_theta_matters(tmp_path):
    """The rope base is read from config.json: a model with another base still matches."""
    model = make_llama(seed=3, rope_theta=10000.0)
    path = save_hf(model, tmp_path / "hf")
    ids = token_ids(model.config.vocab_size, seed=11)
    ref = hf_logits(model, ids)
    ours = md.load_model(spec_path("llama3"), path, variant="tiny")
    pre, dec = compare(ours, ref, ids)
    assert pre <= TOL and dec <= TOL


def test_tinystories_tied_llama_matches_hf(tmp_path):
    """specs/tinystories.yaml: Llama 2 with the classifier tied to the embedding."""
    model = make_llama(seed=5, tied=True, rope_theta=10000.0, num_key_value_heads=4)
    path = save_hf(model, tmp_path / "hf")
    ids = token_ids(model.config.vocab_size, seed=5)
    ref = hf_logits(model, ids)
    ours = md.load_model(spec_path("tinystories"), path, variant="tiny")
    pre, dec = compare(ours, ref, ids)
    print(f"tinystories vs HF: prefill {pre:.2e}, decode {dec:.2e} (of max|ref|)")
    assert pre <= TOL and dec <= TOL


@pytest.mark.parametrize("scaling", [
    {"rope_scaling": {"rope_type": "yarn", "factor": 4.0}},
    {"rope_parameters": {"rope_type": "dynamic", "rope_theta": 10000.0, "factor": 2.0}},
])
def test_llama3_refuses_rope_scaling_it_does_not_model(llama, scaling):
    """config.json with a RoPE scaling other than none or llama3 (formats.hf.refuse) is
    a WeightsError naming it, not a model that runs with the wrong positions."""
    _, path, _, _ = llama
    meta = dict(md.load_weights(path).metadata)
    meta.pop("rope_parameters", None)
    meta.pop("rope_scaling", None)
    spec = md.load_spec(spec_path("llama3"))
    assert params_from_metadata(spec, meta)                      # plain: accepted
    kind = next(iter(scaling.values()))["rope_type"]
    with pytest.raises(md.WeightsError, match=f"RoPE scaling {kind} is not modelled"):
        params_from_metadata(spec, {**meta, **scaling})


def test_llama3_lone_safetensors_file_reads_through_formats_hf(tmp_path):
    """A lone .safetensors file of HF names (a state_dict, or model.safetensors without its
    folder) is mapped by formats.hf; with no config.json the variant gives the sizes.
    A file of the spec's own names loads as it is."""
    import safetensors.torch

    model = make_llama(seed=2, vocab_size=512)            # the tiny variant's sizes
    path = tmp_path / "state_dict.safetensors"
    safetensors.torch.save_file({k: v.contiguous() for k, v in model.state_dict().items()},
                                str(path))
    ours = md.load_model(spec_path("llama3"), path, variant="tiny")
    ids = token_ids(512)
    pre, dec = compare(ours, hf_logits(model, ids), ids)
    assert pre <= TOL and dec <= TOL
    own = tmp_path / "own_names.safetensors"
    import safetensors.numpy
    safetensors.numpy.save_file({k: np.asarray(v) for k, v in ours.weights.items()}, str(own))
    again = md.load_model(spec_path("llama3"), own, variant="tiny")
    np.testing.assert_array_equal(np.asarray(again.logits(ids)), np.asarray(ours.logits(ids)))
