"""Tokenizers: text <-> token ids, loaded the way the weights come.

``load_tokenizer(path)`` picks the loader from the path:

    *.gguf               tokenizer.ggml.model = "llama" -> SentencePiece-style (tokenizer_spm)
                                              = "gpt2"  -> byte-level BPE (tokenizer_bpe)
    directory / *.json   Hugging Face tokenizer.json via the optional ``tokenizers`` package
    *.bin                llama2.c tokenizer.bin -> SentencePiece-style (tokenizer_spm)

Every tokenizer has the same surface:

    ids  = tok.encode(text, add_bos=True)   # list[int]
    text = tok.decode(ids)                  # str
    tok.bos_id, tok.eos_ids, tok.vocab_size
    for piece in tok.decode_stream(ids): ...  # only complete UTF-8 text
    s = tok.stream_decoder(); s.push(id)      # the same, one id at a time

Conventions (the same for every format):

* ``add_bos=True`` adds what the tokenizer's metadata asks for at the ends of
  the text (GGUF ``add_bos_token`` / ``add_eos_token``, llama2.c: BOS only,
  HF: its post-processor). ``add_bos=False`` adds nothing. BOS is never added
  twice: if the text itself starts with the BOS token text (``"<bos>Hi"``),
  it is parsed as that token and no second one is prepended.
* Control tokens written in the text (``<start_of_turn>``, ``<|eot_id|>``)
  are parsed as single tokens by default, as llama.cpp does with
  ``parse_special=True`` and Hugging Face does by default. With
  ``parse_special=False`` they are tokenized as plain text; user-defined
  tokens (GGUF token type 4) are always matched whole, as in llama.cpp.
* ``decode`` renders control tokens as their text (``"<bos>Hi"``, as HF
  does); ``skip_special=True`` drops them. Byte-fallback tokens are joined
  into UTF-8 (an invalid sequence becomes U+FFFD). When the tokenizer adds a
  dummy space prefix (SentencePiece ``add_space_prefix``), the one leading
  space of the first text token (after any BOS) is removed, so
  ``decode(encode(s)) == s``. Decoding generated ids that continue a prompt
  should keep that space: pass ``continuation=True``.
* ``eos_ids`` is the set of ids that end generation: the metadata's EOS, its
  ``eot``/``eom`` ids, and the known end-of-turn control tokens present in the
  vocabulary (``<end_of_turn>``, ``<|eot_id|>``, ``<|end_of_text|>``,
  ``<|im_end|>``, ``<|endoftext|>``, ``<|end|>``, ``<|eom_id|>``).
"""

from __future__ import annotations

from pathlib import Path

from ..errors import MaxdeclError, WeightsError
from .tokenizer_base import (  # noqa: F401  (re-exported: the public tokenizer surface)
    BYTE, CONTROL, END_OF_TURN_TEXTS, NORMAL, UNKNOWN, UNUSED, USER_DEFINED,
    StreamDecoder, Tokenizer)


def load_tokenizer(path: str | Path) -> Tokenizer:
    """Load the tokenizer that comes with a model's weights.

    Args:
        path: a ``.gguf`` file, a Hugging Face directory or ``tokenizer.json``,
            or a llama2.c ``tokenizer.bin``.

    Returns:
        a Tokenizer (``encode``, ``decode``, ``decode_stream``, ``bos_id``,
        ``eos_ids``, ``vocab_size``).

    Raises:
        WeightsError: missing, unreadable or unrecognised file.
        MaxdeclError: unsupported tokenizer model, or ``tokenizers`` not installed.

    Example:
        >>> tok = md.load_tokenizer("gemma-3-270m.gguf")
        >>> tok.decode(tok.encode("Hi there", add_bos=False))
        'Hi there'
    """
    p = Path(path)
    if not p.exists():
        raise WeightsError(f"{p}: tokenizer file or directory not found")
    if p.is_dir() or p.suffix == ".json":
        from .tokenizer_hf import load_hf
        return load_hf(p)
    with open(p, "rb") as f:
        magic = f.read(4)
    if magic == b"GGUF":
        return load_gguf_tokenizer(p)
    if p.suffix == ".bin":
        from .tokenizer_spm import load_llama2c_bin
        return load_llama2c_bin(p)
    raise WeightsError(f"{p}: not a tokenizer: expected a .gguf file, a Hugging Face directory "
                       "or tokenizer.json, or a llama2.c tokenizer.bin")


def load_gguf_tokenizer(path: str | Path, meta: dict | None = None) -> Tokenizer:
    """Build the tokenizer described by a GGUF file's ``tokenizer.ggml.*`` metadata
    (``meta``: that metadata when the caller already read it, e.g. ``td.metadata``)."""
    if meta is None:
        from ..weights.gguf import read_gguf_metadata
        meta = read_gguf_metadata(path)
    model = meta.get("tokenizer.ggml.model")
    if model is None or "tokenizer.ggml.tokens" not in meta:
        raise WeightsError(f"{path}: GGUF has no tokenizer (tokenizer.ggml.model/tokens missing)")
    if model == "llama":
        from .tokenizer_spm import SpmTokenizer
        return SpmTokenizer.from_gguf_metadata(meta)
    if model == "gpt2":
        from .tokenizer_bpe import BpeTokenizer
        return BpeTokenizer.from_gguf_metadata(meta, str(path))
    raise MaxdeclError(f"{path}: tokenizer.ggml.model = {model!r} is not supported "
                       "(expected 'llama' or 'gpt2')")
