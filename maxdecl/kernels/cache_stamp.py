"""numba's on-disk kernel cache, invalidated by a change to any kernel module.

numba keys a cached kernel on its own source file only, but kernels here inline
helpers from other modules (``block_rows._decode_row`` runs inside the GEMM, the
embedding gather and the codecs): after an edit to ``block_rows.py`` the cached GEMM
would still run the old decoder. The locator below stamps every kernel of this
package with a hash of all the package's kernel sources (read once per process), so
any edit recompiles every kernel once.
"""

from __future__ import annotations

import hashlib
import os

_HERE = os.path.dirname(os.path.abspath(__file__))
_STAMP: list = []


def package_stamp() -> str:
    """sha256 of every ``.py`` file of ``maxdecl/kernels`` (names and contents)."""
    if not _STAMP:
        h = hashlib.sha256()
        for name in sorted(os.listdir(_HERE)):
            if name.endswith(".py"):
                h.update(name.encode())
                with open(os.path.join(_HERE, name), "rb") as f:
                    h.update(f.read())
        _STAMP.append(h.hexdigest())
    return _STAMP[0]


def install() -> None:
    """Put package-stamped locators first in numba's cache locators (once): one for
    each of numba's own that a kernel file can use, in numba's order, so a
    ``NUMBA_CACHE_DIR`` still wins over the package's ``__pycache__``, and a read-only
    install still falls back to the user-wide cache, stamped either way."""
    from numba.core import caching

    impl = getattr(caching, "CacheImpl", None)
    if impl is None or not hasattr(impl, "_locator_classes"):
        return                          # another numba layout: its own stamps apply
    if any(getattr(c, "package_stamped", False) for c in impl._locator_classes):
        return
    bases = [getattr(caching, n, None) for n in
             ("UserProvidedCacheLocator", "InTreeCacheLocator", "UserWideCacheLocator")]
    impl._locator_classes[:0] = [_stamped(b) for b in bases if b is not None]


def _stamped(base):
    """``base`` for this package's kernel files only, stamped with the hash of all
    kernel sources besides the kernel's own file."""

    class Stamped(base):
        package_stamped = True

        def get_source_stamp(self):
            return (super().get_source_stamp(), package_stamp())

        @classmethod
        def from_function(cls, py_func, py_file):
            if os.path.dirname(os.path.abspath(py_file)) != _HERE:
                return None
            return super().from_function(py_func, py_file)

    Stamped.__name__ = Stamped.__qualname__ = f"PackageStamped{base.__name__}"
    return Stamped
