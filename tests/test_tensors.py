"""TensorDict / QuantizedTensor (API.md section 5): value semantics and views."""

import numpy as np
import pytest

import maxdecl as md


def test_tensordict_mapping_and_alias():
    td = md.TensorDict()
    td["blocks.0.attn.q.weight"] = np.arange(6, dtype=np.float32).reshape(2, 3)
    assert list(td.keys()) == ["blocks.0.attn.q.weight"]
    assert "blocks.0.attn.q.weight" in td and len(td) == 1
    assert md.TensorMap is md.TensorDict
    with pytest.raises(KeyError, match="did you mean"):
        td["blocks.0.attn.q.weigh"]


def test_copy_has_value_semantics():
    td = md.TensorDict({"a": np.zeros(4, np.float32)})
    td2 = td.copy()
    td2["a"][0] = 7
    td2["b"] = np.ones(1)
    assert td["a"][0] == 0 and "b" not in td
    assert not np.shares_memory(td["a"], td2["a"])


def test_view_unsafe_ptr_is_the_array_address():
    a = np.arange(8, dtype=np.float32)
    td = md.TensorDict({"a": a})
    ptr = td.view("a").unsafe_ptr()
    assert ptr == a.ctypes.data
    assert not hasattr(td.view("a"), "data")


def test_quantized_tensor_checks_byte_shape():
    q = md.QuantizedTensor(np.zeros((2, 18), np.uint8), (2, 32), "Q4_0")
    assert q.encoding == "q4_0" and q.shape == (2, 32) and q.nbytes == 36
    with pytest.raises(md.QuantizationError, match="multiple of 32"):
        md.QuantizedTensor(np.zeros((2, 18), np.uint8), (2, 30), "q4_0")
    with pytest.raises(md.QuantizationError, match="bytes"):
        md.QuantizedTensor(np.zeros((2, 17), np.uint8), (2, 32), "q4_0")
    td = md.TensorDict({"q": q})
    assert td.copy()["q"].data is not q.data
    assert td.view("q").unsafe_ptr() == q.data.ctypes.data
