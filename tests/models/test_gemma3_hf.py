"""specs/gemma3.yaml against transformers' Gemma3ForCausalLM (text only).

A small seeded float32 Gemma 3: QK-norm, sandwich norms, GELU-tanh gated MLP,
embeddings scaled by sqrt(dim), head_dim != dim / n_heads, query_pre_attn_scalar !=
head_dim, six layers with the default pattern (five sliding-window layers with
their own RoPE base, then a global one), a window smaller than the sequence, and
the output tied to the embedding. HF stores norm weights w and computes x * (1 + w):
the spec's hf transforms add 1.
"""

import pytest

import maxdecl as md
from maxdecl.pipelines.model_loading import params_from_metadata

from modelhelp import (N_PROMPT, TOL, compare, hf_logits, make_gemma3, save_hf, spec_path,
                       token_ids, without_hf_transforms)

pytest.importorskip("torch")
pytest.importorskip("transformers")


@pytest.fixture(scope="module")
def gemma3(tmp_path_factory):
    model = make_gemma3()
    assert list(model.config.layer_types).count("full_attention") == 1
    path = save_hf(model, tmp_path_factory.mktemp("gemma3_hf"))
    ids = token_ids(model.config.vocab_size)
    assert model.config.sliding_window < N_PROMPT
    return model, path, ids, hf_logits(model, ids)


def test_gemma3_config_from_hf(gemma3):
    model, path, _, _ = gemma3
    got = params_from_metadata(md.load_spec(spec_path("gemma3")), md.load_weights(path).metadata)
    assert got["dim"] == 128 and got["head_dim"] == 48 and got["n_layers"] == 6
    assert got["n_heads"] == 4 and got["n_kv_heads"] == 2
    assert got["window"] == 5 and got["global_every"] == 6
    assert got["rope_local"] == 20000.0 and got["rope_global"] == 500000.0
    assert got["query_pre_attn_scalar"] == 40


def test_gemma3_prefill_and_decode_match_hf(gemma3):
    model, path, ids, ref = gemma3
    ours = md.load_model(spec_path("gemma3"), path, variant="tiny")
    pre, dec = compare(ours, ref, ids)
    print(f"gemma3 vs HF: prefill {pre:.2e}, decode {dec:.2e} (of max|ref|)")
    assert pre <= TOL and dec <= TOL


def test_gemma3_norms_need_the_added_one(gemma3):
    """Negative control: without the spec's ``add: 1.0`` the logits are far off."""
    model, path, ids, ref = gemma3
    spec = without_hf_transforms(md.load_spec(spec_path("gemma3")))
    ours = md.load_model(spec, path, variant="tiny")
    pre, dec = compare(ours, ref, ids)
    assert pre > 30 * TOL and dec > 30 * TOL


def test_gemma3_window_matters(gemma3):
    """Negative control: the same weights with a wider window give other logits, so
    the test sequence really crosses the window."""
    model, path, ids, ref = gemma3
    td = md.load_weights(path)
    td.metadata["sliding_window"] = 64
    ours = md.load_model(spec_path("gemma3"), td, variant="tiny")
    pre, dec = compare(ours, ref, ids)
    assert pre > 10 * TOL and dec > 10 * TOL


def test_gemma3_layer_types_from_config(tmp_path):
    """A config.json whose layer_types are not every-6th-global: each layer's kind (its
    window and RoPE base) follows the list; reading global_every alone would not."""
    kinds = ["sliding_attention", "full_attention", "sliding_attention",
             "full_attention", "full_attention", "sliding_attention"]
    model = make_gemma3(layer_types=kinds)
    assert list(model.config.layer_types) == kinds
    path = save_hf(model, tmp_path / "hf")
    ids = token_ids(model.config.vocab_size)
    ref = hf_logits(model, ids)
    td = md.load_weights(path)
    assert params_from_metadata(md.load_spec(spec_path("gemma3")), td.metadata)[
        "layer_types"] == kinds
    ours = md.load_model(spec_path("gemma3"), path, variant="tiny")
    pre, dec = compare(ours, ref, ids)
    print(f"gemma3 layer_types vs HF: prefill {pre:.2e}, decode {dec:.2e} (of max|ref|)")
    assert pre <= TOL and dec <= TOL
    del td.metadata["layer_types"]                 # negative control: the periodic pattern
    ours = md.load_model(spec_path("gemma3"), td, variant="tiny")
    pre, dec = compare(ours, ref, ids)
    assert pre > 10 * TOL and dec > 10 * TOL


@pytest.mark.parametrize("n_layers, dim, n_heads, head_dim, want", [
    (62, 5376, 32, 128, 168),      # 27B: dim / n_heads, as llama.cpp and its config.json
    (34, 2560, 8, 256, 256),       # 4B: head_dim
])
def test_gemma3_attention_scale_without_query_pre_attn_scalar(n_layers, dim, n_heads,
                                                              head_dim, want):
    """A GGUF states no query_pre_attn_scalar: the scale follows llama.cpp's rule."""
    spec = md.load_spec(spec_path("gemma3"))
    got = spec.program("270m", dict(n_layers=n_layers, dim=dim, n_heads=n_heads,
                                    head_dim=head_dim, query_pre_attn_scalar=None)).params
    assert got["attn_scalar"] == want and got["attn_scale"] == pytest.approx(want ** -0.5)
