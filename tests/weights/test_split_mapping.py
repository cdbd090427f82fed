"""``formats.hf.tensors`` entries that cut one tensor into several spec weights
(``{split: [names], axis, sizes}``): against NumPy's own split, on arrays of any rank
and on packed rows, with param sizes; bad entries refused by name. (The spec checks
that see a split's names: tests/spec/cases/invalid/format_split_*.yaml.)"""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import maxdecl as md
from maxdecl.errors import WeightsError
from maxdecl.weights.mapping import remap


@settings(max_examples=60, deadline=None, derandomize=True)
@given(st.lists(st.integers(1, 4), min_size=1, max_size=3), st.integers(0, 2),
       st.lists(st.integers(0, 3), min_size=2, max_size=4), st.integers(-1, 3),
       st.booleans())
def test_split_is_numpy_split(shape, axis_pick, sizes, infer_at, negative_axis):
    axis = axis_pick % (len(shape) + 1)
    full = list(shape)
    full.insert(axis, sum(sizes))
    w = np.arange(int(np.prod(full)), dtype=np.float32).reshape(full)
    names = [f"part{k}" for k in range(len(sizes))]
    given_sizes = list(sizes)
    if 0 <= infer_at < len(sizes):
        given_sizes[infer_at] = -1
    rule = {"split": names, "axis": axis - len(full) if negative_axis else axis,
            "sizes": given_sizes}
    out = remap(md.TensorDict({"fused": w}), {"fused": rule})
    want = np.split(w, np.cumsum(sizes)[:-1], axis=axis)
    for name, part in zip(names, want):
        np.testing.assert_array_equal(out[name], part)
        assert out[name].flags.c_contiguous


def test_equal_parts_by_default_and_placeholders_in_every_target():
    w = np.arange(4 * 6 * 2, dtype=np.float32).reshape(4, 6, 2)   # [E, 2F, D]
    out = remap(md.TensorDict({"layers.3.gate_up": w}),
                {"layers.{i}.gate_up": {"split": ["blk.{i}.gate", "blk.{i}.up"], "axis": 1}},
                expected=["blk.3.gate", "blk.3.up"])
    np.testing.assert_array_equal(out["blk.3.gate"], w[:, :3])
    np.testing.assert_array_equal(out["blk.3.up"], w[:, 3:])


def test_sizes_by_param_name_then_transforms():
    w = np.arange(10 * 2, dtype=np.float32).reshape(10, 2)
    out = remap(md.TensorDict({"qkv": w}),
                {"qkv": {"split": ["q", "k", "v"], "sizes": ["q_rows", "{kv_rows}", -1]}},
                {"k": {"scale": 2.0}}, {"q_rows": 6, "kv_rows": 2})
    np.testing.assert_array_equal(out["q"], w[:6])
    np.testing.assert_array_equal(out["k"], 2 * w[6:8])
    np.testing.assert_array_equal(out["v"], w[8:])


def test_packed_rows_split_along_rows():
    e = md.codecs.get("q8_0")
    w = np.random.default_rng(0).standard_normal((6, 64)).astype(np.float32)
    qt = md.QuantizedTensor(e.quantize(w), (6, 64), "q8_0")
    out = remap(md.TensorDict({"w": qt}), {"w": {"split": ["a", "b"], "sizes": [4, 2]}})
    assert out["b"].shape == (2, 64) and out["b"].encoding == "q8_0"
    np.testing.assert_array_equal(np.asarray(out["b"].data), np.asarray(qt.data)[4:])


@pytest.mark.parametrize("rule, match", [
    ({"split": ["a", "b", "c"]}, "does not cut into 3 equal parts"),
    ({"split": ["a", "b"], "axis": 2}, "not an axis of a 2-D tensor"),
    ({"split": ["a", "b"], "sizes": [3, 3]}, "do not add up to 4"),
    ({"split": ["a", "b"], "sizes": [-1, -1]}, "at most one -1"),
    ({"split": ["a", "b"], "sizes": [1, 2, 1]}, "2 ints"),
    ({"split": ["a", "b"], "sizes": ["n", -1]}, "unknown parameter 'n'"),
])
def test_bad_splits_name_the_weight(rule, match):
    td = md.TensorDict({"w": np.zeros((4, 2), np.float32)})
    with pytest.raises(WeightsError, match=match) as err:
        remap(td, {"w": rule}, {}, {})
    assert str(err.value).startswith("a (from w): split")


@pytest.mark.parametrize("rule, match", [
    ({"split": ["a"]}, "two or more names"),
    ({"split": "a"}, "two or more names"),
    ({"split": ["a", "b"], "stride": 2}, "two or more names"),
    ({"split": ["blk.a", "blk.b"]}, "must use every placeholder"),
])
def test_bad_split_entries_are_refused(rule, match):
    td = md.TensorDict({"layers.0.w": np.zeros((4, 2), np.float32)})
    with pytest.raises(WeightsError, match=match):
        remap(td, {"layers.{i}.w": rule})


def test_a_quantized_tensor_does_not_split_its_blocks():
    qt = md.QuantizedTensor(md.codecs.get("q8_0").quantize(np.zeros((2, 64), np.float32)),
                            (2, 64), "q8_0")
    with pytest.raises(WeightsError, match="any axis but its last"):
        remap(md.TensorDict({"w": qt}), {"w": {"split": ["a", "b"], "axis": 1}})


def test_interleaved_split_takes_every_nth_entry():
    w = np.arange(2 * 3 * 8, dtype=np.float32).reshape(2, 3, 8)       # gpt-oss gate_up
    out = remap(md.TensorDict({"gu": w}),
                {"gu": {"split": ["gate", "up"], "axis": -1, "interleaved": True}},
                {"gate": {"transpose": [0, 2, 1]}})
    np.testing.assert_array_equal(out["gate"], np.transpose(w[..., ::2], (0, 2, 1)))
    np.testing.assert_array_equal(out["up"], w[..., 1::2])
    with pytest.raises(WeightsError, match="interleaved split cuts 8 .* into 3 equal"):
        remap(md.TensorDict({"gu": w}),
              {"gu": {"split": ["a", "b", "c"], "axis": -1, "interleaved": True}})


def test_transpose_by_a_permutation():
    w = np.arange(24, dtype=np.float32).reshape(2, 3, 4)
    out = remap(md.TensorDict({"w": w}), {"w": "w"}, {"w": {"transpose": [2, 0, 1]}})
    np.testing.assert_array_equal(out["w"], np.transpose(w, (2, 0, 1)))
    assert out["w"].flags.c_contiguous
    with pytest.raises(WeightsError, match="not a permutation of the 3 axes"):
        remap(md.TensorDict({"w": w}), {"w": "w"}, {"w": {"transpose": [0, 0, 1]}})
