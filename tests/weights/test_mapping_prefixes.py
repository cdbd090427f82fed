"""``formats.hf.prefixes``: a checkpoint that nests the model under another module
(``vision_model.``) maps through the same ``tensors`` entries."""

import numpy as np
import pytest

import maxdecl as md
from maxdecl.errors import WeightsError
from maxdecl.weights.mapping import remap

TENSORS = {"encoder.layers.{i}.fc.weight": "blk.{i}.fc.weight", "post.weight": "post.weight",
           "model.norm": "norm"}


def _td(names):
    td = md.TensorDict()
    for k, n in enumerate(names):
        td[n] = np.full((2,), k, np.float32)
    return td


def test_a_prefixed_name_maps_like_the_bare_one():
    td = _td(["vision_model.encoder.layers.3.fc.weight", "vision_model.post.weight"])
    out = remap(td, TENSORS, prefixes=("text_model.", "vision_model."),
                expected=["blk.3.fc.weight", "post.weight"])
    assert out["blk.3.fc.weight"][0] == 0 and out["post.weight"][0] == 1


def test_a_name_an_entry_matches_as_it_is_keeps_its_prefix():
    # "model.norm" is an entry itself: with prefix "model." it must not become "norm"
    out = remap(_td(["model.norm"]), TENSORS, prefixes=("model.",))
    assert list(out.keys()) == ["norm"]


def test_an_unknown_prefix_is_still_unexpected():
    with pytest.raises(WeightsError, match=r"unexpected 1 \(audio.post.weight\)"):
        remap(_td(["audio.post.weight"]), TENSORS, prefixes=("vision_model.",))


def test_a_catch_all_target_the_model_lacks_is_unexpected_beside_the_missing():
    """A ``*`` entry passes ``predictor.mask_tokens`` through, but the model's weight is
    ``predictor.mask_tokens.weight``: the error lists both sides, so the fix shows."""
    td = _td(["predictor.mask_tokens", "predictor.fc.weight"])
    with pytest.raises(WeightsError, match=r"missing 1 \(predictor.mask_tokens.weight\); "
                                           r"unexpected 1 \(predictor.mask_tokens \(as "
                                           r"predictor.mask_tokens\)\)"):
        remap(td, {"predictor.*": "predictor.*"},
              expected=["predictor.mask_tokens.weight", "predictor.fc.weight"],
              known={"predictor.mask_tokens.weight", "predictor.fc.weight"})


def test_a_conditional_entry_maps_some_indices_and_drops_the_rest():
    """Gemma 3n's shared layers: a checkpoint holds k projections the spec has only for
    the first layers; {name, when} maps those and drops the others, as a null entry."""
    import numpy as np

    from maxdecl.tensors import TensorDict
    from maxdecl.weights.mapping import remap

    td = TensorDict({f"layers.{i}.k.weight": np.full(2, i, np.float32) for i in range(4)})
    td["norm.weight"] = np.ones(2, np.float32)
    entry = {"name": "blk.{i}.attn_k.weight", "when": "{i < first_shared}"}
    out = remap(td, {"layers.{i}.k.weight": entry, "norm.weight": {
        "name": "output_norm.weight", "when": "{has_norm}"}},
        params={"first_shared": 2, "has_norm": True},
        expected=["blk.0.attn_k.weight", "blk.1.attn_k.weight", "output_norm.weight"])
    assert sorted(out.keys()) == ["blk.0.attn_k.weight", "blk.1.attn_k.weight",
                                  "output_norm.weight"]
    assert out["blk.1.attn_k.weight"][0] == 1
    with pytest.raises(md.WeightsError, match=r"when '\{i \+ 1\}' gives 1, expected true"):
        remap(td, {"layers.{i}.k.weight": {"name": "blk.{i}.k", "when": "{i + 1}"}})
    with pytest.raises(md.WeightsError, match="a conditional target is"):
        remap(td, {"layers.{i}.k.weight": {"name": "", "when": "{True}"}})


def test_a_conditional_entry_carries_the_sources_stars():
    """DETR's backbone: a stage's norm tensors (weight, bias, running statistics) through
    one ``*`` entry, kept for the stages that run, dropped for the others."""
    stats = ("weight", "bias", "running_mean", "running_var")
    td = _td([f"stages.{s}.norm.{k}" for s in range(3) for k in stats])
    entry = {"name": "blk.{s}.norm.*", "when": "{s < n_run}"}
    out = remap(td, {"stages.{s}.norm.*": entry}, params={"n_run": 2},
                expected=[f"blk.{s}.norm.{k}" for s in range(2) for k in stats])
    assert sorted(out.keys()) == sorted(f"blk.{s}.norm.{k}" for s in range(2) for k in stats)
    assert out["blk.1.norm.running_var"][0] == 7
    with pytest.raises(WeightsError, match="a '\\*' pattern keeps its text"):
        remap(td, {"stages.{s}.norm.*": {"name": "blk.{s}.norm", "when": "{True}"}})
    with pytest.raises(WeightsError, match="a '\\*' in the target needs one in the source"):
        remap(td, {"stages.{s}.norm.weight": {"name": "blk.{s}.*", "when": "{True}"}})
