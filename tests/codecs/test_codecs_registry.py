"""The registry: case-insensitive names, no double registration, user encodings via the protocol."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

from maxdecl import codecs
from maxdecl.errors import QuantizationError


def test_builtins_registered_case_insensitive():
    assert set(codecs.names()) >= {"bf16", "q4_0", "q4_k", "q6_k", "q5_0", "q8_0"}
    assert codecs.get("Q4_K") is codecs.get("q4_k")
    assert codecs.get("bF16").name == "bf16"
    for name in codecs.names():
        assert isinstance(codecs.get(name), codecs.QuantizationEncoding)
    assert codecs.get(codecs.get("q6_k")) is codecs.get("q6_k")


def test_unknown_name_suggests():
    with pytest.raises(QuantizationError, match=r"'q4_l'.*did you mean .*'q4_k'"):
        codecs.get("q4_l")


def test_double_register_is_an_error():
    with pytest.raises(QuantizationError, match="already registered"):
        codecs.register(codecs.get("q8_0"))

    class Shadow:
        name, block_elements, block_bytes = "Q4_0", 32, 18
        quantize = dequantize = None

    with pytest.raises(QuantizationError, match="'q4_0' is already registered"):
        codecs.register(Shadow())


def test_incomplete_encoding_rejected():
    class Half:
        name = "half"

    with pytest.raises(QuantizationError, match="missing block_elements, block_bytes"):
        codecs.register(Half())


class Int8Rows:
    """A user encoding: per-block float32 scale + 8 int8 values, using only the protocol."""

    name, block_elements, block_bytes = "User_I8", 8, 4 + 8

    def quantize(self, x):
        b = x.reshape(-1, 8)
        s = np.abs(b).max(1, keepdims=True) / 127
        q = np.round(b / np.where(s == 0, 1, s)).astype(np.int8)
        out = np.concatenate([s.astype(np.float32).view(np.uint8), q.view(np.uint8)], axis=1)
        return out.reshape(*x.shape[:-1], -1)

    def dequantize(self, data, shape):
        b = np.asarray(data, np.uint8).reshape(-1, 12)
        s = b[:, :4].copy().view(np.float32)
        return (b[:, 4:].view(np.int8) * s).reshape(shape).astype(np.float32)


def test_user_encoding_through_protocol():
    enc = Int8Rows()
    assert isinstance(enc, codecs.QuantizationEncoding)
    codecs.register(enc)
    try:
        got = codecs.get("user_i8")
        assert got is enc and "user_i8" in codecs.names()
        x = np.linspace(-1, 1, 32, dtype=np.float32).reshape(2, 16)
        y = got.dequantize(got.quantize(x), x.shape)
        np.testing.assert_allclose(y, x, atol=1 / 127)
        from maxdecl.tensors import QuantizedTensor
        qt = QuantizedTensor(got.quantize(x), x.shape, "USER_I8")
        assert qt.data.shape == (2, 24)
    finally:
        codecs.unregister("user_i8")
    with pytest.raises(QuantizationError):
        codecs.get("user_i8")


def test_q5_0_q8_0_use_only_the_public_protocol():
    import ast
    import inspect

    from maxdecl.codecs import q5_0, q8_0

    for mod in (q5_0, q8_0):
        tree = ast.parse(inspect.getsource(mod))
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom):
                assert node.level == 0 and node.module in {"__future__", "numpy", "maxdecl.codecs",
                                                           "maxdecl.errors"}, node.module
                if node.module == "maxdecl.codecs":
                    assert all(a.name in codecs.__all__ for a in node.names)
            elif isinstance(node, ast.Import):
                assert all(a.name in {"numpy", "numba"} for a in node.names)


def test_import_does_not_load_numba():
    code = "import sys, maxdecl.codecs; assert 'numba' not in sys.modules, 'numba imported'"
    subprocess.run([sys.executable, "-c", code], check=True)


def test_no_hardcoded_fastmath_in_codec_kernels():
    import pathlib

    import maxdecl.kernels as k

    for p in pathlib.Path(k.__file__).parent.glob("codec_*.py"):
        assert "fastmath=True" not in p.read_text(), p.name
