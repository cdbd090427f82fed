"""Type checking of an unrolled spec: dtypes and symbolic shapes through every op.

The expander (``semantic.Expander``) calls ``TypeEnv`` as it unrolls a variant: graph
inputs, constants and weights get their types, and every op runs the **same type
rule** the graph runs when ``md.build`` adds the node (``maxdecl.ops``), so a
mistake reads the same at validate time and at build time::

    blk.0.attn_q: linear: x float32[seq, 256] @ weight[264, 260].T: 256 != 260 (inputs: ...)

A value whose type is unknown (its producer failed) is skipped quietly, so one
mistake is reported once. Plain Python: no NumPy, no numba.
"""

from __future__ import annotations

from .. import dims
from ..blocks import FLOAT_STORAGE
from ..dtypes import DType, QuantizedType, TensorType
from ..errors import GraphError
from ..ops import _registry


class TypeEnv:
    """Types of the values and weights of one variant, by value id and weight name."""

    def __init__(self, declared_dims):
        self.declared = frozenset(declared_dims)
        self.values: dict[int, object] = {}
        self.weights: dict[str, object] = {}
        self._memo: dict = {}          # (op, input types, attrs) -> (ok, outputs or reason)

    def input(self, vid: int, dtype: str, shape) -> None:
        try:
            self.values[vid] = TensorType(dtype, shape)
        except GraphError:
            pass                       # the schema or the shape check reports it

    def constant(self, vid: int, value, dtype: str) -> None:
        shape, v = [], value
        while isinstance(v, list):
            shape.append(len(v))
            v = v[0] if v else None
        try:
            self.values[vid] = TensorType(dtype, shape)
        except GraphError:
            pass

    def weight(self, name: str, shape, encoding: str, dtype: str = "float32") -> None:
        """A declared weight: float32 when stored as f32/f16 (f16 is cast on load),
        else packed blocks of its encoding; an integer or bool weight its dtype."""
        if shape is None:
            return
        if dtype != "float32":
            self.weights[name] = TensorType(DType.parse(dtype), shape)
        elif encoding in FLOAT_STORAGE:
            self.weights[name] = TensorType(DType.float32, shape)
        else:
            self.weights[name] = QuantizedType(encoding, tuple(shape))

    def fill(self, name: str, shape) -> None:
        """A weight whose ``absent:`` stand-in is a float32 fill of its shape."""
        if shape is not None:
            self.weights.setdefault(name, TensorType(DType.float32, shape))

    def type_of(self, ref):
        if ref.kind == "value":
            return self.values.get(ref.target)
        if ref.kind == "weight":
            return self.weights.get(ref.target)
        return None

    def op(self, op: str, refs, attrs: dict, out_vids, layer: str) -> str | None:
        """Run op's type rule on its input types and record its outputs; returns the
        problem text (``layer: op: reason (inputs: ...)``) or None."""
        types = []
        for r in refs:
            if r.kind == "scalar":
                types.append(None)
                continue
            t = self.type_of(r)
            if t is None:
                return None            # an earlier problem; don't report it twice
            types.append(t)
        given = [t for t in types if t is not None]     # a bool (a select's cond) last
        partner = next((t for t in given if t.dtype != DType.bool), None)
        opdef = _registry.get(op)
        types = [t if t is not None else _scalar_type(r.target, partner, opdef.index_input(k))
                 for k, (t, r) in enumerate(zip(types, refs))]
        # every layer of a repeat runs the same rule on the same types: run it once
        key = (op, tuple(types), repr(sorted(attrs.items())))
        done = self._memo.get(key)
        if done is None:
            try:
                done = (True, _registry.infer(_registry.get(op), types, attrs)[1])
            except (GraphError, ValueError, TypeError, ArithmeticError) as e:
                done = (False, _registry.type_error(op, types, e))
            if len(self._memo) < 65536:
                self._memo[key] = done
        ok, outs = done
        if not ok:
            return f"{layer or '<root>'}: {outs}"
        for vid, t in zip(out_vids, outs):
            self.values[vid] = t
        return None

    def undeclared(self, shape) -> list[str]:
        """Names in an attribute's dims that are not declared in ``dims:``."""
        out = []
        for d in shape if isinstance(shape, (list, tuple)) else ():
            if isinstance(d, str):
                try:
                    out += sorted(n for n in dims.names(d) if n not in self.declared)
                except TypeError:
                    out.append(d)
        return out

    def state_mismatch(self, want, got) -> str | None:
        """Why a state output of type ``got`` cannot feed its input of type ``want``
        next step (dtype, rank and static dims must agree; symbolic dims may grow)."""
        if want is None or got is None:
            return None
        same = (want.dtype == got.dtype and want.rank == got.rank
                and all(not isinstance(a, int) or a == b
                        for a, b in zip(want.shape, got.shape)))
        return None if same else f"is {got}, but the input it feeds next step is {want}"


def _scalar_type(value, partner, index=False) -> TensorType:
    """A Python number in ``in:`` takes its tensor partner's dtype (as in torch): the
    first non-bool input's, so ``select(cond, 0.0, x)`` gives x's; with none, float32
    for a float, int64 for an int (``select(cond, 0.0, -100.0)``), bool for a bool; an
    int where the op takes indices (``gather(x, "{i}")``) int64."""
    if isinstance(value, bool):
        return TensorType(DType.bool, ())
    if index and isinstance(value, int):
        return TensorType(DType.int64, ())
    if partner is not None and not partner.is_quantized:
        return TensorType(partner.dtype, ())
    return TensorType(DType.float32 if isinstance(value, float) else DType.int64, ())
