"""Elementwise ops with NumPy broadcasting; inputs share one dtype (no implicit promotion).

Activations with no single NumPy call (silu, gelu, gelu_tanh) run numba kernels.
"""

from __future__ import annotations

import numpy as np

from ..dtypes import DType, TensorType
from . import _checks
from ._registry import apply, kernels, register


def _binary_infer(inputs, attrs):
    x, y = inputs
    _checks.not_quantized(x, y)
    dtype = _checks.same_dtype(x, y)
    return [TensorType(dtype, _checks.broadcast_shapes(x.shape, y.shape))]


def _unary_infer(inputs, attrs):
    (x,) = inputs
    _checks.not_quantized(x)
    return [x.type]


def _float_unary_infer(inputs, attrs):
    (x,) = inputs
    _checks.float_input(x)
    return [x.type]


def _cast_infer(inputs, attrs):
    (x,) = inputs
    _checks.not_quantized(x)
    return [TensorType(DType.parse(attrs["dtype"]), x.shape)]


def _normalize_cast(attrs):
    return {**attrs, "dtype": DType.parse(attrs["dtype"])}


def _kernel(name):
    def run(args, attrs):
        activations = kernels("activations")
        return [getattr(activations, name)(args[0])]
    return run


def _rsqrt(x):
    return (1.0 / np.sqrt(x)).astype(x.dtype, copy=False)


_BINARY = {"add": np.add, "sub": np.subtract, "mul": np.multiply, "div": np.divide,
           "pow": np.power, "maximum": np.maximum, "minimum": np.minimum}
_UNARY = {"neg": np.negative, "abs": np.abs, "exp": np.exp, "log": np.log, "sqrt": np.sqrt,
          "rsqrt": _rsqrt, "tanh": np.tanh,
          "relu": lambda x: np.maximum(x, x.dtype.type(0)),
          "sigmoid": lambda x: (1 / (1 + np.exp(-x))).astype(x.dtype, copy=False)}
_FLOAT_ONLY = {"exp", "log", "sqrt", "rsqrt", "tanh", "sigmoid"}

for _name, _fn in _BINARY.items():
    register(_name, infer=_binary_infer, kind="elementwise",
             run=lambda args, attrs, f=_fn: [np.asarray(f(args[0], args[1]))])
for _name, _fn in _UNARY.items():
    register(_name, infer=_float_unary_infer if _name in _FLOAT_ONLY else _unary_infer,
             kind="elementwise", run=lambda args, attrs, f=_fn: [np.asarray(f(args[0]))])
for _name in ("silu", "gelu", "gelu_tanh"):
    register(_name, infer=_float_unary_infer, kind="elementwise", run=_kernel(_name))
register("cast", infer=_cast_infer, normalize=_normalize_cast, kind="elementwise",
         run=lambda args, attrs: [args[0].astype(attrs["dtype"].numpy)])


def _make_binary(name):
    def op(x, y):
        return apply(name, [x, y])[0]
    op.__name__ = name
    op.__doc__ = f"Elementwise ``{name}(x, y)`` with NumPy broadcasting; same dtype in and out."
    return op


def _make_unary(name):
    def op(x):
        return apply(name, [x])[0]
    op.__name__ = name
    op.__doc__ = f"Elementwise ``{name}(x)``."
    return op


add, sub, mul, div, pow, maximum, minimum = (_make_binary(n) for n in _BINARY)  # noqa: A001
(neg, abs, exp, log, sqrt, rsqrt, tanh, relu, sigmoid) = (  # noqa: A001
    _make_unary(n) for n in _UNARY)
silu, gelu, gelu_tanh = (_make_unary(n) for n in ("silu", "gelu", "gelu_tanh"))


def cast(x, dtype):
    """Convert ``x`` to ``dtype`` (a md.DType or its name)."""
    return apply("cast", [x], dtype=dtype)[0]
