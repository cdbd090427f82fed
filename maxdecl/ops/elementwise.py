"""Elementwise ops with NumPy broadcasting; inputs share one dtype (no implicit promotion).

Runtime: ``maxdecl.kernels.elementwise`` (NumPy ufuncs; numba kernels for the
activations with no single NumPy call: silu, gelu, gelu_tanh).
"""

from __future__ import annotations

from .. import dims
from ..dtypes import DType, TensorType
from . import _checks
from ._registry import REQUIRED, define, public_op


def _binary_rule(types, attrs):
    x, y = types
    _checks.not_quantized(x, y)
    dtype = _checks.same_dtype(x, y)
    return [TensorType(dtype, _checks.broadcast_shapes(x.shape, y.shape))]


def _unary_rule(types, attrs):
    (x,) = types
    _checks.not_quantized(x)
    return [x]


def _float_unary_rule(types, attrs):
    (x,) = types
    _checks.float_input(x)
    return [x]


def _cast_rule(types, attrs):
    (x,) = types
    _checks.not_quantized(x)
    return [TensorType(attrs["dtype"], x.shape)]


def _normalize_cast(attrs):
    try:
        return {**attrs, "dtype": DType.parse(attrs["dtype"])}
    except Exception as e:  # noqa: BLE001 - a GraphError from DType.parse
        raise ValueError(str(e)) from None


def _compare_rule(types, attrs):
    x, y = types
    _checks.not_quantized(x, y)
    _checks.same_dtype(x, y)
    return [TensorType(DType.bool, _checks.broadcast_shapes(x.shape, y.shape))]


def _logical_rule(types, attrs):
    _checks.not_quantized(*types)
    for t in types:
        if t.dtype != DType.bool:
            raise TypeError(f"logical ops take bool inputs, got {t} (compare or cast first)")
    return [TensorType(DType.bool, _checks.broadcast_shapes(*(t.shape for t in types)))]


BINARY = ("add", "sub", "mul", "div", "pow", "maximum", "minimum", "mod")
COMPARE = {"equal": "==", "not_equal": "!=", "greater": ">", "greater_equal": ">=",
           "less": "<", "less_equal": "<="}
LOGICAL = {"logical_and": ("x", "y"), "logical_or": ("x", "y"), "logical_not": ("x",)}
UNARY = ("neg", "abs", "relu")
FLOAT_UNARY = ("exp", "log", "sqrt", "rsqrt", "tanh", "sigmoid", "silu", "gelu", "gelu_tanh",
               "sin", "cos", "expm1", "log1p", "floor", "ceil", "round", "sign", "log2", "log10",
               "exp2", "tan", "atan", "logsigmoid", "erf", "lgamma")

_BINARY_DOC = {
    "div": "elementwise x / y with NumPy broadcasting; integers divide with floor (Python's "
           "//, torch.div(..., rounding_mode='floor')), keeping their dtype; an integer "
           "zero divisor is an error",
    "mod": "elementwise remainder with the sign of y (Python's %, torch.remainder), NumPy "
           "broadcasting; an integer zero divisor is an error",
}
for _name in BINARY:
    define(_name, rule=_binary_rule, run="elementwise", inputs=("x", "y"), kind="elementwise",
           doc=_BINARY_DOC.get(_name, f"elementwise {_name} with NumPy broadcasting"),
           rule_doc="x, y: one dtype, not quantized; out: that dtype, shapes broadcast")
for _name, _sym in COMPARE.items():
    define(_name, rule=_compare_rule, run="elementwise", inputs=("x", "y"), kind="elementwise",
           doc=f"elementwise x {_sym} y as bool, NumPy broadcasting (a mask for select)",
           rule_doc="x, y: one dtype, not quantized; out: bool, shapes broadcast")
for _name, _ins in LOGICAL.items():
    define(_name, rule=_logical_rule, run="elementwise", inputs=_ins, kind="elementwise",
           doc=f"elementwise {_name.split('_')[1]} of bool values, NumPy broadcasting",
           rule_doc="bool inputs; out: bool, shapes broadcast")
for _name in UNARY:
    define(_name, rule=_unary_rule, run="elementwise", kind="elementwise",
           doc=f"elementwise {_name}", rule_doc="x: not quantized; out: the type of x")
