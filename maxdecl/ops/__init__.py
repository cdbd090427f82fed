"""Ops: ``md.ops.<name>(...)`` adds a node; the same names are the YAML op types.

Every op is defined once (``_registry.define``): inputs, attributes with defaults,
outputs, doc, and a type rule over ``md.TensorType`` that the spec checker, the
builder and the graph all run; its runtime lives in ``maxdecl.kernels`` and loads
when a graph is compiled. This package imports neither NumPy nor numba.

Shared rules, written once here:

* **Broadcasting**: binary elementwise ops broadcast as NumPy does; a symbolic dim
  matches itself or 1 (and an int, checked at run time).
* **Symbolic dims** are polynomials of the declared names (``past+seq``, ``4*seq``):
  two dims over the same names must be the same polynomial (see ``maxdecl.dims``).
* **Dtypes**: no implicit promotion between tensors: inputs of an op share one
  dtype (cast explicitly). A Python scalar takes the dtype of its tensor partner.
* **Quantized values** (uint8 packed blocks with ``.encoding``) are accepted only
  by ``qmatmul``, ``linear``, ``expert_linear`` and ``embedding``.
* **Errors** name the layer path, op and input types (``GraphError``, or a spec
  problem at the op's ``file:line:col``: the same text).
"""

from . import leaves  # noqa: F401  (constant, weight, quantize)
from ._registry import REGISTRY, define, get
from .elementwise import (abs, activation, add, cast, clamp, div, exp, gelu, gelu_tanh, log,  # noqa: A004
                          maximum, minimum, mul, neg, pow, relu, rsqrt, sigmoid, silu, sqrt,
                          sub, tanh, sin, cos, equal, not_equal, greater, greater_equal, less,
                          less_equal, logical_and, logical_or, logical_not, expm1, log1p,
                          floor, ceil, round, sign, mod, glu, log2, log10, exp2, tan, atan,
                          logsigmoid, erf, lgamma, leaky_relu)
from .linalg import einsum, linear, matmul, qmatmul
from .reduction import *  # noqa: F403
from .shape import *  # noqa: F403
from .norm import *  # noqa: F403
from .conv import *  # noqa: F403
from .conv_transpose import *  # noqa: F403
from .pool import *  # noqa: F403
from .interpolate import *  # noqa: F403
from .transformer import *  # noqa: F403
from .experts import *  # noqa: F403
from .ssm import *  # noqa: F403
from .rnn import *  # noqa: F403
from .fourier import *  # noqa: F403
from .custom import *  # noqa: F403
from .reduction import softmax
from .shape import reshape, transpose
