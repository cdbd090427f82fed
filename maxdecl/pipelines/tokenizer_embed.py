"""A tokenizer inside a checkpoint's metadata, so the checkpoint runs alone.

Where it goes: ``TensorDict.metadata`` (a maxdecl checkpoint stores it as JSON in the
safetensors ``__metadata__``), in one of two forms:

    SentencePiece-style (GGUF "llama", llama2.c tokenizer.bin)   the GGUF keys
    byte-level BPE from a GGUF ("gpt2")                          ``tokenizer.ggml.*``
    Hugging Face tokenizer.json                                  ``maxdecl.tokenizer.hf``:
                                                                 {"tokenizer.json": text,
                                                                  "tokenizer_config.json": {...},
                                                                  "generation_config.json": {...}}

Why in the metadata and not a file beside the checkpoint: a single file cannot lose
its tokenizer when copied or moved (the failure that motivated this). Why the GGUF keys:
they are the one vocabulary format llama.cpp reads, every field maxdecl's own SPM/BPE
tokenizers use has a key there, a GGUF source's arrays are carried unchanged, and
``maxdecl export`` writes them as they are. A llama2.c tokenizer.bin (pieces written with
a plain space for "▁", as llama2.c's tokenizer.py writes them) converts to the same ids
for any text: spaces become "▁", byte tokens ``<0xNN>``, ids 1/2 BOS/EOS renamed
``<s>``/``</s>`` (from "\\n<s>\\n"), as llama.cpp's converter does; what differs is that
``<s>`` written in a prompt is then parsed as BOS (as llama.cpp does) and BOS decodes as
``<s>``. A Hugging Face tokenizer.json keeps its own text, since its normalizer and
pre-tokenizer pipeline has no exact GGUF equivalent. Size: Gemma 3's 262,144-token
vocabulary makes the metadata 7.7 MB of JSON, 2.6% of its 294 MB q8_0 checkpoint.

Example::

    meta = tokenizer_to_metadata("tokenizer.bin")     # or a Tokenizer, a .gguf, a HF dir
    td.metadata.update(meta); md.checkpoint.save(td, "model.safetensors")
    tok = tokenizer_from_metadata(md.checkpoint.load("model.safetensors").metadata)
"""

from __future__ import annotations

import os

import numpy as np

from ..errors import WeightsError
from . import tokenizer as _tokenizer
from .tokenizer import BYTE, CONTROL, Tokenizer, load_gguf_tokenizer

__all__ = ["load_tokenizer", "tokenizer_to_metadata", "tokenizer_from_metadata",
           "has_tokenizer", "HF_KEY"]

GGUF_PREFIX = "tokenizer."
HF_KEY = "maxdecl.tokenizer.hf"


def load_tokenizer(path) -> Tokenizer:
    """``md.load_tokenizer``: ``pipelines.tokenizer.load_tokenizer``'s sources plus a
    maxdecl checkpoint (``.safetensors``) that carries its tokenizer.

    Raises:
        WeightsError: the checkpoint carries no tokenizer, or the file is none of these.
    """
    from ..weights import safetensors_io

    p = os.fspath(path)
    if os.path.isfile(p):
        with open(p, "rb") as f:
            head = f.read(16)
        if safetensors_io.is_safetensors(head):
            meta = _checkpoint_metadata(p, safetensors_io.read(p)[2])
            tok = tokenizer_from_metadata(meta, p)
            if tok is None:
                raise WeightsError(f"{p}: the checkpoint carries no tokenizer (write it with "
                                   "`maxdecl quantize` or md.checkpoint.save(..., tokenizer=tok))")
            return tok
    return _tokenizer.load_tokenizer(p)


def _checkpoint_metadata(path: str, raw: dict) -> dict:
    """TensorDict.metadata of a checkpoint from its raw ``__metadata__`` strings (the key is
    checkpoint.py's ``_METADATA_KEY``; not imported, since checkpoint.save imports this module)."""
    import json

    text = raw.get("maxdecl.metadata")
    if text is None:
        return {}
    try:
        meta = json.loads(text)
    except ValueError as e:
        raise WeightsError(f"{path}: corrupted checkpoint metadata: {e}") from None
    return meta if isinstance(meta, dict) else {}


def has_tokenizer(meta: dict) -> bool:
    """True when ``meta`` carries a tokenizer in one of this module's forms."""
    return ("tokenizer.ggml.tokens" in meta and "tokenizer.ggml.model" in meta) or HF_KEY in meta


def tokenizer_from_metadata(meta: dict, where: str = "checkpoint") -> Tokenizer | None:
    """The tokenizer carried in ``meta`` (a TensorDict's metadata), or None.

    Raises:
        WeightsError: the carried tokenizer is malformed (``where`` names the file).
    """
    if "tokenizer.ggml.tokens" in meta and "tokenizer.ggml.model" in meta:
        return load_gguf_tokenizer(where, meta)
    hf = meta.get(HF_KEY)
    if hf is None:
        return None
    if not isinstance(hf, dict) or not isinstance(hf.get("tokenizer.json"), str):
        raise WeightsError(f"{where}: corrupted {HF_KEY}: expected {{'tokenizer.json': text}}")
    from .tokenizer_hf import from_json_text

    return from_json_text(hf["tokenizer.json"], hf.get("tokenizer_config.json") or {},
                          hf.get("generation_config.json") or {}, where)


