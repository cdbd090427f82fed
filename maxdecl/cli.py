"""The ``maxdecl`` command: validate | run | serve | chat | batch | quantize | export |
inspect | graph | schema | ops.

Each subcommand imports only what it needs (``validate`` never imports numba).
Errors print one line (``file:line:col: message`` or the layer path) and no
traceback unless ``--debug``. Exit codes: 0 ok, 1 invalid input / failure,
2 usage or I/O error.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

from . import __version__
from .errors import InputError, MaxdeclError

EXIT_OK, EXIT_INVALID, EXIT_USAGE = 0, 1, 2


class UsageError(Exception):
    """Bad command line or unreadable file: exit 2."""


class _Help(argparse.ArgumentDefaultsHelpFormatter):
    """Help that shows each option's default: argparse's ``(default: X)`` where one is
    set, the help text's own words where the default is computed (None)."""

    def _get_help_string(self, action):
        if action.default is None or action.default is False or "default:" in (action.help or ""):
            return action.help
        return super()._get_help_string(action)


class _Parser(argparse.ArgumentParser):
    """argparse with a one-line error (exit 2) instead of the usage block."""

    def error(self, message):
        self.exit(EXIT_USAGE, f"{self.prog}: error: {message} (see --help)\n")


_QUANTIZE_EPILOG = """\
encodings (--encoding):
  q4_0 q5_0 q8_0 q4_k q6_k bf16  every float tensor of rank >= 2 (any case: Q8_0);
                                 with --spec, the spec's encodings.overrides come first
  spec                           the spec's own encodings rules (needs --spec)
  Q4_K_M                         llama.cpp's mix: q4_k; q6_k for output.weight and for
                                 attn_v/ffn_down of the layers llama.cpp picks; rows not
                                 a multiple of 256 fall back to q5_0/q8_0 as llama.cpp does
A run that quantizes nothing (e.g. q4_k on 288-wide rows) fails with exit 1; with --spec,
SRC must hold exactly the spec's tensors (missing/unexpected names fail with exit 1).
"""


