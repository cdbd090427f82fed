"""Graph, Value and Node: symbolic construction with layer scopes, then execution.

A node is added by ``Graph._add_node``: the op's shape/dtype rule runs at once, so a
mistake fails at build time with a ``GraphError`` naming the spec ``file:line:col``
(when the node came from a spec), the layer path, the op and the input types.
"""

from __future__ import annotations

import os
import traceback
from contextlib import contextmanager
from dataclasses import dataclass, field

import numpy as np

from . import runtime
from .dtypes import DType, QuantizedType, TensorType, as_type  # noqa: F401 (re-exported)
from .errors import GraphError, MaxdeclError
from .ops import _registry
from .runtime import describe_value  # noqa: F401  (re-exported)
from .tensors import QuantizedTensor

_CURRENT = _registry.CURRENT_GRAPH
__all__ = ["Graph", "Value", "Node", "QuantizedType", "format_system_stack"]


class Value:
    """A symbolic tensor of a graph: ``.dtype``, ``.shape``, ``.rank``.

    Quantized values have dtype uint8 (packed GGML blocks), ``.encoding`` and
    ``.logical_shape`` (the float shape they decode to).
    """

    __slots__ = ("graph", "type", "node", "index", "name")
    is_value = True     # how ops recognise a Value without importing this module

    def __init__(self, graph, type_, node=None, index=0, name=None):
        self.graph = graph
        self.type = type_
        self.node = node
        self.index = index
        self.name = name

    dtype = property(lambda self: self.type.dtype)
    shape = property(lambda self: self.type.shape)
    rank = property(lambda self: len(self.type.shape))

    @property
    def encoding(self) -> str | None:
        return self.type.encoding if isinstance(self.type, QuantizedType) else None

    @property
    def logical_shape(self) -> tuple:
        return self.type.logical_shape if isinstance(self.type, QuantizedType) else self.shape

    @property
    def is_quantized(self) -> bool:
        return isinstance(self.type, QuantizedType)

    def __repr__(self) -> str:
        label = f" {self.name!r}" if self.name else ""
        return f"Value{label}({self.type})"

    # Operator sugar, as torch/MAX users expect.
    def __add__(self, o):
        return self.graph.apply('add', [self, o], {})[0]

    def __radd__(self, o):
        return self.graph.apply('add', [o, self], {})[0]

    def __sub__(self, o):
        return self.graph.apply('sub', [self, o], {})[0]

    def __rsub__(self, o):
        return self.graph.apply('sub', [o, self], {})[0]

    def __mul__(self, o):
        return self.graph.apply('mul', [self, o], {})[0]

    def __rmul__(self, o):
        return self.graph.apply('mul', [o, self], {})[0]

    def __truediv__(self, o):
        return self.graph.apply('div', [self, o], {})[0]

    def __rtruediv__(self, o):
        return self.graph.apply('div', [o, self], {})[0]

    def __matmul__(self, o):
        return self.graph.apply('matmul', [self, o], {})[0]

    def __neg__(self):
        return self.graph.apply('neg', [self], {})[0]


@dataclass(eq=False)
class Node:
    """One op application: ``op`` name, inputs, outputs, attributes and where it came from."""

    op: str
    inputs: list
    outputs: list = field(default_factory=list)
    attrs: dict = field(default_factory=dict)
    layer: str = ""               # dotted layer path current when the node was added
    origin: str | None = None     # spec "file:line:col" when built from a spec

    def where(self) -> str:
        """``file:line:col: layer: op`` prefix for messages."""
        parts = [p for p in (self.origin, self.layer or "<root>", self.op) if p]
        return ": ".join(parts)


