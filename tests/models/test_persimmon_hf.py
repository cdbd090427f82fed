"""specs/persimmon.yaml against transformers' PersimmonForCausalLM.

Two small seeded float32 Persimmon models (eager attention, 2 layers, vocab 128):

- ``qk``: dim 64, 4 heads of 16, per-head q/k LayerNorm (``qk_layernorm``, with
  biases), partial rotary factor 0.5 (8 of 16 features rotate), squared-ReLU MLP,
  untied output head;
- ``noqk``: dim 48, 2 heads of 24, no q/k LayerNorm, partial rotary factor 0.25 (6 of
  24 features rotate), rope_theta 25000 with linear RoPE scaling (factor 2), the output
  tied to the embedding.

Each is compared with transformers for a prompt and for decode steps through the KV
cache, from the folder ``save_pretrained`` writes. Negative controls show that the
fused q/k/v layout, the q/k norms, the rotary width and scaling, the squared ReLU, the
weights and the KV cache all change the logits when they are wrong.
"""

import json
import shutil

import numpy as np
import pytest

import maxdecl as md
from maxdecl.pipelines.model_loading import params_from_metadata

from archhelp import decoder_errors, error_with_state_reset, load
from modelhelp import (TOL, assert_greedy_matches_hf, assert_logits_match, compare, hf_case,
                       hf_params, randomize, spec_path, tiny_model)

pytest.importorskip("torch")
pytest.importorskip("transformers")

PROMPTS = [[3, 17, 42, 99, 5, 7, 64, 1], [8, 9, 120], [5, 60, 33, 2, 90, 11, 7]]
N_NEW = 5

CASES = {
    "qk": dict(hidden_size=64, num_attention_heads=4, qk_layernorm=True,
               partial_rotary_factor=0.5, rope_theta=10000.0, tie_word_embeddings=False),
    "noqk": dict(hidden_size=48, num_attention_heads=2, qk_layernorm=False,
                 rope_parameters=dict(rope_type="linear", factor=2.0, rope_theta=25000.0,
                                      partial_rotary_factor=0.25),
                 tie_word_embeddings=True),
}
# what the spec should read from each config.json
WANT = {
    "qk": dict(dim=64, n_heads=4, head_dim=16, rot_dim=8, qk_layernorm=True,
               rope_theta=10000.0, rope_type="default", pos_scale=1.0),
    "noqk": dict(dim=48, n_heads=2, head_dim=24, rot_dim=6, qk_layernorm=False,
                 rope_theta=25000.0, rope_type="linear", pos_scale=2.0),
}


def make_persimmon(seed=0, **kw):
    """PersimmonForCausalLM: 2 layers, FFN 128, vocab 128, eager attention, float32."""
    import torch
    import transformers

    torch.manual_seed(seed)
    cfg = dict(vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
               num_attention_heads=4, max_position_embeddings=64, layer_norm_eps=1e-5,
               hidden_act="relu2", qk_layernorm=True, partial_rotary_factor=0.5,
               tie_word_embeddings=False, bos_token_id=1, eos_token_id=2,
               attn_implementation="eager")
    cfg.update(kw)
    model = randomize(transformers.PersimmonForCausalLM(transformers.PersimmonConfig(**cfg)),
                      seed)
    if cfg["tie_word_embeddings"]:
        with torch.no_grad():            # a tied N(0, 1) table would dominate the logits
            model.model.embed_tokens.weight.mul_(0.1)
    return model


_BUILT = {}


def _case(name, tmp_path_factory):
    """(name, model, HF folder, prompt ids, HF logits) of a case, built once per module."""
    if name not in _BUILT:
        model = make_persimmon(seed=list(CASES).index(name), **CASES[name])
        _BUILT[name] = (name, *hf_case(model, tmp_path_factory.mktemp(f"persimmon_{name}")))
    return _BUILT[name]


@pytest.fixture(scope="module", params=list(CASES))
def persimmon(request, tmp_path_factory):
    return _case(request.param, tmp_path_factory)


@pytest.fixture(scope="module")
def qk(tmp_path_factory):
    return _case("qk", tmp_path_factory)


@pytest.fixture(scope="module")
def noqk(tmp_path_factory):
    return _case("noqk", tmp_path_factory)


_MODELS = {}


