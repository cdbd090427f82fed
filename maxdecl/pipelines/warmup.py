"""numba started on a background thread while a model loads.

The first kernel a process loads pays fixed costs: importing numba and its NumPy
support, and filling numba's typing and target registries (``refresh``: 0.2-0.4 s on
this machine, most of it imports and LLVM set-up). Nothing about them depends on the
model, so ``start`` runs them beside the spec, weights and tokenizer loading; the
LLVM calls release the GIL. The first kernel load then waits on numba's compiler lock
if the warm-up still holds it, and nothing is done twice. The warm-up takes numba's
locks in numba's own order (a context's property lock, then the compiler lock).
"""

from __future__ import annotations

import sys
import threading

_THREAD: list = []


def start() -> None:
    """Start the warm-up once per process (not when numba is already in use)."""
    if _THREAD or "numba.core.registry" in sys.modules:
        return
    t = threading.Thread(target=_warm, name="maxdecl-numba-warmup", daemon=True)
    _THREAD.append(t)
    t.start()


def _warm() -> None:
    try:
        from .. import kernels  # noqa: F401  (numba, its NumPy support, the cache stamp)
        from ..kernels.cache_stamp import package_stamp
        from numba.core.compiler_lock import global_compiler_lock
        from numba.core.registry import cpu_target

        package_stamp()
        # the contexts first, outside the compiler lock: creating one takes its property's
        # lock and then the compiler lock, the order every other thread takes them in
        typing, target = cpu_target.typing_context, cpu_target.target_context
        with global_compiler_lock:
            typing.refresh()
            target.refresh()
    except Exception:        # a warm-up only: the first kernel load does it again
        pass
