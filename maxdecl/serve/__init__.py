"""``maxdecl serve``: an OpenAI-compatible HTTP server over a model's continuous batching.

Example::

    maxdecl serve specs/gemma3.yaml --port 8080 --parallel 4
    curl http://127.0.0.1:8080/v1/completions -H 'Content-Type: application/json' \\
         -d '{"prompt": "Once upon a time", "max_tokens": 16, "temperature": 0}'
"""

from __future__ import annotations

from .app import Server, build_app, sampling_from
from .engine import Completion, Engine, Handle

__all__ = ["Server", "Engine", "Handle", "Completion", "build_app", "sampling_from",
           "open_server", "serve"]


def make_sampler(params: dict, prompt_ids: list):
    """The ``Sampler`` of one request (``sampler(logits_row, context) -> id``), from the
    fields ``sampling_from`` checked."""
    from ..pipelines.sampling import Sampler

    keys = ("temperature", "top_k", "top_p", "min_p", "repeat_penalty", "presence_penalty",
            "frequency_penalty", "seed")
    return Sampler(**{k: params[k] for k in keys if k in params})


def open_server(spec, weights=None, variant=None, parallel: int = 4, chat_template=None,
                model_name: str | None = None, tokenizer=None) -> Server:
    """Load the model once and start its engine; returns the ``Server`` the app serves."""
    from ..model import load_model
    from ..pipelines.chat_template import ChatTemplate

    model = load_model(spec, weights, variant, tokenizer)
    tok = model.tokenizer
    if tok is None:
        from ..errors import MaxdeclError

        raise MaxdeclError("the weights carry no tokenizer: serving needs one")
    meta = dict(getattr(model.weights, "metadata", {}) or {})
    source = chat_template or meta.get("tokenizer.chat_template") or model.spec.chat_template
    tokens = getattr(tok, "tokens", None)

    def text_of(i):
        return tokens[i] if tokens is not None and i is not None and 0 <= i < len(tokens) else ""

    template = ChatTemplate(source, text_of(getattr(tok, "bos_id", None)),
                            text_of(getattr(tok, "eos_id", None))) if source else None
    engine = Engine(model.compiled, tok, parallel=parallel, context=model.context)
    name = model_name or model.spec.name
    server = Server(engine, name, template, make_sampler)
    server.note = model.note
    return server


def serve(server: Server, host: str = "127.0.0.1", port: int = 8080, log_level="info") -> None:
    """Run the HTTP server until SIGINT/SIGTERM: uvicorn stops taking connections,
    finishes the open responses, then the engine stops; the process exits with 0."""
    import contextlib

    import uvicorn

    class _Server(uvicorn.Server):
        @contextlib.contextmanager
        def capture_signals(self):
            with super().capture_signals():
                yield
                # a signal ended a clean shutdown: exit normally instead of re-raising it
                getattr(self, "_captured_signals", []).clear()

    try:
        _Server(uvicorn.Config(build_app(server), host=host, port=port,
                               log_level=log_level)).run()
    finally:
        server.engine.close()
