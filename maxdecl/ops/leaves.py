"""Leaf nodes: ``constant``, ``weight`` (bound at execute) and ``quantize``."""

from __future__ import annotations

import numpy as np

from ..dtypes import DType, TensorType
from ..tensors import QuantizedTensor
from ._registry import register


def _constant_infer(inputs, attrs):
    from ..graph import QuantizedType

    v = attrs["value"]
    if isinstance(v, QuantizedTensor):
        return [QuantizedType(v.encoding, v.shape)]
    return [TensorType(DType.from_numpy(v.dtype), v.shape)]


def _weight_infer(inputs, attrs):
    from .. import codecs
    from ..graph import QuantizedType

    t = attrs["type"]
    if attrs["encoding"] is None:
        return [t]
    enc = codecs.get(attrs["encoding"])
    k = t.shape[-1] if t.shape else None
    if not isinstance(k, int) or k % enc.block_elements:
        raise ValueError(f"weight {attrs['name']!r} {t}: last dim must be a multiple of "
                         f"{enc.name}'s block of {enc.block_elements}")
    return [QuantizedType(enc.name, t.shape)]


def _quantize_infer(inputs, attrs):
    from .. import codecs
    from ..graph import QuantizedType

    (x,) = inputs
    enc = codecs.get(attrs["encoding"])
    if x.dtype != DType.float32 or x.is_quantized:
        raise TypeError(f"quantize needs float32 input, got {x.type}")
    k = x.shape[-1] if x.shape else None
    if not isinstance(k, int) or k % enc.block_elements:
        raise ValueError(f"last dim {k} is not a multiple of {enc.name}'s block of "
                         f"{enc.block_elements}")
    return [QuantizedType(enc.name, x.shape)]


def _quantize_run(args, attrs):
    from .. import codecs

    x = np.ascontiguousarray(args[0], dtype=np.float32)
    enc = codecs.get(attrs["encoding"])
    return [QuantizedTensor(enc.quantize(x), x.shape, enc.name)]


register("constant", infer=_constant_infer, run=lambda args, attrs: [attrs["value"]], kind="leaf")
register("weight", infer=_weight_infer, run=lambda args, attrs: [], kind="leaf")
register("quantize", infer=_quantize_infer, run=_quantize_run, kind="leaf")
