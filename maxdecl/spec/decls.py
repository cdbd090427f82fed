"""Plain records of the spec layer: declarations as written (``LayerDecl``, ...) and
the flat ``Program`` one variant unrolls to (inputs, constants, weights, ops, each with
its layer path and YAML position). No behaviour, no imports of the other spec modules.
"""

from __future__ import annotations

from dataclasses import dataclass
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
    required: object = None           # raw: bool or "{expr}": absent stands in only while false
    required_pos: Pos | None = None
    dtype: object = None              # raw: an integer or bool dtype name; None: float
    dtype_pos: Pos | None = None
    listed: bool = True               # the shape was a list ([] is a scalar)


@dataclass(frozen=True)
class LayerDecl:
    """One entry of a ``layers:`` list, as written."""

    pos: Pos
    name: str | None = None          # template, e.g. "blk.{i}"; None: anonymous op
    doc: str = ""
    repeat: object = None             # int or expression; None: once
    index: str = "i"
    index_given: bool = False         # `index:` written (else the default "i")
    weights: tuple = ()               # WeightDecl
    inputs: tuple = ()                # IODecl
    outputs: tuple = ()               # (name, Pos)
    op: str | None = None
    ins: tuple = ()                   # (raw ref, Pos)
    outs: tuple = ()                  # (name, Pos)
    attrs: tuple = ()                 # (key, raw value, Pos of value, Pos of key)
    children: tuple = ()              # LayerDecl
    layers_given: bool = False        # `layers:` written (maybe empty)
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
    required: bool = False    # the weights must hold it even though ``absent`` is given
    dtype: str = "float32"    # an integer or bool weight's dtype (stored as is, no encoding)


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
