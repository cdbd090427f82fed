"""remap: per-expert tensors stacked into [n_expert, ...], and the exp / scale /
squeeze transforms (Mamba's A = -exp(A_log), torch's [C, 1, K] conv filters)."""

import numpy as np
import pytest

import maxdecl as md
from maxdecl.weights import remap

PATTERN = {"layers.{i}.experts.{e}.w1.weight": "blk.{i}.ffn_gate_exps.weight"}


def _experts(n=3, layers=2, shape=(4, 32), order=None):
    rng = np.random.default_rng(0)
    td = md.TensorDict()
    src = {}
    for i in range(layers):
        for e in (order or range(n)):
            src[(i, e)] = rng.standard_normal(shape).astype(np.float32)
            td[f"layers.{i}.experts.{e}.w1.weight"] = src[(i, e)]
    return td, src


def test_experts_stack_in_index_order():
    td, src = _experts(n=11, order=[3, 10, 0, 1, 2, 4, 5, 6, 7, 8, 9])   # 10 after 1 as text
    out = remap(td, PATTERN, expected=["blk.0.ffn_gate_exps.weight", "blk.1.ffn_gate_exps.weight"])
    got = out["blk.1.ffn_gate_exps.weight"]
    assert got.shape == (11, 4, 32)
    for e in range(11):
        np.testing.assert_array_equal(got[e], src[(1, e)])


def test_quantized_experts_stack_as_packed_blocks():
    td, src = _experts()
    codec = md.codecs.get("q8_0")
    for k in list(td.keys()):
        td[k] = md.QuantizedTensor(codec.quantize(td[k]), (4, 32), "q8_0")
    got = remap(td, PATTERN)["blk.0.ffn_gate_exps.weight"]
    assert isinstance(got, md.QuantizedTensor) and got.shape == (3, 4, 32)
    np.testing.assert_array_equal(got.data[2], td["layers.0.experts.2.w1.weight"].data)


def test_a_missing_expert_is_an_error():
    td, _ = _experts()
    del td["layers.1.experts.1.w1.weight"]
    with pytest.raises(md.WeightsError, match=r"needs indices 0..1 once each, got \[0, 2\]"):
        remap(td, PATTERN)


def test_exp_scale_and_squeeze_transforms():
    td = md.TensorDict()
    a_log = np.log(np.arange(1, 7, dtype=np.float32)).reshape(2, 3)
    td["a_log"] = a_log
    td["conv"] = np.arange(8, dtype=np.float32).reshape(2, 1, 4)
    out = remap(td, {"a_log": "ssm_a", "conv": "conv.weight"},
                {"ssm_a": {"exp": True, "scale": -1.0}, "conv.weight": {"squeeze": 1}})
    np.testing.assert_allclose(out["ssm_a"], -np.arange(1, 7).reshape(2, 3), rtol=1e-6)
    assert out["conv.weight"].shape == (2, 4)
    with pytest.raises(md.WeightsError, match=r"squeeze: axes \[0\] of shape"):
        remap(td, {"conv": "c", "a_log": None}, {"c": {"squeeze": 0}})
    td["grn"] = np.arange(4, dtype=np.float32).reshape(1, 1, 1, 4)
    out = remap(td, {"grn": "g", "conv": None, "a_log": None}, {"g": {"squeeze": [0, 1, 2]}})
    assert out["g"].shape == (4,)                  # several axes at once (ConvNeXt V2's GRN)
    for bad in ([0, 3], [], [True], "1"):
        with pytest.raises(md.WeightsError, match="squeeze: "):
            remap(td, {"grn": "g", "conv": None, "a_log": None}, {"g": {"squeeze": bad}})
