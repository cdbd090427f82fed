"""Fixtures shared by every test folder."""

import os
import tempfile

import pytest

# load_spec remembers specs it found valid (maxdecl.spec.checked): in a directory of
# this test session's own, not the user's cache
os.environ.setdefault("MAXDECL_CACHE_DIR", tempfile.mkdtemp(prefix="maxdecl-test-cache-"))


def mapped_ranges(path):
    """(start, end) address ranges of this process's mappings of ``path`` (Linux)."""
    real = os.path.realpath(path)
    out = []
    with open("/proc/self/maps") as f:
        for line in f:
            parts = line.split(maxsplit=5)
            if len(parts) == 6 and parts[5].strip() == real:
                lo, hi = (int(x, 16) for x in parts[0].split("-"))
                out.append((lo, hi))
    return out


@pytest.fixture
def in_mapping():
    """in_mapping(ptr, path): True when address ``ptr`` lies in a mapping of ``path``."""
    def check(ptr, path):
        return any(lo <= ptr < hi for lo, hi in mapped_ranges(path))
    return check
