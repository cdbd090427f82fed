"""``maxdecl inspect --metadata``: a weights file's metadata, one key a line.

    GGUF          every key/value, in file order
    safetensors   the ``__metadata__`` strings; a maxdecl checkpoint's ``maxdecl.metadata``
                  JSON (its TensorDict.metadata: carried GGUF keys, params, tokenizer)
                  one key a line
    llama2.c      the header fields;   Hugging Face dir: config.json

Long values are summarized: ``tokenizer.ggml.tokens: [262144 x str] ['<pad>', '<eos>',
'<bos>', ...]``, long strings cut with their length.
"""

from __future__ import annotations

import json

import numpy as np

from .strings import StringArray

__all__ = ["metadata_lines", "summarize"]

_SHOW_ITEMS = 3       # array items shown
_MAX_CHARS = 100      # longer strings are cut


def summarize(value) -> str:
    """One short line for a metadata value."""
    if isinstance(value, np.ndarray):
        return _array(value.tolist(), value.dtype.name)
    if isinstance(value, StringArray):
        return _array(value[:_SHOW_ITEMS] if len(value) > 8 else list(value), "str", len(value))
    if isinstance(value, (list, tuple)):
        kind = type(value[0]).__name__ if value else "?"
        return _array(list(value), kind)
    if isinstance(value, dict):
        if len(value) > 20:
            return f"{{{len(value)} keys}} " + _cut(", ".join(list(value)[:_SHOW_ITEMS]) + ", ...")
        return _cut(json.dumps(value, default=str), 2 * _MAX_CHARS)
    if isinstance(value, str):
        return _cut(repr(value))
    return repr(value)


def _array(items: list, kind: str, n: int | None = None) -> str:
    n = len(items) if n is None else n
    if n <= 8:
        return _cut(repr(items))
    head = ", ".join(_cut(repr(x), 40) for x in items[:_SHOW_ITEMS])
    return f"[{n} x {kind}] [{head}, ...]"


def _cut(text: str, n: int = _MAX_CHARS) -> str:
    return text if len(text) <= n else f"{text[:n]}... ({len(text)} chars)"


def metadata_lines(path) -> list[str]:
    """``key: value`` lines for ``path``'s metadata, then a count line.

    Raises:
        WeightsError: unreadable or unrecognised file.
    """
    from . import detect_format, read_hf_config, read_llama2c_header
    from .gguf import read_gguf_metadata

    fmt = detect_format(path)
    if fmt == "gguf":
        items = list(read_gguf_metadata(path).items())
    elif fmt == "safetensors":
        items = _safetensors_items(path)
    elif fmt == "llama2c":
        items = list(read_llama2c_header(path).items())
    else:
        items = list(read_hf_config(path).items())
    items = [(k, v) for k, v in items if k != "maxdecl.format"]
    width = min(max((len(k) for k, _ in items), default=3), 48)
    lines = [f"{k:<{width}}: {summarize(v)}" for k, v in items]
    lines.append(f"{len(items)} metadata entries ({fmt})")
    return lines


def _safetensors_items(path) -> list:
    """``__metadata__`` strings; JSON-object strings (a checkpoint's) expanded by key."""
    from .safetensors_io import read

    raw = read(path)[2]
    out = []
    for key, text in raw.items():
        try:
            value = json.loads(text) if text[:1] == "{" else None
        except ValueError:
            value = None
        if key == "maxdecl.metadata" and isinstance(value, dict):
            out += list(value.items())          # TensorDict.metadata, key by key
        else:
            out.append((key, value if isinstance(value, dict) else text))
    return out
