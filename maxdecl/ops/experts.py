"""Mixture-of-experts ops: ``topk`` (the router's choice) and ``expert_linear``
(llama.cpp's ``ggml_mul_mat_id``: each row through the weight of its own expert).

An MoE feed-forward block is a few lines of a spec (see docs/spec.md)::

    logits = linear(x, ffn_gate_inp)                 # [seq, n_expert]
    w, ids = topk(logits, k)                         # [seq, k] each
    w = softmax(w)                                   # Mixtral: softmax over the k
    g = expert_linear(x, ffn_gate_exps, ids)         # [seq, k, ffn]
    u = expert_linear(x, ffn_up_exps, ids)
    y = expert_linear(silu(g) * u, ffn_down_exps, ids)   # [seq, k, dim]
    y = sum(y * w[..., None], axis=-2)

Expert weights are 3-D ``[n_expert, N, K]``, each expert's ``[N, K]`` matrix stored
and quantized row-wise along K as GGUF stores ``blk.N.ffn_gate_exps.weight``; the
kernel reads only the selected experts' packed blocks. Runtime:
``maxdecl.kernels.experts``.
"""

from __future__ import annotations

from ..dtypes import DType, TensorType, format_shape
from . import _checks
from ._registry import REQUIRED, apply, define

__all__ = ["topk", "expert_linear"]


# -- topk -------------------------------------------------------------------------------
def _normalize_topk(attrs):
    k = attrs["k"]
    if not isinstance(k, int) or isinstance(k, bool) or k < 1:
        raise ValueError(f"k must be a positive int, got {k!r}")
    return {**attrs, "axis": int(attrs["axis"])}


def _topk_rule(types, attrs):
    (x,) = types
    _checks.not_quantized(x)
    _checks.no_bfloat16(x)
    if x.dtype == DType.bool or x.rank == 0:
        raise TypeError(f"x must be a numeric tensor of rank >= 1, got {x.type}")
    axis = _checks.valid_axis(attrs["axis"], x.rank)
    n, k = x.shape[axis], attrs["k"]
    if isinstance(n, int) and k > n:
        raise ValueError(f"k={k} exceeds the size {n} of axis {attrs['axis']} of "
                         f"x{format_shape(x.shape)}")
    shape = tuple(k if i == axis else d for i, d in enumerate(x.shape))
    return [TensorType(x.dtype, shape), TensorType(DType.int64, shape)]


define("topk", rule=_topk_rule, run="experts", attrs={"k": REQUIRED, "axis": -1}, outputs=2,
       normalize=_normalize_topk, kind="reduction",
       doc="the k largest values along axis, sorted descending, and their int64 indices "
           "(torch.topk; ties: the lower index first)",
       rule_doc="x numeric, k <= x.shape[axis] -> values [..., k, ...] (x's dtype), "
                "indices int64 of the same shape")


def topk(x, k, axis=-1):
    """``(values, indices)``: the ``k`` largest entries of ``x`` along ``axis``.

    Sorted descending; equal values keep their order (the lower index first), as
    ``torch.topk`` on CPU. ``indices`` is int64, the position along ``axis``.

    Example::

        w, ids = md.ops.topk(router_logits, 2)     # [seq, n_expert] -> [seq, 2] twice
    """
    values, indices = apply("topk", [x], k=k, axis=axis)
    return values, indices


# -- expert_linear ----------------------------------------------------------------------
def _expert_linear_rule(types, attrs):
    x, w, ids, *bias = types
    _checks.int_input(ids, "ids")
    if w.rank != 3:
        raise ValueError(f"w {w} must be 3-D [n_expert, N, K] (one [N, K] matrix per expert)")
    e, n, k_w = w.logical_shape if w.is_quantized else w.shape
    if w.is_quantized and (x.is_quantized or x.dtype != DType.float32):
        raise TypeError(f"x must be float32 for a quantized w, got {x} (cast it first)")
    if x.is_quantized or not x.dtype.is_float:
        raise TypeError(f"x must be a float tensor, got {x}")
    if not w.is_quantized and w.dtype != x.dtype:
        raise TypeError(f"x {x} and w {w} must share a dtype (cast explicitly)")
    if ids.rank < 1:
        raise ValueError(f"ids {ids.type} must be [..., k] (k experts per row)")
    *lead, _ = ids.shape
    if x.rank == ids.rank:                   # one input row for all k experts
        x_lead = x.shape[:-1]
    elif x.rank == ids.rank + 1:             # one input row per chosen expert
        x_lead = x.shape[:-2]
        if not _checks.dims_equal(x.shape[-2], ids.shape[-1]):
            raise ValueError(f"x{format_shape(x.shape)} has {x.shape[-2]} rows per token but "
                             f"ids{format_shape(ids.shape)} choose {ids.shape[-1]} experts")
    else:
        raise ValueError(f"x{format_shape(x.shape)} must be [..., K] or [..., k, K] for "
                         f"ids{format_shape(ids.shape)}")
    if len(x_lead) != len(lead) or not all(_checks.dims_equal(a, b)
                                           for a, b in zip(x_lead, lead)):
        raise ValueError(f"x{format_shape(x.shape)} and ids{format_shape(ids.shape)} must "
                         "share their leading (token) dims")
    if not _checks.dims_equal(x.shape[-1], k_w):
        raise ValueError(f"x{format_shape(x.shape)} @ w{format_shape((e, n, k_w))}[e].T: "
                         f"{x.shape[-1]} != {k_w}")
    if bias:
        b = bias[0]
        _checks.float_input(b, "bias")
        _checks.same_dtype(x, b)
        if b.rank != 2 or not (_checks.dims_equal(b.shape[0], e)
                               and _checks.dims_equal(b.shape[1], n)):
            raise ValueError(f"bias {b} must be [{e}, {n}] (one row per expert)")
    return [TensorType(x.dtype, (*lead, ids.shape[-1], n))]


define("expert_linear", rule=_expert_linear_rule, run="experts", inputs=("x", "w", "ids"),
       optional=("bias",), kind="linalg", packed=("w",),
       doc="out[..., j, :] = x_j @ w[ids[..., j]].T (+ bias[ids[..., j]]), x_j the token's "
           "row (or its j-th row): each token through its chosen experts only, no other "
           "expert read (llama.cpp's mul_mat_id)",
       rule_doc="x float[..., K] (shared by the k experts) or [..., k, K] (one row each), "
                "w [E, N, K] (quantized: x float32), ids integer [..., k], bias [E, N] -> "
                "[..., k, N]")


def expert_linear(x, w, ids, bias=None):
    """Each token's row(s) through the weights of the experts ``ids`` chose.

    ``x [..., K]`` (one row for all k experts) or ``[..., k, K]`` (a row per chosen
    expert), ``w [E, N, K]`` float or quantized per expert (GGUF's ``*_exps``),
    ``ids`` integer ``[..., k]`` in ``0..E-1`` -> ``[..., k, N]``:
    ``out[..., j, :] = x_j @ w[ids[..., j]].T (+ bias[ids[..., j]])``.
    Only the chosen experts' weights are read.

    Example::

        g = md.ops.expert_linear(x, gate_exps, ids)      # [seq, dim] -> [seq, k, ffn]
    """
    return apply("expert_linear", [x, w, ids] if bias is None else [x, w, ids, bias])[0]
