"""llama2.c checkpoints (``.bin``) -> TensorDict with GGUF names and float32 arrays.

Three layouts, all little-endian (karpathy/llama2.c ``export.py``, ``run.c``, ``runq.c``)::

  legacy (version 0), 28-byte header, no magic:
    i32 dim, hidden_dim, n_layers, n_heads, n_kv_heads, vocab_size, seq_len
        (vocab_size < 0: the classifier is not shared with the embedding)
    f32 token_embedding[vocab, dim], rms_att[L, dim], wq[L, H*hd, dim], wk[L, KV*hd, dim],
        wv[L, KV*hd, dim], wo[L, dim, H*hd], rms_ffn[L, dim], w1[L, hidden, dim],
        w2[L, dim, hidden], w3[L, hidden, dim], rms_final[dim],
        freq_cis_real[seq_len, hd/2], freq_cis_imag[seq_len, hd/2] (skipped),
        wcls[vocab, dim] (only when not shared)

  version 1, 256-byte header:
    u32 magic 0x616b3432 ("ak42"), i32 version = 1, i32 x 7 as above (vocab_size > 0),
    u8 shared_classifier, zero padding to 256
    f32 attention_norm[L, dim], ffn_norm[L, dim], norm[dim], tok_embeddings[vocab, dim],
        wq, wk, wv, wo, w1, w2, w3 (shapes as above), output[vocab, dim] if not shared

  version 2 (int8 groups), 256-byte header:
    as version 1 plus i32 group_size after shared_classifier
    f32 attention_norm[L, dim], ffn_norm[L, dim], norm[dim]
    then for tok_embeddings, wq, wk, wv, wo, w1, w2, w3 (, output if not shared):
        i8 q[numel], f32 scale[numel / group_size]      (w = q * scale, per group)

Version 2 weights are dequantized to float32 (``q * scale``, the value ``runq.c``'s
``dequantize`` gives): its groups carry float32 scales separate from the values, which
no GGML block layout holds exactly. Versions 0 and 1 are mapped without copying.

Tensor names follow GGUF (llama2.c's wq/wk already use Meta's interleaved rotary
layout, which is GGUF's, so no permutation): ``token_embd.weight``,
``blk.{i}.attn_norm.weight``, ``blk.{i}.attn_q/k/v.weight``, ``blk.{i}.attn_output.weight``,
``blk.{i}.ffn_norm.weight``, ``blk.{i}.ffn_gate.weight`` (w1), ``ffn_down`` (w2),
``ffn_up`` (w3), ``output_norm.weight`` and ``output.weight`` when not shared.
"""

from __future__ import annotations

import mmap
import os
import struct

import numpy as np

from ..errors import WeightsError
from ..tensors import TensorDict

__all__ = ["load_llama2c", "read_llama2c_header", "MAGIC", "looks_like_legacy"]

MAGIC = 0x616B3432            # "ak42" as a little-endian u32; on disk b"24ka"
MAGIC_BYTES = struct.pack("<I", MAGIC)
_LEGACY_HEADER = 28
_HEADER = 256
_FIELDS = ("dim", "hidden_dim", "n_layers", "n_heads", "n_kv_heads", "vocab_size", "seq_len")
_LIMIT = 1 << 24              # no plausible hyperparameter is this large


def _read_head(path: str, n: int = _HEADER) -> tuple[bytes, int]:
    try:
        with open(path, "rb") as f:
            return f.read(n), os.fstat(f.fileno()).st_size
    except FileNotFoundError:
        raise WeightsError(f"{path}: no such file") from None
    except IsADirectoryError:
        raise WeightsError(f"{path}: is a directory, not a llama2.c checkpoint") from None
    except OSError as e:
        raise WeightsError(f"{path}: cannot read: {e.strerror or e}") from None