def ours(case):
    """The maxdecl model of a case (loaded once per module)."""
    name, _, path = case[:3]
    if name not in _MODELS:
        _MODELS[name] = tiny_model("persimmon", path)
    return _MODELS[name]


def errors_with(case, edit=None, spec=None):
    """(prefill, decode) errors of the case's folder loaded with ``edit(td)`` applied to
    the unmapped TensorDict (metadata and HF-named tensors) and/or another spec."""
    _, _, path, ids, ref = case
    td = md.load_weights(path)
    if edit is not None:
        edit(td)
    return compare(md.load_model(spec or spec_path("persimmon"), td, variant="tiny"), ref, ids)


def assert_far(errs):
    pre, dec = errs
    print(f"negative control: prefill {pre:.2e}, decode {dec:.2e}")
    assert pre > 10 * TOL and dec > 10 * TOL


# -- the config and the weights ---------------------------------------------------------

def test_persimmon_spec_validates():
    assert md.validate_spec(spec_path("persimmon")) == []


def test_persimmon_config_from_hf(persimmon):
    name, model, path, _, _ = persimmon
    _, _, got = hf_params("persimmon", path)
    assert {k: got.get(k) for k in ("n_layers", "ffn_dim", "vocab", "context", "hidden_act")} \
        == {"n_layers": 2, "ffn_dim": 128, "vocab": 128, "context": 64, "hidden_act": "relu2"}
    params = ours(persimmon).params
    assert {k: params[k] for k in WANT[name]} == WANT[name]
    assert params["norm_eps"] == pytest.approx(1e-5)
    names = set(ours(persimmon).weights.keys())
    assert ("blk.1.attn_q_norm.bias" in names) == CASES[name]["qk_layernorm"]
    assert ("output.weight" in names) == (not CASES[name]["tie_word_embeddings"])


def test_persimmon_transformers4_config(qk):
    """config.json as adept/persimmon-8b-base ships it (transformers 4): rope_theta,
    partial_rotary_factor and rope_scaling at the top level."""
    spec = md.load_spec(spec_path("persimmon"))
    meta = {k: v for k, v in md.load_weights(qk[2]).metadata.items() if k != "rope_parameters"}
    got = params_from_metadata(spec, {**meta, "rope_theta": 25000.0,
                                      "partial_rotary_factor": 0.5, "rope_scaling": None})
    assert got["rope_theta"] == 25000.0 and got["partial_rotary_factor"] == 0.5
    assert got["rope_type"] == "default" and got["rope_scale"] == 1.0
    got = params_from_metadata(spec, {**meta, "rope_theta": 25000.0, "partial_rotary_factor": 0.5,
                                      "rope_scaling": {"type": "linear", "factor": 4.0}})
    assert got["rope_type"] == "linear" and got["rope_scale"] == 4.0


# -- logits ------------------------------------------------------------------------------

def test_persimmon_prefill_and_decode_match_hf(persimmon):
    name, _, _, ids, ref = persimmon
    assert_logits_match(f"persimmon {name}", ours(persimmon), ids, ref)


def test_persimmon_greedy_generate_matches_hf(qk):
    assert_greedy_matches_hf(qk[1], ours(qk), PROMPTS, N_NEW)


def test_persimmon_low_level_graph_matches_hf(noqk):
    """The same model built with md.load_weights + md.build + md.compile."""
    _, _, path, ids, ref = noqk
    g, td = load("persimmon", path)
    pre, dec = decoder_errors(g, td, ref, ids)
    assert pre <= TOL and dec <= TOL


# -- negative controls -------------------------------------------------------------------

def test_persimmon_perturbed_weight_fails(qk):
    """Seeded noise of a tenth of the weight's scale on one projection gives logits far
    from HF's. (Noise, not a constant: a shift shared by all rows of the MLP's output
    moves every feature of the residual alike, which every LayerNorm after it removes.)"""
    def edit(td):
        w = np.array(td["model.layers.0.mlp.dense_4h_to_h.weight"], np.float32)
        noise = np.random.default_rng(0).standard_normal(w.shape).astype(np.float32)
        td["model.layers.0.mlp.dense_4h_to_h.weight"] = w + 0.1 * np.abs(w).max() * noise
    assert_far(errors_with(qk, edit))