_FLOAT_UNARY_DOC = {
    "sin": "elementwise sine (radians; sinusoidal position tables: positions times "
           "frequencies, then sin and cos)",
    "cos": "elementwise cosine (radians)",
    "rsqrt": "elementwise 1 / sqrt(x)",
    "expm1": "elementwise exp(x) - 1, exact near 0 (torch.expm1; xIELU's negative branch)",
    "log1p": "elementwise log(1 + x), exact near 0 (torch.log1p)",
    "floor": "elementwise floor, as a float (torch.floor)",
    "ceil": "elementwise ceiling, as a float (torch.ceil; DeBERTa's log buckets)",
    "round": "elementwise round half to even, as a float (torch.round)",
    "sign": "elementwise -1, 0 or 1 by the sign of x, as a float (torch.sign)",
    "log2": "elementwise base-2 logarithm (torch.log2; Swin V2's log-spaced offsets)",
    "log10": "elementwise base-10 logarithm (torch.log10)",
    "exp2": "elementwise 2 ** x (torch.exp2)",
    "tan": "elementwise tangent (radians)",
    "atan": "elementwise arctangent in radians (torch.atan)",
    "lgamma": "elementwise log |Gamma(x)| (torch.lgamma; computed in float64, rounded once; "
              "inf at 0 and the negative integers): the Student-t, negative-binomial and "
              "gamma log-likelihoods of a distribution head",
    "erf": "elementwise error function, 2 / sqrt(pi) times the integral of exp(-t^2) from 0 "
           "to x (torch.erf; computed in float64, rounded once)",
    "logsigmoid": "elementwise log(sigmoid(x)) = -logaddexp(0, -x), no overflow "
                  "(torch.nn.functional.logsigmoid; xLSTM's forget gates)",
    "sigmoid": "elementwise 1 / (1 + exp(-x))",
    "silu": "elementwise x * sigmoid(x) (swish; HF hidden_act silu)",
    "gelu": "elementwise exact GELU, 0.5 * x * (1 + erf(x / sqrt(2))) (torch's default; "
            "HF hidden_act gelu)",
    "gelu_tanh": "elementwise GELU in its tanh form, 0.5 * x * (1 + tanh(sqrt(2 / pi) * "
                 "(x + 0.044715 * x^3))) (torch's approximate='tanh'; HF gelu_new, "
                 "gelu_fast, gelu_pytorch_tanh; BLOOM's bloom_gelu; ggml's gelu)",
}
for _name in FLOAT_UNARY:
    define(_name, rule=_float_unary_rule, run="elementwise", kind="elementwise",
           doc=_FLOAT_UNARY_DOC.get(_name, f"elementwise {_name}"),
           rule_doc="x: float; out: the type of x")
# HF's ``hidden_act`` names (transformers' ACT2FN) and the function each one is
ACTIVATIONS = {
    "gelu": "exact GELU (erf)", "gelu_python": "exact GELU (erf)",
    "gelu_new": "GELU, tanh form", "gelu_fast": "GELU, tanh form",
    "gelu_pytorch_tanh": "GELU, tanh form", "gelu_accurate": "GELU, tanh form",
    "gelu_tanh": "GELU, tanh form",
    "quick_gelu": "x * sigmoid(1.702 x)",
    "relu": "max(x, 0)", "relu2": "max(x, 0)^2", "relu6": "min(max(x, 0), 6)",
    "leaky_relu": "x if x >= 0 else 0.01 x",
    "silu": "x * sigmoid(x)", "swish": "x * sigmoid(x)",
    "sigmoid": "1 / (1 + exp(-x))", "tanh": "tanh(x)",
    "mish": "x * tanh(log(1 + exp(x)))", "softplus": "log(1 + exp(x)), computed as logaddexp(0, x): no overflow",
    "linear": "x", "identity": "x",
    "gelu_10": "exact GELU clipped to [-10, 10]",
    "laplace": "0.5 (1 + erf((x - 0.707107) / (0.282095 sqrt 2)))",
    "hardswish": "x * min(max(x + 3, 0), 6) / 6",
    "hardsigmoid": "min(max(x + 3, 0), 6) / 6",
    "elu": "x if x > 0 else exp(x) - 1", "selu": "1.0507 * elu with 1.6733 for x <= 0",
    "softsign": "x / (1 + |x|)",
}


def _normalize_activation(attrs):
    kind = attrs["kind"]
    if kind not in ACTIVATIONS:
        from ._registry import hint
        raise ValueError(f"unknown activation kind {kind!r}{hint(kind, ACTIVATIONS)} "
                         f"(one of: {', '.join(ACTIVATIONS)})")
    return attrs


define("activation", rule=_float_unary_rule, run="elementwise", attrs={"kind": REQUIRED},
       normalize=_normalize_activation, kind="elementwise",
       doc="the activation named by ``kind``, a Hugging Face ``hidden_act`` name, so a "
           "spec can take it from config.json (``kind: \"{hidden_act}\"``)",
       rule_doc="x: float; out: the type of x")
def _normalize_clamp(attrs):
    lo, hi = attrs["min"], attrs["max"]
    for key, v in (("min", lo), ("max", hi)):
        if v is not None and (isinstance(v, bool) or not isinstance(v, (int, float))):
            raise ValueError(f"clamp {key} must be a number or None, got {v!r}")
    if lo is not None and hi is not None and lo > hi:
        raise ValueError(f"clamp min {lo!r} is greater than max {hi!r}")
    return attrs


