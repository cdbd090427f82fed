"""specs/gpt_neo.yaml against transformers' GPTNeoForCausalLM.

Two small seeded float32 GPT-Neo models (eager attention):

- ``alt``: dim 64, 4 heads, attention_types [[["global", "local"], 1]] (layer 0 global,
  layer 1 local), window_size 4, intermediate_size null (4 * dim), gelu_new, the output
  tied to wte;
- ``split``: dim 32, 2 heads, attention_types [[["local"], 1], [["global"], 1]] (two
  groups: layer 0 local, layer 1 global), window_size 5, intermediate_size 48, exact
  gelu, layer_norm_epsilon 1e-6, an untied lm_head.

The prompt (12 tokens) and the decode steps run past both windows, so the local layers'
masks matter in the prefill and through the KV cache. GPT-Neo's scores are not scaled by
1/sqrt(head_dim); the negative controls show that the scale, the window, the order of the
layer types and the weights each change the logits far beyond the tolerance.
"""

import numpy as np
import pytest

import maxdecl as md
from maxdecl.pipelines.model_loading import params_from_metadata

from modelhelp import (TOL, assert_greedy_matches_hf, assert_logits_match, compare, hf_case,
                       hf_params, randomize, save_hf, spec_path, tiny_model)

pytest.importorskip("torch")
pytest.importorskip("transformers")

PROMPTS = [[3, 17, 42, 99, 5, 7, 64, 1], [8, 9, 120], [5, 60, 33, 2, 90, 11, 7]]
N_NEW = 6

CASES = {
    "alt": dict(hidden_size=64, num_heads=4, attention_types=[[["global", "local"], 1]],
                window_size=4, intermediate_size=None, activation_function="gelu_new",
                layer_norm_epsilon=1e-5, tie_word_embeddings=True),
    "split": dict(hidden_size=32, num_heads=2, attention_types=[[["local"], 1], [["global"], 1]],
                  window_size=5, intermediate_size=48, activation_function="gelu",
                  layer_norm_epsilon=1e-6, tie_word_embeddings=False),
}
LAYER_TYPES = {"alt": ["global", "local"], "split": ["local", "global"]}


def make_gpt_neo(seed=0, **kw):
    """GPTNeoForCausalLM: 2 layers, vocab 128, 64 positions, eager attention.

    A tied wte is scaled to 0.1 * N(0, 1): otherwise each token's own embedding dominates
    the tied logits and greedy decoding repeats one token."""
    import torch
    import transformers

    torch.manual_seed(seed)
    cfg = dict(vocab_size=128, num_layers=2, max_position_embeddings=64, bos_token_id=0,
               eos_token_id=0, attn_implementation="eager")
    cfg.update(kw)
    model = randomize(transformers.GPTNeoForCausalLM(transformers.GPTNeoConfig(**cfg)), seed)
    if cfg.get("tie_word_embeddings", True):
        with torch.no_grad():
            model.transformer.wte.weight.mul_(0.1)
    return model


_BUILT = {}


def _case(name, tmp_path_factory):
    """(name, model, HF folder, prompt ids, HF logits) of a case, built once per session."""
    if name not in _BUILT:
        model = make_gpt_neo(seed=list(CASES).index(name), **CASES[name])
        _BUILT[name] = (name, *hf_case(model, tmp_path_factory.mktemp(f"gpt_neo_{name}")))
    return _BUILT[name]


@pytest.fixture(scope="module", params=list(CASES))
def neo(request, tmp_path_factory):
    return _case(request.param, tmp_path_factory)


@pytest.fixture(scope="module")
def alt(tmp_path_factory):
    """The tied global/local case alone, for the tests one case is enough for."""
    return _case("alt", tmp_path_factory)


@pytest.fixture(scope="module")
def split(tmp_path_factory):
    return _case("split", tmp_path_factory)


def _load(td_or_path, spec=None):
    return md.load_model(spec or spec_path("gpt_neo"), td_or_path, variant="tiny")


def test_gpt_neo_config_from_hf(neo):
    name, model, path, _, _ = neo
    case = CASES[name]
    got = hf_params("gpt_neo", path)[2]
    dim = case["hidden_size"]
    want = {"dim": dim, "n_layers": 2, "n_heads": case["num_heads"], "vocab": 128,
            "context": 64, "window": case["window_size"],
            "ffn_dim": case["intermediate_size"] or 4 * dim,
            "hidden_act": case["activation_function"]}
    assert {k: got.get(k) for k in want} == want
    assert got["norm_eps"] == pytest.approx(case["layer_norm_epsilon"])
    params = tiny_model("gpt_neo", path).params
    assert params["layer_types"] == LAYER_TYPES[name] == model.config.attention_layers
    assert params["head_dim"] == dim // case["num_heads"]


def test_gpt_neo_prefill_and_decode_match_hf(neo):
    name, model, path, ids, ref = neo
    ours = tiny_model("gpt_neo", path)
    # the untied case holds its own head; the tied one has none (wte stands in)
    assert ("output.weight" in ours.weights) == (not CASES[name]["tie_word_embeddings"])
    assert_logits_match(f"gpt_neo {name}", ours, ids, ref)


