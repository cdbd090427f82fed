"""md.checkpoint: safetensors round trips, memory maps, atomic saves, hostile files."""

import json
import os
import struct
import tempfile

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as hst
from hypothesis.extra import numpy as hnp

import maxdecl as md
from maxdecl.errors import WeightsError

DTYPES = ["float64", "float32", "float16", "int64", "int32", "int16", "int8",
          "uint64", "uint32", "uint16", "uint8", "bool"]


def assert_same(a, b):
    """Same type, shape, dtype/encoding and bytes."""
    if isinstance(a, md.QuantizedTensor):
        assert isinstance(b, md.QuantizedTensor)
        assert (a.encoding, a.shape) == (b.encoding, b.shape)
        assert a.data.shape == b.data.shape
        assert a.data.tobytes() == b.data.tobytes()
    else:
        assert isinstance(b, np.ndarray) and not isinstance(b, md.QuantizedTensor)
        assert a.dtype == b.dtype and a.shape == b.shape
        assert np.ascontiguousarray(a).tobytes() == b.tobytes()


def random_quantized(rng, encoding, rows, blocks):
    enc = md.codecs.get(encoding)
    data = rng.integers(0, 256, (rows, blocks * enc.block_bytes), dtype=np.uint8)
    return md.QuantizedTensor(data, (rows, blocks * enc.block_elements), encoding)


def sample_td(rng=None):
    rng = rng or np.random.default_rng(0)
    td = md.TensorDict()
    td["emb"] = rng.standard_normal((5, 8)).astype(np.float32)
    td["norm"] = rng.standard_normal(8).astype(np.float16)
    td["ids"] = np.arange(7, dtype=np.int64)
    td["q"] = random_quantized(rng, "q4_k", 3, 1)
    td["b"] = random_quantized(rng, "bf16", 2, 4)
    td.metadata["general.architecture"] = "llama"
    return td


# ---------------------------------------------------------------- round trips

names = hst.text(alphabet="abcdefghij.0123456789_", min_size=1, max_size=12)
arrays = hst.sampled_from(DTYPES).flatmap(
    lambda dt: hnp.arrays(dt, hnp.array_shapes(min_dims=0, max_dims=3, min_side=0, max_side=4)))
quantized = hst.tuples(hst.sampled_from(["bf16", "q4_0", "q4_k", "q6_k", "q5_0", "q8_0"]),
                       hst.integers(1, 3), hst.integers(1, 2), hst.integers(0, 2**32 - 1))


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(hst.dictionaries(names, hst.one_of(arrays, quantized), min_size=0, max_size=6))
def test_round_trip_random(tensors):
    td = md.TensorDict()
    for name, v in tensors.items():
        if isinstance(v, tuple):
            enc, rows, blocks, seed = v
            if enc not in md.codecs.names():
                continue
            v = random_quantized(np.random.default_rng(seed), enc, rows, blocks)
        td[name] = v
    td.metadata = {"k": [1, 2.5, "x"], "n": 3}
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "model.safetensors")
        md.checkpoint.save(td, path)
        back = md.checkpoint.load(path)
        assert list(back.keys()) == list(td.keys())
        for k in td:
            assert_same(td[k], back[k])
        assert back.metadata == {"k": [1, 2.5, "x"], "n": 3, "maxdecl.format": "maxdecl"}
        del back


def test_round_trip_keeps_encodings_and_metadata(tmp_path):
    td = sample_td()
    td.metadata["tokens"] = np.array([1.5, 2.5], np.float32)   # numpy becomes a list
    path = tmp_path / "m.safetensors"
    md.checkpoint.save(td, path)
    back = md.checkpoint.load(path)
    assert back["q"].encoding == "q4_k" and back["q"].shape == (3, 256)
    assert back["b"].encoding == "bf16" and back["b"].shape == (2, 4)
    assert back.metadata["general.architecture"] == "llama"
    assert back.metadata["tokens"] == [1.5, 2.5]
    for k in td:
        assert_same(td[k], back[k])
    # and it dequantizes like the original
    np.testing.assert_array_equal(back["b"].dequantize(), td["b"].dequantize())


def test_save_accepts_plain_dict_and_odd_arrays(tmp_path):
    a = np.arange(12, dtype=">i4").reshape(3, 4)          # big-endian
    t = np.arange(12, dtype=np.float32).reshape(3, 4).T   # non-contiguous
    path = tmp_path / "m.safetensors"
    md.checkpoint.save({"a": a, "t": t}, path)
    back = md.checkpoint.load(path)
    np.testing.assert_array_equal(back["a"], a)
    assert back["a"].dtype == np.dtype("<i4")
    np.testing.assert_array_equal(back["t"], t)


def test_loads_are_memory_maps(tmp_path, in_mapping):
    path = tmp_path / "m.safetensors"
    md.checkpoint.save(sample_td(), path)
    td = md.checkpoint.load(path)
    for name in td:
        v = td.view(name)
        assert in_mapping(v.unsafe_ptr(), path), f"{name} is not memory-mapped"
        assert not v.array.flags.writeable
    with pytest.raises(ValueError):
        td["emb"][0, 0] = 1.0
    # tensors are aligned to their item size (64-byte aligned data section)
    assert td.view("emb").unsafe_ptr() % 4 == 0
    assert td.view("ids").unsafe_ptr() % 8 == 0


