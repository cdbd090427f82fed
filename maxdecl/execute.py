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


def run_graph(graph, inputs, weights=None) -> list:
    """Execute ``graph`` on ``inputs``; returns its outputs as NumPy arrays."""
    from .ops import _registry

    arrays = [a if isinstance(a, QuantizedTensor) else np.asanyarray(a) for a in inputs]
    bind_inputs(graph, arrays)
    if not graph.outputs:
        raise GraphError(f"{graph.name}: no outputs; call graph.output(...) first")
    env: dict[int, object] = {id(v): a for v, a in zip(graph.inputs, arrays)}
    env.update(_bound_weights(graph, weights))
    for node in graph.nodes:
        if node.op == "weight":
            continue
        args = [env[id(v)] for v in node.inputs]
        try:
            outs = _registry.REGISTRY[node.op].run(args, node.attrs)
        except MaxdeclError as e:
            raise GraphError(f"{node.where()}: {e}") from e
        except Exception as e:  # noqa: BLE001 - one error type out of execute
            from .graph import describe_value
            ins = ", ".join(describe_value(a) for a in args)
            raise GraphError(f"{node.where()}: {type(e).__name__}: {e} (inputs: {ins})") from e
        for v, o in zip(node.outputs, outs):
            env[id(v)] = o
    return [env[id(v)] for v in graph.outputs]
