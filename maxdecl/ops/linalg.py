"""Linear algebra: ``matmul`` (NumPy semantics), ``qmatmul`` (on packed blocks) and
``linear`` (``x @ w.T + bias``, quantized or float ``w``).

``qmatmul(x, w_q) = x @ dequantize(w_q).T``: ``x`` float32 ``[..., K]``, ``w_q``
quantized with logical shape ``[N, K]`` (rows quantized along K, as GGML stores
them); the result is float32 ``[..., N]``. The GGML block encodings run numba
kernels on the packed bytes; any other registered encoding is decoded a tile of
rows at a time. The activations are never quantized and no path decodes the whole
matrix. Runtime: ``maxdecl.kernels.linalg``.
"""

from __future__ import annotations

from ..dtypes import DType, TensorType, format_shape
from . import _checks
from ._registry import define, public

__all__ = ["matmul", "qmatmul", "linear"]


def _matmul_rule(types, attrs):
    a, b = types
    _checks.not_quantized(a, b)
    dtype = _checks.same_dtype(a, b)
    if a.rank == 0 or b.rank == 0:
        raise ValueError("matmul needs inputs of rank >= 1")
    sa, sb = list(a.shape), list(b.shape)
    va, vb = a.rank == 1, b.rank == 1
    if va:
        sa = [1] + sa
    if vb:
        sb = sb + [1]
    if not _checks.dims_equal(sa[-1], sb[-2]):
        raise ValueError(f"a{format_shape(a.shape)} @ b{format_shape(b.shape)}: "
                         f"K must match ({sa[-1]} vs {sb[-2]})")
    batch = _checks.broadcast_shapes(tuple(sa[:-2]), tuple(sb[:-2]))
    out = list(batch) + ([] if va else [sa[-2]]) + ([] if vb else [sb[-1]])
    return [TensorType(dtype, tuple(out))]


def _qmatmul_rule(types, attrs):
    x, w = types
    if not w.is_quantized:
        raise TypeError(f"w must be quantized (g.quantize(...) or a weight with an encoding), "
                        f"got {w}")
    return _rows_times_weight(x, w, "w")


def _rows_times_weight(x, w, what):
    """``x [..., K] @ w[N, K].T`` -> ``[..., N]``: the rule qmatmul and linear share."""
    if w.is_quantized and (x.is_quantized or x.dtype != DType.float32):
        raise TypeError(f"x must be float32 for a quantized {what}, got {x} (cast it first)")
    if x.is_quantized or not x.dtype.is_float:
        raise TypeError(f"x must be a float tensor, got {x}")
    if not w.is_quantized and w.dtype != x.dtype:
        raise TypeError(f"x {x} and {what} {w} must share a dtype (cast explicitly)")
    if len(w.logical_shape) != 2:
        raise ValueError(f"{what} {w} must be 2-D [N, K]")
    if x.rank == 0:
        raise ValueError(f"x {x} must have rank >= 1 [..., K]")
    n, k_w = w.logical_shape
    k_x = x.shape[-1]
    if not _checks.dims_equal(k_x, k_w):
        raise ValueError(f"x {x} @ {what}{format_shape(w.logical_shape)}.T: {k_x} != {k_w}")
    return [TensorType(x.dtype, (*x.shape[:-1], n))]


def _linear_rule(types, attrs):
    x, w, *bias = types
    (out,) = _rows_times_weight(x, w, "weight")
    if bias:
        b = bias[0]
        _checks.float_input(b, "bias")
        if b.rank != 1 or not _checks.dims_equal(b.shape[0], out.shape[-1]):
            raise ValueError(f"bias {b} must be [{out.shape[-1]}] (one per output feature)")
        _checks.same_dtype(out, b)
    return [out]


define("matmul", rule=_matmul_rule, run="linalg", inputs=("a", "b"), kind="linalg",
       doc="NumPy matmul with batch broadcasting",
       rule_doc="a, b: one dtype; a[..., M, K] @ b[..., K, N] -> [..., M, N], 1-D promoted "
                "as NumPy; batch dims broadcast")
define("qmatmul", rule=_qmatmul_rule, run="linalg", inputs=("x", "w"), kind="linalg",
       packed=("w",),
       doc="x @ dequantize(w).T on packed blocks; w quantized [N, K]",
       rule_doc="x float32[..., K], w quantized [N, K] -> float32[..., N]")
define("linear", rule=_linear_rule, run="linalg", inputs=("x", "w"), optional=("bias",),
       kind="linalg", packed=("w",), doc="x @ w.T (+ bias); w [N, K] quantized (runs qmatmul) or float",
       rule_doc="x float[..., K], w [N, K] (quantized: x float32; float: x's dtype), "
                "bias [N] -> [..., N]")


@public
def matmul():  # noqa: A001 - the signature comes from the definition
    """``a @ b`` with NumPy semantics (batch broadcasting, 1-D promotion)."""


@public
def qmatmul():  # noqa: A001 - the signature comes from the definition
    """``x @ dequantize(w_q).T`` without decoding the whole of ``w_q``.

    Args:
        x: float32 Value ``[..., K]``.
        w_q: quantized Value (``.encoding``, ``.logical_shape == (N, K)``).
    Returns:
        float32 Value ``[..., N]``.
    Raises:
        GraphError: K differs, ``x`` is not float32, or ``w_q`` is not a 2-D quantized value.

    Example::

        wq = g.quantize(np.random.randn(64, 256).astype(np.float32), "q4_0")
        y = md.ops.qmatmul(x, wq)          # x: float32 [..., 256] -> y: [..., 64]
    """


@public
def linear():  # noqa: A001 - the signature comes from the definition
    """``x @ w.T (+ bias)``: ``w [N, K]`` quantized (packed-block GEMV/GEMM) or float."""
