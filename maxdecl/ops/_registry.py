"""The op registry: one ``OpDef`` per op, the single source every layer reads.

An ``OpDef`` holds an op's name, inputs (required / optional / variadic), attributes
with defaults, number of outputs, a doc line, its attribute canonicalisation
(``normalize``), its **type rule** and where its runtime lives:

* ``rule(types, attrs) -> list[type]``: dtypes and symbolic shapes in, out, or a
  ``ValueError``/``TypeError`` whose text is the one-line reason. Rules are plain
  Python over ``md.TensorType`` / ``QuantizedType`` (no NumPy, no numba), so the
  spec layer (``maxdecl validate``), ``md.ops.<name>()``, the builder and the graph
  all run the same rule and print the same message.
* ``run``: the name of a module in ``maxdecl.kernels`` whose ``RUN`` table maps the
  op name to its runtime function (imported when a graph is compiled, never when a
  spec is checked), or a callable for user ops;
  ``function(args: list[ndarray | QuantizedTensor], attrs) -> list[ndarray]``.

Nothing here imports NumPy or the graph: ``apply`` finds the graph through its
input values (or the current graph set by ``with graph:``).
"""

from __future__ import annotations

import contextvars
import difflib
import importlib
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Callable

from ..errors import GraphError

REQUIRED = object()  # marks an attribute without a default

CURRENT_GRAPH: contextvars.ContextVar = contextvars.ContextVar("maxdecl_graph", default=None)



INDEX_INPUTS = frozenset({"indices", "ids", "positions"})   # integer-valued inputs

@dataclass(frozen=True)
class OpDef:
    """One op, defined once (see the module docstring)."""

    name: str
    rule: Callable
    run: "str | Callable"
    inputs: tuple = ("x",)
    optional: tuple = ()
    variadic: bool = False
    attrs: MappingProxyType = field(default_factory=lambda: MappingProxyType({}))
    outputs: "int | Callable" = 1          # or outputs(n_inputs, attrs) -> int
    doc: str = ""
    normalize: Callable | None = None
    kind: str = ""
    rule_doc: str = ""                     # the type rule in words, for the op reference
    dim_attrs: tuple = ()                  # attributes that hold dims (a reshape's shape)
    outputs_doc: str = ""                  # in words, when ``outputs`` is a function
    # Ops that mix positions along the sequence axis (attention, a causal conv, a scan)
    # run once per sequence when several sequences are batched: the ``sequence_inputs``
    # are cut along ``sequence_axis``, each sequence brings its own ``state`` input
    # (input name -> the output index of the updated state), other inputs (weights)
    # are shared. Every other op is row-wise.
    sequence_axis: int | None = None
    state: MappingProxyType = field(default_factory=lambda: MappingProxyType({}))
    sequence_inputs: tuple = ()
    # md.ops.<name>(): the required inputs, then these names (optional inputs and
    # attributes) in this order; default: the optional inputs, then the attributes
    call_order: tuple = ()
    # inputs the op reads in their packed blocks when they are quantized (linear's w,
    # embedding's table); every other input of a weight must be a plain float tensor
    packed: tuple = ()

    def index_input(self, position: int) -> bool:
        """Whether input ``position`` holds integer indices by its name (``indices``,
        ``ids``, ``positions``): a bare int written there is an int64 constant, not a
        number of the op's float dtype."""
        names = self.inputs + self.optional
        return position < len(names) and names[position] in INDEX_INPUTS

    def arity(self) -> tuple[int, int | None]:
        """(min, max) number of inputs; max None for variadic ops."""
        if self.variadic:
            return (1, None)
        return (len(self.inputs), len(self.inputs) + len(self.optional))

    def n_outputs(self, n_inputs: int, attrs: dict) -> int | None:
        """How many outputs a node with ``n_inputs`` inputs and ``attrs`` has (None: unknown)."""
        if callable(self.outputs):
            try:
                return self.outputs(n_inputs, attrs)
            except (TypeError, ValueError, LookupError):      # attributes still wrong:
                return None                                   # they are reported elsewhere
        return self.outputs

    def runner(self) -> Callable:
        """The runtime function, imported on first use."""
        fn = _RUNNERS.get(self.name)
        if fn is None:
            if callable(self.run):
                fn = self.run
            else:
                fn = importlib.import_module(f"maxdecl.kernels.{self.run}").RUN[self.name]
            _RUNNERS[self.name] = fn
        return fn

    def batch_runner(self) -> Callable | None:
        """The runtime that runs every sequence of a batched step in one call
        (``RUN_BATCH`` of the kernels module: ``fn(args, rows, attrs)`` with the row
        inputs of all sequences together and the states per sequence; it returns the
        outputs, each state output a list per sequence, or None to leave the step to the
        general path), or None: then each sequence runs alone."""
        if self.name not in _BATCH_RUNNERS:
            fn = None
            if not callable(self.run):
                module = importlib.import_module(f"maxdecl.kernels.{self.run}")
                fn = getattr(module, "RUN_BATCH", {}).get(self.name)
            _BATCH_RUNNERS[self.name] = fn
        return _BATCH_RUNNERS[self.name]


