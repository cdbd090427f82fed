"""Time spent preparing numba kernels (compiling them, or loading them from numba's
on-disk cache), so speeds can leave it out.

numba takes its global compiler lock, firing ``numba:compiler_lock`` events, whenever
a kernel meets argument types it has no machine code for yet: to load that code from
the cache or to compile it; a call that finds its code takes no lock. Inside, it fires
``numba:compile`` only when it really compiles (a cache miss). ``CompileTimer``
listens to both: ``seconds`` is the time inside the outermost lock (loading and
compiling), ``count`` the number of real compilations, and ``on_first()`` is called
when the first compilation starts (the CLI prints its "compiling kernels" notice there).
"""

from __future__ import annotations

import time


class CompileTimer:
    """Kernel preparation while the ``with`` block runs: ``seconds`` (load + compile) and
    ``count`` (real compilations).

    Example::

        with CompileTimer() as ct:
            graph.execute(x)
        print(ct.seconds, ct.count)    # 0.0 0 once the kernels are loaded in this process
    """

    def __init__(self, on_first=None):
        self.on_first = on_first
        self.seconds, self.count = 0.0, 0
        self._lock_depth, self._compile_depth, self._t0 = 0, 0, 0.0
        self._ctxs = []

    def __enter__(self) -> CompileTimer:
        from numba.core import event

        class _Lock(event.Listener):
            def on_start(_, ev):
                self._lock_depth += 1
                if self._lock_depth == 1:
                    self._t0 = time.perf_counter()

            def on_end(_, ev):
                self._lock_depth -= 1
                if self._lock_depth == 0:
                    self.seconds += time.perf_counter() - self._t0

        class _Compile(event.Listener):
            def on_start(_, ev):
                self._compile_depth += 1
                if self._compile_depth == 1:
                    if self.count == 0 and self.on_first is not None:
                        self.on_first()
                    self.count += 1

            def on_end(_, ev):
                self._compile_depth -= 1

        self._ctxs = [event.install_listener("numba:compiler_lock", _Lock()),
                      event.install_listener("numba:compile", _Compile())]
        for ctx in self._ctxs:
            ctx.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        for ctx in reversed(self._ctxs):
            ctx.__exit__(*exc)
