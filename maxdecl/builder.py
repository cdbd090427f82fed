"""Spec (+ weights) -> Graph: every node inside the layer scope its YAML declared.

``build`` unrolls the spec into a ``Program`` (see ``maxdecl.spec.model``) and
replays it on a ``Graph``: each step opens the nested ``g.layer(...)`` scopes of
its layer path (so ``node.layer == "blk.3.attn_q"``) and ``g.origin(...)`` of the
YAML node that declared it (so a ``GraphError`` names ``specs/x.yaml:41:7``).

Every op, ``linear`` included, is added through ``Graph.apply``: the graph runs the
op's type rule, the same one ``maxdecl validate`` runs, so their messages agree.
A weight the bound TensorDict lacks takes its spec ``absent:`` stand-in (an
earlier weight's value, or a constant fill); without one it is reported missing.

Graph inputs and outputs carry names: ``graph.inputs[k].name`` and
``graph.output_names[k]``. An output named like an input (``blk.3.kv_cache``) is
state a generation loop feeds back as that input on the next step.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from .errors import SpecError, WeightsError
from .spec import Spec, load_spec
from .blocks import known as known_encodings
from .spec.decls import PConst, PInput, POp, PWeight, Program

__all__ = ["build", "check_weights", "describe_tree", "format_tree", "TreeRow"]

_SHOW = 5   # names listed per category in a WeightsError


def _program(spec, variant=None, params=None, check_encodings=True) -> tuple[Spec, Program]:
    if not isinstance(spec, Spec):
        spec = load_spec(spec, variant)
    return spec, spec.program(variant or spec.variant, params, check_encodings)


BATCHING = ("rows", "per_sequence")


def batching_mode(spec, params) -> str:
    """The spec's ``batching`` for these params: ``rows`` or ``per_sequence``."""
    from .spec.expr import ExprError, render

    try:
        mode = render(spec.batching, dict(params))
    except ExprError as e:
        raise SpecError(f"{spec.file}: batching: {e}") from None
    if mode not in BATCHING:
        raise SpecError(f"{spec.file}: batching {spec.batching!r} gives {mode!r}; expected "
                        f"rows or per_sequence")
    return mode


def build(spec, weights=None, variant: str | None = None, params: dict | None = None):
    """Build the Graph of ``spec`` (a path or a Spec) for ``variant``.

    Args:
        spec: spec file path or a ``Spec`` from ``md.load_spec``.
        weights: optional TensorDict; its names and shapes are checked up front and
            each weight takes the encoding it actually has (a QuantizedTensor's
            encoding, or unquantized for arrays). Without it, encodings follow the
            spec's ``encodings`` rules.
        variant: variant name (default: the spec's selected/default variant).
        params: hyperparameter overrides (e.g. read from weights metadata); by
            default ``weights.params`` (set by ``md.load_weights(path, spec=...)``).

    Returns:
        A Graph; ``graph.output_names`` names its outputs. Run it with
        ``md.compile(graph, weights)(*inputs)`` (or ``graph.execute(..., weights=...)``).

    Raises:
        SpecError: the spec is invalid. WeightsError: missing, unexpected or
        mis-shaped weights (all listed at once). GraphError: an op rejected its
        inputs (message has the spec file:line:col and the layer path).

    Example::

        g = md.build("specs/mlp.yaml", weights=td)
        (y,) = g.execute(np.ones((2, 16), np.float32), weights=td)
    """
    import numpy as np

    from .dtypes import DType, TensorType
    from .graph import Graph

    if weights is not None and params is None:       # md.load_weights(path, spec=...)
        params = getattr(weights, "params", None) or None
        variant = variant or getattr(weights, "variant", None)
    # Bound weights bring their own encodings: the spec's encoding rules do not apply.
    spec, prog = _program(spec, variant, params, check_encodings=weights is None)
    if weights is not None:
        conform_unit_axes(prog, weights)
        check_weights(prog, weights)
    ins = prog.inputs
    g = Graph(prog.name, input_types=[TensorType(p.dtype, p.shape) for p in ins],
              input_names=[p.name for p in ins])
    g.batching = batching_mode(spec, prog.params)
    env = {p.vid: v for p, v in zip(ins, g.inputs)}
    wvals: dict = {}
    scopes = _Scopes(g)
    with g:
        try:
            for step in prog.steps:
                if isinstance(step, PInput):
                    continue
                where = f"{prog.file}:{step.pos.line}:{step.pos.col}"
                if isinstance(step, PConst):
                    scopes.enter(())
                    with g.origin(where):
                        env[step.vid] = g.constant(np.asarray(step.value,
                                                              DType.parse(step.dtype).numpy))
                elif isinstance(step, PWeight):
                    scopes.enter(step.layer)
                    with g.origin(where):
                        if (weights is not None and step.name not in weights and step.absent
                                and not step.required):
                            wvals[step.name] = _stand_in(g, step, wvals)
                        else:
                            wvals[step.name] = _declare_weight(g, step, weights)
                elif isinstance(step, POp):
                    scopes.enter(step.layer)
                    args = [env[r.target] if r.kind == "value" else
                            wvals[r.target] if r.kind == "weight" else r.target
                            for r in step.inputs]
                    with g.origin(where):
                        outs = g.apply(step.op, args, dict(step.attrs))
                    for vid, v in zip(step.outputs, outs):
                        env[vid] = v
        finally:
            scopes.close()
    g.output([env[vid] for _, vid in prog.outputs], names=[name for name, _ in prog.outputs])
    return g


