"""Stop strings for streamed text: the output ends before the first stop string, and
no part of a stop string is ever emitted (a tail that could still begin one is held
back until the next piece decides)."""

from __future__ import annotations


class StopStrings:
    """Feed text pieces with ``push``; it returns what is safe to emit now.

    Example::

        s = StopStrings(["\\n\\n"])
        s.push("Hello\\n")     # "Hello"   (the "\\n" may start "\\n\\n": held back)
        s.push("\\nWorld")     # ""        (stopped: s.stopped is True)
    """

    def __init__(self, stops=()):
        self.stops = [s for s in (stops or ()) if s]
        self.held = ""
        self.stopped = False
        self.text = ""          # everything emitted so far

    def push(self, piece: str) -> str:
        """Add ``piece``; returns the newly emittable text ("" once stopped)."""
        if self.stopped:
            return ""
        buf = self.held + piece
        cut = min((i for i in (buf.find(s) for s in self.stops) if i >= 0), default=-1)
        if cut >= 0:
            self.stopped, self.held = True, ""
            return self._emit(buf[:cut])
        keep = max((k for s in self.stops for k in range(1, len(s))
                    if buf.endswith(s[:k])), default=0)
        self.held = buf[len(buf) - keep:] if keep else ""
        return self._emit(buf[:len(buf) - keep])

    def flush(self) -> str:
        """At the end of generation: the held-back tail (it never became a stop string)."""
        rest, self.held = ("" if self.stopped else self.held), ""
        return self._emit(rest)

    def _emit(self, text: str) -> str:
        self.text += text
        return text
