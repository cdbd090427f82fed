"""md.load_weights tells formats by content, never by the file name."""

import numpy as np
import pytest
from gguf import GGMLQuantizationType as T
from gguf import quants
from test_gguf_loader import write_gguf
from test_llama2c_loader import legacy_bytes, model, v1_bytes

import maxdecl as md
from maxdecl.errors import WeightsError
from maxdecl.weights import detect_format


def test_misleading_extensions(tmp_path):
    x = np.random.default_rng(0).standard_normal((2, 32)).astype(np.float32)
    g = write_gguf(tmp_path / "weights.safetensors", {"w": (quants.quantize(x, T.Q8_0), T.Q8_0)})
    assert detect_format(g) == "gguf"
    assert md.load_weights(g)["w"].encoding == "q8_0"

    s = tmp_path / "weights.gguf"
    md.checkpoint.save({"w": x}, s)
    assert detect_format(s) == "safetensors"
    np.testing.assert_array_equal(md.load_weights(s)["w"], x)
    assert md.load_weights(s).metadata["maxdecl.format"] == "maxdecl"

    m = model()
    for name, blob in (("a.safetensors", legacy_bytes(m, True)), ("b.gguf", v1_bytes(m, False))):
        (tmp_path / name).write_bytes(blob)
        assert detect_format(tmp_path / name) == "llama2c"
        assert md.load_weights(tmp_path / name)["token_embd.weight"].shape == (10, 16)

    hf = tmp_path / "hf.bin"                       # a directory named like a file
    hf.mkdir()
    (hf / "config.json").write_text('{"model_type": "llama"}')
    md.checkpoint.save({"w": x}, hf / "model.safetensors")
    assert detect_format(hf) == "hf"
    td = md.load_weights(hf)
    assert td.metadata["model_type"] == "llama" and td.metadata["maxdecl.format"] == "hf"


def test_unknown_content_lists_formats_tried(tmp_path):
    rng = np.random.default_rng(1)
    for name, blob in (("noise.bin", rng.integers(0, 256, 5000, dtype=np.uint8).tobytes()),
                       ("empty.gguf", b""), ("text.safetensors", b"hello world\n" * 10)):
        (tmp_path / name).write_bytes(blob)
        with pytest.raises(WeightsError) as e:
            md.load_weights(tmp_path / name)
        msg = str(e.value)
        assert name in msg and "GGUF" in msg and "safetensors" in msg and "llama2.c" in msg
        assert "Hugging Face" in msg and "\n" not in msg
    with pytest.raises(WeightsError, match="config.json"):
        md.load_weights(tmp_path)
    with pytest.raises(WeightsError, match="no such file"):
        md.load_weights(tmp_path / "missing")


def test_truncated_safetensors_through_load_weights(tmp_path):
    s = tmp_path / "m.safetensors"
    md.checkpoint.save({"w": np.ones((64, 64), np.float32)}, s)
    blob = s.read_bytes()
    s.write_bytes(blob[:len(blob) // 2])
    with pytest.raises(WeightsError, match="past the end"):
        md.load_weights(s)
    s.write_bytes(blob[:40])                      # cut inside the JSON header
    with pytest.raises(WeightsError, match="truncated"):
        md.load_weights(s)
