"""Hostile weight files of every format, made from valid ones by seeded mutations.

``run(n, seed, workdir)`` writes ``n`` files (GGUF from gguf-py then corrupted,
hand-made GGUF headers, safetensors headers, llama2.c .bin, Hugging Face dirs), loads
each with ``md.load_weights`` and returns the cases that ended in anything but success
or a one-line ``WeightsError`` naming the file. Run by hand::

    python tests/hardening/weights_fuzz.py 5000
"""

from __future__ import annotations

import json
import os
import random
import shutil
import struct
import sys
import time

import numpy as np

HUGE = [0, 1, 2**31 - 1, 2**31, 2**32 - 1, 2**32, 2**61, 2**62, 2**63 - 1, 2**63, 2**64 - 1]


# -- valid seeds --------------------------------------------------------------------------

def gguf_seed(path, rng: random.Random):
    import gguf
    from gguf import GGMLQuantizationType as T

    w = gguf.GGUFWriter(str(path), "llama")
    w.add_uint32("llama.embedding_length", 64)
    w.add_float32("llama.rope.freq_base", 10000.0)
    w.add_string("general.name", "fuzz" * rng.randint(0, 3))
    w.add_array("tokenizer.ggml.tokens", ["a", "bb", "ccc"][:rng.randint(1, 3)])
    w.add_array("tokenizer.ggml.scores", [0.5, 1.5])
    nr = np.random.default_rng(rng.randint(0, 1 << 30))
    w.add_tensor("f32", nr.standard_normal((3, 8)).astype(np.float32))
    w.add_tensor("i32", np.arange(6, dtype=np.int32).reshape(2, 3))
    x = nr.standard_normal((2, 32)).astype(np.float32)
    w.add_tensor("q8", gguf.quants.quantize(x, T.Q8_0), raw_dtype=T.Q8_0)
    w.add_tensor("q4k", nr.integers(0, 255, (1, 144), dtype=np.uint8), raw_dtype=T.Q4_K)
    other = rng.choice([T.Q4_1, T.Q5_1, T.Q2_K, T.Q3_K, T.Q5_K, T.IQ4_NL, T.IQ4_XS, T.TQ1_0,
                        T.TQ2_0])
    w.add_tensor("other", nr.integers(0, 255, (2, gguf.GGML_QUANT_SIZES[other][1]),
                                      dtype=np.uint8), raw_dtype=other)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def gguf_handmade(rng: random.Random) -> bytes:
    """A header with hostile counts, dims, types and offsets."""
    def gstr(s):
        return struct.pack("<Q", len(s)) + s
    n_t = rng.choice([1, 1, 2, rng.choice(HUGE)])
    n_kv = rng.choice([0, 1, rng.choice(HUGE)])
    out = b"GGUF" + struct.pack("<IQQ", rng.choice([3, 3, 2, 1, 4]), n_t, n_kv)
    for _ in range(min(n_kv, 2)):
        vtype = rng.choice([4, 8, 9, 9, 6, 12, rng.randint(0, 40)])
        out += gstr(rng.choice([b"k", b"general.alignment", b"\xff\xfe", b"a" * 300]))
        out += struct.pack("<I", vtype)
        if vtype == 9:
            out += struct.pack("<IQ", rng.choice([4, 8, 9, 0]), rng.choice(HUGE + [3, 5]))
        elif vtype == 8:
            out += struct.pack("<Q", rng.choice(HUGE + [3]))
        out += bytes(rng.randint(0, 16))
    for i in range(min(n_t, 2)):
        nd = rng.choice([1, 2, 3, 4, 0, 5, 2**32 - 1])
        ne = [rng.choice(HUGE + [1, 2, 32, 256]) for _ in range(min(nd, 4))]
        out += gstr(b"t%d" % i) + struct.pack("<I", nd) + struct.pack(f"<{len(ne)}Q", *ne)
        out += struct.pack("<IQ", rng.choice([0, 1, 2, 8, 12, 14, 30, 77, 2**32 - 1]),
                           rng.choice([0, 0, 32, 3] + HUGE))
    out += bytes(-len(out) % 32) + bytes(rng.choice([0, 64, 4096]))
    return out


