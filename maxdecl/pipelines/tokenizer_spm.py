"""SentencePiece-style tokenizer: greedy highest-score merges with byte fallback.

Used for GGUF ``tokenizer.ggml.model = "llama"`` (Llama 1/2, Gemma, ...) and
for llama2.c ``tokenizer.bin``. The algorithm is llama.cpp's SPM tokenizer:

    1. spaces -> U+2581 ("▁"); with add_space_prefix a "▁" goes in front
    2. split the text into characters (the initial symbols)
    3. for every adjacent pair whose concatenation is a vocabulary piece,
       queue (score of that piece, left position); repeatedly merge the
       highest-score pair (leftmost on ties), re-queueing the new neighbours
    4. a final symbol that is a piece -> its id; otherwise its UTF-8 bytes
       -> the byte tokens ``<0xNN>`` (llama2.c: id = byte + 3)
"""

from __future__ import annotations

import heapq
import struct
from array import array
from pathlib import Path

import numpy as np

from ..errors import WeightsError
from .tokenizer_base import BYTE, CONTROL, NORMAL, UNKNOWN, Tokenizer, gguf_common

SPACE = "\u2581"   # SentencePiece's visible space "▁"


class SpmTokenizer(Tokenizer):
    """SentencePiece-style tokenizer over a piece vocabulary with scores.

    Args:
        tokens: piece text per id (spaces written as ``space``).
        scores: merge priority per id (higher merges first).
        token_types: NORMAL/UNKNOWN/CONTROL/USER_DEFINED/UNUSED/BYTE per id.
        space: the character that stands for a space in pieces ("▁"; llama2.c: " ").
        byte_offset: llama2.c's byte-token rule (id = byte + offset); None: look up ``<0xNN>``.
        unk_id: id used when a byte has no token.
    """

    def __init__(self, tokens, scores, token_types, *, bos_id, eos_id, add_bos=True,
                 add_eos=False, add_space_prefix=True, extra_eos=(), space=SPACE,
                 byte_offset=None, unk_id=None, parse_specials=True):
        self._setup(tokens, token_types, bos_id=bos_id, eos_id=eos_id, add_bos=add_bos,
                    add_eos=add_eos, add_space_prefix=add_space_prefix, extra_eos=extra_eos,
                    parse_specials=parse_specials)
        # merge priority per id, as an array: float32 scores kept float32, others as float
        if isinstance(scores, np.ndarray) and scores.dtype == np.float32:
            self.scores = array("f", np.ascontiguousarray(scores).tobytes())
        else:
            self.scores = array("d", np.asarray(scores, dtype=np.float64).tobytes())
        self.space = space
        self.unk_id = unk_id
        if byte_offset is not None:
            self.byte_ids = [b + byte_offset for b in range(256)]
        else:
            self.byte_ids = [self._lookup_byte(b) for b in range(256)]

    @classmethod
    def from_gguf_metadata(cls, meta: dict) -> SpmTokenizer:
        """Build from ``tokenizer.ggml.*`` metadata (model "llama")."""
        kw = gguf_common(meta, default_add_bos=True)
        n = len(kw["tokens"])
        scores = meta.get("tokenizer.ggml.scores")
        if scores is None or len(scores) != n:
            raise WeightsError(f"GGUF tokenizer.ggml.scores: expected {n} scores, found "
                               f"{None if scores is None else len(scores)}")
        return cls(scores=scores,
                   add_space_prefix=bool(meta.get("tokenizer.ggml.add_space_prefix", True)),
                   unk_id=meta.get("tokenizer.ggml.unknown_token_id"), **kw)

    def _lookup_byte(self, b: int) -> int | None:
        """llama.cpp byte_to_token: ``<0xNN>``, else the byte as a 1-char piece, else unk."""
        tid = self.piece_to_id.get(f"<0x{b:02X}>")
        if tid is None and b < 0x80:
            tid = self.piece_to_id.get(chr(b))
        return tid if tid is not None else self.unk_id

    def _encode_fragment(self, text: str) -> list[int]:
        if self.space != " ":
            text = text.replace(" ", self.space)
        else:       # pieces written with " " (llama2.c): a literal "▁" is a space, as in
            text = text.replace(SPACE, " ")     # SentencePiece, where both are one symbol
        vocab, scores = self.piece_to_id, self.scores
        n = len(text)
        if n == 0:
            return []
        # Symbol i covers text[i : i + size[i]]; a merged-away symbol has size 0.
        size = [1] * n
        prev = list(range(-1, n - 1))
        nxt = list(range(1, n + 1))
        nxt[-1] = -1
        # Bigram queue entries: (-score of the merged piece, left, right, merged length);
        # heapq pops the highest score first, then the leftmost pair (llama.cpp's order).
        def bigram(left: int, right: int) -> tuple[float, int, int, int] | None:
            length = size[left] + size[right]
            tid = vocab.get(text[left:left + length])
            return None if tid is None else (-scores[tid], left, right, length)

        queue = [b for b in (bigram(i - 1, i) for i in range(1, n)) if b is not None]
        heapq.heapify(queue)
        while queue:
            _, left, right, length = heapq.heappop(queue)
            # Stale entry: one side was merged away or has grown since it was queued.
            if size[left] == 0 or size[right] == 0 or size[left] + size[right] != length:
                continue
            size[left] = length
            size[right] = 0
            nxt[left] = nxt[right]
            if nxt[right] >= 0:
                prev[nxt[right]] = left
            for a, b in ((prev[left], left), (left, nxt[left])):
                if a >= 0 and b >= 0:
                    item = bigram(a, b)
                    if item is not None:
                        heapq.heappush(queue, item)

        out: list[int] = []
        i = 0
        while i != -1:
            piece = text[i:i + size[i]]
            tid = vocab.get(piece)
            if tid is not None:
                out.append(tid)
            else:
                for b in piece.encode("utf-8", errors="surrogateescape"):
                    bid = self.byte_ids[b]
                    if bid is not None:
                        out.append(bid)
            i = nxt[i]
        return out

    def _normal_piece_bytes(self, tid: int, ty: int) -> bytes:
        text = self.tokens[tid]
        if ty == BYTE and len(text) == 6 and text.startswith("<0x"):   # "<0xNN>"
            try:
                return bytes([int(text[3:5], 16)])
            except ValueError:
                pass
        return text.replace(self.space, " ").encode("utf-8", "surrogateescape")


