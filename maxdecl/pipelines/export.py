"""``maxdecl export SRC --spec SPEC -o OUT.gguf``: any weights the spec runs -> a GGUF.

What goes into the file:

    general.architecture    the spec's ``formats.gguf.arch``
    general.name            the source's, else the spec's name
    general.file_type       llama.cpp's ftype of the matrices' encoding (the source's when mixed)
    <arch>.* keys           ``formats.gguf.metadata`` inverted: each param's resolved value
                            under its key (``{arch}`` substituted); a GGUF source's other
                            keys of the same architecture are kept
    ``formats.gguf.write``  constant keys no param gave (llama.cpp's required ones)
    value_length            = key_length when only key_length is known (llama.cpp would
                            otherwise take embedding_length / head_count)
    tokenizer.ggml.*        the source's own (a GGUF's arrays as they are), else the one
                            carried in a checkpoint or found beside the source (tokenizer.bin)
    tensors                 the spec's weight names (GGUF names), each in its encoding;
                            1-D bf16/f16 tensors widened to f32 as llama.cpp's converter does

SRC is read as ``maxdecl run`` reads it (GGUF, maxdecl checkpoint, HF dir, llama2.c .bin,
through the spec's ``formats``) and must fit the spec (``fit.check_fit``).
"""

from __future__ import annotations

import os
import sys

from ..errors import WeightsError
from ..tensors import QuantizedTensor
from ..weights.for_spec import metadata_constant

__all__ = ["export_gguf", "gguf_metadata", "export_cli"]

# Keys recomputed for the written file, never copied from the source.
_RECOMPUTED = ("general.architecture", "general.alignment", "general.file_type",
               "general.quantization_version")
GGML_QUANTIZATION_VERSION = 2     # ggml.h GGML_QNT_VERSION


def gguf_metadata(spec, params: dict, source_meta: dict, td, file_type=None) -> dict:
    """The architecture and general keys of the GGUF for ``td`` (no tokenizer keys).

    Args:
        spec: the Spec (its ``formats.gguf``).
        params: every resolved hyperparameter (``spec.program(...).params``).
        source_meta: the source's metadata (a GGUF's keys are carried when its
            architecture is the spec's).
        td: the tensors to be written (for ``general.file_type``).
        file_type: llama.cpp's ftype when the caller knows it (a quantize preset);
            None: from the tensors, or the GGUF source's own when ``td`` is as loaded.

    Raises:
        WeightsError: the spec has no ``formats.gguf.arch``.
    """
    section = dict(spec.formats.get("gguf", {}) or {})
    arch = section.get("arch")
    if isinstance(arch, list):
        arch = arch[0] if arch else None
    if not arch:
        raise WeightsError(f"{spec.file}: no formats.gguf.arch: the spec does not say which "
                           "llama.cpp architecture it is")
    out = {}
    if _source_gguf(source_meta) and source_meta.get("general.architecture") == arch:
        out.update(_carried(source_meta))
    out.setdefault("general.name", str(source_meta.get("general.name") or spec.name))
    written = set()
    for name, key in dict(section.get("metadata", {}) or {}).items():
        names = [k for k in (key if isinstance(key, list) else [key])
                 if metadata_constant(k) is None]
        if not names:
            continue
        key = str(names[0]).replace("{arch}", arch)
        value = _metadata_param(params.get(name))
        if value is None or key in written:
            continue                  # the first param mapped to a key wins
        out[key] = value
        written.add(key)
    for key, value in dict(section.get("write", {}) or {}).items():
        out.setdefault(str(key).replace("{arch}", arch), value)   # constants llama.cpp needs
    k_len, v_len = f"{arch}.attention.key_length", f"{arch}.attention.value_length"
    if k_len in out and v_len not in out:
        out[v_len] = out[k_len]
    return _recomputed(out, arch, td, source_meta, file_type)


