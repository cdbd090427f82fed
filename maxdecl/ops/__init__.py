"""Ops: ``md.ops.<name>(...)`` adds a node; the same names are the YAML op types.

Shared rules, written once here:

* **Broadcasting**: binary elementwise ops broadcast as NumPy does; a symbolic dim
  matches itself or 1 (and an int, checked at run time).
* **Dtypes**: no implicit promotion between tensors: inputs of an op share one
  dtype (cast explicitly). A Python scalar takes the dtype of its tensor partner.
* **Quantized values** (uint8 packed blocks with ``.encoding``) are accepted only
  by ``qmatmul`` and ``embedding``.
* **Errors** at build time name the layer path, op and input types (``GraphError``).

Every op lives in one family module and registers an ``OpDef`` (shape/dtype rule +
runtime function) in ``_registry.REGISTRY``; kernels are imported inside ``run``.
"""

from . import leaves  # noqa: F401  (constant, weight, quantize)
from ._registry import REGISTRY, get, register
from .elementwise import (abs, add, cast, div, exp, gelu, gelu_tanh, log, maximum,  # noqa: A004
                          minimum, mul, neg, pow, relu, rsqrt, sigmoid, silu, sqrt, sub, tanh)
from .linalg import matmul
from .reduction import *  # noqa: F403
from .shape import *  # noqa: F403
from .norm import *  # noqa: F403
from .conv import *  # noqa: F403
from .pool import *  # noqa: F403
from .transformer import *  # noqa: F403
from .quantized import *  # noqa: F403
from .custom import *  # noqa: F403
from .reduction import softmax
from .shape import reshape, transpose
