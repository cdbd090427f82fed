"""Weight files -> TensorDict, the format told by content, never by file name.

=====================  =======================================  ==========================
format                 recognised by                            tensors
=====================  =======================================  ==========================
GGUF                   magic ``GGUF``                           GGUF names; blocks packed
safetensors            u64 header length, then ``{``            file names; maxdecl
                                                                checkpoints keep encodings
llama2.c v1 / v2       u32 magic 0x616b3432 (``ak42``)          GGUF names, float32
llama2.c legacy        7 plausible int32s and an exact size     GGUF names, float32
Hugging Face           a directory with config.json             HF names (see ``remap``)
=====================  =======================================  ==========================

Every loader memory-maps (read-only) where the bytes can be used as they are,
and sets ``td.metadata`` (``metadata["maxdecl.format"]`` names the format).
"""

from __future__ import annotations

import os

from ..errors import WeightsError
from ..tensors import TensorDict
from .gguf import load_gguf, read_gguf_metadata

__all__ = ["load_weights", "detect_format", "load_gguf", "read_gguf_metadata", "load_hf",
           "load_safetensors", "read_hf_config", "load_llama2c", "read_llama2c_header",
           "remap", "permute_qk", "compute_tensors"]

# Imported when first used: a GGUF run needs none of them.
_LAZY = {"load_hf": "hf", "load_safetensors": "hf", "read_hf_config": "hf",
         "load_llama2c": "llama2c", "read_llama2c_header": "llama2c",
         "remap": "mapping", "permute_qk": "mapping", "compute_tensors": "mapping"}


def __getattr__(name: str):
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(f".{module}", __name__), name)
    globals()[name] = value
    return value


_TRIED = ("GGUF (magic 'GGUF'), safetensors (header length + JSON), llama2.c v1/v2 "
          "(magic 'ak42'), legacy llama2.c (plausible header and exact size), "
          "Hugging Face directory (config.json)")


def detect_format(path) -> str:
    """``"gguf"``, ``"safetensors"``, ``"llama2c"`` or ``"hf"``, judged by content.

    Raises:
        WeightsError: missing path, or content none of the formats matches
            (the message lists what was tried).
    """
    path = os.fspath(path)
    if os.path.isdir(path):
        if os.path.isfile(os.path.join(path, "config.json")):
            return "hf"
        raise WeightsError(f"{path}: a directory without config.json is not a Hugging Face "
                           "model (tried: " + _TRIED + ")")
    try:
        with open(path, "rb") as f:
            head = f.read(256)
            size = os.fstat(f.fileno()).st_size
    except FileNotFoundError:
        raise WeightsError(f"{path}: no such file") from None
    except OSError as e:
        raise WeightsError(f"{path}: cannot read: {e.strerror or e}") from None
    if head[:4] == b"GGUF":
        return "gguf"
    from . import llama2c, safetensors_io

    if head[:4] == llama2c.MAGIC_BYTES:
        return "llama2c"
    if llama2c.looks_like_legacy(head, size):   # exact size: checked before the looser test
        return "llama2c"
    if safetensors_io.is_safetensors(head):
        return "safetensors"
    if len(head) >= 28:
        try:
            llama2c.read_llama2c_header(path)
        except WeightsError as e:
            if "looks like a legacy" in str(e):
                raise
    raise WeightsError(f"{path}: not a recognised weights file ({size} bytes; tried: "
                       f"{_TRIED})")


_LOADERS = {"gguf": "load_gguf", "safetensors": "load_safetensors", "llama2c": "load_llama2c",
            "hf": "load_hf"}


def _loader(fmt: str):
    """The loader function of a format (imported on first use)."""
    name = _LOADERS[fmt]
    return globals().get(name) or __getattr__(name)




def load_weights(path, spec=None, variant: str | None = None) -> TensorDict:
    """Load any supported weights file or directory into a TensorDict.

    The format is told by content (see the module table), not by extension. With
    ``spec`` (a path or ``Spec``), its ``formats`` apply (``load_for_spec``): tensors
    take the spec's names and transforms, and ``td.params`` holds the hyperparameters
    read from the file, which ``md.build(spec, weights=td)`` uses.

    Returns:
        TensorDict; GGUF tensors keep their GGUF names and packed encodings;
        ``td.metadata`` carries the format's metadata (GGUF key/values, HF
        config.json, llama2.c header) and ``"maxdecl.format"``.

    Raises:
        WeightsError: unknown format (listing the formats tried), or the
            loader's own error for a truncated or corrupted file.

    Example::

        td = md.load_weights("gemma-3-270m-q4_k_m.gguf")
        td["blk.0.attn_q.weight"]            # QuantizedTensor(q5_0, shape=[1024, 640], ...)
        td.metadata["general.architecture"]  # 'gemma3'
    """
    if spec is not None:
        from .for_spec import load_for_spec

        return load_for_spec(_loader(detect_format(path))(path), spec, variant)
    return _loader(detect_format(path))(path)
