"""``maxdecl run SPEC``: the command-line face of ``md.load_model``.

A language model (graph inputs ``tokens``/``positions``) streams generated text to
stdout after the prompt, then prints a last line with tokens/s. Any other spec runs
once on ``--input NAME=FILE.npy`` arrays and prints each output (``--output`` saves
them). stdout carries the note about random weights (first line), the text and the
figures; stderr carries the weights/tokenizer in use, the compile notice and progress.

Speeds exclude the time numba spends preparing kernels (compiling them on a cold
cache, loading them from its cache otherwise): listeners on numba's events
(``compile_timer.CompileTimer``) measure it and it is subtracted from the prefill and
decode times; the last line says how long it took.
"""

from __future__ import annotations

import os
import sys

from ..errors import InputError, WeightsError
from . import params as checks


def run_cli(args) -> int:
    """Implements ``maxdecl run`` (see ``maxdecl run --help``)."""
    sampling = checks.check_sampling(args.temperature, args.top_k, args.top_p, args.min_p,
                                     args.repeat_penalty, args.repeat_last_n, args.seed)
    max_new = checks.check_max_new_tokens(args.max_new_tokens)
    threads = checks.check_threads(args.threads)
    checks.check_int("ctx_size", args.ctx_size, 0)
    stop = checks.check_stop(args.stop or None)
    lookup = checks.check_lookup(getattr(args, "lookup", 0))
    if lookup and sampling["temperature"] != 0:
        raise InputError("--lookup is greedy decoding: use --temp 0")
    inputs = _parse_inputs(args.input or [])
    prefix = _parse_ids("--decoder-prompt", getattr(args, "decoder_prompt", None))
    for opt, path in (("--weights", args.weights), ("--tokenizer", args.tokenizer)):
        if path is not None and not os.path.exists(path):
            raise InputError(f"{opt} {path}: no such file or directory")
    prompt = None if inputs else _read_prompt(args)

    from ..model import load_model
    from .compile_timer import CompileTimer

    _set_threads(threads)
    with CompileTimer(on_first=_compile_notice) as compiling:
        model = load_model(args.spec, args.weights, args.variant, args.tokenizer,
                           args.ctx_size or None, getattr(args, "activations", None))
        if model.note:
            print(model.note, flush=True)
        text_source = model.encoder_decoder and not model._array_source()
        source = _array_source_only(model, inputs)
        if source is not None and not args.output:
            return _run_source_array(model, source, inputs[source], max_new, sampling, stop,
                                     prefix)
        if model.session is None and (inputs or args.output or not text_source):
            return _run_graph(model, inputs, args.output)      # encoder-decoders: either
        if inputs or args.output:
            raise InputError(f"{args.spec} is a language model: --input/--output are for "
                             "specs without a 'tokens' input; give a --prompt")
        return _run_text(model, prompt, max_new, sampling, stop, args.truncate, compiling,
                         lookup, prefix)


def _parse_ids(opt: str, text):
    """The token ids in ``text`` (comma or space separated), or None for no option."""
    if text is None:
        return None
    parts = text.replace(",", " ").split()
    if not parts or not all(p.isdigit() for p in parts):
        raise InputError(f"{opt} takes token ids separated by commas or spaces, got {text!r}")
    return [int(p) for p in parts]


