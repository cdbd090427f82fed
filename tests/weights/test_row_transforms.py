"""The row transforms for fused projections whose row blocks differ between formats:
``permute_rows`` (rows seen as an array of a given shape, axes reordered) against
NumPy's own reshape and transpose, ``regroup_rows`` (groups cut into sections,
reassembled section by section) against a plain loop; on arrays and packed rows; and
the transform names the schema accepts are the loader's."""

import json
import os

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import maxdecl as md
from maxdecl.errors import WeightsError
from maxdecl.weights.mapping import (TRANSFORMS, drop_rows, permute_qk, permute_rows,
                                     regroup_rows, remap)


@settings(max_examples=60, deadline=None, derandomize=True)
@given(st.lists(st.integers(1, 4), min_size=1, max_size=4), st.randoms(use_true_random=False),
       st.integers(0, 2), st.booleans())
def test_permute_rows_is_numpy_reshape_transpose(shape, rnd, trailing, infer):
    order = list(range(len(shape)))
    rnd.shuffle(order)
    rows = int(np.prod(shape))
    w = np.arange(rows * 3 ** trailing, dtype=np.float32).reshape(rows, *[3] * trailing)
    want = w.reshape(*shape, *w.shape[1:]).transpose(
        *order, *range(len(shape), len(shape) + trailing)).reshape(w.shape)
    given_shape = list(shape)
    if infer:
        given_shape[rnd.randrange(len(shape))] = -1
    np.testing.assert_array_equal(permute_rows(w, given_shape, order), want)


def test_permute_rows_generalises_permute_qk_and_moves_packed_rows():
    rng = np.random.default_rng(0)
    w = rng.standard_normal((16, 8)).astype(np.float32)
    np.testing.assert_array_equal(permute_rows(w, [2, 2, -1], [0, 2, 1]), permute_qk(w, 2))
    enc = md.codecs.get("q8_0")
    data = rng.integers(0, 256, (6, enc.block_bytes), dtype=np.uint8)
    qt = md.QuantizedTensor(data, (6, 32), "q8_0")
    out = permute_rows(qt, [2, 3], [1, 0])
    assert out.encoding == "q8_0" and out.shape == (6, 32)
    np.testing.assert_array_equal(out.data, data[[0, 3, 1, 4, 2, 5]])


def test_permute_rows_through_remap_with_param_names():
    w = np.arange(24, dtype=np.float32).reshape(12, 2)      # [n_heads=2, 3, head_dim=2]
    out = remap(md.TensorDict({"qkv": w}), {"qkv": "attn_qkv.weight"},
                {"attn_qkv.weight": {"permute_rows": {"shape": ["n_heads", 3, "{head_dim}"],
                                                      "order": [1, 0, 2]}}},
                {"n_heads": 2, "head_dim": 2})
    np.testing.assert_array_equal(out["attn_qkv.weight"][:, 0],
                                  [0, 2, 12, 14, 4, 6, 16, 18, 8, 10, 20, 22])


@pytest.mark.parametrize("arg, match", [
    ({"shape": [5, -1], "order": [1, 0]}, "12 rows do not fit"),
    ({"shape": [4, 3], "order": [0, 0]}, "not a permutation"),
    ({"shape": [-1, -1], "order": [0, 1]}, "one may be -1"),
    ({"shape": [2.5, -1], "order": [0, 1]}, "whole numbers"),
    ({"shape": [10 ** 30, -1], "order": [0, 1]}, "whole numbers"),
    ({"shape": [4, 3]}, "expects {shape"),
    ([4, 3], "expects {shape"),
    ({"shape": ["n", 3], "order": [0, 1]}, "unknown parameter 'n'"),
])
def test_permute_rows_errors_name_the_weight(arg, match):
    td = md.TensorDict({"w": np.zeros((12, 2), np.float32)})
    with pytest.raises(WeightsError, match=match) as err:
        remap(td, {"w": "w"}, {"w": {"permute_rows": arg}}, {})
    assert str(err.value).startswith("w (from w)")


@settings(max_examples=60, deadline=None, derandomize=True)
@given(st.integers(1, 4), st.lists(st.integers(0, 3), min_size=1, max_size=4),
       st.integers(0, 3), st.booleans())
def test_regroup_rows_is_sections_across_groups(groups, sizes, infer_at, trailing):
    per = sum(sizes)
    w = np.arange(groups * per * (3 if trailing else 1), dtype=np.float32)
    w = w.reshape(groups * per, 3) if trailing else w
    want = []
    for k, size in enumerate(sizes):                  # section k of every group in turn
        start = sum(sizes[:k])
        for g in range(groups):
            want.extend(w[g * per + start: g * per + start + size])
    given_sizes = list(sizes)
    given_sizes[infer_at % len(sizes)] = -1
    got = regroup_rows(w, groups, given_sizes)
    assert got.shape == w.shape
    np.testing.assert_array_equal(got, np.array(want, np.float32).reshape(w.shape))