define("clamp", rule=_unary_rule, run="elementwise", attrs={"min": None, "max": None},
       normalize=_normalize_clamp, kind="elementwise",
       doc="elementwise min(max(x, min), max) (torch.clamp; either bound may be None)",
       rule_doc="x: not quantized; out: the type of x")
define("cast", rule=_cast_rule, run="elementwise", attrs={"dtype": REQUIRED},
       normalize=_normalize_cast, kind="elementwise", doc="convert element type",
       rule_doc="x: not quantized; out: dtype, the shape of x")


def _glu_rule(types, attrs):
    (x,) = types
    _checks.float_input(x)
    axis = _checks.valid_axis(attrs["axis"], x.rank)
    d = x.shape[axis]
    if isinstance(d, int):
        if d % 2:
            raise ValueError(f"glu halves axis {axis} of {x.type}, whose size {d} is not even")
        half = d // 2
    else:                        # a symbolic length: checked when it runs
        half = dims.divide(d, 2) or f"div({d},2)"
    shape = list(x.shape)
    shape[axis] = half
    return [TensorType(x.dtype, tuple(shape))]


def _normalize_slope(attrs):
    slope = attrs["negative_slope"]
    if isinstance(slope, bool) or not isinstance(slope, (int, float)) or slope != slope:
        raise ValueError(f"negative_slope must be a number, got {slope!r}")
    return {**attrs, "negative_slope": float(slope)}


define("leaky_relu", rule=_float_unary_rule, run="elementwise",
       attrs={"negative_slope": 0.01}, normalize=_normalize_slope, kind="elementwise",
       doc="elementwise x where x >= 0, else negative_slope * x "
           "(torch.nn.functional.leaky_relu; HiFi-GAN and UnivNet use 0.1 / 0.2)",
       rule_doc="x: float; out: the type of x")
define("glu", rule=_glu_rule, run="elementwise", attrs={"axis": -1}, kind="elementwise",
       normalize=lambda a: {**a, "axis": int(a["axis"])},
       doc="gated linear unit: the first half of axis times the sigmoid of the second "
           "(torch.nn.functional.glu(x, dim))",
       rule_doc="x float, axis even; out: that axis halved")


add, sub, mul, div, pow, maximum, minimum, mod = (public_op(n) for n in BINARY)  # noqa: A001
neg, abs, relu = (public_op(n) for n in UNARY)  # noqa: A001
equal, not_equal, greater, greater_equal, less, less_equal = (public_op(n) for n in COMPARE)
logical_and, logical_or, logical_not = (public_op(n) for n in LOGICAL)
(exp, log, sqrt, rsqrt, tanh, sigmoid, silu, gelu, gelu_tanh, sin, cos, expm1, log1p,
 floor, ceil, round, sign, log2, log10, exp2, tan, atan, logsigmoid, erf, lgamma) = (
    public_op(n) for n in FLOAT_UNARY)  # noqa: A001
activation = public_op(
    "activation",
    "The activation named by ``kind``, a Hugging Face ``hidden_act`` name.\n\n"
    + "``kind``: " + "; ".join(
        f"{', '.join(k for k in ACTIVATIONS if ACTIVATIONS[k] == f)}: {f}"
        for f in dict.fromkeys(ACTIVATIONS.values()))
    + ". The GELU forms compute exactly what ``gelu`` and ``gelu_tanh`` do; a spec "
      "reads the name from config.json (``attrs: {kind: \"{hidden_act}\"}``) instead of "
      "computing each candidate and picking one with ``select``.")
clamp = public_op(
    "clamp",
    "Elementwise ``min(max(x, min), max)``, as ``torch.clamp``.\n\n"
    "``min``, ``max``: numbers (expressions allowed), either None for no bound; min <= "
    "max. NaN stays NaN. OLMo's ``clip_qkv`` is ``{min: \"{-clip_qkv}\", max: "
    "\"{clip_qkv}\"}``; a bound in the dtype of ``x`` (an int ``x`` takes whole bounds).")
leaky_relu = public_op("leaky_relu", "``x`` where ``x >= 0``, else ``negative_slope * x`` "
                       "(``torch.nn.functional.leaky_relu``; the slope in x's dtype).")
glu = public_op("glu", "``a * sigmoid(b)`` where ``a, b`` are the halves of ``x`` along "
                "``axis`` (``torch.nn.functional.glu``): Speech2Text's and wav2vec-style "
                "convolutional gates.")
cast = public_op("cast", "Convert ``x`` to ``dtype`` (a md.DType or its name).\n\n"
                 "``dtype``: float32, float16, bfloat16, int8, uint8, int32, int64 or bool, "
                 "as NumPy's ``astype``: to bool, nonzero is True; float to int truncates.")