REGISTRY: dict[str, OpDef] = {}
_RUNNERS: dict[str, Callable] = {}
_BATCH_RUNNERS: dict[str, Callable | None] = {}


def define(name: str, *, rule, run, inputs=("x",), optional=(), variadic=False, attrs=None,
           outputs=1, doc="", normalize=None, kind="", rule_doc="", dim_attrs=(),
           outputs_doc="", sequence_axis=None, state=None, call_order=(),
           sequence_inputs=(), packed=()) -> OpDef:
    """Define and register op ``name``; a name is defined once."""
    if name in REGISTRY:
        raise GraphError(f"op {name!r} is already registered")
    opdef = OpDef(name, rule, run, tuple(inputs), tuple(optional), variadic,
                  MappingProxyType(dict(attrs or {})), outputs, doc, normalize, kind, rule_doc,
                  tuple(dim_attrs), outputs_doc, sequence_axis,
                  MappingProxyType(dict(state or {})), tuple(sequence_inputs),
                  tuple(call_order), tuple(packed))
    REGISTRY[name] = opdef
    return opdef


def undefine(name: str) -> None:
    """Remove op ``name`` (user ops only; see ``md.ops.unregister_custom``)."""
    REGISTRY.pop(name, None)
    _RUNNERS.pop(name, None)


def get(name: str) -> OpDef:
    """The OpDef registered as ``name``; unknown names list the closest ones."""
    try:
        return REGISTRY[name]
    except KeyError:
        _load_entry_points()
        if name in REGISTRY:
            return REGISTRY[name]
        raise GraphError(f"unknown op {name!r}{hint(name, spec_ops())}") from None


def spec_ops() -> list[str]:
    """Op names a spec may use (leaf nodes such as ``constant`` are the graph's own)."""
    return sorted(n for n, d in REGISTRY.items() if d.kind != "leaf")


def hint(word, choices) -> str:
    """``"; did you mean 'x'?"`` for the closest of ``choices``, or ``""``."""
    close = difflib.get_close_matches(str(word), [str(c) for c in choices], n=1)
    return f"; did you mean {close[0]!r}?" if close else ""


def with_defaults(opdef: OpDef, attrs: dict) -> dict:
    """``attrs`` with the op's defaults filled in; ValueError for unknown/missing ones."""
    unknown = [k for k in attrs if k not in opdef.attrs]
    if unknown:
        known = ", ".join(opdef.attrs) or "none"
        extra = ""
        if unknown[0] in (*opdef.inputs, *opdef.optional):
            extra = f" ({unknown[0]!r} is an input of {opdef.name}: pass it in `in:`)"
        raise ValueError(f"unknown attribute {unknown[0]!r} (known: {known})"
                         f"{hint(unknown[0], opdef.attrs)}{extra}")
    out = {}
    for k, default in opdef.attrs.items():
        if k in attrs:
            out[k] = attrs[k]
        elif default is REQUIRED:
            raise ValueError(f"missing required attribute {k!r}")
        else:
            out[k] = default
    return out