def test_persimmon_qkv_layout_matters(qk, tmp_path):
    """Reading the fused projection as q | k | v blocks ([3, n_heads, head_dim], as
    GPT-NeoX's GGUF does) instead of HF's per-head interleaving gives other logits."""
    text = open(spec_path("persimmon")).read()
    old = ('{op: reshape, in: qkv, attrs: {shape: [seq, "{n_heads}", 3, "{head_dim}"]}, out: qkv}\n'
           '          - {op: split, in: qkv, attrs: {sizes: [1, 1, 1], axis: 2}')
    new = ('{op: reshape, in: qkv, attrs: {shape: [seq, 3, "{n_heads}", "{head_dim}"]}, out: qkv}\n'
           '          - {op: split, in: qkv, attrs: {sizes: [1, 1, 1], axis: 1}')
    assert text.count(old) == 1
    blocks = tmp_path / "persimmon_blocks.yaml"
    blocks.write_text(text.replace(old, new))
    assert_far(errors_with(qk, spec=str(blocks)))


def test_persimmon_qk_layernorm_matters(qk):
    """q and k norms swapped (gains and biases) give other logits."""
    def edit(td):
        for kind in ("weight", "bias"):
            for i in range(2):
                a = f"model.layers.{i}.self_attn.q_layernorm.{kind}"
                b = f"model.layers.{i}.self_attn.k_layernorm.{kind}"
                td[a], td[b] = td[b], td[a]
    assert_far(errors_with(qk, edit))


def test_persimmon_qk_layernorm_flag_must_match_the_tensors(qk, noqk):
    """qk_layernorm in config.json decides the part: a flag that disagrees with the
    tensors fails the load with the missing / unexpected names."""
    def drop(td):
        td.metadata["qk_layernorm"] = False
    with pytest.raises(md.WeightsError, match="unexpected.*blk.0.attn_k_norm"):
        errors_with(qk, drop)

    def add(td):
        td.metadata["qk_layernorm"] = True
    with pytest.raises(md.WeightsError, match="missing.*attn_q_norm"):
        errors_with(noqk, add)


def test_persimmon_rotary_details_matter(qk, noqk):
    """Every feature rotating (factor 1.0), or the linear scaling ignored, gives other
    logits."""
    def full(td):
        td.metadata["rope_parameters"] = {**td.metadata["rope_parameters"],
                                          "partial_rotary_factor": 1.0}
    assert_far(errors_with(qk, full))

    def unscaled(td):
        td.metadata["rope_parameters"] = {**td.metadata["rope_parameters"],
                                          "rope_type": "default"}
    assert_far(errors_with(noqk, unscaled))


def test_persimmon_squared_relu_matters(qk):
    def relu(td):
        td.metadata["hidden_act"] = "relu"
    assert_far(errors_with(qk, relu))


def test_persimmon_kv_cache_matters(qk):
    """A decode step after the prefill with the KV caches emptied is far from HF."""
    _, _, path, ids, ref = qk
    g, td = load("persimmon", path)
    assert error_with_state_reset(g, td, ref, ids, "kv_cache") > 10 * TOL


def test_persimmon_refuses_what_it_does_not_model(qk, tmp_path):
    _, _, path, _, _ = qk
    spec = md.load_spec(spec_path("persimmon"))
    base = {"maxdecl.format": "hf", "hidden_act": "relu2"}
    with pytest.raises(md.WeightsError, match="RoPE scaling dynamic is not modelled"):
        params_from_metadata(spec, {**base, "rope_parameters": {
            "rope_type": "dynamic", "factor": 2.0, "rope_theta": 1e4,
            "partial_rotary_factor": 0.5}})
    with pytest.raises(md.WeightsError, match="hidden_act gelu_10 is not modelled"):
        params_from_metadata(spec, {**base, "hidden_act": "gelu_10"})
    # a whole checkpoint folder with dynamic NTK scaling in config.json
    dyn = tmp_path / "dyn"
    shutil.copytree(path, dyn)
    cfg = json.loads((dyn / "config.json").read_text())
    cfg["rope_parameters"] = {**cfg["rope_parameters"], "rope_type": "dynamic", "factor": 2.0}
    (dyn / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(md.WeightsError, match="RoPE scaling dynamic"):
        md.load_model(spec_path("persimmon"), str(dyn), variant="tiny")