def load_llama2c_bin(path: str | Path) -> SpmTokenizer:
    """Read a llama2.c ``tokenizer.bin``.

    Layout: ``max_token_length: i32``, then per token ``score: f32``,
    ``length: i32``, ``length`` bytes. The vocabulary size is the number of
    records. As in llama2.c: pieces use a plain space, ids 1/2 are BOS/EOS,
    byte ``b`` is token ``b + 3``, a dummy " " prefix is always added, and no
    special tokens are parsed from the text.
    """
    path = Path(path)
    data = path.read_bytes()
    if len(data) < 4:
        raise WeightsError(f"{path}: llama2.c tokenizer.bin too short ({len(data)} bytes)")
    (max_len,) = struct.unpack_from("<i", data, 0)
    if not 0 < max_len < 1 << 16:
        raise WeightsError(f"{path}: not a llama2.c tokenizer.bin (max_token_length={max_len})")
    tokens: list[str] = []
    scores: list[float] = []
    off = 4
    while off < len(data):
        if off + 8 > len(data):
            raise WeightsError(f"{path}: truncated record header at byte {off} "
                               f"(token {len(tokens)})")
        score, n = struct.unpack_from("<fi", data, off)
        off += 8
        if n < 0 or off + n > len(data):
            raise WeightsError(f"{path}: token {len(tokens)} length {n} runs past end of file")
        tokens.append(data[off:off + n].decode("utf-8", errors="surrogateescape"))
        scores.append(score)
        off += n
    if len(tokens) < 259:
        raise WeightsError(f"{path}: {len(tokens)} tokens; a llama2.c vocabulary has at least "
                           "259 (unk, bos, eos and 256 byte tokens)")
    types = [NORMAL] * len(tokens)
    types[0], types[1], types[2] = UNKNOWN, CONTROL, CONTROL
    for b in range(256):
        types[b + 3] = BYTE
    return SpmTokenizer(tokens, scores, types, bos_id=1, eos_id=2, add_bos=True, add_eos=False,
                        add_space_prefix=True, space=" ", byte_offset=3, unk_id=0,
                        parse_specials=False)
