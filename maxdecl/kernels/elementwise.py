"""Runtime of the elementwise ops (``maxdecl.ops.elementwise``): NumPy ufuncs, and the
numba activation kernels for silu, gelu and gelu_tanh."""

from __future__ import annotations

import numpy as np

from . import activations
from .step_outputs import empty, writes_into


def _rsqrt(x):
    return (1.0 / np.sqrt(x)).astype(x.dtype, copy=False)


def _binary(f):
    return lambda args, attrs: [np.asarray(f(args[0], args[1]))]


def _arithmetic(f):
    """``_binary(f)`` for an arithmetic ufunc, whose result has its operands' dtype when
    they share one: into an array of the step's (``step_outputs``) when both operands
    are float arrays of one dtype and the second broadcasts to the first's shape."""
    @writes_into
    def run(args, attrs, out=None):
        a, b = args
        if (out is not None and type(a) is np.ndarray and type(b) is np.ndarray
                and a.dtype is b.dtype and a.dtype.kind == "f"
                and (b.shape == a.shape or (b.size == 1 and b.ndim <= a.ndim))):
            return [f(a, b, out=empty(out, 0, a.shape, a.dtype))]
        return [np.asarray(f(a, b))]
    return run


def _integer_or(f_int, f_float, what):
    """A division-like op: ``f_int`` on two integer arrays (a zero divisor refused),
    ``f_float`` otherwise; the result keeps the inputs' dtype, as the type rule says."""
    def run(args, attrs):
        x, y = np.asarray(args[0]), np.asarray(args[1])
        if x.dtype.kind in "iu" and y.dtype.kind in "iu":
            if not np.all(y):
                raise ValueError(f"integer {what} by zero")
            return [np.asarray(f_int(x, y))]
        return [np.asarray(f_float(x, y))]
    return run


def _unary(f):
    return lambda args, attrs: [np.asarray(f(args[0]))]


def _activation(name):
    kernel = getattr(activations, name)
    return lambda args, attrs: [kernel(args[0])]


def _relu(x):
    return np.maximum(x, x.dtype.type(0))


def _clamp(x, attrs):
    lo, hi = attrs["min"], attrs["max"]
    t = x.dtype.type
    if lo is not None:
        x = np.maximum(x, t(lo))
    if hi is not None:
        x = np.minimum(x, t(hi))
    return np.asarray(x)


def _glu(x, axis):
    if x.shape[axis] % 2:
        raise ValueError(f"glu halves axis {axis} of x{list(x.shape)}, whose size is odd")
    a, b = np.split(x, 2, axis=axis)
    return (a * _sigmoid(b)).astype(x.dtype, copy=False)


def _sigmoid(x):
    return (1 / (1 + np.exp(-x))).astype(x.dtype, copy=False)


# ``activation``'s kinds (``maxdecl.ops.elementwise.ACTIVATIONS``): float arrays in and out
ACTIVATION = {
    "gelu": activations.gelu, "gelu_python": activations.gelu,
    "gelu_new": activations.gelu_tanh, "gelu_fast": activations.gelu_tanh,
    "gelu_pytorch_tanh": activations.gelu_tanh, "gelu_accurate": activations.gelu_tanh,
    "gelu_tanh": activations.gelu_tanh,
    "quick_gelu": lambda x: (x * _sigmoid(x * x.dtype.type(1.702))).astype(x.dtype, copy=False),
    "relu": _relu, "relu2": lambda x: np.square(_relu(x)),
    "relu6": lambda x: np.clip(x, x.dtype.type(0), x.dtype.type(6)),
    "leaky_relu": lambda x: np.where(x >= 0, x, x * x.dtype.type(0.01)),
    "silu": activations.silu, "swish": activations.silu,
    "sigmoid": _sigmoid, "tanh": np.tanh,
    "mish": lambda x: (x * np.tanh(np.logaddexp(x.dtype.type(0), x))).astype(x.dtype,
                                                                              copy=False),
    "softplus": lambda x: np.logaddexp(x.dtype.type(0), x).astype(x.dtype, copy=False),
    "linear": np.array, "identity": np.array,
    "gelu_10": lambda x: np.clip(activations.gelu(x), x.dtype.type(-10), x.dtype.type(10)),
    "laplace": lambda x: _laplace(x),
    "hardswish": lambda x: (x * np.clip(x + x.dtype.type(3), 0, 6) / x.dtype.type(6)).astype(
        x.dtype, copy=False),
    "hardsigmoid": lambda x: (np.clip(x + x.dtype.type(3), 0, 6) / x.dtype.type(6)).astype(
        x.dtype, copy=False),
    "elu": lambda x: np.where(x > 0, x, np.expm1(np.minimum(x, 0))).astype(x.dtype, copy=False),
    "selu": lambda x: (x.dtype.type(1.0507009873554805) * np.where(
        x > 0, x, x.dtype.type(1.6732632423543772) * np.expm1(np.minimum(x, 0)))).astype(
        x.dtype, copy=False),
    "softsign": lambda x: (x / (1 + np.abs(x))).astype(x.dtype, copy=False),
}