def _run_text(model, prompt, max_new, sampling, stop, truncate, compiling, lookup=0,
              prefix=None) -> int:
    tok = model.tokenizer
    if tok is None:
        raise WeightsError(f"{model.source}: no tokenizer in the weights or beside them: pass "
                           "--tokenizer PATH (a `maxdecl quantize` checkpoint carries one)")
    _say_what_runs(model)
    full = checks.check_prompt(model.encode(prompt), model.vocab)   # before any output
    fit = checks.fit_source if model.encoder_decoder else checks.fit_context
    ids = fit(full, max_new, model.context, truncate)
    out = sys.stdout
    if len(ids) < len(full):
        print(f"maxdecl: the prompt keeps its last {len(ids)} of {len(full)} tokens "
              f"(--truncate; context {model.context})", file=sys.stderr, flush=True)
        prompt = _decode_prompt(tok, ids)
    out.write(prompt + ("\n" if model.encoder_decoder else ""))   # a new text, not a continuation
    out.flush()

    def emit(text):
        out.write(text)
        out.flush()

    from ..model import PREFILL_CHUNK

    progress = _PrefillProgress() if len(ids) > 2 * PREFILL_CHUNK else None   # long prompts
    res = model.generate(ids, max_new, stop=stop, on_text=emit,
                         on_prefill=None if lookup else progress, lookup=lookup,
                         decoder_prompt=prefix, **sampling)
    out.write("\n")
    n = len(res.ids)
    decode = (f"{res.decode_tps:.1f} tokens/s" if n > 1
              else "no decode step (the first token comes from the prefill)")
    built = (f"; kernels compiled in {compiling.seconds:.1f} s (not counted)" if compiling.count
             else f"; kernels loaded in {compiling.seconds:.2f} s (not counted)"
             if compiling.seconds >= 0.01 else "")
    looked = (f"; lookup: {res.accepted} of {res.drafted} drafted tokens accepted "
              f"({100 * res.accepted / res.drafted:.0f}%)" if res.drafted else
              "; lookup: no draft found" if lookup else "")
    print(f"[{res.prompt_tokens} prompt tokens: {res.prefill_tps:.1f} tokens/s; "
          f"{n} generated token{'' if n == 1 else 's'}: {decode}; "
          f"finish: {res.finish_reason}{looked}{built}]", flush=True)
    return 0


def _array_source_only(model, inputs: dict):
    """The source input's name when ``model`` is an encoder-decoder over an array (Whisper's
    spectrogram) and ``--input`` gives that source alone (then ``run`` generates from it),
    else None."""
    if not (model.encoder_decoder and model._array_source()) or len(inputs) != 1:
        return None
    from .seq2seq import source_input

    name = source_input(model.input_names)
    return name if name in inputs else None


def _run_source_array(model, name: str, path: str, max_new, sampling, stop,
                      prefix=None) -> int:
    """Generate from the ``.npy`` array at ``path`` as the encoder's source ``name``."""
    arr = _load_input(next(v for v in model.graph.inputs if v.name == name), path)
    _say_what_runs(model)
    out = sys.stdout

    def emit(text):
        out.write(text)
        out.flush()

    res = model.generate(arr, max_new, stop=stop, decoder_prompt=prefix,
                         on_text=emit if model.tokenizer is not None else None, **sampling)
    if model.tokenizer is None:
        out.write("ids: " + " ".join(map(str, res.ids)))
    out.write("\n")
    n = len(res.ids)
    print(f"[source {name} {list(arr.shape)}; {n} generated token{'' if n == 1 else 's'}: "
          f"{res.decode_tps:.1f} tokens/s; finish: {res.finish_reason}]", flush=True)
    return 0


def _load_input(v, path: str):
    """The ``.npy`` array at ``path`` for graph input ``v``, checked against its type."""
    import numpy as np

    try:
        arr = np.load(path, allow_pickle=False)
    except (OSError, ValueError) as e:
        raise InputError(f"--input {v.name}={path}: cannot read a .npy array: {e}") from None
    want = f"{v.dtype.name}[{', '.join(map(str, v.shape))}]"
    fits = arr.ndim == len(v.shape) and all(isinstance(d, str) or d == n
                                            for d, n in zip(v.shape, arr.shape))
    if arr.dtype != v.dtype.numpy or not fits:
        raise InputError(f"--input {v.name}={path}: expected {want}, got "
                         f"{arr.dtype.name}{list(arr.shape)}")
    return arr


