"""Specs already found valid, so loading a model does not check an unchanged spec again.

Checking a spec (its JSON Schema, then the semantic pass over every variant) costs
~90 ms for ``specs/gemma3.yaml`` in a fresh process, a tenth of ``maxdecl run``. A
spec text that passes both leaves an empty marker file in the user cache, named by a
hash of the text, of maxdecl's own files (path, size, modification time) and of the
ops and encodings registered in the process. ``load_spec`` (so ``md.load_model`` and
``maxdecl run``) parses a marked text without checking it again; ``md.build`` still
type-checks every node it adds, and ``maxdecl validate`` always checks in full.

The cache directory is ``$MAXDECL_CACHE_DIR``, else ``$XDG_CACHE_HOME/maxdecl``, else
``~/.cache/maxdecl``; ``MAXDECL_CACHE_DIR=""`` turns the markers off, and a directory
that cannot be written is ignored (everything is checked each time).
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

_PACKAGE = Path(__file__).resolve().parent.parent
_CODE: list = []          # the fingerprint of maxdecl's files, made once per process


def _directory() -> Path | None:
    env = os.environ.get("MAXDECL_CACHE_DIR")
    if env is not None:
        return Path(env) / "checked-specs" if env.strip() else None
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "maxdecl" / "checked-specs"


def _code() -> bytes:
    if not _CODE:
        from .. import __version__

        h = hashlib.sha256(__version__.encode())
        for root, dirs, files in os.walk(_PACKAGE):
            dirs[:] = sorted(d for d in dirs if d != "__pycache__")
            for name in sorted(files):
                if name.endswith((".py", ".json")):
                    st = os.stat(os.path.join(root, name))
                    h.update(f"{root}/{name}:{st.st_size}:{st.st_mtime_ns}\n".encode())
        _CODE.append(h.digest())
    return _CODE[0]


def _registry() -> bytes:
    from .. import blocks
    from ..ops._registry import REGISTRY

    ops = sorted((name, tuple(sorted(map(str, d.attrs))), d.inputs, d.optional)
                 for name, d in REGISTRY.items())
    return repr((ops, sorted(blocks.known().items()))).encode()


def _marker(text: str) -> Path | None:
    directory = _directory()
    if directory is None:
        return None
    h = hashlib.sha256(text.encode("utf-8", "surrogatepass"))
    h.update(_code())
    h.update(_registry())
    return directory / h.hexdigest()


def was_valid(text: str) -> bool:
    """Whether ``text`` passed every check before, under this code and registry."""
    try:
        marker = _marker(text)
        return marker is not None and marker.is_file()
    except OSError:
        return False


def mark_valid(text: str) -> None:
    """Remember that ``text`` passed every check (silently nothing if the cache cannot
    be written)."""
    try:
        marker = _marker(text)
        if marker is not None and not marker.is_file():
            marker.parent.mkdir(parents=True, exist_ok=True)
            tmp = marker.with_name(f"{marker.name}.{os.getpid()}.tmp")
            tmp.write_bytes(b"")
            os.replace(tmp, marker)
    except OSError:
        pass
