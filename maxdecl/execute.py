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
    """The node loop compiled once per graph state: ``(input slots, weight slots, run)``.

    ``run(env)`` takes the inputs and bound weights in their slots of the list ``env``
    and returns the outputs. It is Python generated from the graph (one local
    variable per value, one line per node, each intermediate deleted after its last
    use): a decode step runs ~400 nodes, and interpreting them from a table cost
    ~5 us of bookkeeping each.
    """
    key = (len(graph.nodes), len(graph.inputs), tuple(map(id, graph.outputs)))
    cached = getattr(graph, "_plan", None)
    if cached is not None and cached[0] == key:
        return cached[1]
    from . import kernels  # noqa: F401  (numba's NumPy support, loaded the fast way)
    from .ops import _registry

    slot: dict[int, int] = {}

    def v(value) -> str:
        return f"v{slot.setdefault(id(value), len(slot))}"

    inputs = [v(x) for x in graph.inputs]
    weights = [(v(n.outputs[0]), n) for n in graph.nodes if n.op == "weight"]
    nodes = [n for n in graph.nodes if n.op != "weight"]
    last = {}
    for i, n in enumerate(nodes):
        for x in n.inputs:
            last[v(x)] = i
    keep = {v(x) for x in graph.outputs}
    loaded = [name for name in (*inputs, *(name for name, _ in weights))]
    lines = ["def run(env):"]
    lines += [f"    {name} = env[{k}]" for k, name in enumerate(loaded)]
    for i, n in enumerate(nodes):
        outs = ", ".join(v(x) for x in n.outputs)
        lines.append(f"    _i = {i}")
        lines.append(f"    _args = [{', '.join(v(x) for x in n.inputs)}]")
        lines.append(f"    {outs}, = _ops[{i}].run(_args, _attrs[{i}])" if n.outputs
                     else f"    _ops[{i}].run(_args, _attrs[{i}])")
        dead = [name for name, at in last.items() if at == i and name not in keep]
        if dead:
            lines.append(f"    del {', '.join(sorted(dead))}")
    lines.append(f"    return [{', '.join(v(x) for x in graph.outputs)}]")
    scope = {"_ops": [_registry.REGISTRY[n.op] for n in nodes],
             "_attrs": [n.attrs for n in nodes]}
    exec(compile("\n".join(lines), f"<maxdecl plan of {graph.name}>", "exec"), scope)
    plan = (len(graph.inputs), weights, scope["run"], nodes)
    graph._plan = (key, plan)
    return plan


def _failed_step(e: BaseException, run):
    """(node index, its input values) of the generated ``run`` frame an error left."""
    tb = e.__traceback__
    while tb is not None:
        if tb.tb_frame.f_code is run.__code__:
            loc = tb.tb_frame.f_locals
            return loc.get("_i"), loc.get("_args", [])
        tb = tb.tb_next
    return None, []


def run_graph(graph, inputs, weights=None) -> list:
    """Execute ``graph`` on ``inputs``; returns its outputs as NumPy arrays."""
    arrays = [a if isinstance(a, QuantizedTensor) else np.asanyarray(a) for a in inputs]
    bind_inputs(graph, arrays)
    if not graph.outputs:
        raise GraphError(f"{graph.name}: no outputs; call graph.output(...) first")
    n_inputs, weight_slots, run, nodes = _plan(graph)
    bound = _bound_weights(graph, weights)
    env = arrays[:n_inputs] + [bound[id(node.outputs[0])] for _, node in weight_slots]
    try:
        return run(env)
    except Exception as e:  # noqa: BLE001 - one error type out of execute
        i, args = _failed_step(e, run)
        if i is None:
            raise
        node = nodes[i]
        if isinstance(e, MaxdeclError):
            raise GraphError(f"{node.where()}: {e}") from e
        from .graph import describe_value
        ins_text = ", ".join(describe_value(a) for a in args)
        raise GraphError(f"{node.where()}: {type(e).__name__}: {e} (inputs: {ins_text})") from e
