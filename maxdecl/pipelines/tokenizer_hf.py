"""Thin wrapper over a Hugging Face ``tokenizer.json`` (optional ``tokenizers`` package).

The ``tokenizers`` package does the work; this module only reads the ids the
rest of maxdecl asks for (BOS, the end-of-generation set) from the files next
to ``tokenizer.json``:

    tokenizer_config.json     bos_token / eos_token (str or {"content": ...}), add_bos_token
    generation_config.json    eos_token_id (int or list), bos_token_id
    config.json               eos_token_id / bos_token_id (fallback)
"""

from __future__ import annotations

import json
from pathlib import Path

from ..errors import MaxdeclError, WeightsError
from .tokenizer_base import END_OF_TURN_TEXTS, Tokenizer


class HfTokenizer(Tokenizer):
    """A ``tokenizers.Tokenizer`` with maxdecl's encode/decode surface.

    ``add_bos=True`` applies the file's post-processor (its BOS/EOS template);
    ``parse_special=False`` encodes special tokens written in the text as plain
    text. ``continuation`` is ignored: the file's own decoder decides whether a
    leading space is stripped.
    """

    def __init__(self, tk, config: dict, gen_config: dict, model_config: dict) -> None:
        self._tk = tk
        self.vocab_size = tk.get_vocab_size(with_added_tokens=True)
        self.add_space_prefix = False

        def token_id(name: str) -> int | None:
            t = config.get(name)
            if isinstance(t, dict):
                t = t.get("content")
            return tk.token_to_id(t) if isinstance(t, str) else None

        def ids_of(key: str) -> list[int]:
            for c in (gen_config, model_config):
                v = c.get(key)
                if v is not None:
                    return [int(x) for x in (v if isinstance(v, list) else [v])]
            return []

        bos = token_id("bos_token")
        self.bos_id = bos if bos is not None else next(iter(ids_of("bos_token_id")), None)
        self.eos_id = token_id("eos_token")
        eos = set(ids_of("eos_token_id"))
        if self.eos_id is None and eos:
            self.eos_id = min(eos)
        specials = {i for i, t in tk.get_added_tokens_decoder().items() if t.special}
        for text in END_OF_TURN_TEXTS:
            i = tk.token_to_id(text)
            if i is not None and i in specials:
                eos.add(i)
        if self.eos_id is not None:
            eos.add(self.eos_id)
        self.eos_ids = frozenset(eos)
        self.add_bos = bool(config.get("add_bos_token", False))

    def encode(self, text: str, add_bos: bool = True, *, parse_special: bool = True) -> list[int]:
        """Token ids of ``text`` (see ``Tokenizer.encode``)."""
        if not isinstance(text, str):
            raise MaxdeclError(f"encode: expected str, got {type(text).__name__}")
        tk = self._tk
        old = tk.encode_special_tokens
        tk.encode_special_tokens = not parse_special
        try:
            ids = tk.encode(text, add_special_tokens=add_bos).ids
        finally:
            tk.encode_special_tokens = old
        bos = self.bos_id
        if add_bos and bos is not None:
            if self.add_bos and (not ids or ids[0] != bos):
                ids.insert(0, bos)            # config asks for BOS, template lacks it
            if len(ids) >= 2 and ids[0] == bos and ids[1] == bos:
                del ids[0]                    # the text already started with BOS
        return ids

    def decode(self, ids, *, skip_special: bool = False, continuation: bool = False) -> str:
        """Text of ``ids`` through the file's decoder (see ``Tokenizer.decode``)."""
        return self._tk.decode([int(i) for i in ids], skip_special_tokens=skip_special)

    def token_to_id(self, piece: str) -> int | None:
        """Id of a token given its text, or None."""
        return self._tk.token_to_id(piece)

    def id_to_token(self, tid: int) -> str:
        """Stored text of token ``tid``."""
        t = self._tk.id_to_token(int(tid))
        if t is None:
            raise MaxdeclError(f"id_to_token: token id {tid} out of range [0, {self.vocab_size})")
        return t

    def _new_hf_stream(self, skip_special: bool):
        from tokenizers.decoders import DecodeStream
        return DecodeStream(skip_special_tokens=skip_special)

    def _hf_stream_step(self, state, tid: int) -> str:
        return state.step(self._tk, tid) or ""


def load_hf(path: str | Path) -> HfTokenizer:
    """Load ``tokenizer.json`` (or a directory holding it) and its config files."""
    path = Path(path)
    file = path / "tokenizer.json" if path.is_dir() else path
    if not file.is_file():
        raise WeightsError(f"{path}: no tokenizer.json (a directory must hold one; "
                           "a SentencePiece tokenizer.model alone is not supported)")
    try:
        from tokenizers import Tokenizer as HfTk
    except ImportError:
        raise MaxdeclError(f"{file}: loading a Hugging Face tokenizer.json needs the optional "
                           "'tokenizers' package: pip install tokenizers") from None
    try:
        tk = HfTk.from_file(str(file))
    except Exception as exc:  # the Rust error type is not importable
        raise WeightsError(f"{file}: cannot parse tokenizer.json: {exc}") from None
    folder = file.parent
    return HfTokenizer(tk, _json(folder / "tokenizer_config.json"),
                       _json(folder / "generation_config.json"), _json(folder / "config.json"))


def from_json_text(text: str, config: dict, gen_config: dict, where: str = "") -> HfTokenizer:
    """An HfTokenizer from tokenizer.json's text and its config dicts (a checkpoint's copy)."""
    try:
        from tokenizers import Tokenizer as HfTk
    except ImportError:
        raise MaxdeclError(f"{where}: its Hugging Face tokenizer needs the optional "
                           "'tokenizers' package: pip install tokenizers") from None
    try:
        tk = HfTk.from_str(text)
    except Exception as exc:  # the Rust error type is not importable
        raise WeightsError(f"{where}: cannot parse its tokenizer.json: {exc}") from None
    return HfTokenizer(tk, config, gen_config, {})


def _json(path: Path) -> dict:
    if not path.is_file():
        return {}
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise WeightsError(f"{path}: unreadable JSON: {exc}") from None
    return data if isinstance(data, dict) else {}