def test_copy_is_independent_of_the_file(tmp_path, in_mapping):
    path = tmp_path / "m.safetensors"
    md.checkpoint.save(sample_td(), path)
    td = md.checkpoint.load(path)
    c = td.copy()
    assert c.metadata == td.metadata and c.metadata is not td.metadata
    assert not in_mapping(c.view("emb").unsafe_ptr(), path)
    c["emb"][0, 0] = 42.0
    assert td["emb"][0, 0] != 42.0


def test_file_is_readable_by_safetensors(tmp_path):
    torch = pytest.importorskip("torch")
    from safetensors import safe_open
    from safetensors.numpy import load_file

    td = sample_td()
    path = tmp_path / "m.safetensors"
    md.checkpoint.save(td, path)
    with safe_open(str(path), framework="pt") as f:
        assert list(f.keys()) == sorted(td.keys())
        assert f.metadata()["maxdecl.version"] == "1"
        b = f.get_tensor("b")
        assert b.dtype == torch.bfloat16 and tuple(b.shape) == (2, 4)
        np.testing.assert_array_equal(b.float().numpy(), td["b"].dequantize())
        q = f.get_tensor("q").numpy()
        assert q.tobytes() == td["q"].data.tobytes()
    # numpy has no bf16 dtype: safetensors.numpy reads the file once bf16 is left out
    no_bf16 = {k: v for k, v in td.items() if k != "b"}
    md.checkpoint.save(no_bf16, path)
    loaded = load_file(str(path))
    np.testing.assert_array_equal(loaded["emb"], td["emb"])


def test_foreign_safetensors_loads_as_plain_arrays(tmp_path):
    torch = pytest.importorskip("torch")
    from safetensors.numpy import save_file
    from safetensors.torch import save_file as save_torch

    path = tmp_path / "plain.safetensors"
    save_file({"w": np.ones((2, 3), np.float32), "u": np.arange(4, dtype=np.uint8)}, str(path),
              metadata={"format": "np"})
    td = md.checkpoint.load(path)
    assert isinstance(td["u"], np.ndarray) and td["u"].dtype == np.uint8
    assert td.metadata == {"format": "np", "maxdecl.format": "safetensors"}
    t = torch.randn(3, 4).to(torch.bfloat16)
    save_torch({"t": t, "s": torch.tensor(1.5, dtype=torch.bfloat16)}, str(path))
    td = md.checkpoint.load(path)
    assert td["t"].encoding == "bf16" and td["t"].shape == (3, 4)
    np.testing.assert_array_equal(td["t"].dequantize(), t.float().numpy())
    assert td["s"].dtype == np.float32 and float(td["s"]) == 1.5


# ---------------------------------------------------------------- atomic saves

def test_failed_save_leaves_no_file(tmp_path):
    path = tmp_path / "m.safetensors"
    td = sample_td()
    td["bad"] = np.array([1 + 2j])
    with pytest.raises(WeightsError, match="'bad'.*complex128"):
        md.checkpoint.save(td, path)
    assert os.listdir(tmp_path) == []


def test_failed_save_keeps_old_file(tmp_path, monkeypatch):
    path = tmp_path / "m.safetensors"
    md.checkpoint.save(sample_td(), path)
    before = path.read_bytes()
    bad = sample_td()
    bad.metadata["x"] = object()
    with pytest.raises(WeightsError, match="metadata"):
        md.checkpoint.save(bad, path)
    assert path.read_bytes() == before

    def broken_fsync(fd):
        raise OSError(5, "Input/output error")
    monkeypatch.setattr(os, "fsync", broken_fsync)
    with pytest.raises(WeightsError, match="cannot write"):
        md.checkpoint.save(sample_td(np.random.default_rng(1)), path)
    assert path.read_bytes() == before
    assert os.listdir(tmp_path) == ["m.safetensors"]   # no temporary file left behind


def test_interrupted_write_keeps_old_file(tmp_path, monkeypatch):
    path = tmp_path / "m.safetensors"
    md.checkpoint.save(sample_td(), path)
    before = path.read_bytes()

    class Boom(Exception):
        pass
    real_replace = os.replace

    def no_replace(a, b):
        raise Boom()
    monkeypatch.setattr(os, "replace", no_replace)
    with pytest.raises(Boom):
        md.checkpoint.save(sample_td(np.random.default_rng(2)), path)
    monkeypatch.setattr(os, "replace", real_replace)
    assert path.read_bytes() == before
    assert os.listdir(tmp_path) == ["m.safetensors"]


def test_save_over_a_loaded_file(tmp_path):
    path = tmp_path / "m.safetensors"
    md.checkpoint.save(sample_td(), path)
    old = md.checkpoint.load(path)
    snapshot = np.array(old["emb"])
    new = sample_td(np.random.default_rng(5))
    md.checkpoint.save(new, path)
    np.testing.assert_array_equal(old["emb"], snapshot)     # old mapping still valid
    np.testing.assert_array_equal(md.checkpoint.load(path)["emb"], new["emb"])
    # saving a TensorDict onto the very file it maps
    md.checkpoint.save(old, path)
    np.testing.assert_array_equal(md.checkpoint.load(path)["emb"], snapshot)


