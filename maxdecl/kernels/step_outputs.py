"""Output arrays that a compiled graph's steps write into, kept from one run to the next.

A decode step runs the same steps on the same shapes every token, so its activations
need not be allocated anew each time: ``runtime._generate`` gives each step whose
runner is marked ``writes_into`` a ``StepOutputs``, and the runner takes its output
arrays from it (``empty``). Outputs of one type share a ``Slot`` where their lives
within a run do not overlap (``runtime._slot_plan``), as an allocator hands a freed
block to the next request: the arrays stay few and recently written. (Against NumPy's
allocator, which does the same, a Gemma 3 decode step measured 1.009x the time; with
one array a step, 1.018x.) The runtime gives none where an
output could outlive the run (a graph output, a value a fixed run remembers, or an
array such a value may be a view of), and each thread its own, so that a run never
writes into an array its caller still holds.
"""

from __future__ import annotations

import numpy as np

# Kept arrays are at most MAX_BYTES each and BUDGET_BYTES in all for a plan in one
# thread (a decode step's are 2.5-120 KB); larger ones are made each run.
MAX_BYTES = 1 << 20
BUDGET_BYTES = 32 << 20
ALL = -1       # ``empty``'s index for one array whose views are all the step's outputs


class Slot:
    """An array that outputs of one type share, one after another within a run (the
    plan gives two outputs one slot only when no step reads the first, or a view of
    it, at or after the step that makes the second)."""

    __slots__ = ("array", "dtype", "shape")

    def __init__(self):
        self.array = self.shape = self.dtype = None


class StepOutputs:
    """One step's output arrays: output index (or ``ALL``) -> its ``Slot``; outputs
    without one are made anew each run. ``budget``: a one-element list of the bytes
    the plan's slots may still hold, shared by them; ``made`` counts arrays made."""

    __slots__ = ("_budget", "_slots", "made")

    def __init__(self, slots: dict, budget: list):
        self._slots = slots
        self._budget = budget
        self.made = 0

    def empty(self, i: int, shape: tuple, dtype) -> np.ndarray:
        """An uninitialised array for output ``i`` (``ALL``: one array of which every
        output is a view): the slot's when its shape and dtype match, else a new one,
        which the slot then holds (see MAX_BYTES)."""
        slot = self._slots.get(i)
        if slot is not None and slot.shape == shape and (
                slot.dtype is dtype or slot.array.dtype == dtype):   # np.float32 or a dtype
            return slot.array
        self.made += 1
        a = np.empty(shape, dtype)      # (64-byte aligned measured no faster)
        if slot is None:
            return a
        held = 0 if slot.array is None else slot.array.nbytes
        if a.nbytes <= MAX_BYTES and a.nbytes <= self._budget[0] + held:
            self._budget[0] += held - a.nbytes
            slot.array, slot.shape, slot.dtype = a, shape, dtype
        return a


def outputs_of(plan: list) -> list:
    """A plan's ``StepOutputs`` for one thread from ``plan``: per step, None or
    {output index (or ALL): slot number}; steps naming one slot number share its
    ``Slot``; all under one BUDGET_BYTES."""
    budget = [BUDGET_BYTES]
    slots: dict = {}
    return [None if p is None else
            StepOutputs({i: slots.setdefault(n, Slot()) for i, n in p.items()}, budget)
            for p in plan]


def empty(out: StepOutputs | None, i: int, shape: tuple, dtype=np.float32) -> np.ndarray:
    """``out.empty(i, shape, dtype)``, or a new array when ``out`` is None (a runner
    called outside a compiled graph, or a step whose outputs may outlive the run).
    ``shape`` a tuple, ``dtype`` a dtype or a type such as ``np.float32``."""
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
