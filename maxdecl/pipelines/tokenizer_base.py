"""The tokenizer base shared by every tokenizer module: the ``Tokenizer`` class, the
incremental ``StreamDecoder``, GGUF token types and the helpers the GGUF loaders share.

Conventions (BOS, control tokens, decoding) are documented in ``tokenizer.py``.
"""

from __future__ import annotations

import codecs
from array import array
from collections.abc import Iterable, Iterator, Sequence

import numpy as np

from ..errors import MaxdeclError, WeightsError

# GGUF / llama.cpp token types (tokenizer.ggml.token_type).
NORMAL, UNKNOWN, CONTROL, USER_DEFINED, UNUSED, BYTE = 1, 2, 3, 4, 5, 6

# Texts of control tokens that end a turn in common chat models.
END_OF_TURN_TEXTS = (
    "<end_of_turn>", "<|eot_id|>", "<|end_of_text|>", "<|im_end|>",
    "<|endoftext|>", "<|end|>", "<|eom_id|>",
)


class Tokenizer:
    """Common surface and the logic shared by the vocabulary-based tokenizers.

    A subclass fills the vocabulary fields in ``__init__`` and implements
    ``_encode_fragment`` (plain text -> ids) and ``_normal_piece_bytes`` (one
    normal or byte token -> the bytes it stands for). The Hugging Face wrapper overrides the public
    methods instead.
    """

    vocab_size: int
    bos_id: int | None
    eos_id: int | None
    eos_ids: frozenset[int]

    def _setup(self, tokens: Sequence[str], token_types: Sequence[int], *,
               bos_id: int | None, eos_id: int | None, add_bos: bool, add_eos: bool,
               add_space_prefix: bool, extra_eos: Iterable[int] = (),
               parse_specials: bool = True) -> None:
        """Store the fields every vocabulary tokenizer has (called by subclasses).

        The vocabulary is kept as arrays (``tokens``: a StringArray, ``token_types``:
        int32 ``array``, ``piece_to_id``: a VocabIndex), not one object per token."""
        from ..weights.strings import StringArray
        from .tokenizer_vocab import VocabIndex

        try:
            tokens = StringArray.from_strings(tokens)
        except UnicodeEncodeError as e:
            raise WeightsError(f"tokenizer: a token is not text read from bytes: {e}") from None
        self.tokens = tokens                      # id -> token text as stored
        types = np.ascontiguousarray(token_types, dtype=np.int32)
        if types.shape != (len(tokens),):
            raise WeightsError(f"tokenizer: {types.size} token types for {len(tokens)} tokens")
        self.token_types = array("i", types.tobytes())   # id -> NORMAL..BYTE
        self.vocab_size = len(tokens)
        self.piece_to_id = VocabIndex(tokens)     # text -> first id (as llama.cpp)
        self.bos_id, self.eos_id = _valid_id(bos_id, tokens), _valid_id(eos_id, tokens)
        self.add_bos, self.add_eos = add_bos, add_eos
        self.add_space_prefix = add_space_prefix
        eos = {i for i in (self.eos_id, *extra_eos) if _valid_id(i, tokens) is not None}
        for text in END_OF_TURN_TEXTS:
            i = self.piece_to_id.get(text)
            if i is not None and self.token_types[i] == CONTROL:
                eos.add(i)
        self.eos_ids = frozenset(eos)
        # Tokens matched whole in the raw text before the model runs, longest first
        # (llama.cpp's cache_special_tokens): (text, id, needs parse_special).
        specials = []
        if parse_specials:
            for i in np.flatnonzero(np.isin(types, (CONTROL, USER_DEFINED, UNKNOWN))).tolist():
                if tokens[i]:
                    specials.append((tokens[i], i, self.token_types[i] != USER_DEFINED))
        specials.sort(key=lambda s: (-len(s[0]), s[1]))
        self._specials = specials
        self._piece_cache: dict[tuple[int, bool], bytes] = {}

    # ---- encode -----------------------------------------------------------------------------

    def encode(self, text: str, add_bos: bool = True, *, parse_special: bool = True) -> list[int]:
        """Token ids of ``text``.

        Special tokens written in the text are matched first (longest first),
        then each remaining fragment goes through the model.

        Args:
            text: the text to encode.
            add_bos: add BOS (and EOS) as the tokenizer's metadata asks; False adds none.
            parse_special: match control tokens written in the text as single tokens.

        Returns:
            list of token ids.

        Example:
            >>> tok = load_tokenizer("gemma-3-270m.gguf")
            >>> tok.encode("Hello world")
            [2, 9259, 1902]
        """
        if not isinstance(text, str):
            raise MaxdeclError(f"encode: expected str, got {type(text).__name__}")
        out: list[int] = []
        if add_bos and self.add_bos and self.bos_id is not None:
            out.append(self.bos_id)
        prev_special = True                       # a space prefix goes before the first fragment
        for k, (frag, tid) in enumerate(self._partition(text, parse_special)):
            if tid is not None:
                if not (k == 0 and tid == self.bos_id and out == [tid]):   # never BOS twice
                    out.append(tid)
                prev_special = True
            else:
                if self.add_space_prefix and prev_special:
                    frag = " " + frag
                out.extend(self._encode_fragment(frag))
                prev_special = False
        if add_bos and self.add_eos and self.eos_id is not None:
            out.append(self.eos_id)
        return out

    def _partition(self, text: str, parse_special: bool) -> list[tuple[str, int | None]]:
        """Split ``text`` into plain fragments and whole special tokens (llama.cpp order).

        For each special token, longest first, every plain fragment is split at
        each of its occurrences (searching left to right).
        """
        frags: list[tuple[str, int | None]] = [(text, None)] if text else []
        # Only tokens found in the whole text can split a fragment of it.
        found = [s for s in self._specials if s[0] in text and (parse_special or not s[2])]
        for stext, sid, _ in found:
            new: list[tuple[str, int | None]] = []
            for frag, tid in frags:
                if tid is not None or stext not in frag:
                    new.append((frag, tid))
                    continue
                parts = frag.split(stext)
                for k, part in enumerate(parts):
                    if k:
                        new.append((stext, sid))
                    if part:
                        new.append((part, None))
            frags = new
        return frags

    def _encode_fragment(self, text: str) -> list[int]:
        raise NotImplementedError

    def token_to_id(self, piece: str) -> int | None:
        """Id of a token given its stored text (``"<end_of_turn>"``, ``"▁the"``), or None."""
        return self.piece_to_id.get(piece)

    def id_to_token(self, tid: int) -> str:
        """Stored text of token ``tid`` (byte-level/▁ form, not decoded)."""
        return self.tokens[tid]

    # ---- decode -----------------------------------------------------------------------------

    def decode(self, ids: Iterable[int], *, skip_special: bool = False,
               continuation: bool = False) -> str:
        """Text of ``ids``; byte-fallback tokens are joined into UTF-8.

        Args:
            ids: token ids.
            skip_special: drop control tokens (BOS, EOS, ``<start_of_turn>``...).
            continuation: the ids continue earlier text: keep the leading space
                that a dummy-prefix tokenizer would otherwise strip.

        Returns:
            the decoded text (invalid UTF-8 becomes U+FFFD).

        Example:
            >>> tok.decode(tok.encode("Hello world"), skip_special=True)
            'Hello world'
        """
        s = StreamDecoder(self, skip_special=skip_special, continuation=continuation)
        return "".join(s.push(i) for i in ids) + s.flush()

    def stream_decoder(self, *, skip_special: bool = False,
                       continuation: bool = False) -> StreamDecoder:
        """A ``StreamDecoder`` for ids that arrive one at a time (``push(id) -> str``).

        Example:
            >>> s = tok.stream_decoder(continuation=True)   # ids continue a prompt
            >>> print(s.push(next_id), end="", flush=True)
        """
        return StreamDecoder(self, skip_special=skip_special, continuation=continuation)

    def decode_stream(self, ids: Iterable[int], *, skip_special: bool = False,
                      continuation: bool = False) -> Iterator[str]:
        """Yield decoded text as ids arrive, only ever complete UTF-8 characters.

        Example:
            >>> list(tok.decode_stream([0xE6 + 3, 0x97 + 3, 0xA5 + 3]))   # llama2.c bytes
            ['日']
        """
        s = StreamDecoder(self, skip_special=skip_special, continuation=continuation)
        for i in ids:
            piece = s.push(i)
            if piece:
                yield piece
        tail = s.flush()
        if tail:
            yield tail

    def _piece_bytes(self, tid: int, skip_special: bool) -> bytes:
        """The bytes token ``tid`` stands for (cached)."""
        key = (tid, skip_special)
        b = self._piece_cache.get(key)
        if b is None:
            if not 0 <= tid < self.vocab_size:
                raise MaxdeclError(f"decode: token id {tid} out of range [0, {self.vocab_size})")
            ty = self.token_types[tid]
            if ty in (CONTROL, UNKNOWN, UNUSED):
                b = b"" if skip_special else _utf8(self.tokens[tid])
            elif ty == USER_DEFINED:
                b = _utf8(self.tokens[tid])
            else:
                b = self._normal_piece_bytes(tid, ty)
            self._piece_cache[key] = b
        return b

    def _normal_piece_bytes(self, tid: int, ty: int) -> bytes:
        raise NotImplementedError

    def _is_text_token(self, tid: int) -> bool:
        return self.token_types[tid] in (NORMAL, BYTE, USER_DEFINED)

    def __repr__(self) -> str:
        return (f"{type(self).__name__}(vocab_size={self.vocab_size}, bos_id={self.bos_id}, "
                f"eos_ids={sorted(self.eos_ids)})")