# ---------------------------------------------------------------- hostile files

def test_truncated_at_every_offset(tmp_path):
    src = tmp_path / "m.safetensors"
    md.checkpoint.save(sample_td(), src)
    blob = src.read_bytes()
    cut = tmp_path / "cut.safetensors"
    for n in range(len(blob)):
        cut.write_bytes(blob[:n])
        with pytest.raises(WeightsError) as e:
            md.checkpoint.load(cut)
        msg = str(e.value)
        assert str(cut) in msg and "\n" not in msg, (n, msg)


def write_raw(path, header, data=b"", raw_header=None):
    h = raw_header if raw_header is not None else json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(h)) + h + data)


BAD_HEADERS = [
    ({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}}, b"", "past the end"),
    ({"a": {"dtype": "F32", "shape": [3], "data_offsets": [0, 8]}}, bytes(8), "needs 12"),
    ({"a": {"dtype": "F32", "shape": [2], "data_offsets": [8, 0]}}, bytes(8), "data_offsets"),
    ({"a": {"dtype": "F32", "shape": [-2], "data_offsets": [0, 8]}}, bytes(8), "shape"),
    ({"a": {"dtype": "F32", "shape": "x", "data_offsets": [0, 8]}}, bytes(8), "shape"),
    ({"a": {"dtype": "C64", "shape": [1], "data_offsets": [0, 8]}}, bytes(8), "dtype 'C64'"),
    ({"a": {"shape": [1], "data_offsets": [0, 4]}}, bytes(4), "dtype None"),
    ({"a": [1, 2]}, b"", "entry"),
    ({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
      "b": {"dtype": "F32", "shape": [2], "data_offsets": [4, 12]}}, bytes(12), "overlap"),
    ({"__metadata__": {"x": 1}}, b"", "__metadata__"),
    ({"__metadata__": {"maxdecl.version": "9"}}, b"", "version '9'"),
    ({"__metadata__": {"maxdecl.version": "1", "maxdecl.encodings": "{oops"}}, b"",
     "not valid JSON"),
    ({"__metadata__": {"maxdecl.version": "1", "maxdecl.encodings": '{"a": {}}'}}, b"",
     "not in the file"),
    ({"a": {"dtype": "U8", "shape": [144], "data_offsets": [0, 144]},
      "__metadata__": {"maxdecl.version": "1",
                       "maxdecl.encodings": '{"a": {"encoding": "nope", "shape": [256]}}'}},
     bytes(144), "nope"),
    ({"a": {"dtype": "U8", "shape": [100], "data_offsets": [0, 100]},
      "__metadata__": {"maxdecl.version": "1",
                       "maxdecl.encodings": '{"a": {"encoding": "q4_k", "shape": [256]}}'}},
     bytes(100), "bytes"),
    ({"a": {"dtype": "F32", "shape": [36], "data_offsets": [0, 144]},
      "__metadata__": {"maxdecl.version": "1",
                       "maxdecl.encodings": '{"a": {"encoding": "q4_k", "shape": [256]}}'}},
     bytes(144), "stored as U8"),
]


@pytest.mark.parametrize("header,data,match", BAD_HEADERS)
def test_corrupted_headers(tmp_path, header, data, match):
    path = tmp_path / "bad.safetensors"
    write_raw(path, header, data)
    with pytest.raises(WeightsError, match=match):
        md.checkpoint.load(path)


@pytest.mark.parametrize("raw,match", [
    (b"{not json", "not valid JSON"),
    (b"[1, 2]", "JSON object"),
    (b"\xff\xfe{}", "not valid JSON"),
])
def test_garbage_header_bytes(tmp_path, raw, match):
    path = tmp_path / "bad.safetensors"
    write_raw(path, None, raw_header=raw)
    with pytest.raises(WeightsError, match=match):
        md.checkpoint.load(path)


def test_foreign_and_missing_files(tmp_path):
    rng = np.random.default_rng(0)
    cases = {
        "random.bin": rng.integers(0, 256, 4096, dtype=np.uint8).tobytes(),
        "empty.safetensors": b"",
        "model.gguf": b"GGUF" + struct.pack("<IQQ", 3, 0, 0),
        "huge.safetensors": struct.pack("<Q", 2**63) + b"{}",
    }
    for name, blob in cases.items():
        (tmp_path / name).write_bytes(blob)
        with pytest.raises(WeightsError) as e:
            md.checkpoint.load(tmp_path / name)
        assert name in str(e.value)
    with pytest.raises(WeightsError, match="GGUF"):
        md.checkpoint.load(tmp_path / "model.gguf")
    with pytest.raises(WeightsError, match="no such file"):
        md.checkpoint.load(tmp_path / "missing.safetensors")
    with pytest.raises(WeightsError, match="directory"):
        md.checkpoint.load(tmp_path)