def safetensors_seed(path, rng: random.Random):
    from maxdecl import checkpoint
    from maxdecl.tensors import QuantizedTensor, TensorDict

    nr = np.random.default_rng(rng.randint(0, 1 << 30))
    td = TensorDict(metadata={"general.name": "fuzz", "k": [1, 2]})
    td["a"] = nr.standard_normal((3, 4)).astype(np.float32)
    td["b"] = np.arange(5, dtype=np.int64)
    td["c"] = nr.standard_normal(2).astype(np.float16)
    td["q"] = QuantizedTensor(nr.integers(0, 255, (2, 34), dtype=np.uint8), (2, 32), "q8_0")
    td["k"] = QuantizedTensor(nr.integers(0, 255, (1, 144), dtype=np.uint8), (1, 256), "q4_k")
    td["h"] = QuantizedTensor(nr.integers(0, 255, (2, 8), dtype=np.uint8), (2, 4), "bf16")
    checkpoint.save(td, path)


def safetensors_handmade(rng: random.Random) -> bytes:
    """A header naming hostile dtypes, shapes, offsets, duplicates and nesting."""
    choice = rng.randrange(9)
    ent = {"dtype": "F32", "shape": [2, 2], "data_offsets": [0, 16]}
    if choice == 0:
        ent["shape"] = rng.choice([[0, 2**61, 2**61], [2**62, 0], [-1, 4], [2**63, 0, 5],
                                   [1.5], ["x"], [0] * 100, None, [True]])
        ent["data_offsets"] = [0, 0]
    elif choice == 1:
        ent["data_offsets"] = rng.choice([[0, 2**64], [-8, 8], [16, 0], [0], "x",
                                          [0, 16.0], [2**70, 2**70 + 16]])
    elif choice == 2:
        ent["dtype"] = rng.choice(["F8", "f32", None, 5, "BF16", "BOOL", "U64", ""])
    if choice == 3:
        text = '{"a": %s, "a": %s}' % (json.dumps(ent), json.dumps(ent))
    elif choice == 4:
        d = rng.choice([100, 5000, 100000])
        text = '{"__metadata__": ' + "[" * d + "]" * d + "}"
    elif choice == 5:
        text = '{"__metadata__": {"k": ' + '{"a":' * 3000 + "1" + "}" * 3000 + "}}"
    elif choice == 6:
        text = json.dumps({"__metadata__": {"maxdecl.version": rng.choice(["1", "9", "x"]),
                                            "maxdecl.encodings": rng.choice(
                                                ['{"a": {"encoding": "q4_k", "shape": [2, 2]}}',
                                                 "[" * 5000, '{"a": 5}', "{",
                                                 '{"a": {"encoding": "q8_0", '
                                                 '"shape": [0, 2305843009213693952]}}'])},
                           "a": {"dtype": "U8", "shape": [2, 8], "data_offsets": [0, 16]}})
    elif choice == 7:
        text = '{"\udcff": ' + json.dumps(ent) + "}"
        raw = text.encode("utf-8", "surrogateescape")
        return struct.pack("<Q", len(raw)) + raw + bytes(16)
    else:
        text = json.dumps({"a": ent})
    raw = text.encode()
    n = len(raw) if rng.random() < 0.8 else rng.choice(HUGE)
    return struct.pack("<Q", n) + raw + bytes(rng.choice([0, 8, 16, 64]))


HOSTILE_JSON = [0, -1, 1, 2**31, 2**63, 2**64, 2**70, -2**63, 1.5, "x", "", None, True, [],
                {}, [0], [2**62, 0], [0, 2**63], [1, 2, 3, 4, 5, 6, 7, 8, 9], [[1]], ["F32"]]


def safetensors_edit(seed: bytes, rng: random.Random) -> bytes:
    """The seed checkpoint with one header field (or encoding record) replaced."""
    n = struct.unpack_from("<Q", seed)[0]
    header = json.loads(seed[8:8 + n])
    data = seed[8 + n:]
    names = [k for k in header if k != "__metadata__"]
    meta = header["__metadata__"]
    if rng.random() < 0.35:
        enc = json.loads(meta["maxdecl.encodings"])
        rec = enc[rng.choice(sorted(enc))]
        field = rng.choice(["encoding", "shape", "extra"])
        rec[field] = rng.choice(HOSTILE_JSON + ["q4_0", "q6_k", "nope", [2, 64], [4, 16]])
        meta["maxdecl.encodings"] = json.dumps(enc)
    elif rng.random() < 0.2:
        meta[rng.choice(["maxdecl.version", "maxdecl.metadata", "x"])] = rng.choice(
            ["2", "0", "1x", "{", "[]", '{"a": ' * 100 + "1" + "}" * 100, "\ud800"])
    else:
        ent = header[rng.choice(names)]
        field = rng.choice(["dtype", "shape", "data_offsets"])
        ent[field] = rng.choice(HOSTILE_JSON + ["U8", "BF16", "F64", "BOOL"])
    raw = json.dumps(header).encode()
    return struct.pack("<Q", len(raw)) + raw + data


