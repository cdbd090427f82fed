"""The byte tokenizer of random-weight runs: ids 0-255 are UTF-8 bytes."""

from __future__ import annotations


class ByteTokenizer:
    """Ids 0-255 are UTF-8 bytes: the tokenizer of random-weight ``tiny`` runs.

    Example::

        ByteTokenizer().encode("Hi")      # [72, 105]
    """

    vocab_size = 256
    bos_id = None
    eos_ids = frozenset()

    def encode(self, text: str, add_bos: bool = True) -> list[int]:
        """The UTF-8 bytes of ``text`` ([0] for the empty text: a prompt needs a token)."""
        return list(text.encode("utf-8")) or [0]

    def decode(self, ids) -> str:
        """The text of byte ids (invalid UTF-8 becomes U+FFFD)."""
        return bytes(int(i) % 256 for i in ids).decode("utf-8", errors="replace")