def test_regroup_rows_falcon_qkv_and_bloom_as_a_special_case():
    n_kv, q_per_kv, hd = 2, 3, 4                     # Falcon-40B: per kv head q q q k v
    w = np.arange(n_kv * (q_per_kv + 2) * hd, dtype=np.float32)
    out = remap(md.TensorDict({"qkv": w}), {"qkv": "qkv"},
                {"qkv": {"regroup_rows": {"groups": "n_kv_heads",
                                          "sizes": [-1, "head_dim", "{head_dim}"]}}},
                {"n_kv_heads": n_kv, "head_dim": hd})["qkv"]
    g = w.reshape(n_kv, q_per_kv + 2, hd)
    np.testing.assert_array_equal(out, np.concatenate(
        [g[:, :q_per_kv].ravel(), g[:, q_per_kv].ravel(), g[:, q_per_kv + 1].ravel()]))
    b = np.arange(24, dtype=np.float32)              # BLOOM: [n_heads, 3, head_dim] -> q|k|v
    np.testing.assert_array_equal(regroup_rows(b, 4, [2, 2, 2]),
                                  permute_rows(b, [4, 3, 2], [1, 0, 2]))
    enc = md.codecs.get("q8_0")
    data = np.random.default_rng(1).integers(0, 256, (6, enc.block_bytes), dtype=np.uint8)
    qt = regroup_rows(md.QuantizedTensor(data, (6, 32), "q8_0"), 2, [1, -1])
    np.testing.assert_array_equal(qt.data, data[[0, 3, 1, 2, 4, 5]])


@pytest.mark.parametrize("arg, match", [
    ({"groups": 5, "sizes": [-1]}, "cannot be cut into 5 groups"),
    ({"groups": 2, "sizes": [-1, -1]}, "one size may be -1"),
    ({"groups": 2, "sizes": [7, 2]}, "do not fit the 6 rows"),
    ({"groups": 2.5, "sizes": [1]}, "whole numbers"),
    ({"groups": 2}, "expects {groups"),
    ({"groups": "n", "sizes": [1]}, "unknown parameter 'n'"),
])
def test_regroup_rows_errors_name_the_weight(arg, match):
    td = md.TensorDict({"w": np.zeros((12, 2), np.float32)})
    with pytest.raises(WeightsError, match=match) as err:
        remap(td, {"w": "w"}, {"w": {"regroup_rows": arg}}, {})
    assert str(err.value).startswith("w (from w)")


def test_schema_accepts_exactly_the_loaders_transforms():
    path = os.path.join(os.path.dirname(md.__file__), "schema", "spec.schema.json")
    with open(path) as f:
        schema = json.load(f)
    hf = schema["properties"]["formats"]["properties"]["hf"]["properties"]
    names = hf["transforms"]["additionalProperties"]["propertyNames"]["enum"]
    assert sorted(names) == sorted(TRANSFORMS)


def test_drop_rows_keeps_the_rows_from_n_on():
    w = np.arange(12, dtype=np.float32).reshape(6, 2)
    out = remap(md.TensorDict({"p": w}), {"p": "p"}, {"p": {"drop_rows": "pad_rows"}},
                {"pad_rows": 2})["p"]
    np.testing.assert_array_equal(out, w[2:])
    enc = md.codecs.get("q8_0")
    data = np.arange(4 * enc.block_bytes, dtype=np.uint8).reshape(4, enc.block_bytes)
    qt = drop_rows(md.QuantizedTensor(data, (4, 32), "q8_0"), 1)
    assert qt.shape == (3, 32) and qt.encoding == "q8_0"
    np.testing.assert_array_equal(qt.data, data[1:])
    for bad in (6, -1, 2.5, True, "2"):
        with pytest.raises(WeightsError, match="drop_rows"):
            remap(md.TensorDict({"p": w}), {"p": "p"}, {"p": {"drop_rows": bad}}, {"2": 7})


def test_star_patterns_drop_whole_subtrees():
    """``"text_model.*": null`` drops every tensor under a prefix (a CLIP checkpoint's
    text tower for a vision spec); ``*`` matches dots too; a pattern with too many stars
    is an error."""
    from maxdecl.weights.mapping import remap

    td = md.TensorDict({"text_model.encoder.layers.0.w": np.ones(2, np.float32),
                        "text_model.final.w": np.ones(2, np.float32),
                        "logit_scale": np.ones(1, np.float32),
                        "vision_model.pre.w": np.zeros(2, np.float32)})
    out = remap(td, {"text_model.*": None, "*scale": None, "vision_model.pre.w": "pre.w"},
                expected=["pre.w"])
    assert list(out.keys()) == ["pre.w"]
    with pytest.raises(md.WeightsError, match="unexpected.*text_model"):
        remap(td, {"text_model.encoder.*": None, "*scale": None,
                   "vision_model.pre.w": "pre.w"}, expected=["pre.w"])
    with pytest.raises(md.WeightsError, match="more than 2"):
        remap(td, {"a*b*c*": None})


