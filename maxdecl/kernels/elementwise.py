"""Runtime of the elementwise ops (``maxdecl.ops.elementwise``): NumPy ufuncs, and the
numba activation kernels for silu, gelu and gelu_tanh."""

from __future__ import annotations

import numpy as np

from . import activations


def _rsqrt(x):
    return (1.0 / np.sqrt(x)).astype(x.dtype, copy=False)


def _binary(f):
    return lambda args, attrs: [np.asarray(f(args[0], args[1]))]


def _unary(f):
    return lambda args, attrs: [np.asarray(f(args[0]))]


def _activation(name):
    kernel = getattr(activations, name)
    return lambda args, attrs: [kernel(args[0])]


RUN = {
    "add": _binary(np.add), "sub": _binary(np.subtract), "mul": _binary(np.multiply),
    "div": _binary(np.divide), "pow": _binary(np.power), "maximum": _binary(np.maximum),
    "minimum": _binary(np.minimum),
    "neg": _unary(np.negative), "abs": _unary(np.abs), "exp": _unary(np.exp),
    "log": _unary(np.log), "sqrt": _unary(np.sqrt), "rsqrt": _unary(_rsqrt),
    "tanh": _unary(np.tanh),
    "relu": _unary(lambda x: np.maximum(x, x.dtype.type(0))),
    "sigmoid": _unary(lambda x: (1 / (1 + np.exp(-x))).astype(x.dtype, copy=False)),
    "silu": _activation("silu"), "gelu": _activation("gelu"),
    "gelu_tanh": _activation("gelu_tanh"),
    "cast": lambda args, attrs: [args[0].astype(attrs["dtype"].numpy)],
}
