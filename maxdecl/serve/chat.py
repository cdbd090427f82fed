"""``maxdecl chat SPEC``: multi-turn chat in the terminal with the model's chat template.

Replies stream as they are generated; the line editor keeps a history (readline,
``~/.maxdecl_chat_history``). ``/reset`` starts a new conversation (keeping the
system message), ``/exit`` (or end of input) leaves.
"""

from __future__ import annotations

import os
import sys

from ..errors import MaxdeclError

HISTORY = os.path.join(os.path.expanduser("~"), ".maxdecl_chat_history")


def _line_editor():
    try:
        import readline
    except ImportError:                          # no readline (Windows): plain input()
        return None
    try:
        readline.read_history_file(HISTORY)
    except OSError:
        pass
    return readline


def chat_cli(args, stdin=None, stdout=None) -> int:
    """Implements ``maxdecl chat`` (see ``maxdecl chat --help``)."""
    from . import make_sampler, open_server

    stdin, stdout = stdin or sys.stdin, stdout or sys.stdout
    template = None
    if args.chat_template:
        with open(args.chat_template, encoding="utf-8") as f:
            template = f.read()
    server = open_server(args.spec, args.weights, args.variant, 1, template)
    if server.template is None:
        server.engine.close()
        raise MaxdeclError(f"{args.spec}: the model has no chat template; give one with "
                           "--chat-template FILE")
    if server.note:
        print(server.note, file=sys.stderr)
    editor = _line_editor() if stdin.isatty() else None
    system = [{"role": "system", "content": args.system}] if args.system else []
    messages = list(system)
    params = {"temperature": args.temperature, "seed": args.seed}
    print(f"maxdecl chat: {server.model_name}. /reset starts over, /exit leaves.",
          file=sys.stderr)
    try:
        while True:
            try:
                line = input("> ") if stdin is sys.stdin and stdin.isatty() else stdin.readline()
            except EOFError:
                break
            if line == "":
                break
            line = line.rstrip("\n")
            if line.strip() == "/exit":
                break
            if line.strip() == "/reset":
                messages = list(system)
                print("[new conversation]", file=sys.stderr)
                continue
            if not line.strip():
                continue
            messages.append({"role": "user", "content": line})
            ids = server.engine.tokenizer.encode(server.template.render(messages), add_bos=True)

            def emit(text, reason):
                stdout.write(text)
                stdout.flush()

            handle = server.engine.submit(ids, make_sampler(params, ids), args.max_new_tokens,
                                          (), emit)
            reply = handle.wait().text
            stdout.write("\n")
            stdout.flush()
            messages.append({"role": "assistant", "content": reply})
    finally:
        server.engine.close()
        if editor is not None:
            try:
                editor.write_history_file(HISTORY)
            except OSError:
                pass
    return 0
