"""The demo weights' checksum runs once, and again whenever the file changes."""

from __future__ import annotations

import os

from maxdecl.weights.sources import _assembled_once


def test_checksum_skipped_only_while_the_file_is_unchanged(tmp_path):
    gguf = tmp_path / "model.gguf"
    gguf.write_bytes(b"GGUF" + bytes(60))
    calls = []

    def assemble():
        calls.append(1)
        return gguf

    assert _assembled_once(gguf, assemble) == str(gguf)
    assert _assembled_once(gguf, assemble) == str(gguf)
    assert len(calls) == 1
    st = os.stat(gguf)
    os.utime(gguf, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000_000))
    _assembled_once(gguf, assemble)
    assert len(calls) == 2
    gguf.write_bytes(b"GGUF" + bytes(61))
    _assembled_once(gguf, assemble)
    assert len(calls) == 3


def test_missing_file_is_assembled(tmp_path):
    gguf = tmp_path / "absent.gguf"

    def assemble():
        gguf.write_bytes(b"GGUF")
        return gguf

    assert _assembled_once(gguf, assemble) == str(gguf)
    assert (tmp_path / "absent.gguf.maxdecl-verified").exists()
