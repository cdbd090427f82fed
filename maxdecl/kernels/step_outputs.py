"""Output arrays that a compiled graph's steps write into, kept from one run to the next.

A decode step runs the same steps on the same shapes every token, so its activations
need not be allocated anew each time: ``runtime._generate`` gives each step whose
runner is marked ``writes_into`` a ``StepOutputs``, and the runner takes its output
arrays from it (``empty``). The runtime gives none where an output could outlive the
run (a graph output, a value a fixed run remembers, or an array such a value may be a
view of), and each thread its own, so that a run never writes into an array its caller
still holds.
"""

from __future__ import annotations

import numpy as np

# An array is kept once its output had the same shape and dtype in the run before (a
# prefill's arrays, made once, are not), up to MAX_BYTES each (a decode step's are
# 2.5-120 KB) and BUDGET_BYTES for all of a plan's steps in one thread, so that runs
# repeating large shapes (an encoder's) hold at most that much between runs.
MAX_BYTES = 1 << 20
BUDGET_BYTES = 32 << 20
ALL = -1       # ``empty``'s index for one array whose views are all the step's outputs


class StepOutputs:
    """One step's output arrays, by output index, reused while shape and dtype repeat.

    ``reusable``: the indices of the outputs that may be kept (the others are made anew
    each run); ``budget``: a one-element list of the bytes the plan's steps may still
    keep, shared by them; ``made`` counts the arrays allocated."""

    __slots__ = ("_arrays", "_budget", "_last", "_reusable", "made")

    def __init__(self, reusable, n_outputs: int, budget: list):
        self._arrays: dict = {}
        self._last: dict = {}
        self._reusable = frozenset(reusable) | ({ALL} if len(reusable) == n_outputs else set())
        self._budget = budget
        self.made = 0

    def empty(self, i: int, shape: tuple, dtype) -> np.ndarray:
        """An uninitialised array for output ``i`` (``ALL``: one array of which every
        output is a view): the one kept from the last run when its shape and dtype
        match, else a new one, kept when output ``i`` may be and asked the same shape
        and dtype the last time (see MAX_BYTES)."""
        kept = self._arrays.get(i)
        if kept is not None:
            if kept[1] == shape and kept[2] is dtype:
                return kept[0]
            del self._arrays[i]
            self._budget[0] += kept[0].nbytes
        a = np.empty(shape, dtype)
        self.made += 1
        if i in self._reusable:
            key = (shape, dtype)
            if (self._last.get(i) == key and a.nbytes <= MAX_BYTES
                    and a.nbytes <= self._budget[0]):
                self._arrays[i] = (a, shape, dtype)
                self._budget[0] -= a.nbytes
            self._last[i] = key
        return a


def outputs_of(reuse: list, n_outputs: list) -> list:
    """A plan's ``StepOutputs`` for one thread: per step, one over the output indices
    ``reuse[s]``, or None where that is None; all under one BUDGET_BYTES."""
    budget = [BUDGET_BYTES]
    return [None if r is None else StepOutputs(r, n, budget)
            for r, n in zip(reuse, n_outputs)]

def empty(out: StepOutputs | None, i: int, shape: tuple, dtype=np.float32) -> np.ndarray:
    """``out.empty(i, shape, dtype)``, or a new array when ``out`` is None (a runner
    called outside a compiled graph, or a step whose outputs may outlive the run).
    ``shape`` a tuple; a kept array is matched by ``shape`` and the very ``dtype``
    object (``x.dtype``, or a type such as ``np.float32``)."""
    if out is None:
        return np.empty(shape, dtype)
    return out.empty(i, shape, dtype)


def writes_into(fn):
    """Mark ``fn(args, attrs, out=None)`` as a runner that takes its output arrays from
    ``out`` (a ``StepOutputs``) where given. Its contract: no output shares memory with
    an input, other than a state output with its state input (a KV cache grown in
    place), so the runtime may keep its outputs' arrays between runs."""
    fn.writes_into = True
    return fn