def llama2c_bytes(rng: random.Random) -> bytes:
    p = [16, 24, 2, 4, 2, 10, 8]
    if rng.random() < 0.5:
        i = rng.randrange(7)
        p[i] = rng.choice([0, -1, 2**31 - 1, -2**31, 3, 1 << 24, 7])
    version = rng.choice([0, 1, 2, 3])
    if version == 0:
        head = struct.pack("<7i", *p)
    else:
        head = struct.pack("<Ii7iB", 0x616B3432, version, *p, rng.randint(0, 1))
        if version == 2:
            head += struct.pack("<i", rng.choice([8, 16, 0, -4, 3, 2**31 - 1]))
        head += bytes(256 - len(head))
    size = 4 * rng.choice([0, 100, 1000, 5000])
    if rng.random() < 0.6:                  # the size the header implies, when plausible
        from maxdecl.weights import llama2c

        h = dict(zip(llama2c._FIELDS, p))
        h.update(version=version, shared_classifier=h["vocab_size"] > 0,
                 vocab_size=abs(h["vocab_size"]))
        if version == 2:
            h["group_size"] = struct.unpack_from("<i", head, 37)[0]
        try:
            if llama2c._plausible(h) is None and (version != 2 or h["group_size"] > 0):
                size = llama2c._expected_size(h) - len(head)
        except (ZeroDivisionError, KeyError):
            pass
    body = np.random.default_rng(rng.randrange(1 << 30)).standard_normal(
        max(0, min(size, 1 << 22)) // 4 + 1).astype(np.float32).tobytes()
    return head + body[:max(0, min(size, 1 << 22))]


def hf_dir(path, rng: random.Random, shard: bytes | None):
    os.makedirs(path, exist_ok=True)
    choice = rng.randrange(6)
    cfg = b'{"model_type": "llama", "hidden_size": 4}'
    if choice == 0:
        d = rng.choice([200, 5000, 100000])
        cfg = b'{"a": ' + b"[" * d + b"]" * d + b"}"
    elif choice == 1:
        cfg = rng.choice([b"\xff\xfe{}", b"[]", b"", b"{", b'{"a": 1, "a": 2}', b"\x00"])
    with open(os.path.join(path, "config.json"), "wb") as f:
        f.write(cfg)
    if choice == 2:
        idx = rng.choice([b'{"weight_map": {"a": "../x.safetensors"}}', b"[" * 50000,
                          b'{"weight_map": {"a": "m.safetensors", "a": "n.safetensors"}}',
                          b'{"weight_map": 5}', b'{"weight_map": {"zz": "m.safetensors"}}'])
        with open(os.path.join(path, "model.safetensors.index.json"), "wb") as f:
            f.write(idx)
    if shard is not None and choice != 3:
        with open(os.path.join(path, "m.safetensors"), "wb") as f:
            f.write(shard)


# -- mutations ------------------------------------------------------------------------

def mutate(data: bytes, rng: random.Random, header_len: int) -> bytes:
    b = bytearray(data)
    for _ in range(rng.choice([1, 1, 2, 3])):
        kind = rng.randrange(6)
        hot = rng.randrange(max(1, min(len(b), header_len))) if b else 0
        if kind == 0 and b:                       # flip bytes, mostly in the header
            for _ in range(rng.randint(1, 4)):
                b[rng.choice([hot, rng.randrange(len(b))])] ^= 1 << rng.randrange(8)
        elif kind == 1 and len(b) >= 8:           # a hostile u64 / u32 somewhere in the header
            at = min(hot, len(b) - 8)
            v = rng.choice(HUGE)
            b[at:at + 8] = struct.pack("<Q", v % 2**64)
        elif kind == 2:                           # truncate
            del b[rng.randrange(len(b) + 1):]
        elif kind == 3:                           # insert junk
            b[hot:hot] = bytes(rng.randrange(256) for _ in range(rng.randint(1, 9)))
        elif kind == 4 and b:                     # delete a span
            del b[hot:hot + rng.randint(1, 9)]
        else:                                     # a u32 field
            at = min(hot, max(0, len(b) - 4))
            b[at:at + 4] = struct.pack("<I", rng.choice([0, 1, 9, 12, 2**31, 2**32 - 1]))
    return bytes(b)


def cases(n: int, seed: int, workdir: str):
    """Yield ``(kind, path)`` for ``n`` hostile files under ``workdir``."""
    rng = random.Random(seed)
    seeds = {}
    p = os.path.join(workdir, "seed.gguf")
    gguf_seed(p, rng)
    seeds["gguf"] = open(p, "rb").read()
    p = os.path.join(workdir, "seed.safetensors")
    safetensors_seed(p, rng)
    seeds["st"] = open(p, "rb").read()
    for i in range(n):
        kind = ["gguf", "gguf", "gguf_hand", "st", "st_hand", "st_edit", "llama2c", "hf"][i % 8]
        if kind == "gguf":
            data = mutate(seeds["gguf"], rng, 600)
        elif kind == "gguf_hand":
            data = gguf_handmade(rng)
        elif kind == "st":
            data = mutate(seeds["st"], rng, 8 + struct.unpack_from("<Q", seeds["st"])[0])
        elif kind == "st_hand":
            data = safetensors_handmade(rng)
        elif kind == "st_edit":
            data = safetensors_edit(seeds["st"], rng)
        elif kind == "llama2c":
            data = llama2c_bytes(rng)
            if rng.random() < 0.5:
                data = mutate(data, rng, 256)
        else:
            d = os.path.join(workdir, f"hf{i}")
            shard = rng.choice([None, seeds["st"], mutate(seeds["st"], rng, 200),
                                safetensors_handmade(rng)])
            hf_dir(d, rng, shard)
            yield kind, d
            shutil.rmtree(d, ignore_errors=True)
            continue
        path = os.path.join(workdir, f"case{i}.bin")
        with open(path, "wb") as f:
            f.write(data)
        yield kind, path
        os.unlink(path)


def check_one(path: str) -> str | None:
    """None when loading ``path`` succeeds or fails cleanly; else what went wrong."""
    import maxdecl as md
    from maxdecl.tensors import QuantizedTensor

    try:
        td = md.load_weights(path)
        for name in list(td.keys())[:8]:          # touch what was loaded
            t = td[name]
            if isinstance(t, QuantizedTensor):
                if t.nbytes < 1 << 20:
                    t.dequantize()
            else:
                np.asarray(t).sum()
    except md.WeightsError as e:
        msg = str(e)
        if "\n" in msg or os.path.basename(path) not in msg:
            return f"unclear WeightsError: {msg[:300]}"
    except Exception as e:      # noqa: BLE001 - the point is to catch anything else
        return f"{type(e).__name__}: {str(e)[:300]}"
    return None


def run(n: int, seed: int, workdir: str) -> tuple[int, list[tuple[str, str, str]]]:
    """Load ``n`` hostile files; ``(count, [(kind, file, problem)])``."""
    bad, count = [], 0
    for kind, path in cases(n, seed, workdir):
        count += 1
        why = check_one(path)
        if why is not None:
            keep = os.path.join(workdir, "bad", f"{count}-{kind}")
            os.makedirs(os.path.dirname(keep), exist_ok=True)
            if os.path.isdir(path):
                shutil.copytree(path, keep, dirs_exist_ok=True)
            else:
                shutil.copy(path, keep)
            bad.append((kind, keep, why))
    return count, bad


if __name__ == "__main__":
    import tempfile

    n = int(sys.argv[1]) if len(sys.argv) > 1 else 1000
    seed = int(sys.argv[2]) if len(sys.argv) > 2 else 0
    work = tempfile.mkdtemp(prefix="wfuzz")
    t0 = time.perf_counter()
    count, bad = run(n, seed, work)
    print(json.dumps({"count": count, "seconds": round(time.perf_counter() - t0, 1),
                      "failures": bad[:50], "n_failures": len(bad)}, indent=1))