def test_star_patterns_carry_their_text_to_the_target():
    """``"cvt.encoder.*": "encoder.*"`` keeps every name under a prefix, the k-th ``*`` of
    the target getting the k-th ``*``'s text of the source (with ``{i}`` placeholders
    beside them); the first pattern written that matches a name takes it; stars must
    pair up."""
    from maxdecl.weights.mapping import remap

    names = ["cvt.encoder.stages.0.attn.w", "cvt.encoder.stages.1.mlp.b",
             "cvt.encoder.stages.1.num_batches_tracked", "blk.3.x.attn.w", "head.w"]
    td = md.TensorDict({n: np.full(2, i, np.float32) for i, n in enumerate(names)})
    out = remap(td, {"*.num_batches_tracked": None, "cvt.encoder.*": "encoder.*",
                     "blk.{i}.*.w": "layers.{i}.*.weight", "*": "*"},
                expected=["encoder.stages.0.attn.w", "encoder.stages.1.mlp.b",
                          "layers.3.x.attn.weight", "head.w"])
    assert sorted(out.keys()) == ["encoder.stages.0.attn.w", "encoder.stages.1.mlp.b",
                                  "head.w", "layers.3.x.attn.weight"]
    assert out["layers.3.x.attn.weight"][0] == 3 and out["encoder.stages.1.mlp.b"][0] == 1
    out = remap(td, {"blk.{i}.x.attn.w": "b{i}", "*": None}, expected=["b3"])  # as written
    assert list(out.keys()) == ["b3"]
    with pytest.raises(md.WeightsError, match="missing.*encoder.stages.2"):
        remap(td, {"*.num_batches_tracked": None, "cvt.encoder.*": "encoder.*",
                   "blk.{i}.*.w": "layers.{i}.*.weight", "head.w": "head.w"},
              expected=["encoder.stages.2.w"])
    for bad, message in [({"text_model.*": "x"}, "as many '\\*'"),
                         ({"a.*.*": "b.*"}, "as many '\\*'"),
                         ({"a": "b.*"}, "needs one in the source"),
                         ({"a.{_star0}.*": "b.{_star0}.*"}, "reserved")]:
        with pytest.raises(md.WeightsError, match=message):
            remap(td, bad)


def test_unsqueeze_inserts_an_axis_and_undoes_squeeze():
    """``unsqueeze: 2`` makes torch's Conv1d filter [F, C, K] the [F, C, 1, K] of a
    height-1 conv2d; on packed rows it keeps the blocks; out of range is an error."""
    from maxdecl.weights.mapping import TRANSFORMS

    w = np.arange(24, dtype=np.float32).reshape(2, 3, 4)
    u = TRANSFORMS["unsqueeze"](w, 2)
    assert u.shape == (2, 3, 1, 4) and np.array_equal(u.reshape(2, 3, 4), w)
    assert np.array_equal(TRANSFORMS["squeeze"](u, 2), w)
    assert TRANSFORMS["unsqueeze"](w, -1).shape == (2, 3, 4, 1)
    q8 = md.codecs.get("q8_0")
    qt = md.QuantizedTensor(q8.quantize(np.ones((6, 32), np.float32)).reshape(2, 3, -1),
                            (2, 3, 32), "q8_0")
    assert TRANSFORMS["unsqueeze"](qt, 1).shape == (2, 1, 3, 32)
    with pytest.raises(md.WeightsError, match="packed last axis"):
        TRANSFORMS["unsqueeze"](qt, 3)
    with pytest.raises(md.WeightsError, match="out of range"):
        TRANSFORMS["unsqueeze"](w, 5)


def test_reshape_transform_moves_stacked_experts_and_keeps_packed_rows():
    """``reshape: [E, F, D]`` (DBRX's experts stored [E * F, D]); -1 infers one entry;
    a packed tensor keeps its last (block) axis; the schema lists every transform."""
    import json

    from maxdecl.spec.schema import SCHEMA_PATH
    from maxdecl.weights.mapping import TRANSFORMS, _shape_arg

    w = np.arange(4 * 3 * 5, dtype=np.float32).reshape(12, 5)
    r = TRANSFORMS["reshape"](w, _shape_arg(["n_expert", -1, 5], {"n_expert": 4}, "t"))
    assert r.shape == (4, 3, 5) and np.array_equal(r.reshape(12, 5), w)
    q8 = md.codecs.get("q8_0")
    qt = md.QuantizedTensor(q8.quantize(np.ones((6, 32), np.float32)), (6, 32), "q8_0")
    rq = TRANSFORMS["reshape"](qt, [2, 3, 32])
    assert rq.shape == (2, 3, 32) and rq.data.shape == (2, 3, 34)
    for bad, match in (([4, 4], "cannot be"), ([-1, -1], "at most one -1"), ([7, -1], "divide")):
        with pytest.raises(md.WeightsError, match=match):
            TRANSFORMS["reshape"](w, bad)
    with pytest.raises(md.WeightsError, match="keeps its last axis"):
        TRANSFORMS["reshape"](qt, [3, 64])
    schema = json.loads(SCHEMA_PATH.read_text())
    text = json.dumps(schema)
    assert all(f'"{name}"' in text for name in TRANSFORMS)
