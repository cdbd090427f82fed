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
* **Norms into their producer**: an ``add`` runs as one ``norm_chain`` call
  (``kernels.fused_rows``) with the ``rms_norm`` that feeds it when nothing else reads
  that norm (a post-norm before the residual add), and with the first ``rms_norm`` of
  its sum whose weight is known by then (the pre-norm of the next block); the sum stays
  an output for its other readers. Both norms run the op's own row function.
* **Activation into its product**: a ``silu``, ``gelu`` or ``gelu_tanh`` read only by a
  ``mul`` runs inside it as one ``act_mul`` call (a gated MLP's ``act(gate) * up``).

Fused elementwise steps take their kernels when every operand is a float32 array of one
shape (C order) and 1-D norm weights; otherwise they run their nodes' own runtimes one
after another, so the numbers and the errors are the unfused ones either way.

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
        from .kernels import fused_rows, linalg

        fn = _RUNNERS[kind] = {"linear_group": linalg.linear_group,
                               "norm_chain": fused_rows.norm_chain,
                               "act_mul": fused_rows.act_mul}[kind]
    return fn


def plan(nodes, bound: dict, fuse: bool = True, outputs=()) -> list:
    """The steps running ``nodes`` in order; ``bound`` maps ``id(Value)`` of each weight
    node's output to its bound array; ``outputs``: the graph's outputs (never fused
    away). ``fuse=False``: one ``"node"`` step per node."""
    one = [Step("node", (i,), tuple(n.inputs), tuple(n.outputs)) for i, n in enumerate(nodes)]
    if not fuse:
        return one
    groups = _linear_groups(nodes, bound)
    elementwise, absorbed = _elementwise_steps(nodes, {id(v) for v in outputs}, set(groups))
    steps = []
    for i, n in enumerate(nodes):
        members = groups.get(i)
        if i in absorbed:
            continue
        if i in elementwise:
            steps.append(elementwise[i])
        elif members is not None:
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


_ACTIVATIONS = ("silu", "gelu", "gelu_tanh")


class _Uses:
    """Who makes and who reads each value of ``nodes``, for the elementwise rules."""

    def __init__(self, nodes, outputs: set):
        self.nodes, self.outputs = nodes, outputs
        self.made, self.readers = {}, {}
        for i, n in enumerate(nodes):
            for v in n.outputs:
                self.made[id(v)] = i
            for x in n.inputs:
                self.readers.setdefault(id(x), []).append(i)

    def only_reader(self, v, j) -> bool:
        """v is read once, by node j, and is no graph output."""
        return self.readers.get(id(v)) == [j] and id(v) not in self.outputs


def _plain(n, op: str, n_in) -> bool:
    return n.op == op and len(n.inputs) in n_in and len(n.outputs) == 1


def _elementwise_steps(nodes, outputs: set, taken: set) -> tuple:
    """``({node index: fused Step}, {indices of the nodes folded into them})`` for the
    ``norm_chain`` and ``act_mul`` rules (module doc). ``taken``: nodes already fused."""
    uses = _Uses(nodes, outputs)
    steps, used = {}, set(taken)
    for j, n in enumerate(nodes):
        if j in used:
            continue
        if _plain(n, "mul", (2,)):
            step = _act_mul(uses, j, used)
        elif _plain(n, "add", (2,)):
            step = _norm_chain(uses, j, used)
        else:
            continue
        if step is not None:
            steps[j] = step
            used.update(step.nodes)
    absorbed = {i for s in steps.values() for i in s.nodes[1:]}
    return steps, absorbed


def _act_mul(uses, j, used):
    """The ``act_mul`` step of mul node j, or None."""
    nodes, n = uses.nodes, uses.nodes[j]
    for k, x in enumerate(n.inputs):
        i = uses.made.get(id(x))
        if (i is not None and i not in used and nodes[i].op in _ACTIVATIONS
                and _plain(nodes[i], nodes[i].op, (1,)) and uses.only_reader(x, j)):
            return Step("act_mul", (j, i), (nodes[i].inputs[0], n.inputs[1 - k]),
                        tuple(n.outputs), {"act": nodes[i].op, "first": k == 0})
    return None


def _norm_chain(uses, j, used):
    """The ``norm_chain`` step of add node j, or None: the norm feeding it (read by it
    alone) and the first norm of its sum whose other inputs exist before it. Inputs
    ``[x, r, (w1), (w2)]``: the norm's x (or the add's first operand), the add's other
    operand, then the norms' weights when they have them."""
    nodes, n = uses.nodes, uses.nodes[j]
    pre = next(((k, i) for k, i in ((k, uses.made.get(id(x))) for k, x in enumerate(n.inputs))
                if i is not None and i not in used and _plain(nodes[i], "rms_norm", (1, 2))
                and uses.only_reader(n.inputs[k], j)), None)
    post = next((q for q in uses.readers.get(id(n.outputs[0]), ())
                 if q > j and q not in used and _plain(nodes[q], "rms_norm", (1, 2))
                 and nodes[q].inputs[0] is n.outputs[0]
                 and all(uses.made.get(id(x), -1) < j for x in nodes[q].inputs[1:])), None)
    if pre is None and post is None:
        return None
    attrs = {"pre": pre is not None, "post": post is not None, "w1": False, "eps1": 0.0,
             "first": True, "w2": False, "eps2": 0.0}
    members, ins, outs = [j], list(n.inputs), list(n.outputs)
    if pre is not None:
        k, i = pre
        p = nodes[i]
        ins = [p.inputs[0], n.inputs[1 - k], *p.inputs[1:]]
        attrs.update(w1=len(p.inputs) > 1, eps1=p.attrs["epsilon"], first=k == 0)
        members.append(i)
    if post is not None:
        q = nodes[post]
        ins += q.inputs[1:]
        outs += q.outputs
        attrs.update(w2=len(q.inputs) > 1, eps2=q.attrs["epsilon"])
        members.append(post)
    return Step("norm_chain", tuple(members), tuple(ins), tuple(outs), attrs)


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