class Graph:
    """A computation under construction; nodes are kept in insertion order.

    Example::

        g = md.Graph("mlp", input_types=[md.TensorType(md.DType.float32, ("batch", 16))])
        with g.layer("fc1"):
            y = md.ops.relu(g.inputs[0])
        g.output(y)
        (out,) = g.execute(np.ones((2, 16), np.float32))
    """

    # how a batch of sequences runs (``rows``: one call over all their rows;
    # ``per_sequence``: each sequence alone), from a spec's top-level ``batching``
    batching = "rows"

    def __init__(self, name: str, input_types=(), input_names=None):
        self.name = name
        self.nodes: list[Node] = []
        self.outputs: list[Value] = []
        self.output_names: list[str | None] = []
        self.weights: dict[str, Value] = {}
        self._layers: list[str] = []
        self._origin: str | None = None
        self._tokens: list = []
        if isinstance(input_types, (str, bytes)) or not hasattr(input_types, "__iter__"):
            raise GraphError(f"{name}: input_types must be a list of md.TensorType")
        types = [as_type(t) for t in input_types]
        names = list(input_names) if input_names else [None] * len(types)
        if len(names) != len(types):
            raise GraphError(f"{name}: {len(types)} input types but {len(names)} input names")
        self.inputs = [Value(self, t, None, i, n) for i, (t, n) in enumerate(zip(types, names))]

    # -- scopes ------------------------------------------------------------------------
    def __enter__(self) -> "Graph":
        self._tokens.append(_CURRENT.set(self))
        return self

    def __exit__(self, *exc) -> None:
        _CURRENT.reset(self._tokens.pop())

    @staticmethod
    def current() -> "Graph | None":
        """The graph made current by ``with g:``, or None."""
        return _CURRENT.get()

    @contextmanager
    def layer(self, name):
        """Nest a named layer scope; nodes added inside record its dotted path."""
        name = str(name)
        if not name or any(not part for part in name.split(".")):
            raise GraphError(f"{self.current_layer() or '<root>'}: invalid layer name {name!r}")
        self._layers.append(name)
        try:
            yield self.current_layer()
        finally:
            self._layers.pop()

    def current_layer(self) -> str:
        """Dotted path of the innermost open layer scope; ``""`` at the root."""
        return ".".join(self._layers)

    @contextmanager
    def origin(self, where: str | None):
        """Attach a spec position (``file:line:col``) to nodes added in this scope."""
        saved, self._origin = self._origin, where or self._origin
        try:
            yield
        finally:
            self._origin = saved

    # -- leaves ------------------------------------------------------------------------
    def constant(self, value, dtype=None) -> Value:
        """A constant tensor node (NumPy array, scalar or QuantizedTensor)."""
        if isinstance(value, QuantizedTensor):
            return self._add_node("constant", [], {"value": value})[0]
        arr = np.asarray(value, dtype=DType.parse(dtype).numpy if dtype is not None else None)
        if arr.dtype == np.float64 and dtype is None:
            arr = arr.astype(np.float32)
        return self._add_node("constant", [], {"value": arr})[0]

    def weight(self, name: str, tensor_type, encoding=None) -> Value:
        """Declare a named weight bound at ``execute(weights=...)`` (or by ``md.build``).

        ``tensor_type`` is the logical float type; with ``encoding`` the value holds
        packed blocks (dtype uint8) of that encoding.
        """
        if name in self.weights:
            raise GraphError(f"{self.current_layer() or '<root>'}: weight {name!r} declared twice")
        t = as_type(tensor_type)
        if encoding is not None:
            attrs = {"name": name, "type": t, "encoding": str(encoding).lower()}
        else:
            attrs = {"name": name, "type": t, "encoding": None}
        v = self._add_node("weight", [], attrs)[0]
        v.name = name
        self.weights[name] = v
        return v

    def quantize(self, value_or_array, encoding) -> Value:
        """A quantized tensor (uint8 packed GGML blocks; ``.logical_shape`` = float shape)."""
        from . import codecs

        enc = codecs.get(encoding)
        if isinstance(value_or_array, Value):
            return self._add_node("quantize", [value_or_array], {"encoding": enc.name})[0]
        arr = np.ascontiguousarray(value_or_array, dtype=np.float32)
        try:
            qt = QuantizedTensor(enc.quantize(arr), arr.shape, enc.name)
        except MaxdeclError as e:
            raise GraphError(f"{self.current_layer() or '<root>'}: quantize: {e}") from None
        return self.constant(qt)

    def output(self, *values, names=None) -> None:
        """Mark the graph's outputs (a list or several values); ``names`` label them
        (``output_names``), defaulting to the values' own names."""
        if len(values) == 1 and isinstance(values[0], (list, tuple)):
            values = tuple(values[0])
        for v in values:
            if not isinstance(v, Value) or v.graph is not self:
                raise GraphError(f"{self.name}: output {v!r} is not a value of this graph")
        self.outputs = list(values)
        self.output_names = list(names) if names is not None else [v.name for v in values]
        if len(self.output_names) != len(self.outputs):
            raise GraphError(f"{self.name}: {len(self.outputs)} outputs but "
                             f"{len(self.output_names)} names")

    # -- the one place nodes are made -------------------------------------------------
    def apply(self, op: str, inputs: list, attrs: dict) -> list[Value]:
        """Add a node ``op`` on ``inputs``: non-Values (arrays, Python scalars) become
        constants of this graph (a Python scalar takes its float partner's dtype)."""
        opdef = _registry.get(op)
        vals = [v if isinstance(v, Value) else self.constant(
                    _as_const(v, inputs, opdef.index_input(k)))
                for k, v in enumerate(inputs)]
        return self._add_node(op, vals, attrs)

    def _add_node(self, op: str, inputs: list, attrs: dict) -> list[Value]:
        node = Node(op, list(inputs), [], dict(attrs), self.current_layer(), self._origin)
        types = [getattr(v, "type", v) for v in node.inputs]
        try:
            for v in node.inputs:
                if not isinstance(v, Value):
                    raise TypeError(f"input {v!r} is not a graph value")
                if v.graph is not self:
                    raise ValueError(f"input {v} belongs to graph {v.graph.name!r}, "
                                     f"not {self.name!r}")
            node.attrs, out_types = _registry.infer(_registry.get(op), types, node.attrs)
        except GraphError as e:
            raise GraphError(f"{node.where()}: {e}") from None
        except Exception as e:  # noqa: BLE001 - every rule failure becomes one GraphError
            raise GraphError(f"{_where(node)}: {_registry.type_error(op, types, e)}") from None
        node.outputs = [Value(self, t, node, i) for i, t in enumerate(out_types)]
        self.nodes.append(node)
        return node.outputs

    # -- execution ---------------------------------------------------------------------
    def execute(self, *inputs, weights=None) -> list[np.ndarray]:
        """Run the graph on NumPy inputs: ``md.compile(self, weights)(*inputs)``.

        ``weights`` (a TensorDict or mapping) binds the declared ``g.weight`` names.
        Compile once with ``md.compile`` to run a graph many times.
        """
        return runtime.compile(self, weights)(*inputs)

    def __repr__(self) -> str:
        return f"Graph({self.name!r}, {len(self.inputs)} inputs, {len(self.nodes)} nodes)"