def _declare_weight(g, w: PWeight, weights):
    """``g.weight`` with the encoding actually bound (or the spec's rule); float16
    arrays get a cast to float32 so every op sees float32."""
    from . import ops
    from .dtypes import DType, TensorType
    from .tensors import QuantizedTensor

    bound = weights[w.name] if weights is not None and w.name in weights else None
    if w.dtype != "float32":                 # an integer or bool weight, as stored
        if bound is not None and getattr(bound, "dtype", None) != DType.parse(w.dtype).numpy:
            got = bound.encoding if isinstance(bound, QuantizedTensor) else bound.dtype.name
            raise WeightsError(f"{w.name}: {got}; the spec declares it {w.dtype}")
        return g.weight(w.name, TensorType(DType.parse(w.dtype), w.shape), None)
    if isinstance(bound, QuantizedTensor):
        return g.weight(w.name, TensorType(DType.float32, w.shape), bound.encoding)
    if bound is not None:
        dtype = bound.dtype.name
        if dtype not in ("float32", "float16"):
            raise WeightsError(f"{w.name}: {dtype} array; expected float32, float16 or a "
                               "QuantizedTensor")
    else:
        dtype = {"f32": "float32", "f16": "float16"}.get(w.encoding)
        if dtype is None:
            return g.weight(w.name, TensorType(DType.float32, w.shape), w.encoding)
    v = g.weight(w.name, TensorType(dtype, w.shape), None)
    return ops.cast(v, DType.float32) if dtype == "float16" else v


def _stand_in(g, w: PWeight, wvals: dict):
    """The value used for a weight the bound weights lack (its spec ``absent:``): an
    earlier weight's value (a tied output) or a float32 constant filled as declared."""
    import numpy as np

    if w.absent.kind == "weight":
        return wvals[w.absent.target]
    from .dtypes import DType

    fill = np.asarray(w.absent.target, DType.parse(w.dtype).numpy)
    return g.constant(np.broadcast_to(fill.reshape(w.shape) if fill.ndim else fill, w.shape)
                      .copy())


class _Scopes:
    """Keeps ``g.layer`` scopes open along a path, entering/leaving only what changes."""

    def __init__(self, g):
        self.g = g
        self.path: list = []
        self.cms: list = []

    def enter(self, path: tuple):
        k = 0
        while k < min(len(path), len(self.path)) and path[k] == self.path[k]:
            k += 1
        while len(self.path) > k:
            self.path.pop()
            self.cms.pop().__exit__(None, None, None)
        for seg in path[k:]:
            cm = self.g.layer(seg)
            cm.__enter__()
            self.cms.append(cm)
            self.path.append(seg)

    def close(self):
        self.enter(())


def conform_unit_axes(prog: Program, weights) -> None:
    """Give a bound tensor whose shape differs from its declaration only by axes of size
    1 (``[dim]`` for ``[1, dim]``: converters squeeze some, not others) the declared
    shape, in place: a view of the same data (a packed tensor keeps its last axis)."""
    from .tensors import QuantizedTensor

    for w in prog.weights:
        t = weights[w.name] if w.name in weights else None
        if t is None:
            continue
        got, want = tuple(int(d) for d in t.shape), tuple(w.shape)
        if got == want or [d for d in got if d != 1] != [d for d in want if d != 1]:
            continue
        if isinstance(t, QuantizedTensor):
            if got and want and got[-1] == want[-1]:
                weights[w.name] = QuantizedTensor(t.data.reshape(*want[:-1], -1), want,
                                                  t.encoding)
        elif hasattr(t, "reshape"):
            weights[w.name] = t.reshape(want)


