"""Hostile weight files of every format: each loads, or fails with a one-line
WeightsError naming the file, in bounded memory. ``MAXDECL_FUZZ_WEIGHTS=5000`` runs more."""

import os
import struct

import numpy as np
import pytest

import maxdecl as md
from _limited import run_limited

N = int(os.environ.get("MAXDECL_FUZZ_WEIGHTS", "3000"))


def test_hostile_weight_files():
    out = run_limited("weights_fuzz", N, seed=20261201, memory=3 << 30, timeout=600)
    count, bad = out["result"]
    print(f"{count} hostile weight files in {out['seconds']:.1f} s")
    assert count == N
    assert not bad, "\n".join(f"{kind} {path}: {why}" for kind, path, why in bad[:20])


def _gguf(ne, gtype=0):
    name = b"t"
    blob = b"GGUF" + struct.pack("<IQQ", 3, 1, 0) + struct.pack("<Q", len(name)) + name
    blob += struct.pack("<I", len(ne)) + struct.pack(f"<{len(ne)}Q", *ne)
    blob += struct.pack("<IQ", gtype, 0)
    return blob + bytes(-len(blob) % 32) + bytes(64)


def _safetensors(header: str, data: bytes = b"") -> bytes:
    raw = header.encode()
    return struct.pack("<Q", len(raw)) + raw + data


CASES = {
    "gguf_zero_hides_huge": (_gguf((0, 2**63)), "too large"),
    "gguf_huge_zero": (_gguf((2**62, 2**62, 0)), "too large"),
    # a quantized tensor is checked as the float32 it decodes to: 2**61 q6_k values by 0
    # rows is 2**61 bytes packed-span but 2**63 as float32
    "gguf_quantized_zero_hides_huge": (_gguf((2**61, 0), gtype=14), "too large"),
    "st_zero_hides_huge": (_safetensors('{"a": {"dtype": "F32", "shape": [0, 2305843009213693952, '
                                        '2305843009213693952], "data_offsets": [0, 0]}}'),
                           "too large"),
    "st_duplicate": (_safetensors('{"a": {"dtype": "U8", "shape": [1], "data_offsets": [0, 1]}, '
                                  '"a": {"dtype": "U8", "shape": [1], "data_offsets": [0, 1]}}',
                                  b"\0"), "appears twice"),
    "st_deep": (_safetensors('{"__metadata__": ' + "[" * 100000 + "]" * 100000 + "}"),
                "nested"),
    "st_deep_ok_for_json": (_safetensors('{"__metadata__": ' + "[" * 500 + "]" * 500 + "}"),
                            "nested"),
    "st_bad_utf8_name": (struct.pack("<Q", 16) + b'{"\xff": 1, "b": 2}', "UTF-8"),
    "st_lying_length": (struct.pack("<Q", 2**63) + b"{}", "header length"),
    "st_dtype_not_a_string": (_safetensors('{"a": {"dtype": ["F32"], "shape": [1], '
                                           '"data_offsets": [0, 4]}}', bytes(4)), "dtype"),
    "st_bad_dtype": (_safetensors('{"a": {"dtype": "F8", "shape": [1], "data_offsets": [0, 1]}}',
                                  b"\0"), "dtype"),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_named_hostile_files(tmp_path, case):
    data, want = CASES[case]
    path = tmp_path / f"{case}.bin"
    path.write_bytes(data)
    with pytest.raises(md.WeightsError, match=want) as e:
        md.load_weights(path)
    assert str(path) in str(e.value) and "\n" not in str(e.value)


@pytest.mark.parametrize("config, want", [
    (b'{"a": ' + b"[" * 100000 + b"]" * 100000 + b"}", "nested"),
    (b'{"a": 1, "a": 2}', "appears twice"),
    (b"\xff{}", "UTF-8"),
    (b"[]", "JSON object"),
])
def test_hf_config(tmp_path, config, want):
    (tmp_path / "config.json").write_bytes(config)
    md.checkpoint.save({"w": np.zeros(2, np.float32)}, tmp_path / "m.safetensors")
    with pytest.raises(md.WeightsError, match=want) as e:
        md.load_weights(tmp_path)
    assert "config.json" in str(e.value)


def test_gguf_huge_metadata_array_is_bounded(tmp_path):
    # 2**23 empty strings fit in 64 MiB of file but are over the item limit
    n = 2**23
    key = b"tokenizer.ggml.tokens"
    blob = b"GGUF" + struct.pack("<IQQ", 3, 0, 1) + struct.pack("<Q", len(key)) + key
    blob += struct.pack("<IIQ", 9, 8, n) + bytes(8 * n)
    path = tmp_path / "big.gguf"
    path.write_bytes(blob)
    with pytest.raises(md.WeightsError, match="limit"):
        md.load_weights(path)


def test_gguf_huge_metadata_string_is_bounded(tmp_path):
    n = (1 << 24) + 1
    key = b"tokenizer.chat_template"
    blob = b"GGUF" + struct.pack("<IQQ", 3, 0, 1) + struct.pack("<Q", len(key)) + key
    blob += struct.pack("<IQ", 8, n) + b"a" * n
    path = tmp_path / "big.gguf"
    path.write_bytes(blob)
    with pytest.raises(md.WeightsError, match="limit") as e:
        md.weights.read_gguf_metadata(path)
    assert "tokenizer.chat_template" in str(e.value)


def test_gguf_alignment_array_is_one_line(tmp_path):
    key = b"general.alignment"
    blob = b"GGUF" + struct.pack("<IQQ", 3, 0, 1) + struct.pack("<Q", len(key)) + key
    blob += struct.pack("<IIQ", 9, 4, 40) + bytes(160)
    path = tmp_path / "a.gguf"
    path.write_bytes(blob)
    with pytest.raises(md.WeightsError, match="power of two") as e:
        md.load_weights(path)
    assert "\n" not in str(e.value)


@pytest.mark.parametrize("source", ["{a}{b}{c}{d}{e}{f}{g}x", "x.{a}1{b}.w",
                                    ".".join("{p%d}" % i for i in range(9))])
def test_mapping_patterns_that_could_backtrack_are_refused(source):
    from maxdecl.tensors import TensorDict
    from maxdecl.weights import remap

    td = TensorDict()
    td["1" * 40] = np.zeros(1, np.float32)
    with pytest.raises(md.WeightsError, match="placeholders"):
        remap(td, {source: "blk.{a}.w"})
