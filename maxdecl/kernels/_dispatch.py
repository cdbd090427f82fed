"""Parallel and serial twins of one kernel, picked by the size of the work.

A numba parallel region costs a thread wake-up per call (tens of microseconds,
far more when the machine is busy). Decode runs hundreds of tiny kernels per
token (norms, rope, activations on one row), so those run on the calling thread
and only large work spreads over the threads.
"""

from __future__ import annotations

import types

import numba

from .config import CACHE

# Elements (or multiply-adds) below which a kernel runs serially. Measured: rms_norm over
# 128 x 640 takes 29 us on one thread, while a parallel region must wait for a second
# thread, which costs milliseconds when another process holds the other core.
PARALLEL_MIN_WORK = 1 << 20


def njit_twins(**flags):
    """Decorator: compile ``fn`` lazily as ``(parallel, serial)`` dispatchers.

    The serial twin is a copy of the function under another qualified name, so the
    two never share an on-disk cache entry.
    """
    def deco(fn):
        par = numba.njit(cache=CACHE, parallel=True, **flags)(fn)
        clone = types.FunctionType(fn.__code__, fn.__globals__, fn.__name__ + "_serial",
                                   fn.__defaults__, fn.__closure__)
        clone.__qualname__ = fn.__qualname__ + "_serial"
        clone.__module__ = fn.__module__
        ser = numba.njit(cache=CACHE, **flags)(clone)
        return par, ser
    return deco


def pick(twins, work: int):
    """The parallel twin for ``work >= PARALLEL_MIN_WORK``, else the serial one."""
    return twins[0] if work >= PARALLEL_MIN_WORK else twins[1]
