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
