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
    assert locs[0].__name__ == "PackageStampedLocator"
    fn = block_rows._dec_q4_1.py_func
    loc = locs[0].from_function(fn, block_rows.__file__)
    assert loc is not None
    own, package = loc.get_source_stamp()
    assert package == cache_stamp.package_stamp()
    assert locs[0].from_function(numba.njit.__code__, numba.__file__) is None