def _metadata_param(value):
    """A param value as GGUF can store it: a scalar as it is, a non-empty list of numbers,
    bools or strings as an array (ints and floats mixed: floats); None (not written) for
    null, an empty or mixed list, or a mapping."""
    if not isinstance(value, (list, tuple)):
        return None if isinstance(value, dict) else value
    if not value:
        return None
    for kinds in ((bool,), (str,)):
        if all(isinstance(v, kinds) for v in value):
            return list(value)
    if all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in value):
        return list(value) if all(isinstance(v, int) for v in value) else \
            [float(v) for v in value]
    return None


def source_gguf_metadata(source_meta: dict, td, file_type=None) -> dict:
    """A GGUF source's own keys (tokenizer aside) for re-encoded tensors ``td``: what
    ``quantize X.gguf -o Y.gguf`` writes without a spec."""
    return _recomputed(_carried(source_meta), source_meta.get("general.architecture"), td,
                       {}, file_type)


def _carried(meta: dict) -> dict:
    return {k: v for k, v in meta.items() if not k.startswith(("tokenizer.", "maxdecl."))
            and "." in k and k not in _RECOMPUTED}


def _recomputed(out: dict, arch, td, source_meta: dict, file_type=None) -> dict:
    if not arch:
        raise WeightsError("the source has no general.architecture: give --spec")
    out["general.file_type"] = file_type_of(td, source_meta) if file_type is None else file_type
    if any(isinstance(t, QuantizedTensor) and t.encoding != "bf16" for t in td.values()):
        out["general.quantization_version"] = GGML_QUANTIZATION_VERSION
    out["general.architecture"] = arch
    return out


def _source_gguf(meta: dict) -> bool:
    fmt = meta.get("maxdecl.format")
    return fmt == "gguf" or (fmt == "maxdecl" and meta.get("maxdecl.source_format") == "gguf")


def file_type_of(td, meta: dict | None = None) -> int:
    """llama.cpp's ftype: the one encoding of every matrix, else (mixed) the source's own
    when the tensors are a GGUF's as loaded, else the encoding holding the most bytes."""
    from ..weights.gguf_write import LLAMA_FILE_TYPES

    by_enc: dict = {}
    for t in td.values():
        if len(t.shape) < 2:
            continue
        enc = t.encoding if isinstance(t, QuantizedTensor) else str(t.dtype)
        enc = {"float32": "f32", "float16": "f16", "float64": "f32"}.get(enc, enc)
        by_enc[enc] = by_enc.get(enc, 0) + int(t.nbytes)
    meta = meta or {}
    if len(by_enc) > 1 and meta.get("maxdecl.format") == "gguf" and "general.file_type" in meta:
        return int(meta["general.file_type"])
    known = {e: n for e, n in by_enc.items() if e in LLAMA_FILE_TYPES}
    return LLAMA_FILE_TYPES[max(known, key=known.get)] if known else 0


def widen_vectors(td):
    """1-D bf16/f16 tensors (norms, biases) as float32, as llama.cpp's converter writes
    them (its CPU ops take float32 there); the values are unchanged (the widening is exact)."""
    import numpy as np

    from ..tensors import TensorDict

    out = TensorDict(metadata=dict(getattr(td, "metadata", {}) or {}))
    for name, t in td.items():
        if len(t.shape) <= 1 and isinstance(t, QuantizedTensor) and t.encoding == "bf16":
            t = t.dequantize()
        elif len(t.shape) <= 1 and not isinstance(t, QuantizedTensor) and t.dtype == np.float16:
            t = t.astype(np.float32)
        out[name] = t
    return out