class StreamDecoder:
    """Incremental decoder: ``push(id)`` returns the text that became complete.

    Bytes of a character split over several byte-fallback tokens are held
    back until the character is complete; ``flush()`` returns what is left
    (an unfinished character becomes U+FFFD).

    Example:
        >>> s = StreamDecoder(tok)
        >>> [s.push(i) for i in ids]   # '' while a character is incomplete
    """

    def __init__(self, tok: Tokenizer, *, skip_special: bool = False,
                 continuation: bool = False) -> None:
        self.tok = tok
        self.skip_special = skip_special
        self._utf8 = codecs.getincrementaldecoder("utf-8")(errors="replace")
        # Strip the dummy-prefix space of the first text token (SentencePiece rule).
        self._strip = bool(getattr(tok, "add_space_prefix", False)) and not continuation
        self._hf = getattr(tok, "_new_hf_stream", None)
        self._hf_state = self._hf(skip_special) if self._hf else None

    def push(self, tid: int) -> str:
        """Add one id; return the newly complete text (possibly '')."""
        tid = int(tid)
        if self._hf_state is not None:
            return self.tok._hf_stream_step(self._hf_state, tid)
        b = self.tok._piece_bytes(tid, self.skip_special)
        if self._strip and tid != self.tok.bos_id and self.tok._is_text_token(tid):
            self._strip = False
            if b.startswith(b" "):
                b = b[1:]
        return self._utf8.decode(b)

    def flush(self) -> str:
        """Return any held-back bytes (U+FFFD for an unfinished character)."""
        if self._hf_state is not None:
            return ""
        return self._utf8.decode(b"", final=True)


def gguf_common(meta: dict, default_add_bos: bool) -> dict:
    """Keyword arguments shared by the GGUF tokenizers (ids, flags, token types)."""
    tokens = meta["tokenizer.ggml.tokens"]
    types = meta.get("tokenizer.ggml.token_type")
    if types is None:
        types = np.full(len(tokens), NORMAL, dtype=np.int32)
    g = meta.get
    extra = [g(f"tokenizer.ggml.{k}_token_id") for k in ("eot", "eom")]
    return dict(
        tokens=tokens, token_types=types,
        bos_id=g("tokenizer.ggml.bos_token_id"), eos_id=g("tokenizer.ggml.eos_token_id"),
        add_bos=bool(g("tokenizer.ggml.add_bos_token", default_add_bos)),
        add_eos=bool(g("tokenizer.ggml.add_eos_token", False)),
        extra_eos=[i for i in extra if i is not None],
    )


def _valid_id(i: int | None, tokens: Sequence[str]) -> int | None:
    return int(i) if i is not None and 0 <= int(i) < len(tokens) else None


def _utf8(s: str) -> bytes:
    return s.encode("utf-8", errors="surrogateescape")