def test_gpt_neo_greedy_generate_matches_hf(alt):
    _, model, path, _, _ = alt
    assert_greedy_matches_hf(model, tiny_model("gpt_neo", path), PROMPTS, N_NEW)


def test_gpt_neo_stops_at_the_position_table(alt):
    """Learned positions end at max_position_embeddings (64): a prompt plus new tokens
    past it is an InputError, not an index past the table."""
    ours = tiny_model("gpt_neo", alt[2])
    with pytest.raises(md.InputError, match="context of 64"):
        ours.generate(list(range(60)), 8, temperature=0)


def test_gpt_neo_base_model_and_mask_buffers_load(alt, tmp_path):
    """A GPTNeoModel checkpoint (names without transformer., no lm_head) loads, and so do
    the per-layer mask buffers older checkpoints store (dropped by null mappings)."""
    _, model, _, ids, ref = alt
    path = save_hf(model.transformer, tmp_path / "base")
    td = md.load_weights(path)
    assert "wte.weight" in td.keys() and not any(k.startswith("transformer.") for k in td.keys())
    for i in range(2):
        td[f"h.{i}.attn.attention.bias"] = np.tril(np.ones((1, 1, 64, 64), bool))
        td[f"h.{i}.attn.attention.masked_bias"] = np.array(-1e9, np.float32)
    pre, dec = compare(_load(td), ref, ids)
    assert pre <= TOL and dec <= TOL


# -- negative controls: each detail the spec models changes the logits --------------------

def test_gpt_neo_unscaled_scores_matter(alt, tmp_path):
    """Scaling q.k by the attention op's default 1/sqrt(head_dim) gives other logits."""
    _, _, path, ids, ref = alt
    text = open(spec_path("gpt_neo")).read()
    assert text.count("scale: 1.0, sliding_window") == 1
    scaled = tmp_path / "gpt_neo_scaled.yaml"
    scaled.write_text(text.replace("scale: 1.0, sliding_window", "scale: null, sliding_window"))
    pre, dec = compare(_load(path, str(scaled)), ref, ids)
    assert pre > 10 * TOL and dec > 10 * TOL


@pytest.mark.parametrize("change", ["window", "order", "all_global"])
def test_gpt_neo_local_attention_matters(alt, change):
    """A wider window, the layer types swapped, or every layer global: other logits."""
    _, _, path, ids, ref = alt
    td = md.load_weights(path)
    if change == "window":
        td.metadata["window_size"] = 64
    elif change == "order":
        td.metadata["attention_types"] = [[["local", "global"], 1]]
    else:
        td.metadata["attention_types"] = [[["global"], 2]]
    pre, dec = compare(_load(td), ref, ids)
    assert pre > 10 * TOL and dec > 10 * TOL


def test_gpt_neo_perturbed_weight_fails(alt):
    """One perturbed q_proj weight gives a large error."""
    _, _, path, ids, ref = alt
    td = md.load_weights(path)
    name = "transformer.h.1.attn.attention.q_proj.weight"
    w = np.array(td[name], np.float32)
    w += 0.5 * np.random.default_rng(0).standard_normal(w.shape).astype(np.float32)
    td[name] = w
    pre, dec = compare(_load(td), ref, ids)
    assert pre > 10 * TOL and dec > 10 * TOL


def test_gpt_neo_untied_head_is_used(split):
    """Without its lm_head the untied model falls back to wte: other logits."""
    _, _, path, ids, ref = split
    td = md.load_weights(path)
    del td["lm_head.weight"]
    pre, dec = compare(_load(td), ref, ids)
    assert pre > 10 * TOL and dec > 10 * TOL


def test_gpt_neo_refuses_what_it_does_not_model():
    spec = md.load_spec(spec_path("gpt_neo"))
    base = {"maxdecl.format": "hf", "num_layers": 2}
    with pytest.raises(md.WeightsError, match="expands to 4 layers for 2 layers"):
        params_from_metadata(spec, {**base, "attention_types": [[["global", "local"], 2]]})
    with pytest.raises(md.WeightsError, match="not all global or local"):
        params_from_metadata(spec, {**base, "attention_types": [[["global", "sparse"], 1]]})
    got = params_from_metadata(spec, {**base, "attention_types": [[["local", "global"], 1]]})
    assert got["attention_types"] == [[["local", "global"], 1]]


def test_a_param_the_config_breaks_is_named_not_the_refuse_rule_that_reads_it():
    from maxdecl.pipelines.model_loading import params_from_metadata

    meta = {"maxdecl.format": "hf", "num_layers": 2,
            "attention_types": [[["global", "local"], "1"]]}          # a count as a string
    with pytest.raises(md.WeightsError, match=r"/params/layer_types: .*range takes") as e:
        params_from_metadata(md.load_spec(spec_path("gpt_neo")), meta)
    assert "refuse" not in str(e.value)
