"""Bad input raises QuantizationError naming the encoding and the shapes."""

from __future__ import annotations

import numpy as np
import pytest

from maxdecl import codecs
from maxdecl.errors import QuantizationError

BLOCK = ["q4_0", "q5_0", "q8_0", "q4_k", "q6_k"]
ALL = ["bf16", *BLOCK]


@pytest.mark.parametrize("name", BLOCK)
def test_k_not_multiple_of_block(name):
    enc = codecs.get(name)
    x = np.zeros((3, enc.block_elements + 1), dtype=np.float32)
    with pytest.raises(QuantizationError, match=rf"{name}.*{enc.block_elements + 1}.*multiple"):
        enc.quantize(x)


@pytest.mark.parametrize("name", ALL)
def test_wrong_dtype(name):
    enc = codecs.get(name)
    x = np.zeros((2, 256), dtype=np.float64)
    with pytest.raises(QuantizationError, match=rf"{name}.*float64"):
        enc.quantize(x)
    with pytest.raises(QuantizationError, match=name):
        enc.quantize([[0.0] * 256])


@pytest.mark.parametrize("name", BLOCK)
@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_nan_inf_rejected(name, bad):
    enc = codecs.get(name)
    x = np.zeros((2, 512), dtype=np.float32)
    x[1, 300] = bad
    with pytest.raises(QuantizationError, match=rf"{name}.*\[2, 512\].*NaN or Inf"):
        enc.quantize(x)


def test_bf16_accepts_nan_inf():
    x = np.array([[np.nan, np.inf, -np.inf, 1.0]], dtype=np.float32)
    y = codecs.get("bf16").dequantize(codecs.get("bf16").quantize(x), x.shape)
    assert np.isnan(y[0, 0]) and y[0, 1] == np.inf and y[0, 2] == -np.inf and y[0, 3] == 1.0


@pytest.mark.parametrize("name", ALL)
def test_truncated_or_wrong_bytes(name):
    enc = codecs.get(name)
    shape = (4, 512)
    n = 4 * 512 // enc.block_elements * enc.block_bytes
    with pytest.raises(QuantizationError, match=rf"{name}.*{n - 1} bytes.*\[4, 512\].*{n}"):
        enc.dequantize(np.zeros(n - 1, dtype=np.uint8), shape)
    with pytest.raises(QuantizationError, match=name):
        enc.dequantize(np.zeros(n + enc.block_bytes, dtype=np.uint8), shape)
    with pytest.raises(QuantizationError, match=rf"{name}.*uint8"):
        enc.dequantize(np.zeros(n, dtype=np.int8), shape)
    if enc.block_elements > 1:
        with pytest.raises(QuantizationError, match=rf"{name}.*\[4, 511\]"):
            enc.dequantize(np.zeros(n, dtype=np.uint8), (4, 511))


def test_quantized_tensor_uses_codecs():
    from maxdecl.tensors import QuantizedTensor

    x = np.linspace(-1, 1, 2 * 256, dtype=np.float32).reshape(2, 256)
    qt = QuantizedTensor(codecs.get("Q4_K").quantize(x), x.shape, "Q4_K")
    assert qt.encoding == "q4_k" and qt.data.shape == (2, 144)
    np.testing.assert_allclose(qt.dequantize(), x, atol=0.05)


@pytest.mark.parametrize("name", ["bf16", "q4_0", "q5_0", "q8_0", "q4_k", "q6_k"])
def test_bad_out_buffer(name):
    enc = codecs.get(name)
    q = enc.quantize(np.ones((2, 256), dtype=np.float32))
    for bad, why in [(np.empty((2, 256), np.float64), "float64"),
                     (np.empty((2, 512), np.float32), "[2, 512]"),
                     (np.empty((256, 2), np.float32).T, "C-contiguous"),
                     ([0.0] * 512, "list")]:
        with pytest.raises(QuantizationError, match=why) as e:
            enc.dequantize(q, (2, 256), out=bad)
        assert name in str(e.value)
    ro = np.empty((2, 256), np.float32)
    ro.flags.writeable = False
    with pytest.raises(QuantizationError, match="writeable"):
        enc.dequantize(q, (2, 256), out=ro)