def infer(opdef: OpDef, types: list, attrs: dict) -> tuple[dict, list]:
    """Check a node's arity, attributes and input types by the op's definition.

    Returns ``(normalized attrs, output types)``; raises ValueError/TypeError with the
    reason (``type_error`` formats it the same way for the spec checker and the graph).
    """
    lo, hi = opdef.arity()
    if len(types) < lo or (hi is not None and len(types) > hi):
        names = list(opdef.inputs) + [f"{n}?" for n in opdef.optional]
        want = f"{lo}" if lo == hi else f"{lo} to {hi}" if hi is not None else f"{lo}+"
        raise ValueError(f"takes {want} input{'s' if hi != 1 else ''} ({', '.join(names)}), "
                         f"got {len(types)}")
    attrs = with_defaults(opdef, attrs)
    if opdef.normalize is not None:
        attrs = opdef.normalize(attrs)
    outs = list(opdef.rule(list(types), attrs))
    return attrs, outs


def type_error(op: str, types, exc: BaseException) -> str:
    """``op: reason (inputs: float32[seq, 64], q8_0[64, 64])``: one line for any rule failure."""
    text = str(exc) or type(exc).__name__
    ins = ", ".join(str(t) for t in types) or "no inputs"
    return f"{op}: {text} (inputs: {ins})"


def public(fn: Callable) -> Callable:
    """Decorator: ``md.ops.<name>`` made from op ``name``'s definition (the function's
    name; its docstring kept, its body unused). Positional parameters: the required
    inputs, then the optional inputs and attributes in ``call_order``, each attribute
    defaulting to the definition's default; one output comes back as a Value, several
    as a list. So a Python call and a YAML node give the same node, with no default
    written twice."""
    return public_op(fn.__name__, fn.__doc__, fn.__module__)


def public_op(name: str, doc: str | None = None, module: str | None = None) -> Callable:
    """``md.ops.<name>`` for op ``name`` (see ``public``)."""
    import inspect

    opdef = REGISTRY[name]
    rest = opdef.call_order or (*opdef.optional, *opdef.attrs)
    P = inspect.Parameter
    params = [P(i, P.POSITIONAL_OR_KEYWORD) for i in opdef.inputs]
    for n in rest:
        default = opdef.attrs.get(n, None) if n in opdef.attrs else None
        params.append(P(n, P.POSITIONAL_OR_KEYWORD) if default is REQUIRED
                      else P(n, P.POSITIONAL_OR_KEYWORD, default=default))
    sig = inspect.Signature(params)

    def op(*args, **kwargs):
        given = sig.bind(*args, **kwargs).arguments
        ins = list(given[opdef.inputs[0]]) if opdef.variadic else \
            [given[i] for i in opdef.inputs]
        optional = [given.get(o) for o in opdef.optional]
        while optional and optional[-1] is None:
            optional.pop()
        attrs = {k: v for k, v in given.items() if k in opdef.attrs}
        outs = apply(name, ins + optional, **attrs)
        return outs[0] if len(outs) == 1 else list(outs)

    op.__name__ = op.__qualname__ = name
    op.__doc__ = doc or opdef.doc[:1].upper() + opdef.doc[1:] + "."
    op.__signature__ = sig
    if module:
        op.__module__ = module
    return op


def apply(name: str, inputs, **attrs) -> list:
    """Add a node ``name`` to the graph of ``inputs`` (or the current graph); returns
    its output Values. Non-Value inputs (arrays, scalars) become constants."""
    graph = next((v.graph for v in inputs if getattr(v, "is_value", False)), None) \
        or CURRENT_GRAPH.get()
    if graph is None:
        raise GraphError(f"{name}: no graph: pass a graph Value or use `with graph:`")
    return graph.apply(name, list(inputs), attrs)


_ENTRY_POINTS_LOADED = False


def _load_entry_points() -> None:
    """Import packages that register ops through the ``maxdecl.ops`` entry-point group."""
    global _ENTRY_POINTS_LOADED
    if _ENTRY_POINTS_LOADED:
        return
    _ENTRY_POINTS_LOADED = True
    from importlib.metadata import entry_points

    for ep in entry_points(group="maxdecl.ops"):
        ep.load()