def _where(node: Node) -> str:
    """``file:line:col: layer`` of a node (the op follows in the message)."""
    return ": ".join(p for p in (node.origin, node.layer or "<root>") if p)


def _as_const(v, inputs, index=False):
    """Python scalars take the dtype of their tensor partner (as in torch): the first
    non-bool input's (``select(cond, 0.0, x)``: x's); with none (a bool condition at
    most), float32 for a float and int64 for an int (``select(cond, 0.0, -100.0)``).
    An int where the op takes indices (``index``: ``gather(x, 3)``) is int64."""
    if index and isinstance(v, int) and not isinstance(v, bool):
        return np.asarray(v, dtype=np.int64)
    if isinstance(v, (int, float)) and not isinstance(v, bool):
        values = [x for x in inputs if isinstance(x, Value)]
        partner = next((x for x in values if x.dtype != DType.bool), None)
        if partner is not None:
            return np.asarray(v, dtype=partner.dtype.numpy)
        return np.asarray(v, dtype=np.float32 if isinstance(v, float) else np.int64)
    return v


def format_system_stack(limit: int | None = None) -> str:
    """The current Python call stack for humans: innermost last, maxdecl frames folded."""
    pkg = os.path.dirname(os.path.abspath(__file__))
    frames = traceback.extract_stack()[:-1]
    if limit:
        frames = frames[-limit:]
    lines, folded = [], 0
    for fr in frames:
        if os.path.abspath(fr.filename).startswith(pkg):
            folded += 1
            continue
        if folded:
            lines.append(f"  ... {folded} maxdecl frame{'s' if folded > 1 else ''} ...")
            folded = 0
        lines.append(f"  {fr.filename}:{fr.lineno} in {fr.name}")
        if fr.line:
            lines.append(f"    {fr.line.strip()}")
    if folded:
        lines.append(f"  ... {folded} maxdecl frame{'s' if folded > 1 else ''} ...")
    return "\n".join(lines)