def _laplace(x):
    # transformers' LaplaceActivation: 0.5 (1 + erf((x - mu) / (sigma sqrt 2)))
    u = (x.astype(np.float64) - 0.707107) / (0.282095 * np.sqrt(2.0))
    return (0.5 * (1.0 + activations.erf(u))).astype(x.dtype, copy=False)


RUN = {
    "add": _arithmetic(np.add), "sub": _arithmetic(np.subtract),
    "mul": _arithmetic(np.multiply),
    "div": _integer_or(np.floor_divide, np.divide, "division"),
    "mod": _integer_or(np.mod, np.mod, "modulo"), "pow": _binary(np.power), "maximum": _binary(np.maximum),
    "minimum": _binary(np.minimum),
    "neg": _unary(np.negative), "abs": _unary(np.abs), "exp": _unary(np.exp),
    "log": _unary(np.log), "sqrt": _unary(np.sqrt), "rsqrt": _unary(_rsqrt),
    "tanh": _unary(np.tanh), "sin": _unary(np.sin), "cos": _unary(np.cos),
    "expm1": _unary(np.expm1), "log1p": _unary(np.log1p),
    "floor": _unary(np.floor), "ceil": _unary(np.ceil), "round": _unary(np.rint),
    "sign": _unary(np.sign), "log2": _unary(np.log2), "log10": _unary(np.log10),
    "exp2": _unary(np.exp2), "tan": _unary(np.tan), "atan": _unary(np.arctan),
    "logsigmoid": _unary(lambda x: np.negative(np.logaddexp(x.dtype.type(0), -x))),
    "relu": _unary(_relu),
    "sigmoid": _unary(_sigmoid),
    "silu": _activation("silu"), "gelu": _activation("gelu"),
    "gelu_tanh": _activation("gelu_tanh"), "erf": _activation("erf"),
    "lgamma": _activation("lgamma"),
    "activation": lambda args, attrs: [np.asarray(ACTIVATION[attrs["kind"]](args[0]))],
    "equal": _binary(np.equal), "not_equal": _binary(np.not_equal),
    "greater": _binary(np.greater), "greater_equal": _binary(np.greater_equal),
    "less": _binary(np.less), "less_equal": _binary(np.less_equal),
    "logical_and": _binary(np.logical_and), "logical_or": _binary(np.logical_or),
    "logical_not": _unary(np.logical_not),
    "cast": lambda args, attrs: [args[0].astype(attrs["dtype"].numpy)],
    "clamp": lambda args, attrs: [_clamp(args[0], attrs)],
    "glu": lambda args, attrs: [_glu(args[0], attrs["axis"])],
    "leaky_relu": lambda args, attrs: [np.where(
        args[0] >= 0, args[0], args[0] * args[0].dtype.type(attrs["negative_slope"]))],
}