def _parser() -> argparse.ArgumentParser:
    p = _Parser(prog="maxdecl", description="Neural networks declared as YAML.")
    p.add_argument("--debug", action="store_true", help="show tracebacks on errors")
    p.add_argument("--version", action="version", version=f"maxdecl {__version__}")
    sub = p.add_subparsers(dest="cmd", metavar="COMMAND", parser_class=_Parser)

    v = sub.add_parser("validate", help="check specs against the schema and semantic rules")
    v.add_argument("specs", nargs="+", metavar="SPEC",
                   help="spec files, or directories (every *.yaml / *.yml below, sorted)")
    v.add_argument("--format", choices=["text", "json", "github"], default="text",
                   help="output format; json/github also report I/O errors (exit 2) "
                        "(default: %(default)s)")

    r = sub.add_parser("run", formatter_class=_Help,
                       help="generate text with a model spec, or run any spec on .npy inputs",
                       description="Generate text with a language-model spec (llama.cpp-style "
                       "options), or run any other spec once on --input arrays.")
    r.add_argument("spec", metavar="SPEC", help="the model spec (YAML)")
    r.add_argument("-m", "--weights", metavar="PATH",
                   help="GGUF, safetensors, HF dir or llama2.c .bin (default: models/<spec "
                   "name>/, then known sources, else seeded random weights)")
    r.add_argument("-p", "--prompt", metavar="TEXT",
                   help="the prompt; '-' reads it from stdin (default: 'Once upon a time')")
    r.add_argument("-f", "--file", metavar="FILE", help="read the prompt from a UTF-8 file")
    r.add_argument("-n", "--max-new-tokens", type=int, default=32, metavar="N",
                   help="tokens to generate at most")
    r.add_argument("--temp", "--temperature", dest="temperature", type=float, default=0.0,
                   metavar="T", help="sampling temperature; 0 is greedy")
    r.add_argument("--top-k", type=int, default=0, metavar="K",
                   help="keep the K most likely tokens; 0 is off")
    r.add_argument("--top-p", type=float, default=1.0, metavar="P",
                   help="keep the smallest set of tokens reaching probability P; 1 is off")
    r.add_argument("--min-p", type=float, default=0.0, metavar="P",
                   help="drop tokens less likely than P times the top one; 0 is off")
    r.add_argument("--repeat-penalty", type=float, default=1.0, metavar="R",
                   help="penalise tokens of the last --repeat-last-n; 1 is off")
    r.add_argument("--repeat-last-n", type=int, default=64, metavar="N",
                   help="tokens the repeat penalty looks back over; -1 is all, 0 is off")
    r.add_argument("-s", "--seed", type=int, default=0, metavar="S",
                   help="sampling seed; -1 draws a random one")
    r.add_argument("--stop", action="append", metavar="TEXT",
                   help="stop before this text (repeatable)")
    r.add_argument("-c", "--ctx-size", type=int, default=0, metavar="N",
                   help="context limit for prompt + new tokens; 0 is the model's")
    r.add_argument("--lookup", type=int, default=0, metavar="N",
                   help="prompt lookup decoding (greedy): draft up to N tokens (<= 15) from "
                   "n-grams of the context and verify them in one step; same ids, fewer steps")
    r.add_argument("--truncate", action="store_true",
                   help="keep the prompt's last tokens when it does not fit the context "
                   "(default: an error)")
    r.add_argument("--decoder-prompt", metavar="IDS",
                   help="encoder-decoders: token ids (comma or space separated) the decoder "
                   "reads after its start token, e.g. mBART-50's target language")
    r.add_argument("--activations", choices=("f32", "q8"),
                   help="q8: decode matmuls round x to int8 per 32 values (as llama.cpp; "
                   "faster, not bit-identical); default f32, or MAXDECL_ACTIVATIONS")
    r.add_argument("-t", "--threads", type=int, metavar="N",
                   help="kernel threads (default: all CPUs numba may use)")
    r.add_argument("--tokenizer", metavar="PATH",
                   help="tokenizer file or HF dir (default: the one with the weights)")
    r.add_argument("--variant", metavar="NAME", help="spec variant (default: the spec's)")
    r.add_argument("--input", action="append", metavar="NAME=FILE.npy",
                   help="a graph input, for specs that are not language models (repeatable)")
    r.add_argument("--output", metavar="OUT.npz", help="save the outputs of --input runs")

    sv = sub.add_parser("serve", help="OpenAI-compatible HTTP server (needs the 'serve' extra)",
                        formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    sv.add_argument("spec", metavar="SPEC")
    sv.add_argument("-m", "--weights", help="GGUF, safetensors, HF dir or llama2.c .bin "
                    "(default: models/<spec name>/ or a known source)")
    sv.add_argument("--variant", help="spec variant (default: the weights decide)")
    sv.add_argument("--host", default="127.0.0.1", help="address to bind")
    sv.add_argument("--port", type=int, default=8080, help="TCP port")
    sv.add_argument("--parallel", type=int, default=4, help="sequences decoded together")
    sv.add_argument("--chat-template", metavar="FILE",
                    help="Jinja chat template (default: the weights', else the spec's)")
    sv.add_argument("--model-name", help="model id clients send (default: the spec's name)")

    ch = sub.add_parser("chat", help="interactive chat in the terminal",
                        formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    ch.add_argument("spec", metavar="SPEC")
    ch.add_argument("-m", "--weights", help="weights file or HF dir")
    ch.add_argument("--variant", help="spec variant")
    ch.add_argument("--chat-template", metavar="FILE", help="Jinja chat template")
    ch.add_argument("--system", help="a system message to start with")
    ch.add_argument("-n", "--max-new-tokens", type=int, default=256, help="tokens per reply")
    ch.add_argument("--temp", "--temperature", dest="temperature", type=float, default=0.0,
                    help="sampling temperature (0 = greedy)")
    ch.add_argument("-s", "--seed", type=int, default=0, help="sampling seed")

    bt = sub.add_parser("batch", help="JSONL prompts in, JSONL results out (local or Ray)",
                        formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    bt.add_argument("spec", metavar="SPEC")
    bt.add_argument("-m", "--weights", help="weights file or HF dir")
    bt.add_argument("--variant", help="spec variant")
    bt.add_argument("--input", required=True, metavar="PROMPTS.jsonl",
                    help='one {"id": ..., "prompt": ...} a line (+ optional OpenAI fields)')
    bt.add_argument("--output", required=True, metavar="RESULTS.jsonl",
                    help="results, one a line; ids already there are skipped (resume)")
    bt.add_argument("--parallel", type=int, default=8, help="sequences decoded together")
    bt.add_argument("--ray", nargs="?", const="", default=None, metavar="ADDRESS",
                    help="run on Ray Data (a local Ray when no address is given)")
    bt.add_argument("--ray-workers", type=int, default=1, help="model replicas on Ray")

    q = sub.add_parser(
        "quantize", help="quantize a checkpoint, safetensors, GGUF, HF dir or llama2.c .bin",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Re-encode SRC's tensors. The output (a maxdecl checkpoint, or a GGUF "
                    "when OUT ends in .gguf) carries the tokenizer and the hyperparameters, "
                    "so `maxdecl run SPEC --weights OUT` needs nothing else.",
        epilog=_QUANTIZE_EPILOG)
    q.add_argument("src", metavar="SRC", help="weights to re-encode")
    q.add_argument("-o", "--output", required=True, metavar="OUT",
                   help="OUT.safetensors (maxdecl checkpoint) or OUT.gguf")
    q.add_argument("--encoding", required=True, metavar="ENC",
                   help="an encoding, 'spec' or Q4_K_M (see below)")
    q.add_argument("--spec", metavar="SPEC",
                   help="map SRC's names/hyperparameters by this spec and check they fit it")

    e = sub.add_parser("export", help="write a GGUF that llama.cpp runs",
                       description="Write SRC (GGUF, maxdecl checkpoint, HF dir, llama2.c "
                                   ".bin) as a GGUF: the spec's formats.gguf architecture "
                                   "keys, the tokenizer, every tensor in the encoding it "
                                   "was loaded in (float32 stays F32; `maxdecl quantize` "
                                   "first for a smaller file).")
    e.add_argument("src", metavar="SRC", help="weights the spec runs")
    e.add_argument("--spec", required=True, metavar="SPEC", help="the model's spec")
    e.add_argument("-o", "--output", required=True, metavar="OUT.gguf", help="the GGUF to write")
    e.add_argument("--variant", help="spec variant (default: the spec's default)")

    i = sub.add_parser("inspect", help="list a weights file's tensors (or --metadata)")
    i.add_argument("weights", metavar="WEIGHTS")
    i.add_argument("--metadata", action="store_true",
                   help="list the metadata instead: GGUF key/values, safetensors __metadata__ "
                        "(long arrays summarized)")

    g = sub.add_parser("graph", help="print a spec's layer tree with op and parameter counts")
    g.add_argument("spec", metavar="SPEC")
    g.add_argument("--variant")
    g.add_argument("--dot", action="store_true", help="Graphviz dot of the built graph")

    sc = sub.add_parser("schema", help="print (or write) the spec JSON Schema, for editors")
    sc.add_argument("-o", "--output", metavar="FILE",
                    help="write the schema to FILE (e.g. .vscode/maxdecl.schema.json) instead "
                         "of printing it")
    sub.add_parser("ops", help="print the op reference (inputs, attributes, type rules)")
    return p


def main(argv=None) -> int:
    """Entry point of the ``maxdecl`` console script."""
    parser = _parser()
    args = parser.parse_args(argv)
    if not args.cmd:
        parser.print_help()
        return EXIT_USAGE
    try:
        return COMMANDS[args.cmd](args)
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        return EXIT_OK
    except (UsageError, InputError, OSError) as e:
        if args.debug:
            raise
        print(f"maxdecl: error: {_oneline(e)}", file=sys.stderr)
        return EXIT_USAGE
    except MaxdeclError as e:
        if args.debug:
            raise
        print(f"maxdecl: error: {_oneline(e)}", file=sys.stderr)
        return EXIT_INVALID


def console_main() -> None:
    """The ``maxdecl`` command: ``main()``, then, once numba is loaded, a fast exit.

    Python's teardown after a command that ran kernels (numba's many modules and
    objects) took 0.5 s of the 2.7 s of ``maxdecl run ... --max-new-tokens 1``
    here. Everything a command writes is closed or flushed by then, so the process
    ends with ``os._exit`` after flushing the standard streams.
    """
    code = main()
    if "numba" not in sys.modules:
        raise SystemExit(code)
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (BrokenPipeError, ValueError):
            pass
    os._exit(code)


def _oneline(e: BaseException) -> str:
    if isinstance(e, OSError) and e.filename:
        return f"{e.filename}: {e.strerror or e}"
    return " ".join(str(e).split("\n")[0:1]) or type(e).__name__


def _need_file(path: str) -> None:
    if not os.path.exists(path):
        raise UsageError(f"{path}: no such file")


# -- subcommands ----------------------------------------------------------------------
def cmd_validate(args) -> int:
    from .spec import format_problems, validate_spec

    paths, io_errors = _spec_paths(args.specs)
    if io_errors and args.format == "text":
        raise UsageError(": ".join(io_errors[0]))
    problems = []
    for path in paths:
        try:
            problems.extend(validate_spec(path))
        except OSError as e:
            if args.format == "text":
                raise
            io_errors.append((path, f"cannot read: {e.strerror or e}"))
    if io_errors:
        print(_io_report(io_errors, args.format, format_problems(problems, args.format)))
        return EXIT_USAGE
    text = format_problems(problems, args.format)
    if text:
        print(text, flush=True)     # before the summary on stderr, when both share a pipe
    if args.format == "text":
        n = len(paths)
        if problems:
            print(f"{len(problems)} problem(s) in {len({p.file for p in problems})} of {n} "
                  f"spec(s)", file=sys.stderr)
        else:
            print(f"{n} spec(s) valid", file=sys.stderr)
    return EXIT_INVALID if problems else EXIT_OK


def _spec_paths(args: list) -> tuple[list, list]:
    """(spec files, I/O errors as (file, message)): a directory gives every *.yaml / *.yml
    below it, sorted."""
    paths, errors = [], []
    for arg in args:
        if os.path.isdir(arg):
            found = sorted(os.path.join(d, f) for d, _, files in os.walk(arg) for f in files
                           if f.endswith((".yaml", ".yml")))
            if not found:
                errors.append((arg, "directory holds no *.yaml or *.yml spec"))
            paths.extend(found)
        elif not os.path.exists(arg):
            errors.append((arg, "no such file"))
        elif not os.access(arg, os.R_OK):
            errors.append((arg, "cannot read: permission denied"))
        else:
            paths.append(arg)
    return paths, errors


def _io_report(errors: list, fmt: str, problems_text: str) -> str:
    """I/O errors in the machine format (json: the problem objects' shape plus
    ``"kind": "io"``, after any spec problems; github: ``::error`` lines)."""
    if fmt == "json":
        items = json.loads(problems_text) if problems_text else []
        items += [{"file": f, "line": None, "col": None, "path": "", "message": m,
                   "kind": "io"} for f, m in errors]
        return json.dumps(items, indent=2)
    lines = [problems_text] if problems_text else []
    lines += [f"::error file={f}::{m}" for f, m in errors]
    return "\n".join(lines)


def cmd_schema(args) -> int:
    from .spec.schema import SCHEMA

    text = json.dumps(SCHEMA, indent=2) + "\n"
    if args.output:
        tmp = f"{args.output}.tmp"
        with open(tmp, "w", encoding="utf-8") as f:
            f.write(text)
        os.replace(tmp, args.output)
        print(f"wrote {args.output}; point editors at it with the first line "
              f"'# yaml-language-server: $schema=<path to {os.path.basename(args.output)}>'",
              file=sys.stderr)
    else:
        print(text, end="")
    return EXIT_OK


def cmd_ops(args) -> int:
    from .ops.reference import reference_markdown

    print(reference_markdown(), end="")
    return EXIT_OK


def cmd_inspect(args) -> int:
    from .tensors import QuantizedTensor
    from .weights import load_weights

    _need_file(args.weights)
    if args.metadata:
        from .weights.describe import metadata_lines

        lines = metadata_lines(args.weights)
        print("\n".join(lines))
        return EXIT_OK
    td = load_weights(args.weights)
    rows = []
    for name, t in td.items():
        if isinstance(t, QuantizedTensor):
            rows.append((name, list(t.shape), t.encoding, t.nbytes))
        else:
            rows.append((name, list(t.shape), t.dtype.name, t.nbytes))
    width = max((len(r[0]) for r in rows), default=4)
    print(f"{'name':<{width}}  {'shape':<20} {'encoding':<9} {'bytes':>12}")
    by_enc: dict[str, int] = {}
    for name, shape, enc, nbytes in rows:
        print(f"{name:<{width}}  {str(shape):<20} {enc:<9} {nbytes:>12,}")
        by_enc[enc] = by_enc.get(enc, 0) + nbytes
    summary = ", ".join(f"{k}: {v:,}" for k, v in sorted(by_enc.items()))
    print(f"{len(rows)} tensors, {sum(by_enc.values()):,} bytes ({summary})")
    return EXIT_OK


def cmd_graph(args) -> int:
    from .builder import describe_tree
    from .spec import load_spec

    _need_file(args.spec)
    spec = load_spec(args.spec, variant=args.variant)
    if args.dot:
        from .builder import build
        from .dot import to_dot

        print(to_dot(build(spec, variant=args.variant)))
        return EXIT_OK
    print(describe_tree(spec, variant=args.variant))
    return EXIT_OK


def cmd_run(args) -> int:
    from .pipelines.run import run_cli

    _need_file(args.spec)
    return run_cli(args)


def cmd_serve(args) -> int:
    from .serve.cli import serve_cli

    _need_file(args.spec)
    return serve_cli(args)


def cmd_chat(args) -> int:
    from .serve.chat import chat_cli

    _need_file(args.spec)
    return chat_cli(args)


def cmd_batch(args) -> int:
    from .batch import batch_cli

    _need_file(args.spec)
    _need_file(args.input)
    return batch_cli(args)


def cmd_export(args) -> int:
    from .pipelines.export import export_cli

    if not os.path.exists(args.src):
        raise UsageError(f"{args.src}: no such file or directory")
    _need_file(args.spec)
    return export_cli(args)


def cmd_quantize(args) -> int:
    from .pipelines.quantize import quantize_cli

    if not os.path.exists(args.src):
        raise UsageError(f"{args.src}: no such file or directory")
    return quantize_cli(args)


COMMANDS = {"validate": cmd_validate, "schema": cmd_schema, "ops": cmd_ops, "inspect": cmd_inspect,
            "graph": cmd_graph, "run": cmd_run, "quantize": cmd_quantize, "export": cmd_export,
            "serve": cmd_serve, "chat": cmd_chat, "batch": cmd_batch}
