"""Time spent compiling numba kernels, so speeds can leave it out.

numba fires a ``numba:compile`` event only when it really compiles (a cache miss; a
kernel loaded from the on-disk cache fires none), so a listener on that event sees
exactly the cold-cache work. ``CompileTimer`` is a context manager: ``seconds`` and
``count`` add up the outermost compilations inside it; ``on_first()`` is called when
the first one starts (the CLI prints its "compiling kernels" notice there).
"""

from __future__ import annotations

import time


class CompileTimer:
    """Seconds and number of numba compilations while the ``with`` block runs.

    Example::

        with CompileTimer() as ct:
            graph.execute(x)
        print(ct.seconds, ct.count)    # 0.0 0 with a warm cache
    """

    def __init__(self, on_first=None):
        self.on_first = on_first
        self.seconds, self.count = 0.0, 0
        self._depth, self._t0, self._ctx = 0, 0.0, None

    def __enter__(self) -> CompileTimer:
        from numba.core import event

        class _Listener(event.Listener):
            def on_start(_, ev):
                self._start()

            def on_end(_, ev):
                self._end()

        self._ctx = event.install_listener("numba:compile", _Listener())
        self._ctx.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        self._ctx.__exit__(*exc)

    def _start(self) -> None:
        self._depth += 1
        if self._depth == 1:
            if self.count == 0 and self.on_first is not None:
                self.on_first()
            self._t0 = time.perf_counter()

    def _end(self) -> None:
        self._depth -= 1
        if self._depth == 0:
            self.seconds += time.perf_counter() - self._t0
            self.count += 1
