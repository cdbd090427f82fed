"""Loading a cached kernel without numba's whole compiler context.

Before it loads a kernel from its on-disk cache, numba refreshes the target context:
it imports and installs every lowering registry it has (NumPy, typed containers,
random, datetime, jitclass, ...), 0.42-0.48 s of a 1 s ``maxdecl run`` here, measured.
A cached kernel is machine code that needs none of them: what loading it needs is the
runtime's symbols (``rtsys.initialize``, done below), numba's C helpers (installed
with the context) and, for a parallel kernel, the thread pool, which the cached
kernel's own reload hooks start. A cache miss compiles, and numba's compiler refreshes
the whole context itself before it compiles, so nothing a compile needs is skipped.
If a light load fails for any reason, the kernel is loaded again numba's own way.
"""

from __future__ import annotations


def install() -> None:
    """Make numba's cache load kernels without the full context refresh (once; a numba
    whose cache class looks different keeps its own behaviour)."""
    from numba.core import caching

    cache = getattr(caching, "Cache", None)
    needed = ("load_overload", "_load_overload", "_guard_against_spurious_io_errors")
    if cache is None or not all(hasattr(cache, n) for n in needed):
        return
    if getattr(cache.load_overload, "_maxdecl_light", False):
        return
    full = cache.load_overload

    def load_overload(self, sig, target_context):
        from numba.core.runtime import rtsys

        try:
            rtsys.initialize(target_context)
            with self._guard_against_spurious_io_errors():
                loaded = self._load_overload(sig, target_context)
        except Exception:
            loaded = None
        return loaded if loaded is not None else full(self, sig, target_context)

    load_overload._maxdecl_light = True
    cache.load_overload = load_overload
