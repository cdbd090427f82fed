"""Fusion: the steps ``md.compile`` runs, with some nodes merged by general rules.

The graph is never changed: ``plan`` maps its (non-weight) nodes to steps, and the
runtime generates one line per step. Every rule keeps each output bit-identical to
running the nodes one by one:

* **Sibling linears**: ``linear`` nodes that read the same ``x``, whose weights are
  bound weights of one kind (one encoding, or one float dtype) and one K, and whose
  biases are all absent or all bound weights, run as one ``linear_group`` call
  (``kernels.linalg.linear_group`` -> ``kernels.fused.qmatmul_group``), placed where
  the first of them was: q/k/v and gate/up projections become one call over all
  rows of the batch. The group's first node names its errors.
* **Views inline**: a ``reshape`` with at most one symbolic dim is a NumPy view;
  it is written into the generated code as ``y = x.reshape(shape)``, no call.

``md.compile(graph, weights, fuse=False)`` or ``MAXDECL_FUSE=0`` runs node by node.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

from .tensors import QuantizedTensor

_RUNNERS: dict = {}       # fused step kind -> its runtime (bench/profile_ops wraps these)


@dataclass(frozen=True)
class Step:
    """One line of the generated plan: ``kind`` ``"node"`` (the node's own runtime),
    ``"linear_group"`` or ``"reshape"`` (inline view) over ``nodes`` (indices into the
    compiled node list; the first names errors), reading ``inputs`` and writing
    ``outputs`` (graph Values)."""

    kind: str
    nodes: tuple
    inputs: tuple
    outputs: tuple
    attrs: dict = field(default_factory=dict)


def enabled(fuse: bool | None) -> bool:
    """``fuse`` if given, else the ``MAXDECL_FUSE`` environment variable (default on)."""
    if fuse is not None:
        return bool(fuse)
    return os.environ.get("MAXDECL_FUSE", "1").strip().lower() not in ("0", "false", "no", "off")


def runner(kind: str):
    """The runtime of a fused step kind, imported on first use."""
    fn = _RUNNERS.get(kind)
    if fn is None:
        from .kernels import linalg

        fn = _RUNNERS[kind] = {"linear_group": linalg.linear_group}[kind]
    return fn


def plan(nodes, bound: dict, fuse: bool = True) -> list:
    """The steps running ``nodes`` in order; ``bound`` maps ``id(Value)`` of each weight
    node's output to its bound array. ``fuse=False``: one ``"node"`` step per node."""
    one = [Step("node", (i,), tuple(n.inputs), tuple(n.outputs)) for i, n in enumerate(nodes)]
    if not fuse:
        return one
    groups = _linear_groups(nodes, bound)
    steps = []
    for i, n in enumerate(nodes):
        members = groups.get(i)
        if members is not None:
            if members[0] == i:
                ins = [n.inputs[0], *(nodes[j].inputs[1] for j in members)]
                ins += [nodes[j].inputs[2] for j in members if len(nodes[j].inputs) > 2]
                steps.append(Step("linear_group", tuple(members), tuple(ins),
                                  tuple(nodes[j].outputs[0] for j in members),
                                  {"n": len(members)}))
        elif n.op == "reshape" and _view_shape(n.attrs["shape"]) is not None:
            steps.append(Step("reshape", (i,), tuple(n.inputs), tuple(n.outputs),
                              {"shape": _view_shape(n.attrs["shape"])}))
        else:
            steps.append(one[i])
    return steps


def _linear_groups(nodes, bound) -> dict:
    """``{node index: member indices}`` for every group of two or more sibling linears."""
    by_key: dict = {}
    for i, n in enumerate(nodes):
        if n.op != "linear" or len(n.inputs) not in (2, 3) or len(n.outputs) != 1:
            continue
        kind = _weight_kind(bound.get(id(n.inputs[1])))
        bias = n.inputs[2] if len(n.inputs) > 2 else None
        if kind is not None and (bias is None or id(bias) in bound):
            key = (id(n.inputs[0]), kind, bias is None, repr(sorted(n.attrs.items())))
            by_key.setdefault(key, []).append(i)
    return {i: members for members in by_key.values() if len(members) > 1 for i in members}


def _weight_kind(w):
    """``(encoding or dtype, K)`` of a 2-D bound weight, or None (not a bound weight)."""
    if w is None or len(getattr(w, "shape", ())) != 2:
        return None
    if isinstance(w, QuantizedTensor):
        return ("q", str(w.encoding), int(w.shape[1]))
    dtype = getattr(w, "dtype", None)
    return None if dtype is None else ("f", str(dtype), int(w.shape[1]))


def _view_shape(shape):
    """The shape argument ``x.reshape`` takes for a reshape's ``shape`` attribute (a
    symbolic dim becomes -1), or None with more than one symbolic dim."""
    out = tuple(d if isinstance(d, int) else -1 for d in shape)
    return out if out.count(-1) <= 1 else None
