"""Leaf nodes: ``constant``, ``weight`` (bound when a graph is compiled) and ``quantize``.

These are the graph's own nodes (``g.constant``, ``g.weight``, ``g.quantize``); a spec
declares them through ``constants:`` and ``weights:``, not as ops.
"""

from __future__ import annotations

from ..blocks import block_size
from ..dtypes import DType, QuantizedType, TensorType
from ._registry import REQUIRED, define


def _constant_rule(types, attrs):
    v = attrs["value"]
    if getattr(v, "encoding", None) is not None:        # a QuantizedTensor
        return [QuantizedType(v.encoding, tuple(v.shape))]
    return [TensorType(DType.from_numpy(v.dtype), v.shape)]


def _block_rule(what: str, t, encoding: str):
    be, _ = block_size(encoding)
    k = t.shape[-1] if t.shape else None
    if not isinstance(k, int) or k % be:
        raise ValueError(f"{what} {t}: last dim {k} is not a multiple of {encoding}'s block "
                         f"of {be}")
    return [QuantizedType(encoding, t.shape)]


def _weight_rule(types, attrs):
    t = attrs["type"]
    if attrs["encoding"] is None:
        return [t]
    return _block_rule(f"weight {attrs['name']!r}", t, attrs["encoding"])


def _quantize_rule(types, attrs):
    (x,) = types
    if x.dtype != DType.float32 or x.is_quantized:
        raise TypeError(f"quantize needs float32 input, got {x}")
    return _block_rule("x", x, attrs["encoding"])


define("constant", rule=_constant_rule, run="leaves", inputs=(), attrs={"value": REQUIRED},
       kind="leaf", doc="a constant tensor (NumPy array or QuantizedTensor)")
define("weight", rule=_weight_rule, run="leaves", inputs=(),
       attrs={"name": REQUIRED, "type": REQUIRED, "encoding": None}, kind="leaf",
       doc="a named weight, bound when the graph is compiled")
define("quantize", rule=_quantize_rule, run="leaves", attrs={"encoding": REQUIRED},
       kind="leaf", doc="float32 [..., K] -> packed blocks of an encoding")
