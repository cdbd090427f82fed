"""Frozen records: what a spec declares (``Spec``) and what it unrolls to (``Program``).

``Spec`` keeps the declaration as written (templates and expressions unevaluated),
so one Spec serves every variant. ``Spec.program(variant)`` unrolls repeats and
blocks, evaluates every expression and resolves every name, giving a flat
``Program``: graph inputs, constants, weights (full names, integer shapes,
encodings) and ops in dataflow order, each with its layer path and YAML position.
The builder, ``describe_tree`` and the semantic checks all read the same Program.
"""

from __future__ import annotations

import fnmatch
from dataclasses import dataclass, field
from types import MappingProxyType

EMPTY = MappingProxyType({})


@dataclass(frozen=True)
class Pos:
    """Where a declaration is: JSON pointer plus 1-based line and column."""

    ptr: str
    line: int
    col: int


@dataclass(frozen=True)
class IODecl:
    """A graph input declared at the root or inside a layer (``dtype``, ``shape``)."""

    name: str
    dtype: str
    shape: tuple            # raw dims: int, declared symbol or expression
    pos: Pos
    doc: str = ""


@dataclass(frozen=True)
class WeightDecl:
    """A weight of a layer: local name (``weight``), raw shape and, when the weights
    may lack it, what stands in (``absent``: a weight name or a fill value)."""

    local: str
    shape: tuple
    pos: Pos
    shape_ptr: str = ""               # JSON pointer of the shape list
    absent: object = None             # raw: weight name, number or "{expr}"; None: required
    absent_pos: Pos | None = None


@dataclass(frozen=True)
class LayerDecl:
    """One entry of a ``layers:`` list, as written."""

    pos: Pos
    name: str | None = None          # template, e.g. "blk.{i}"; None: anonymous op
    doc: str = ""
    repeat: object = None             # int or expression; None: once
    index: str = "i"
    weights: tuple = ()               # WeightDecl
    inputs: tuple = ()                # IODecl
    outputs: tuple = ()               # (name, Pos)
    op: str | None = None
    ins: tuple = ()                   # (raw ref, Pos)
    outs: tuple = ()                  # (name, Pos)
    attrs: tuple = ()                 # (key, raw value, Pos of value, Pos of key)
    children: tuple = ()              # LayerDecl
    block: str | None = None
    with_: tuple = ()                 # (key, raw value, Pos)


@dataclass(frozen=True)
class BlockDecl:
    """A reusable block: parameters, input/output value names and layers."""

    name: str
    pos: Pos
    params: tuple = ()
    inputs: tuple = ()
    outputs: tuple = ()
    layers: tuple = ()
    doc: str = ""


@dataclass(frozen=True)
class ConstDecl:
    name: str
    value: object
    dtype: str
    pos: Pos


@dataclass(frozen=True)
class Spec:
    """A parsed, checked spec. ``params`` are the selected variant's resolved values.

    Example::

        spec = md.load_spec("specs/llama3.yaml", variant="tiny")
        spec.params["head_dim"]          # 64
        prog = spec.program()            # flat ops, weights, graph inputs/outputs
        [w.name for w in prog.weights][:2]   # ['token_embd.weight', 'blk.0.attn_norm.weight']
    """

    file: str
    name: str
    version: int
    doc: str
    variant: str                     # the selected variant
    default_variant: str
    variants: MappingProxyType       # name -> {hyperparameter: raw value}
    derived: tuple                   # (name, raw value, Pos) in order
    params: MappingProxyType         # selected variant: every hyperparameter and derived param
    dims: MappingProxyType           # symbolic dim -> doc
    encoding_default: str
    encoding_overrides: tuple        # (glob, encoding, Pos)
    inputs: tuple                    # IODecl (root)
    constants: tuple                 # ConstDecl
    blocks: MappingProxyType         # name -> BlockDecl
    layers: tuple                    # LayerDecl
    outputs: tuple                   # (name, Pos)
    formats: MappingProxyType        # format -> plain dict (hf, gguf, llama2c, ...)
    marks: MappingProxyType = field(default_factory=lambda: EMPTY, repr=False)


    def program(self, variant: str | None = None, params: dict | None = None,
                check_encodings: bool = True) -> "Program":
        """Unroll the spec for ``variant`` (default: the selected one); ``params``
        override hyperparameters (e.g. from weights metadata); ``check_encodings=False``
        when the weights bring their own encodings. Raises SpecError."""
        from .semantic import expand_or_raise

        return expand_or_raise(self, variant or self.variant, params, check_encodings)

    def with_variant(self, variant: str) -> "Spec":
        """The same spec with another variant selected (SpecError if unknown)."""
        from .semantic import select_variant

        return select_variant(self, variant)

    def encoding_for(self, weight_name: str, env: dict | None = None) -> str:
        """Encoding of ``weight_name`` by the spec's rules (first matching glob wins)."""
        from .expr import render

        for glob, enc, _ in self.encoding_overrides:
            if fnmatch.fnmatchcase(weight_name, glob):
                return str(render(enc, env or dict(self.params))).lower()
        return str(render(self.encoding_default, env or dict(self.params))).lower()