def tokenizer_to_metadata(source) -> dict:
    """Metadata entries that carry a tokenizer (see the module docstring for the forms).

    Args:
        source: a Tokenizer, or a path: a ``.gguf`` (its ``tokenizer.*`` keys are
            copied as they are), a llama2.c ``tokenizer.bin``, ``tokenizer.json`` or
            a Hugging Face directory.

    Raises:
        WeightsError: the path holds no tokenizer.
    """
    if isinstance(source, (str, os.PathLike)):
        path = os.fspath(source)
        if os.path.isfile(path):
            with open(path, "rb") as f:
                if f.read(4) == b"GGUF":
                    from ..weights.gguf import read_gguf_metadata

                    keys = gguf_tokenizer_keys(read_gguf_metadata(path))
                    if not keys:
                        raise WeightsError(f"{path}: GGUF has no tokenizer")
                    return keys
        source = load_tokenizer(path)
    if hasattr(source, "_tk"):                 # the Hugging Face wrapper
        return {HF_KEY: _hf_record(source)}
    if hasattr(source, "scores"):
        return _spm_keys(source)
    if hasattr(source, "ranks"):
        return _bpe_keys(source)
    raise WeightsError(f"cannot carry a {type(source).__name__} in a checkpoint "
                       "(supported: SentencePiece-style, byte-level BPE, Hugging Face)")


def gguf_tokenizer_keys(meta: dict) -> dict:
    """The ``tokenizer.*`` keys of GGUF metadata (empty when it has no tokenizer)."""
    if "tokenizer.ggml.tokens" not in meta:
        return {}
    return {k: v for k, v in meta.items() if k.startswith(GGUF_PREFIX)}


def _common(tok) -> dict:
    out = {}
    for key, v in (("bos_token_id", tok.bos_id), ("eos_token_id", tok.eos_id),
                   ("unknown_token_id", getattr(tok, "unk_id", None))):
        if v is not None:
            out[f"tokenizer.ggml.{key}"] = int(v)
    out["tokenizer.ggml.add_bos_token"] = bool(tok.add_bos)
    out["tokenizer.ggml.add_eos_token"] = bool(tok.add_eos)
    return out


def _spm_keys(tok) -> dict:
    """GGUF "llama" keys of a SentencePiece-style tokenizer (llama2.c pieces normalised)."""
    from .tokenizer_spm import SPACE

    tokens = list(tok.tokens)
    types = np.asarray(tok.token_types, dtype=np.int32)
    if tok.space != SPACE:                       # llama2.c writes "▁" as a plain space
        tokens = [t.replace(tok.space, SPACE) for t in tokens]
    for b, tid in enumerate(tok.byte_ids):       # llama2.c: byte b is id b + 3
        if tid is not None and types[tid] == BYTE:
            tokens[tid] = f"<0x{b:02X}>"
    for tid in (tok.bos_id, tok.eos_id):         # llama2.c: "\n<s>\n" -> "<s>"
        if tid is not None and types[tid] == CONTROL:
            tokens[tid] = tokens[tid].strip()
    out = {"tokenizer.ggml.model": "llama", "tokenizer.ggml.tokens": tokens,
           "tokenizer.ggml.scores": np.asarray(tok.scores, dtype=np.float32),
           "tokenizer.ggml.token_type": types}
    out.update(_common(tok))
    out["tokenizer.ggml.add_space_prefix"] = bool(tok.add_space_prefix)
    return out


def _bpe_keys(tok) -> dict:
    """GGUF "gpt2" keys of a byte-level BPE tokenizer (merges in rank order)."""
    merges = [f"{a} {b}" for (a, b), _ in sorted(tok.ranks.items(), key=lambda kv: kv[1])]
    out = {"tokenizer.ggml.model": "gpt2", "tokenizer.ggml.pre": tok.pre,
           "tokenizer.ggml.tokens": list(tok.tokens),
           "tokenizer.ggml.token_type": np.asarray(tok.token_types, dtype=np.int32),
           "tokenizer.ggml.merges": merges}
    out.update(_common(tok))
    return out


def _hf_record(tok) -> dict:
    """tokenizer.json text plus the ids the wrapper read from the files beside it."""
    config = {"add_bos_token": bool(tok.add_bos)}
    if tok.bos_id is not None:
        config["bos_token"] = tok.id_to_token(tok.bos_id)
    if tok.eos_id is not None:
        config["eos_token"] = tok.id_to_token(tok.eos_id)
    return {"tokenizer.json": tok._tk.to_str(), "tokenizer_config.json": config,
            "generation_config.json": {"eos_token_id": sorted(tok.eos_ids)}}
