"""The serving engine: one thread decodes every client's sequences together.

Requests come from any thread (the HTTP server's event loop, a chat prompt, a batch
job); ``Engine.submit`` queues them and returns a ``Handle``. The engine thread runs a
``BatchRunner`` (continuous batching: up to ``parallel`` sequences decode together,
first come first served), turns each new token into text (a stream decoder per
sequence, stop strings held back until they are decided) and hands the pieces to the
request's ``emit(text, finish_reason)`` callback; the last call carries the reason
("stop" or "length"). ``Handle.cancel()`` (a client that went away) ends a sequence
at its next token and frees its slot.
"""

from __future__ import annotations

import itertools
import queue
import threading
import time
from dataclasses import dataclass

from ..errors import MaxdeclError
from ..pipelines.batching import BatchRunner, Request
from ..pipelines.textstream import TextStream


@dataclass
class Completion:
    """What a finished request produced."""

    text: str
    ids: list
    finish_reason: str
    prompt_tokens: int
    prefill_s: float
    decode_s: float


class Handle:
    """A submitted request: ``cancel()`` it, or ``wait()`` for its Completion."""

    def __init__(self, request: Request, text: TextStream, prompt_tokens: int):
        self.request, self._text, self.prompt_tokens = request, text, prompt_tokens
        self._done = threading.Event()
        self.cancelled = False
        self.error: BaseException | None = None

    def cancel(self) -> None:
        """End the sequence at its next token (its slot is freed)."""
        self.cancelled = True

    @property
    def done(self) -> bool:
        return self._done.is_set()

    def wait(self, timeout: float | None = None) -> Completion:
        """Block until finished; raises the engine's error for this request, if any."""
        if not self._done.wait(timeout):
            raise TimeoutError("the request did not finish in time")
        if self.error is not None:
            raise self.error
        r = self.request
        return Completion(self._text.stops.text, list(r.ids), r.finish_reason, self.prompt_tokens,
                          r.prefill_s, r.decode_s)


class Engine:
    """Serves one model: ``submit(prompt_ids, sampler, max_tokens, stop, emit)``.

    Args:
        compiled: the model's ``CompiledGraph`` (a language model graph).
        tokenizer: encode/decode (with ``stream_decoder`` when it has one).
        parallel: how many sequences decode together.
        context: the model's context length (prompt + max_tokens must fit), or None.
    """

    def __init__(self, compiled, tokenizer, parallel: int = 4, context: int | None = None):
        self.tokenizer, self.context = tokenizer, context
        self.runner = BatchRunner(compiled, max_batch=parallel)
        self._inbox: queue.Queue = queue.Queue()
        self._ids = itertools.count()
        self._closed = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="maxdecl-engine", daemon=True)
        self._thread.start()

    def submit(self, prompt_ids: list, sampler, max_tokens: int, stop=(),
               emit=None) -> Handle:
        """Queue a sequence; ``sampler(logits_row, context_ids) -> id`` picks its tokens,
        ``emit(text, finish_reason_or_None)`` streams its text."""
        if self._closed.is_set():
            raise MaxdeclError("the engine is shut down")
        if not prompt_ids:
            raise MaxdeclError("the prompt is empty (no tokens to start from)")
        if self.context is not None and len(prompt_ids) + max_tokens > self.context:
            raise MaxdeclError(f"the prompt ({len(prompt_ids)} tokens) plus max_tokens "
                               f"({max_tokens}) exceeds the model's context of "
                               f"{self.context} tokens")
        tok = self.tokenizer
        text = TextStream(tok, stop, None if emit is None else (lambda t: emit(t, None)))
        eos = frozenset(getattr(tok, "eos_ids", ()) or ())
        holder: dict = {}

        def on_token(tid: int) -> bool:
            return text.push(tid) or holder["handle"].cancelled

        request = Request(list(prompt_ids), None, int(max_tokens), eos, on_token)
        request.sample = lambda row: sampler(row, request.prompt + request.ids)
        handle = holder["handle"] = Handle(request, text, len(prompt_ids))
        handle._emit = emit
        self._inbox.put(handle)
        return handle

    def close(self, timeout: float = 10.0) -> None:
        """Stop the engine thread (pending requests end with finish_reason "stop")."""
        self._closed.set()
        self._inbox.put(None)
        self._thread.join(timeout)

    # -- the engine thread ------------------------------------------------------------
    def _loop(self) -> None:
        live: list[Handle] = []
        while not self._closed.is_set():
            try:
                item = self._inbox.get(timeout=None if not live else 0)
            except queue.Empty:
                item = False
            while item is not False:
                if item is None:
                    break
                live.append(item)
                self.runner.add(item.request)
                try:
                    item = self._inbox.get_nowait()
                except queue.Empty:
                    item = False
            if item is None:
                break
            for h in live:
                if h.cancelled and not h.request.done:
                    h.request.finish_reason = "stop"     # frees its slot or its queue place
            try:
                self.runner.step()
            except Exception as e:  # noqa: BLE001 - fail the requests in flight, keep serving
                for h in live:
                    if not h.done:
                        h.error = e if isinstance(e, MaxdeclError) else \
                            MaxdeclError(f"{type(e).__name__}: {e}")
                        h.request.finish_reason = h.request.finish_reason or "error"
                self.runner = BatchRunner(self.runner.compiled, self.runner.max_batch)
            for h in [h for h in live if h.request.done]:
                self._finish(h)
            live = [h for h in live if not h.done]
            time.sleep(0)                      # let the server thread take the GIL
        for h in live:
            h.request.finish_reason = h.request.finish_reason or "stop"
            self._finish(h)

    @staticmethod
    def _finish(h: Handle) -> None:
        if h.done:
            return
        before = len(h._text.stops.text)
        h._text.emit = None                            # the tail goes out with the reason
        tail = h._text.finish()[before:]
        reason = h.request.finish_reason
        if reason not in ("stop", "length", "error") or h._text.stopped or h.cancelled:
            reason = "stop"
        h.request.finish_reason = reason
        if h._emit is not None and h.error is None:
            h._emit(tail, reason)
        h._done.set()