def _run_graph(model, inputs: dict, output) -> int:
    """Run a spec that is not a language model once on named .npy inputs; a state input
    (one with an output of its name) left out starts empty: its symbolic dims 0, the
    rest zeros, as a generation loop's first step."""
    import numpy as np

    names = model.input_names
    unknown = sorted(set(inputs) - set(names))
    states = set(names) & set(model.output_names)   # a first step starts them empty
    missing = [n for n in names if n not in inputs and n not in states]
    types = ", ".join(f"{v.name}: {v.dtype.name}[{', '.join(map(str, v.shape))}]"
                      for v in model.graph.inputs)
    if unknown or missing:
        what = (f"unknown input(s) {', '.join(unknown)}" if unknown
                else f"missing --input for {', '.join(missing)}")
        raise InputError(f"{what}; {model.spec.name} takes {types} (--input NAME=FILE.npy)")
    arrays = [_load_input(v, inputs[v.name]) if v.name in inputs else
              np.zeros(tuple(0 if isinstance(d, str) else d for d in v.shape), v.dtype.numpy)
              for v in model.graph.inputs]
    outs = model(*arrays)
    for name, arr in zip(model.output_names, outs):
        arr = np.asarray(arr)
        flat = arr.reshape(-1)[:6]
        more = ", ..." if arr.size > flat.size else ""
        values = ", ".join(f"{x:.6g}" if arr.dtype.kind == "f" else str(x) for x in flat.tolist())
        print(f"{name}: {arr.dtype.name} {list(arr.shape)} [{values}{more}]")
    if output:
        np.savez(output, **{n: np.asarray(a) for n, a in zip(model.output_names, outs)})
        print(f"saved {len(outs)} output(s) to {output}")
    return 0


def _parse_inputs(items) -> dict:
    inputs = {}
    for item in items:
        name, eq, path = item.partition("=")
        if not eq or not name or not path:
            raise InputError(f"--input {item!r}: expected NAME=FILE.npy")
        inputs[name] = path
    return inputs


def _read_prompt(args) -> str:
    """The prompt from ``-p TEXT``, ``-p -`` (stdin) or ``-f FILE``; checked as Unicode."""
    if args.prompt is not None and args.file is not None:
        raise InputError("give the prompt with -p/--prompt or -f/--file, not both")
    if args.file is not None:
        try:
            with open(args.file, encoding="utf-8") as f:
                text = f.read()
        except UnicodeDecodeError as e:
            raise InputError(f"{args.file}: not UTF-8 text (byte {e.start})") from None
    elif args.prompt == "-":
        text = sys.stdin.read()
    else:
        text = args.prompt if args.prompt is not None else DEFAULT_PROMPT
    return checks.check_prompt(text, None)


def _decode_prompt(tok, ids) -> str:
    try:
        return tok.decode(ids, skip_special=True)
    except TypeError:
        return tok.decode(ids)


def _say_what_runs(model) -> None:
    tok = model.tokenizer
    what = "none" if tok is None else (
        f"{type(tok).__name__} (vocab {getattr(tok, 'vocab_size', '?')})"
        + (f" from {model.tokenizer_source}" if model.tokenizer_source else ""))
    print(f"maxdecl: weights: {model.source} (variant {model.spec.variant}); tokenizer: {what}",
          file=sys.stderr, flush=True)


def _compile_notice() -> None:
    print("maxdecl: compiling kernels (first run only; cached for later runs)...",
          file=sys.stderr, flush=True)


class _PrefillProgress:
    """``maxdecl: prefill 512/3019 tokens`` on stderr: one line rewritten in place on a
    terminal, else a line per tenth of the prompt (logs stay short)."""

    def __init__(self):
        self.tty = sys.stderr.isatty()
        self.shown = 0

    def __call__(self, done: int, total: int) -> None:
        text = f"maxdecl: prefill {done}/{total} tokens"
        if self.tty:
            print("\r" + text, end="\n" if done == total else "", file=sys.stderr, flush=True)
        elif done == total or done * 10 // total > self.shown:
            self.shown = done * 10 // total
            print(text, file=sys.stderr, flush=True)


def _set_threads(n) -> None:
    if n:
        import numba

        numba.set_num_threads(min(n, numba.config.NUMBA_NUM_THREADS))


DEFAULT_PROMPT = "Once upon a time"