@dataclass(frozen=True)
class Ref:
    """An op input after resolution: a value id, a weight name or a scalar."""

    kind: str          # "value" | "weight" | "scalar" | "fill" (a weight's stand-in)
    target: object     # value id (int) | weight name (str) | number | number or list


@dataclass(frozen=True)
class PInput:
    """A graph input: full name (``blk.3.kv_cache``), dtype, shape (ints / symbols)."""

    name: str
    dtype: str
    shape: tuple
    vid: int
    layer: tuple
    pos: Pos


@dataclass(frozen=True)
class PConst:
    name: str
    value: object
    dtype: str
    vid: int
    pos: Pos


@dataclass(frozen=True)
class PWeight:
    """A weight: full name, integer shape, encoding by the spec's rules.

    ``absent`` says what the builder uses when bound weights lack it: a
    ``Ref("weight", name)`` of an earlier weight, a ``Ref("fill", value)`` (number
    or flat list), or None (the weight is required)."""

    name: str
    shape: tuple
    encoding: str
    layer: tuple          # layer path segments of the declaring layer
    pos: Pos
    absent: "Ref | None" = None


@dataclass(frozen=True)
class POp:
    """One node: op type, resolved inputs, output value ids, evaluated attributes."""

    op: str
    layer: tuple          # path segments, e.g. ("blk.3", "attn_q")
    inputs: tuple         # Ref
    outputs: tuple        # value ids
    attrs: MappingProxyType
    pos: Pos

    @property
    def path(self) -> str:
        return ".".join(self.layer)


@dataclass(frozen=True)
class PLayer:
    """A named layer of the unrolled tree (for ``maxdecl graph``)."""

    path: str
    depth: int
    pos: Pos


@dataclass(frozen=True)
class Program:
    """A spec unrolled for one variant: everything the builder needs, in order.

    ``steps`` holds PInput/PConst/PWeight/POp records in dataflow order;
    ``outputs`` is ((graph output name, value id), ...) with the root outputs first.
    An output named like an input is state: feed it back as that input next step.
    """

    name: str
    file: str
    variant: str
    params: MappingProxyType
    steps: tuple
    outputs: tuple
    layers: tuple                 # PLayer
    value_names: MappingProxyType  # value id -> the dataflow name it was bound to

    @property
    def inputs(self) -> tuple:
        return tuple(s for s in self.steps if isinstance(s, PInput))

    @property
    def weights(self) -> tuple:
        return tuple(s for s in self.steps if isinstance(s, PWeight))

    @property
    def ops(self) -> tuple:
        return tuple(s for s in self.steps if isinstance(s, POp))

    @property
    def state(self) -> tuple:
        """Names that are both a graph input and a graph output (e.g. KV caches)."""
        ins = {p.name for p in self.inputs}
        return tuple(n for n, _ in self.outputs if n in ins)
