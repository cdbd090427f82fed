"""Stop strings over streamed text: the text ends before the first stop string, and a
stream never shows part of one (text that might begin a stop string is held back
until it cannot)."""

from __future__ import annotations


class StopStrings:
    """Feed text pieces with ``push``; it returns the text safe to show and whether a stop
    string was completed.

    Example::

        s = StopStrings(["\\n\\n"])
        s.push("Hello\\n")      # ('Hello', False): the '\\n' might begin the stop string
        s.push("\\nWorld")      # ('', True): the text ends before '\\n\\n'
        s.text                  # 'Hello'
    """

    def __init__(self, stops):
        self.stops = tuple(stops)
        self._longest = max((len(s) for s in self.stops), default=0)
        self._buf = ""        # all text so far
        self._shown = 0       # characters of _buf already returned
        self.stopped = False

    @property
    def text(self) -> str:
        """The text up to the first stop string (all of it when none was seen)."""
        return self._buf

    def push(self, piece: str) -> tuple[str, bool]:
        """Add ``piece``; returns (newly safe text, whether a stop string ended the text)."""
        if self.stopped or not piece:
            return "", self.stopped
        start = max(0, len(self._buf) - self._longest + 1)
        self._buf += piece
        hits = [i for i in (self._buf.find(s, start) for s in self.stops) if i >= 0]
        if hits:
            self._buf = self._buf[:min(hits)]
            self.stopped = True
            return self._take(len(self._buf)), True
        return self._take(len(self._buf) - self._held()), False

    def flush(self) -> str:
        """The held-back text once no more pieces come."""
        return self._take(len(self._buf))

    def _held(self) -> int:
        """How many trailing characters could still begin a stop string."""
        for k in range(min(self._longest - 1, len(self._buf)), 0, -1):
            tail = self._buf[-k:]
            if any(s.startswith(tail) for s in self.stops):
                return k
        return 0

    def _take(self, end: int) -> str:
        end = max(end, self._shown)
        out, self._shown = self._buf[self._shown:end], end
        return out
