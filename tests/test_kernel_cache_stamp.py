"""The numba kernel cache is stamped with every kernel source, not only the kernel's own
file (a cached GEMM must not keep an old decoder inlined from block_rows.py)."""

from __future__ import annotations

import numba

from maxdecl.kernels import block_rows, cache_stamp


def test_every_kernel_module_is_stamped_with_the_whole_package(tmp_path, monkeypatch):
    (tmp_path / "a.py").write_text("x = 1\n")
    (tmp_path / "b.py").write_text("y = 2\n")
    monkeypatch.setattr(cache_stamp, "_HERE", str(tmp_path))
    monkeypatch.setattr(cache_stamp, "_STAMP", [])
    first = cache_stamp.package_stamp()
    monkeypatch.setattr(cache_stamp, "_STAMP", [])
    (tmp_path / "b.py").write_text("y = 3\n")           # a helper module edited
    assert cache_stamp.package_stamp() != first


def test_locator_applies_to_kernel_modules_only():
    from numba.core import caching

    locs = caching.CacheImpl._locator_classes
    stamped = [c for c in locs if getattr(c, "package_stamped", False)]
    assert [c.__name__ for c in locs[:3]] == [c.__name__ for c in stamped] == [
        "PackageStampedUserProvidedCacheLocator", "PackageStampedInTreeCacheLocator",
        "PackageStampedUserWideCacheLocator"]
    fn = block_rows._dec_q4_1.py_func
    loc = stamped[1].from_function(fn, block_rows.__file__)
    assert loc is not None
    own, package = loc.get_source_stamp()
    assert package == cache_stamp.package_stamp()
    assert all(c.from_function(numba.njit.__code__, numba.__file__) is None for c in stamped)


def test_numba_cache_dir_still_decides_where_kernels_are_cached(tmp_path):
    """``NUMBA_CACHE_DIR`` (a cold-cache measurement, a read-only install) puts the
    package's kernels there, stamped, and not in the package's ``__pycache__``."""
    import os
    import subprocess
    import sys

    code = ("import numpy as np; from maxdecl.kernels import activations as a; "
            "a.silu(np.ones(4, np.float32)); "
            "print(type(a._silu[0]._cache._impl.locator).__name__)")
    env = dict(os.environ, NUMBA_CACHE_DIR=str(tmp_path))
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                         text=True, check=True).stdout.split()
    assert out[-1] == "PackageStampedUserProvidedCacheLocator"
    assert any(p.name.startswith("activations._silu") for p in tmp_path.rglob("*.nbi"))
