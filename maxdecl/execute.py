"""Run a Graph: nodes in order, each through its op's ``run()``.

The first numba import happens here (inside the ops' run functions), never when a
spec is parsed or validated. Every failure becomes a ``GraphError`` naming the
node's spec position, layer path, op and the runtime types of its inputs.
"""

from __future__ import annotations

import numpy as np

from .dtypes import TensorType, format_shape
from .errors import GraphError, MaxdeclError
from .tensors import QuantizedTensor


def bind_inputs(graph, arrays) -> dict:
    """Check runtime inputs against the graph's input types; returns {symbol: size}."""
    if len(arrays) != len(graph.inputs):
        raise GraphError(f"{graph.name}: expected {len(graph.inputs)} inputs, got {len(arrays)}")
    symbols: dict[str, int] = {}
    for i, (v, a) in enumerate(zip(graph.inputs, arrays)):
        label = v.name or f"input {i}"
        t = v.type
        if not isinstance(a, QuantizedTensor) and a.dtype != t.dtype.numpy:
            raise GraphError(f"{graph.name}: {label}: expected {t}, got "
                             f"{a.dtype.name}{format_shape(a.shape)}")
        if len(a.shape) != len(t.shape):
            raise GraphError(f"{graph.name}: {label}: expected rank {len(t.shape)} {t}, "
                             f"got shape {format_shape(a.shape)}")
        for want, got in zip(t.shape, a.shape):
            if isinstance(want, str):
                if symbols.setdefault(want, got) != got:
                    raise GraphError(f"{graph.name}: {label}: dim {want!r} is {symbols[want]} "
                                     f"elsewhere but {got} here")
            elif want != got:
                raise GraphError(f"{graph.name}: {label}: expected {t}, got shape "
                                 f"{format_shape(a.shape)}")
    return symbols


def _bind_weight(node, weights):
    name = node.attrs["name"]
    if weights is None or name not in weights:
        raise GraphError(f"{node.where()}: weight {name!r} is not bound "
                         "(pass weights=TensorDict with that name)")
    w = weights[name]
    t: TensorType = node.attrs["type"]
    enc = node.attrs["encoding"]
    if enc is not None:
        if not isinstance(w, QuantizedTensor) or w.encoding != enc:
            got = w.encoding if isinstance(w, QuantizedTensor) else f"{w.dtype.name} array"
            raise GraphError(f"{node.where()}: weight {name!r} must be {enc}, got {got}")
        shape = w.shape
    else:
        if isinstance(w, QuantizedTensor):
            raise GraphError(f"{node.where()}: weight {name!r} is {w.encoding}, "
                             f"expected unquantized {t}")
        shape = w.shape
        if w.dtype != t.dtype.numpy:
            raise GraphError(f"{node.where()}: weight {name!r} is {w.dtype.name}, expected {t}")
    if len(shape) != len(t.shape) or any(isinstance(d, int) and d != s
                                         for d, s in zip(t.shape, shape)):
        raise GraphError(f"{node.where()}: weight {name!r} has shape {format_shape(shape)}, "
                         f"expected {format_shape(t.shape)}")
    return w


def _bound_weights(graph, weights) -> dict:
    """{id(weight value): tensor} for every weight node, checked once per TensorDict
    state (a generation loop binds the same weights on every step)."""
    key = (id(weights), getattr(weights, "version", None), len(graph.nodes))
    cached = getattr(graph, "_binding", None)
    if cached is not None and cached[0] == key and cached[1] is weights and key[1] is not None:
        return cached[2]
    bound = {id(n.outputs[0]): _bind_weight(n, weights) for n in graph.nodes if n.op == "weight"}
    graph._binding = (key, weights, bound)
    return bound


def _plan(graph):
    """The node loop compiled once per graph state: ``(n_slots, input slots, weight slots,
    steps, output slots)``; each step is ``(op, attrs, in slots, out slots, slots freed
    after it, node)``. Intermediates are dropped after their last use, so a step's
    arrays can reuse memory that is still in cache."""
    key = (len(graph.nodes), len(graph.inputs), tuple(map(id, graph.outputs)))
    cached = getattr(graph, "_plan", None)
    if cached is not None and cached[0] == key:
        return cached[1]
    from . import kernels  # noqa: F401  (numba's NumPy support, loaded the fast way)
    from .ops import _registry

    slot: dict[int, int] = {}

    def slot_of(v) -> int:
        return slot.setdefault(id(v), len(slot))

    inputs = [slot_of(v) for v in graph.inputs]
    weights = [(slot_of(n.outputs[0]), n) for n in graph.nodes if n.op == "weight"]
    nodes = [n for n in graph.nodes if n.op != "weight"]
    steps = [[_registry.REGISTRY[n.op], n.attrs, [slot_of(v) for v in n.inputs],
              [slot_of(v) for v in n.outputs], [], n] for n in nodes]
    outputs = [slot_of(v) for v in graph.outputs]
    last: dict[int, int] = {}
    for i, step in enumerate(steps):
        for s in step[2]:
            last[s] = i
    keep = set(outputs)
    for s, i in last.items():
        if s not in keep:
            steps[i][4].append(s)
    plan = (len(slot), inputs, weights, [tuple(st) for st in steps], outputs)
    graph._plan = (key, plan)
    return plan


def run_graph(graph, inputs, weights=None) -> list:
    """Execute ``graph`` on ``inputs``; returns its outputs as NumPy arrays."""
    arrays = [a if isinstance(a, QuantizedTensor) else np.asanyarray(a) for a in inputs]
    bind_inputs(graph, arrays)
    if not graph.outputs:
        raise GraphError(f"{graph.name}: no outputs; call graph.output(...) first")
    n_slots, input_slots, weight_slots, steps, output_slots = _plan(graph)
    env: list = [None] * n_slots
    for s, a in zip(input_slots, arrays):
        env[s] = a
    bound = _bound_weights(graph, weights)
    for s, node in weight_slots:
        env[s] = bound[id(node.outputs[0])]
    for op, attrs, ins, outs, free, node in steps:
        args = [env[s] for s in ins]
        try:
            results = op.run(args, attrs)
        except MaxdeclError as e:
            raise GraphError(f"{node.where()}: {e}") from e
        except Exception as e:  # noqa: BLE001 - one error type out of execute
            from .graph import describe_value
            ins_text = ", ".join(describe_value(a) for a in args)
            raise GraphError(f"{node.where()}: {type(e).__name__}: {e} (inputs: {ins_text})") from e
        for s, o in zip(outs, results):
            env[s] = o
        for s in free:
            env[s] = None
    return [env[s] for s in output_slots]
