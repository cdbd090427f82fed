"""``weights.gguf_write.write_gguf``: types as llama.cpp reads them, bytes as they are,
atomic; gguf-py's GGUFReader is the independent reader."""

import os

import numpy as np
import pytest
from gguf import GGMLQuantizationType, GGUFReader, GGUFValueType

import maxdecl as md
from maxdecl.errors import WeightsError
from maxdecl.weights.gguf_write import write_gguf

V = GGUFValueType


def _fields(path):
    return {f.name: f for f in GGUFReader(str(path)).fields.values()}


def test_metadata_types_follow_llama_cpp(tmp_path):
    path = tmp_path / "m.gguf"
    meta = {"llama.block_count": 2, "llama.attention.layer_norm_rms_epsilon": 1e-5,
            "llama.rope.freq_base": 10000.0, "general.name": "x", "flag": True, "neg": -3,
            "big": 1 << 40,
            "tokenizer.ggml.tokens": ["<unk>", "a", "b\udcff"],       # invalid UTF-8 kept
            "tokenizer.ggml.scores": [0.0, -1.0, -2.0],               # lists, as JSON gives
            "tokenizer.ggml.token_type": [2, 1, 1], "tokenizer.ggml.bos_token_id": 1,
            "tokenizer.ggml.add_bos_token": 1, "per_layer": np.array([4, 4], np.int32),
            "skipped": None}
    write_gguf(path, "llama", meta, {"w": np.ones((2, 4), np.float32)})
    f = _fields(path)
    want = {"general.architecture": (V.STRING,), "llama.block_count": (V.UINT32,),
            "llama.attention.layer_norm_rms_epsilon": (V.FLOAT32,),
            "llama.rope.freq_base": (V.FLOAT32,), "general.name": (V.STRING,),
            "flag": (V.BOOL,), "neg": (V.INT32,), "big": (V.UINT64,),
            "tokenizer.ggml.tokens": (V.ARRAY, V.STRING),
            "tokenizer.ggml.scores": (V.ARRAY, V.FLOAT32),
            "tokenizer.ggml.token_type": (V.ARRAY, V.INT32),
            "tokenizer.ggml.bos_token_id": (V.UINT32,),
            "tokenizer.ggml.add_bos_token": (V.BOOL,), "per_layer": (V.ARRAY, V.INT32)}
    assert {k: tuple(f[k].types) for k in want} == want
    assert "skipped" not in f
    tokens = f["tokenizer.ggml.tokens"]
    assert bytes(tokens.parts[tokens.data[2]]) == b"b\xff"
    assert md.weights.read_gguf_metadata(path)["tokenizer.ggml.tokens"][2] == "b\udcff"


def test_tensors_keep_their_encoding_and_bytes(tmp_path):
    rng = np.random.default_rng(0)
    x = rng.standard_normal((4, 256)).astype(np.float32)
    td = md.TensorDict({"f16": x.astype(np.float16), "f64": x.astype(np.float64)})
    for enc in ("q4_0", "q5_0", "q8_0", "q4_k", "q6_k", "bf16"):
        e = md.codecs.get(enc)
        td[enc] = md.QuantizedTensor(e.quantize(x), x.shape, e.name)
    path = tmp_path / "t.gguf"
    write_gguf(path, "llama", {"general.alignment": 64}, td)
    reader = GGUFReader(str(path))
    assert reader.alignment == 64
    types = {t.name: t.tensor_type for t in reader.tensors}
    assert types["f16"] == GGMLQuantizationType.F16 and types["f64"] == GGMLQuantizationType.F32
    back = md.load_weights(path)
    for enc in ("q4_0", "q5_0", "q8_0", "q4_k", "q6_k", "bf16"):
        assert types[enc] == GGMLQuantizationType[enc.upper()]
        assert back[enc].encoding == enc and tuple(back[enc].shape) == (4, 256)
        np.testing.assert_array_equal(np.asarray(back[enc].data), np.asarray(td[enc].data))
        t = next(t for t in reader.tensors if t.name == enc)
        assert t.data_offset % 64 == 0
    np.testing.assert_array_equal(back["f64"], x)


def test_an_encoding_ggml_lacks_is_refused_and_nothing_is_left(tmp_path):
    path = tmp_path / "x.gguf"
    path.write_bytes(b"old")
    bad = md.QuantizedTensor(np.zeros((2, 18), np.uint8), (2, 32), "q4_0")
    object.__setattr__(bad, "encoding", "my_enc")     # as a user-registered encoding would be
    with pytest.raises(WeightsError, match="'my_enc' has no GGML type"):
        write_gguf(path, "llama", {}, {"w": bad})
    assert path.read_bytes() == b"old" and os.listdir(tmp_path) == ["x.gguf"]


def test_a_failed_write_removes_its_temporary_file(tmp_path):
    path = tmp_path / "x.gguf"
    with pytest.raises(WeightsError, match="empty array"):
        write_gguf(path, "llama", {"k": []}, {"w": np.ones(2, np.float32)})
    with pytest.raises(WeightsError, match="dtype"):
        write_gguf(path, "llama", {}, {"w": np.ones(2, np.complex64)})
    assert os.listdir(tmp_path) == []