def check_weights(prog: Program, weights) -> None:
    """Raise one WeightsError listing every missing, unexpected and mis-shaped weight
    (a weight with an ``absent:`` stand-in may be missing)."""
    want = {w.name: tuple(w.shape) for w in prog.weights}
    optional = {w.name for w in prog.weights if w.absent is not None and not w.required}
    have = set(weights.keys())
    missing = [n for n in want if n not in have and n not in optional]
    unexpected = [n for n in weights.keys() if n not in want]
    misshaped = []
    for n, shape in want.items():
        if n in have:
            got = tuple(int(d) for d in weights[n].shape)
            if got != shape:
                misshaped.append(f"{n} {list(got)} (expected {list(shape)})")
    if not (missing or unexpected or misshaped):
        return
    parts = []
    for label, items in (("missing", missing), ("unexpected", unexpected),
                         ("mis-shaped", misshaped)):
        if items:
            more = f", ... {len(items) - _SHOW} more" if len(items) > _SHOW else ""
            parts.append(f"{len(items)} {label}: {', '.join(items[:_SHOW])}{more}")
    raise WeightsError(f"{prog.file}: weights do not match spec {prog.name!r} "
                       f"(variant {prog.variant}): " + "; ".join(parts))


@dataclass
class TreeRow:
    """One row of ``maxdecl graph``: a layer with totals over its subtree."""

    path: str                 # "" for the whole model
    depth: int                # 0 for the model, 1 for top-level layers, ...
    ops: dict = field(default_factory=dict)     # op -> count
    params: int = 0                             # weight elements
    bytes: dict = field(default_factory=dict)   # encoding -> bytes


class TreeRows(list):
    """The rows of ``describe_tree``; ``str()`` renders them as an indented table."""

    def __str__(self) -> str:
        return format_tree(self)


def _count(n: int) -> str:
    for unit, size in (("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if n >= size:
            return f"{n / size:.2f}{unit}"
    return str(n)


def _size(n: int) -> str:
    for unit, size in (("GiB", 2 ** 30), ("MiB", 2 ** 20), ("KiB", 2 ** 10)):
        if n >= size:
            return f"{n / size:.1f} {unit}"
    return f"{n} B"


def format_tree(rows) -> str:
    """An indented table: layer, parameters, bytes per encoding, op counts."""
    table = [("layer", "params", "bytes", "ops")]
    for r in rows:
        table.append(("  " * r.depth + (r.path or "<model>"),
                      _count(r.params) if r.params else "-",
                      ", ".join(f"{e} {_size(b)}" for e, b in sorted(r.bytes.items())) or "-",
                      ", ".join(f"{op} {c}" for op, c in r.ops.items()) or "-"))
    widths = [max(len(row[k]) for row in table) for k in range(3)]
    return "\n".join(f"{a:<{widths[0]}}  {b:>{widths[1]}}  {c:<{widths[2]}}  {d}".rstrip()
                     for a, b, c, d in table)


def describe_tree(spec, variant: str | None = None, params: dict | None = None) -> TreeRows:
    """Layer tree rows (path, depth, op counts, parameter count, bytes per encoding).

    Pure spec arithmetic: no NumPy, no numba. Bytes use each encoding's block size
    (``n // block_elements * block_bytes``).

    Example::

        for r in describe_tree("specs/llama3.yaml", "tiny"):   # maxdecl.builder
            print("  " * r.depth + (r.path or "<model>"), r.params, r.bytes)
    """
    spec, prog = _program(spec, variant, params)
    encs = known_encodings()
    rows = TreeRows([TreeRow("", 0)] + [TreeRow(p.path, p.depth + 1) for p in prog.layers])
    by_path = {r.path: r for r in rows}

    def owners(layer: tuple):
        yield by_path[""]
        for k in range(1, len(layer) + 1):
            r = by_path.get(".".join(layer[:k]))
            if r is not None:
                yield r

    for step in prog.steps:
        if isinstance(step, POp):
            for r in owners(step.layer):
                r.ops[step.op] = r.ops.get(step.op, 0) + 1
        elif isinstance(step, PWeight):
            n = 1
            for d in step.shape:
                n *= d
            be, bb = encs.get(step.encoding, (1, 4))
            nbytes = n // be * bb
            for r in owners(step.layer):
                r.params += n
                r.bytes[step.encoding] = r.bytes.get(step.encoding, 0) + nbytes
    return rows

