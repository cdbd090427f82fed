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
    """The sampler of one request (temperature 0 is greedy; top_k 0 means off)."""
    from ..pipelines.sampling import Sampler

    top_k = params.get("top_k") or None
    top_p = params.get("top_p")
    return Sampler(params.get("temperature", 0.0), top_k, None if top_p == 1.0 else top_p,
                   params.get("seed", 0) % (1 << 64))


def open_server(spec, weights=None, variant=None, parallel: int = 4, chat_template=None,
                model_name: str | None = None, tokenizer=None) -> Server:
    """Load the model once and start its engine; returns the ``Server`` the app serves."""
    from ..pipelines.chat_template import ChatTemplate
    from ..pipelines.model_loading import load_model

    session, tok, note = load_model(spec, weights, variant)
    tok = tokenizer or tok
    if tok is None:
        from ..errors import MaxdeclError

        raise MaxdeclError("the weights carry no tokenizer: serving needs one")
    meta = dict(getattr(session.weights, "metadata", {}) or {})
    source = chat_template or meta.get("tokenizer.chat_template") or \
        getattr(getattr(session, "spec", None), "chat_template", "") or \
        _spec_template(spec)
    tokens = getattr(tok, "tokens", None)

    def text_of(i):
        return tokens[i] if tokens is not None and i is not None and 0 <= i < len(tokens) else ""

    template = ChatTemplate(source, text_of(getattr(tok, "bos_id", None)),
                            text_of(getattr(tok, "eos_id", None))) if source else None
    params = dict(getattr(session.graph, "params", {}) or {})
    context = _context(spec, variant, params)
    engine = Engine(session.compiled, tok, parallel=parallel, context=context)
    name = model_name or _spec_name(spec)
    server = Server(engine, name, template, make_sampler)
    server.note = note
    return server


def _spec_template(spec) -> str:
    from ..spec import load_spec

    return load_spec(spec).chat_template if not hasattr(spec, "chat_template") \
        else spec.chat_template


def _spec_name(spec) -> str:
    from ..spec import load_spec

    return spec.name if hasattr(spec, "name") else load_spec(spec).name


def _context(spec, variant, params) -> int | None:
    from ..spec import load_spec

    s = spec if hasattr(spec, "params") else load_spec(spec, variant)
    ctx = params.get("context", s.params.get("context"))
    return int(ctx) if isinstance(ctx, int) and ctx > 0 else None


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
