"""Token ids -> streamed text for one sequence: a stream decoder (whole UTF-8 characters,
SentencePiece's leading space kept as a continuation) and stop strings held back until
decided. Used by batched generation and the serving engine."""

from __future__ import annotations

from .stops import StopStrings


class DecodeSoFar:
    """A stream decoder for tokenizers without one: decode all ids so far and emit the
    new text, holding back a tail that ends in an incomplete UTF-8 character."""

    def __init__(self, tok):
        self.tok, self.ids, self.sent = tok, [], ""

    def push(self, tid: int) -> str:
        self.ids.append(tid)
        text = self.tok.decode(self.ids)
        if text.endswith("\ufffd"):
            return ""
        new, self.sent = text[len(self.sent):], text
        return new

    def flush(self) -> str:
        text = self.tok.decode(self.ids) if self.ids else ""
        new, self.sent = text[len(self.sent):], text
        return new


class TextStream:
    """``push(id) -> stopped``; ``emit(text)`` (optional) receives text as it completes;
    ``finish() -> text`` flushes the tail and returns everything emitted."""

    def __init__(self, tok, stop=(), emit=None):
        self.decoder = tok.stream_decoder(continuation=True) if hasattr(tok, "stream_decoder") \
            else DecodeSoFar(tok)
        self.stops, self.emit = StopStrings(stop), emit

    @property
    def stopped(self) -> bool:
        return self.stops.stopped

    def push(self, tid: int) -> bool:
        """Add one generated id; True once a stop string has completed."""
        piece = self.decoder.push(tid)
        text = self.stops.push(piece) if piece else ""
        if text and self.emit is not None:
            self.emit(text)
        return self.stops.stopped

    def finish(self) -> str:
        """The text of the whole sequence, the decoder's and the stop matcher's tails
        emitted first."""
        tail = self.decoder.flush()
        text = (self.stops.push(tail) if tail else "") + self.stops.flush()
        if text and self.emit is not None:
            self.emit(text)
        return self.stops.text
