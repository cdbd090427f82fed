"""Byte-level BPE tokenizer (GGUF ``tokenizer.ggml.model = "gpt2"``: GPT-2, Llama 3, ...).

    1. split the text with the pre-tokenizer regexes named by ``tokenizer.ggml.pre``
       (each regex splits every piece further; text between matches is kept)
    2. write each word's UTF-8 bytes as printable characters (GPT-2 bytes-to-unicode)
    3. repeatedly merge the adjacent pair with the lowest merge rank (leftmost on
       ties); with ``ignore_merges`` (Llama 3) a word that is a token is taken whole
    4. look the final symbols up in the vocabulary

The regexes need ``\\p{L}``/``\\p{N}``, which Python's ``re`` lacks: the
``regex`` package is required (imported when a BPE tokenizer is built).
"""

from __future__ import annotations

import heapq

from ..errors import MaxdeclError, WeightsError
from .tokenizer_base import Tokenizer, gguf_common

_GPT2 = r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)"""
_LLAMA3 = (r"""(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])"""
           r"""|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+"""
           r"""|\s+(?!\S)|\s+""")
_QWEN2 = _LLAMA3.replace(r"\p{N}{1,3}", r"\p{N}")

# tokenizer.ggml.pre -> (regexes applied in order, ignore_merges, default add_bos), as in llama.cpp.
PRE_TOKENIZERS: dict[str, tuple[tuple[str, ...], bool, bool]] = {
    "default": ((r"[\p{P}\$\+<=>\^~\|]+", _GPT2, r"\p{N}+", r"[0-9][0-9][0-9]"), False, False),
    "llama-bpe": ((_LLAMA3,), True, True),
    "llama3": ((_LLAMA3,), True, True),
    "gpt-2": ((_GPT2,), False, False),
    "gpt2": ((_GPT2,), False, False),
    "mpt": ((_GPT2,), False, False),
    "olmo": ((_GPT2,), False, False),
    "starcoder": ((r"\p{N}", _GPT2), False, False),
    "refact": ((r"\p{N}", _GPT2), False, False),
    "smollm": ((r"\p{N}", _GPT2), False, False),
    "qwen2": ((_QWEN2,), False, False),
    "deepseek-r1-qwen": ((_QWEN2,), False, False),
}


def bytes_to_unicode() -> dict[int, str]:
    """GPT-2's byte -> printable character map.

    Bytes that are printable Latin-1 ('!'..'~', '¡'..'¬', '®'..'ÿ') map to
    themselves; the other 68 map, in byte order, to U+0100, U+0101, ...
    """
    keep = [*range(0x21, 0x7F), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
    table, extra = {}, 0
    for b in range(256):
        if b in keep:
            table[b] = chr(b)
        else:
            table[b] = chr(0x100 + extra)
            extra += 1
    return table


class BpeTokenizer(Tokenizer):
    """Byte-level BPE over a vocabulary and a ranked merge list.

    Args:
        tokens: token text per id (byte-level characters for normal tokens).
        merges: ``"left right"`` strings, best (rank 0) first.
        token_types: NORMAL/CONTROL/USER_DEFINED/... per id.
        pre: the ``tokenizer.ggml.pre`` name choosing the split regexes.
    """

    def __init__(self, tokens, merges, token_types, *, pre="default", bos_id=None,
                 eos_id=None, add_bos=None, add_eos=False, extra_eos=()):
        if pre not in PRE_TOKENIZERS:
            raise MaxdeclError(f"tokenizer.ggml.pre = {pre!r} is not supported; known: "
                               f"{', '.join(sorted(PRE_TOKENIZERS))}")
        patterns, self.ignore_merges, default_add_bos = PRE_TOKENIZERS[pre]
        self._setup(tokens, token_types, bos_id=bos_id, eos_id=eos_id,
                    add_bos=default_add_bos if add_bos is None else add_bos, add_eos=add_eos,
                    add_space_prefix=False, extra_eos=extra_eos)
        self.pre = pre
        self._regexes = [_regex().compile(p) for p in patterns]
        self.ranks: dict[tuple[str, str], int] = {}
        for rank, m in enumerate(merges):
            left, sep, right = m.partition(" ")
            if not sep:
                raise WeightsError(f"BPE merge {rank} {m!r}: expected 'left right'")
            self.ranks.setdefault((left, right), rank)
        self.byte_char = [c for _, c in sorted(bytes_to_unicode().items())]
        self.char_byte = {c: b for b, c in enumerate(self.byte_char)}
        self._cache: dict[str, list[int]] = {}

    @classmethod
    def from_gguf_metadata(cls, meta: dict, where: str = "GGUF") -> BpeTokenizer:
        """Build from ``tokenizer.ggml.*`` metadata (model "gpt2")."""
        merges = meta.get("tokenizer.ggml.merges")
        if merges is None:
            raise WeightsError(f"{where}: tokenizer.ggml.merges missing (needed by a gpt2 BPE)")
        kw = gguf_common(meta, default_add_bos=False)
        if "tokenizer.ggml.add_bos_token" not in meta:
            kw["add_bos"] = None                       # the pre-tokenizer's default
        return cls(merges=merges, pre=meta.get("tokenizer.ggml.pre", "default"), **kw)

    def split(self, text: str) -> list[str]:
        """Pre-tokenize: apply each regex in turn, keeping the text between matches."""
        parts = [text]
        for rx in self._regexes:
            new: list[str] = []
            for s in parts:
                pos = 0
                for m in rx.finditer(s):
                    a, b = m.span()
                    if a > pos:
                        new.append(s[pos:a])
                    if b > a:
                        new.append(s[a:b])
                    pos = b
                if pos < len(s):
                    new.append(s[pos:])
            parts = new
        return parts

    def _encode_fragment(self, text: str) -> list[int]:
        out: list[int] = []
        cache, bc = self._cache, self.byte_char
        for word in self.split(text):
            ids = cache.get(word)
            if ids is None:
                ids = self._bpe("".join([bc[b] for b in word.encode("utf-8", "surrogatepass")]))
                if len(cache) > 50_000:
                    cache.clear()
                cache[word] = ids
            out.extend(ids)
        return out

    def _bpe(self, word: str) -> list[int]:
        vocab = self.piece_to_id
        if self.ignore_merges and word in vocab:
            return [vocab[word]]
        syms = list(word)                 # current symbols; '' marks a merged-away one
        nxt = list(range(1, len(syms) + 1))
        prev = list(range(-1, len(syms) - 1))
        ranks = self.ranks

        def pair(i: int, j: int) -> tuple[int, int, int, str, str] | None:
            r = ranks.get((syms[i], syms[j]))
            return None if r is None else (r, i, j, syms[i], syms[j])

        queue = [p for p in (pair(i, i + 1) for i in range(len(syms) - 1)) if p is not None]
        heapq.heapify(queue)
        while queue:
            _, i, j, a, b = heapq.heappop(queue)
            if syms[i] != a or syms[j] != b or nxt[i] != j:   # stale
                continue
            syms[i], syms[j] = a + b, ""
            nxt[i] = nxt[j]
            if nxt[j] < len(syms):
                prev[nxt[j]] = i
            for x, y in ((prev[i], i), (i, nxt[i])):
                if x >= 0 and y < len(syms):
                    p = pair(x, y)
                    if p is not None:
                        heapq.heappush(queue, p)
        out: list[int] = []
        i = 0
        while i < len(syms):
            tid = vocab.get(syms[i])
            if tid is not None:
                out.append(tid)
            else:                         # incomplete vocabulary: one token per character
                out.extend(vocab[c] for c in syms[i] if c in vocab)
            i = nxt[i]
        return out

    def _normal_piece_bytes(self, tid: int, ty: int) -> bytes:
        cb = self.char_byte
        text = self.tokens[tid]
        if all(c in cb for c in text):
            return bytes([cb[c] for c in text])
        return b"".join(bytes([cb[c]]) if c in cb else c.encode("utf-8", "surrogateescape")
                        for c in text)


def _regex():
    try:
        import regex
    except ImportError:
        raise MaxdeclError("byte-level BPE tokenizers need the 'regex' package "
                           "(\\p{L} classes): pip install regex") from None
    return regex
