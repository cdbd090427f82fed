"""The op registry: a plain dict from op name to OpDef.

An OpDef pairs a shape/dtype rule (``infer``, run when a node is added) with a
runtime function (``run``, called by ``Graph.execute``). ``normalize`` (optional)
canonicalises attributes (``stride=2`` -> ``(2, 2)``) once, at build time, so YAML
and Python callers get identical nodes.
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass
from typing import Callable

from ..errors import GraphError
from ..signatures import REQUIRED, SIGNATURES, OpSig


@dataclass(frozen=True)
class OpDef:
    """An op: ``infer(inputs: list[Value], attrs) -> list[type]`` and
    ``run(args: list[ndarray | QuantizedTensor], attrs) -> list[ndarray]``."""

    name: str
    infer: Callable
    run: Callable
    normalize: Callable | None = None
    kind: str = ""


REGISTRY: dict[str, OpDef] = {}
_KERNELS: dict = {}


def kernels(name: str):
    """The module ``maxdecl.kernels.<name>``, imported on first use (numba loads then,
    never when a spec is parsed or a graph built); later calls are one dict lookup
    where a function-level import statement cost ~1 us per op call."""
    mod = _KERNELS.get(name)
    if mod is None:
        import importlib

        mod = _KERNELS[name] = importlib.import_module(f"maxdecl.kernels.{name}")
    return mod


def register(name: str, *, infer, run, normalize=None, kind: str = "",
             signature: OpSig | None = None) -> OpDef:
    """Register op ``name``; its signature must exist in ``maxdecl.signatures``
    (or be given, for ops defined outside the package)."""
    if name in REGISTRY:
        raise GraphError(f"op {name!r} is already registered")
    if signature is not None:
        from ..signatures import register_signature
        register_signature(name, signature)
    elif name not in SIGNATURES and name not in _LEAVES:
        raise GraphError(f"op {name!r} has no signature in maxdecl.signatures")
    opdef = OpDef(name, infer, run, normalize, kind)
    REGISTRY[name] = opdef
    return opdef


_LEAVES = {"constant", "weight", "quantize", "custom"}


def get(name: str) -> OpDef:
    """The OpDef registered as ``name``; unknown names list the closest ones."""
    try:
        return REGISTRY[name]
    except KeyError:
        _load_entry_points()
        if name in REGISTRY:
            return REGISTRY[name]
        close = difflib.get_close_matches(name, list(REGISTRY), n=3)
        hint = f"; did you mean {', '.join(repr(c) for c in close)}?" if close else ""
        raise GraphError(f"unknown op {name!r}{hint}") from None


def with_defaults(name: str, attrs: dict) -> dict:
    """Fill missing attributes from the op's signature; reject unknown/missing ones."""
    sig = SIGNATURES.get(name)
    if sig is None:
        return dict(attrs)
    unknown = [k for k in attrs if k not in sig.attrs]
    if unknown:
        close = difflib.get_close_matches(unknown[0], list(sig.attrs), n=1)
        hint = f"; did you mean {close[0]!r}?" if close else ""
        known = ", ".join(sig.attrs) or "none"
        raise ValueError(f"unknown attribute {unknown[0]!r} (known: {known}){hint}")
    out = {}
    for k, default in sig.attrs.items():
        if k in attrs:
            out[k] = attrs[k]
        elif default is REQUIRED:
            raise ValueError(f"missing required attribute {k!r}")
        else:
            out[k] = default
    return out


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


def apply(name: str, inputs, **attrs):
    """Add a node ``name`` to the graph of ``inputs`` (or the current graph).

    Non-Value inputs (arrays, scalars) become constants of that graph. Returns the
    list of output Values.
    """
    from ..graph import Graph, Value

    graph = next((v.graph for v in inputs if isinstance(v, Value)), None) or Graph.current()
    if graph is None:
        raise GraphError(f"{name}: no graph: pass a graph Value or use `with graph:`")
    vals = [v if isinstance(v, Value) else graph.constant(_as_const(v, inputs)) for v in inputs]
    attrs = with_defaults_or_error(graph, name, attrs)
    return graph._add_node(name, vals, attrs)


def with_defaults_or_error(graph, name, attrs):
    try:
        return with_defaults(name, attrs)
    except ValueError as e:
        layer = graph.current_layer() or "<root>"
        where = f"{graph._origin}: " if graph._origin else ""
        raise GraphError(f"{where}{layer}: {name}: {e}") from None


def _as_const(v, inputs):
    """Python scalars take the float dtype of their float partner (as in torch)."""
    import numpy as np

    from ..graph import Value

    if isinstance(v, (int, float)) and not isinstance(v, bool):
        partner = next((x for x in inputs if isinstance(x, Value)), None)
        if partner is not None:
            return np.asarray(v, dtype=partner.dtype.numpy)
        return np.asarray(v, dtype=np.float32 if isinstance(v, float) else np.int64)
    return v
