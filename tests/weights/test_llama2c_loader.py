"""llama2.c .bin checkpoints (legacy, v1, v2), written here byte by byte as export.py does."""

import struct

import numpy as np
import pytest

import maxdecl as md
from maxdecl.errors import WeightsError
from maxdecl.weights import load_llama2c, read_llama2c_header

P = dict(dim=16, hidden_dim=24, n_layers=2, n_heads=4, n_kv_heads=2, vocab_size=10, seq_len=8)


def model(seed=0, p=P):
    """Random weights of a llama2.c model, in PyTorch (out, in) layout."""
    rng = np.random.default_rng(seed)
    d, hid, L, H, KV, V = (p[k] for k in ("dim", "hidden_dim", "n_layers", "n_heads",
                                           "n_kv_heads", "vocab_size"))
    hd = d // H

    def r(*s):
        return rng.standard_normal(s).astype(np.float32)
    return {
        "tok": r(V, d), "out": r(V, d), "norm": r(d),
        "att_norm": [r(d) for _ in range(L)], "ffn_norm": [r(d) for _ in range(L)],
        "wq": [r(H * hd, d) for _ in range(L)], "wk": [r(KV * hd, d) for _ in range(L)],
        "wv": [r(KV * hd, d) for _ in range(L)], "wo": [r(d, H * hd) for _ in range(L)],
        "w1": [r(hid, d) for _ in range(L)], "w2": [r(d, hid) for _ in range(L)],
        "w3": [r(hid, d) for _ in range(L)],
        "freqs": r(p["seq_len"], hd // 2),
    }


def f32(*arrays):
    return b"".join(np.asarray(a, "<f4").tobytes() for a in arrays)


def header7(p, vocab):
    return struct.pack("<7i", p["dim"], p["hidden_dim"], p["n_layers"], p["n_heads"],
                       p["n_kv_heads"], vocab, p["seq_len"])


def legacy_bytes(m, shared, p=P):
    """export.py legacy_export: header, then each weight kind for all layers."""
    out = header7(p, p["vocab_size"] if shared else -p["vocab_size"])
    out += f32(m["tok"], *m["att_norm"], *m["wq"], *m["wk"], *m["wv"], *m["wo"],
               *m["ffn_norm"], *m["w1"], *m["w2"], *m["w3"], m["norm"],
               m["freqs"], m["freqs"] * 2)          # freqs_cos, freqs_sin (ignored)
    if not shared:
        out += f32(m["out"])
    return out


def v1_bytes(m, shared, p=P):
    """export.py version1_export: 256-byte header, norms first, then matrices."""
    out = struct.pack("<I", 0x616B3432) + struct.pack("<i", 1) + header7(p, p["vocab_size"])
    out += struct.pack("B", int(shared))
    out += bytes(256 - len(out))
    out += f32(*m["att_norm"], *m["ffn_norm"], m["norm"], m["tok"], *m["wq"], *m["wk"],
               *m["wv"], *m["wo"], *m["w1"], *m["w2"], *m["w3"])
    if not shared:
        out += f32(m["out"])
    return out


def quantize_q80(w, group):
    """export.py quantize_q80: int8 values and float32 scales per group."""
    w = w.reshape(-1, group)
    scale = np.abs(w).max(axis=1) / 127.0
    q = np.round(w / scale[:, None]).astype(np.int8)
    return q, scale.astype(np.float32)


def v2_bytes(m, shared, group, p=P):
    """export.py version2_export: norms in float32, then each matrix as int8 + scales."""
    out = struct.pack("<I", 0x616B3432) + struct.pack("<i", 2) + header7(p, p["vocab_size"])
    out += struct.pack("B", int(shared)) + struct.pack("<i", group)
    out += bytes(256 - len(out))
    out += f32(*m["att_norm"], *m["ffn_norm"], m["norm"])
    mats = [m["tok"], *m["wq"], *m["wk"], *m["wv"], *m["wo"], *m["w1"], *m["w2"], *m["w3"]]
    if not shared:
        mats.append(m["out"])
    deq = []
    for w in mats:
        q, s = quantize_q80(w, group)
        out += q.tobytes() + s.astype("<f4").tobytes()
        deq.append((q.astype(np.float32) * s[:, None]).reshape(w.shape))
    return out, deq


def expected(m, shared, p=P):
    want = {"token_embd.weight": m["tok"]}
    for i in range(p["n_layers"]):
        want.update({
            f"blk.{i}.attn_norm.weight": m["att_norm"][i],
            f"blk.{i}.ffn_norm.weight": m["ffn_norm"][i],
            f"blk.{i}.attn_q.weight": m["wq"][i], f"blk.{i}.attn_k.weight": m["wk"][i],
            f"blk.{i}.attn_v.weight": m["wv"][i], f"blk.{i}.attn_output.weight": m["wo"][i],
            f"blk.{i}.ffn_gate.weight": m["w1"][i], f"blk.{i}.ffn_down.weight": m["w2"][i],
            f"blk.{i}.ffn_up.weight": m["w3"][i],
        })
    want["output_norm.weight"] = m["norm"]
    if not shared:
        want["output.weight"] = m["out"]
    return want


def check(td, want):
    assert set(td.keys()) == set(want)
    for k, v in want.items():
        assert td[k].dtype == np.float32, k
        assert td[k].shape == v.shape, k
        np.testing.assert_array_equal(td[k], v, err_msg=k)


@pytest.mark.parametrize("shared", [True, False])
@pytest.mark.parametrize("fmt", ["legacy", "v1"])
def test_float_formats(tmp_path, fmt, shared, in_mapping):
    m = model()
    blob = (legacy_bytes if fmt == "legacy" else v1_bytes)(m, shared)
    path = tmp_path / "model.bin"
    path.write_bytes(blob)
    td = load_llama2c(path)
    check(td, expected(m, shared))
    assert in_mapping(td.view("blk.1.attn_q.weight").unsafe_ptr(), path)   # no copy
    meta = td.metadata
    assert meta == read_llama2c_header(path)
    assert {k: meta[k] for k in P} == P
    assert meta["shared_classifier"] is shared
    assert meta["version"] == (0 if fmt == "legacy" else 1)
    assert meta["maxdecl.format"] == "llama2c"
    check(md.load_weights(path), expected(m, shared))    # detected by content


@pytest.mark.parametrize("shared", [True, False])
def test_v2_dequantized(tmp_path, shared):
    m = model(1)
    group = 8
    blob, deq = v2_bytes(m, shared, group)
    path = tmp_path / "q80.bin"
    path.write_bytes(blob)
    td = md.load_weights(path)
    mats = dict(m)
    L = P["n_layers"]
    mats["tok"] = deq[0]
    for j, kind in enumerate(["wq", "wk", "wv", "wo", "w1", "w2", "w3"]):
        mats[kind] = deq[1 + j * L:1 + (j + 1) * L]
    if not shared:
        mats["out"] = deq[-1]
    check(td, expected(mats, shared))
    assert td.metadata["group_size"] == group and td.metadata["version"] == 2
    # close to the float weights (int8 groups)
    np.testing.assert_allclose(td["blk.0.attn_q.weight"], m["wq"][0], atol=0.05)


@pytest.mark.parametrize("fmt", ["legacy", "v1", "v2"])
def test_truncated(tmp_path, fmt):
    m = model()
    blob = {"legacy": lambda: legacy_bytes(m, False), "v1": lambda: v1_bytes(m, False),
            "v2": lambda: v2_bytes(m, False, 8)[0]}[fmt]()
    path = tmp_path / "cut.bin"
    for n in (len(blob) - 1, len(blob) // 2, 300, 100, 40, 3, 0):
        path.write_bytes(blob[:n])
        with pytest.raises(WeightsError) as e:
            load_llama2c(path)
        assert str(path) in str(e.value) and "\n" not in str(e.value)
    path.write_bytes(blob[:len(blob) // 2])
    with pytest.raises(WeightsError, match="truncated"):
        md.load_weights(path)


def test_bad_headers(tmp_path):
    path = tmp_path / "bad.bin"
    m = model()
    blob = bytearray(v1_bytes(m, True))
    blob[4:8] = struct.pack("<i", 7)
    path.write_bytes(bytes(blob))
    with pytest.raises(WeightsError, match="version 7"):
        load_llama2c(path)
    bad = dict(P, n_heads=3)
    path.write_bytes(header7(bad, 10) + bytes(1000))
    with pytest.raises(WeightsError, match="not a multiple of n_heads"):
        load_llama2c(path)
    blob = bytearray(v2_bytes(m, True, 8)[0])
    blob[37:41] = struct.pack("<i", 5)
    path.write_bytes(bytes(blob))
    with pytest.raises(WeightsError, match="group_size 5"):
        load_llama2c(path)
