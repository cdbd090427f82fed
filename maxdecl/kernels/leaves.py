"""Runtime of the leaf nodes (``maxdecl.ops.leaves``)."""

from __future__ import annotations

import numpy as np

from .. import codecs
from ..tensors import QuantizedTensor


def _quantize_run(args, attrs):
    x = np.ascontiguousarray(args[0], dtype=np.float32)
    enc = codecs.get(attrs["encoding"])
    return [QuantizedTensor(enc.quantize(x), x.shape, enc.name)]


RUN = {"constant": lambda args, attrs: [attrs["value"]],
       "weight": lambda args, attrs: [],
       "quantize": _quantize_run}