def tokenizer_keys(src: str, meta: dict) -> tuple[dict, str]:
    """(``tokenizer.*`` keys for the GGUF, a note when there are none).

    A GGUF's keys are used as they are; a llama2.c tokenizer.bin is converted (see
    ``tokenizer_embed``); a Hugging Face byte-level BPE tokenizer.json is converted and
    checked (see ``tokenizer_gguf``)."""
    from ..errors import MaxdeclError
    from .tokenizer_embed import (HF_KEY, gguf_tokenizer_keys, load_tokenizer,
                                  tokenizer_from_metadata, tokenizer_to_metadata)
    from .tokenizer_gguf import hf_to_gguf_keys

    keys = gguf_tokenizer_keys(meta)
    if keys:
        return keys, ""
    beside = None if HF_KEY in meta else find_tokenizer_file(src)
    if HF_KEY not in meta and beside is None:
        return {}, "no tokenizer found in the source or beside it"
    if HF_KEY in meta or beside.endswith(".json") or os.path.isdir(beside):
        tok = tokenizer_from_metadata(meta, src) if HF_KEY in meta else load_tokenizer(beside)
        try:
            return hf_to_gguf_keys(tok), ""
        except MaxdeclError as e:
            return {}, f"its Hugging Face tokenizer.json was not converted: {e}"
    return tokenizer_to_metadata(beside), ""


def find_tokenizer_file(path: str):
    """tokenizer.json / tokenizer.bin / tokenizer.gguf beside (or in) a weights path, or None."""
    folder = path if os.path.isdir(path) else os.path.dirname(os.path.abspath(path))
    for name in ("tokenizer.json", "tokenizer.bin", "tokenizer.gguf"):
        cand = os.path.join(folder, name)
        if os.path.exists(cand):
            return cand
    return None


def export_gguf(src, spec, out, variant=None) -> dict:
    """Write the GGUF of ``src`` (any weights ``spec`` runs) to ``out``.

    Returns:
        a summary dict: ``tensors``, ``bytes``, ``arch``, ``encodings`` (name -> count),
        ``note`` (why the file has no tokenizer, or "").

    Raises:
        WeightsError: the weights do not fit the spec, or a value GGUF cannot hold.
        SpecError: the spec is invalid.

    Example::

        export_gguf("stories15M-q4_0.safetensors", "specs/tinystories.yaml", "s.gguf")
    """
    from ..spec import Spec, load_spec
    from ..weights import load_weights
    from ..weights.gguf_write import write_gguf
    from .fit import check_fit
    from .model_loading import params_from_metadata, prepare_weights

    src = os.fspath(src)
    if not isinstance(spec, Spec):
        spec = load_spec(spec)
    if variant:
        spec = spec.with_variant(variant)
    td = load_weights(src)
    meta = dict(td.metadata)
    params = params_from_metadata(spec, meta)
    td = prepare_weights(spec, td, params)
    check_fit(spec, params, td, src)
    full = dict(spec.program(spec.variant, params, check_encodings=False).params)
    td = widen_vectors(td)
    metadata = gguf_metadata(spec, full, meta, td)
    tok, note = tokenizer_keys(src, meta)
    metadata.update(tok)
    arch = metadata.pop("general.architecture")
    write_gguf(out, arch, metadata, td)
    encodings: dict = {}
    for t in td.values():
        enc = t.encoding if isinstance(t, QuantizedTensor) else str(t.dtype)
        encodings[enc] = encodings.get(enc, 0) + 1
    return {"tensors": len(td), "bytes": os.path.getsize(out), "arch": arch,
            "encodings": encodings, "note": note}


def export_cli(args) -> int:
    """Implements ``maxdecl export SRC --spec SPEC -o OUT.gguf``."""
    info = export_gguf(args.src, args.spec, args.output, args.variant)
    if info["note"]:
        print(f"warning: the GGUF carries no tokenizer: {info['note']}", file=sys.stderr)
    encs = ", ".join(f"{n} {e}" for e, n in sorted(info["encodings"].items()))
    print(f"wrote {args.output}: {info['tensors']} tensors ({encs}), {info['bytes']:,} bytes, "
          f"architecture {info['arch']}")
    return 0