def _plausible(h: dict) -> str | None:
    """Why the hyperparameters cannot be a llama2.c model, or None when they can."""
    for k in ("dim", "hidden_dim", "n_layers", "n_heads", "n_kv_heads", "vocab_size", "seq_len"):
        if not 0 < h[k] < _LIMIT:
            return f"{k}={h[k]} is out of range"
    if h["dim"] % h["n_heads"]:
        return f"dim={h['dim']} is not a multiple of n_heads={h['n_heads']}"
    if h["n_heads"] % h["n_kv_heads"]:
        return f"n_heads={h['n_heads']} is not a multiple of n_kv_heads={h['n_kv_heads']}"
    if (h["dim"] // h["n_heads"]) % 2:
        return f"head size {h['dim'] // h['n_heads']} is odd"
    return None


def _layout(h: dict) -> dict[str, tuple]:
    """Shape of each per-layer weight, keyed by its GGUF kind (``attn_q``...)."""
    d, hid, H, KV = h["dim"], h["hidden_dim"], h["n_heads"], h["n_kv_heads"]
    hd = d // H                                   # head size
    return {
        "attn_norm": (d,), "ffn_norm": (d,),
        "attn_q": (H * hd, d), "attn_k": (KV * hd, d), "attn_v": (KV * hd, d),
        "attn_output": (d, H * hd),
        "ffn_gate": (hid, d), "ffn_down": (d, hid), "ffn_up": (hid, d),
    }


def _numel(shape) -> int:
    n = 1
    for s in shape:
        n *= s
    return n


def read_llama2c_header(path) -> dict:
    """The hyperparameters of a llama2.c checkpoint (any version).

    Returns:
        dict with ``dim hidden_dim n_layers n_heads n_kv_heads vocab_size seq_len``
        (vocab_size always positive), ``shared_classifier`` (bool), ``version``
        (0 for the legacy layout), ``group_size`` (version 2 only) and
        ``maxdecl.format`` = ``"llama2c"``.

    Raises:
        WeightsError: not a llama2.c checkpoint, or implausible header.
    """
    path = os.fspath(path)
    head, size = _read_head(path)
    h = _header(path, head, size)
    if h["version"] == 0:
        _check_legacy_size(path, h, size)
    return h


def _header(path: str, head: bytes, size: int) -> dict:
    if head[:4] == MAGIC_BYTES:
        if size < _HEADER or len(head) < _HEADER:
            raise WeightsError(f"{path}: truncated llama2.c header ({size} bytes, "
                               f"{_HEADER} expected)")
        version = struct.unpack_from("<i", head, 4)[0]
        if version not in (1, 2):
            raise WeightsError(f"{path}: llama2.c checkpoint version {version} is not "
                               "supported (supported: legacy, 1, 2)")
        vals = struct.unpack_from("<7i", head, 8)
        h = dict(zip(_FIELDS, vals))
        h["shared_classifier"] = bool(head[36])
        if version == 2:
            h["group_size"] = struct.unpack_from("<i", head, 37)[0]
    else:
        if len(head) < _LEGACY_HEADER:
            raise WeightsError(f"{path}: not a llama2.c checkpoint (only {size} bytes)")
        version = 0
        h = dict(zip(_FIELDS, struct.unpack_from("<7i", head, 0)))
        h["shared_classifier"] = h["vocab_size"] > 0
        h["vocab_size"] = abs(h["vocab_size"])
    h["version"] = version
    why = _plausible(h)
    if why:
        raise WeightsError(f"{path}: not a valid llama2.c checkpoint: {why}")
    if version == 2:
        g = h["group_size"]
        if not 0 < g <= h["dim"] or h["dim"] % g:
            raise WeightsError(f"{path}: corrupted llama2.c v2 header: group_size {g} does "
                               f"not divide dim {h['dim']}")
    h["maxdecl.format"] = "llama2c"
    return h


def _expected_size(h: dict) -> int:
    """File size in bytes that the header implies."""
    d, L, V = h["dim"], h["n_layers"], h["vocab_size"]
    per_layer = _layout(h)
    norms = 2 * L * d + d                                  # attention, ffn, final norms
    mats = V * d + L * sum(_numel(s) for k, s in per_layer.items() if "norm" not in k)
    if not h["shared_classifier"]:
        mats += V * d                                      # the classifier
    if h["version"] == 0:
        freqs = h["seq_len"] * (d // h["n_heads"])         # freq_cis_real + freq_cis_imag
        return _LEGACY_HEADER + 4 * (norms + mats + freqs)
    if h["version"] == 1:
        return _HEADER + 4 * (norms + mats)
    return _HEADER + 4 * norms + mats + 4 * (mats // h["group_size"])   # int8 + f32 scales


def _check_legacy_size(path: str, h: dict, size: int) -> None:
    want = _expected_size(h)
    if size != want:
        dims = ", ".join(f"{k}={h[k]}" for k in _FIELDS)
        raise WeightsError(f"{path}: looks like a legacy llama2.c checkpoint ({dims}) but is "
                           f"{size} bytes where {want} are expected: truncated or not llama2.c")


def looks_like_legacy(head: bytes, size: int) -> bool:
    """True when a headerless file's first 28 bytes are plausible llama2.c hyperparameters."""
    if len(head) < _LEGACY_HEADER:
        return False
    h = dict(zip(_FIELDS, struct.unpack_from("<7i", head, 0)))
    h["shared_classifier"] = h["vocab_size"] > 0
    h["vocab_size"] = abs(h["vocab_size"])
    h["version"] = 0
    return _plausible(h) is None and _expected_size(h) == size


def load_llama2c(path) -> TensorDict:
    """Load a llama2.c ``.bin`` checkpoint (legacy, version 1 or 2).

    Returns:
        TensorDict of float32 arrays with GGUF names (see the module docstring);
        ``metadata`` is ``read_llama2c_header(path)``.

    Raises:
        WeightsError: not a llama2.c checkpoint, implausible header, or a file
            whose size does not match its header (truncated).
    """
    path = os.fspath(path)
    head, size = _read_head(path)
    h = _header(path, head, size)
    want = _expected_size(h)
    if size != want:
        if h["version"] == 0:
            _check_legacy_size(path, h, size)
        raise WeightsError(f"{path}: llama2.c v{h['version']} checkpoint is {size} bytes but "
                           f"its header implies {want}: the file is truncated or corrupted")
    with open(path, "rb") as f:
        buf = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    reader = _Reader(buf)
    d, L, V, H = h["dim"], h["n_layers"], h["vocab_size"], h["n_heads"]
    per_layer = _layout(h)
    td = TensorDict(metadata=h)
    out: dict[str, np.ndarray] = {}

    def layers(kind, take):
        for i in range(L):
            out[f"blk.{i}.{kind}.weight"] = take(per_layer[kind])

    if h["version"] == 0:
        reader.pos = _LEGACY_HEADER
        f32 = reader.f32
        out["token_embd.weight"] = f32((V, d))
        layers("attn_norm", f32)
        for kind in ("attn_q", "attn_k", "attn_v", "attn_output"):
            layers(kind, f32)
        layers("ffn_norm", f32)
        for kind in ("ffn_gate", "ffn_down", "ffn_up"):
            layers(kind, f32)
        out["output_norm.weight"] = f32((d,))
        f32((h["seq_len"], d // H))           # freq_cis_real, unused (rope is computed)
        if not h["shared_classifier"]:
            out["output.weight"] = f32((V, d))
    else:
        reader.pos = _HEADER
        f32 = reader.f32
        layers("attn_norm", f32)
        layers("ffn_norm", f32)
        out["output_norm.weight"] = f32((d,))
        take = f32 if h["version"] == 1 else (lambda s: reader.q8(s, h["group_size"]))
        out["token_embd.weight"] = take((V, d))
        for kind in ("attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_down",
                     "ffn_up"):
            layers(kind, take)
        if not h["shared_classifier"]:
            out["output.weight"] = take((V, d))
    # GGUF-like order: embedding, then each block's tensors, then the head.
    order = ["token_embd.weight"]
    for i in range(L):
        order += [f"blk.{i}.{k}.weight" for k in per_layer]
    order += ["output_norm.weight"] + (["output.weight"] if "output.weight" in out else [])
    for name in order:
        td[name] = out[name]
    return td


class _Reader:
    """Sequential typed views of a mapped buffer (sizes were checked up front)."""

    def __init__(self, buf):
        self.buf, self.pos = buf, 0

    def f32(self, shape) -> np.ndarray:
        n = _numel(shape)
        a = np.frombuffer(self.buf, "<f4", n, self.pos).reshape(shape)
        self.pos += 4 * n
        return a

    def q8(self, shape, group: int) -> np.ndarray:
        n = _numel(shape)
        q = np.frombuffer(self.buf, np.int8, n, self.pos)
        self.pos += n
        s = np.frombuffer(self.buf, "<f4", n // group, self.pos)
        self.pos += 4 * (n // group)
        w = q.reshape(-1, group).astype(np.float32) * s[:, None]
        return w.reshape(shape)
