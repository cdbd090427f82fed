"""``maxdecl serve SPEC``: load the model, start the engine, serve HTTP until SIGTERM."""

from __future__ import annotations

import sys

from ..errors import MaxdeclError


def serve_cli(args) -> int:
    """Implements ``maxdecl serve`` (see ``maxdecl serve --help``)."""
    try:
        import starlette  # noqa: F401
        import uvicorn  # noqa: F401
    except ImportError:
        raise MaxdeclError("maxdecl serve needs the 'serve' extra: "
                           "pip install 'maxdecl[serve]'") from None
    from . import open_server, serve

    if not 1 <= args.parallel <= 256:
        raise MaxdeclError(f"--parallel must be in 1..256, got {args.parallel}")
    if not 0 <= args.port <= 65535:
        raise MaxdeclError(f"--port must be in 0..65535, got {args.port}")
    template = None
    if args.chat_template:
        with open(args.chat_template, encoding="utf-8") as f:
            template = f.read()
    server = open_server(args.spec, args.weights, args.variant, args.parallel, template,
                         args.model_name)
    if server.note:
        print(server.note, file=sys.stderr, flush=True)
    print(f"maxdecl: serving {server.model_name} on http://{args.host}:{args.port}/v1 "
          f"({args.parallel} parallel)", file=sys.stderr, flush=True)
    serve(server, args.host, args.port)
    return 0
