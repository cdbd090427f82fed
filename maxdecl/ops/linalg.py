"""Linear algebra: ``matmul`` (NumPy semantics), ``qmatmul`` (on packed blocks) and
``linear`` (``x @ w.T + bias``, quantized or float ``w``) and ``einsum`` (NumPy's and
torch's Einstein summation).

``qmatmul(x, w_q) = x @ dequantize(w_q).T``: ``x`` float32 ``[..., K]``, ``w_q``
quantized with logical shape ``[N, K]`` (rows quantized along K, as GGML stores
them); the result is float32 ``[..., N]``. The GGML block encodings run numba
kernels on the packed bytes; any other registered encoding is decoded a tile of
rows at a time. The activations are never quantized and no path decodes the whole
matrix. Runtime: ``maxdecl.kernels.linalg``.
"""

from __future__ import annotations

from collections import Counter

from ..dtypes import DType, TensorType, format_shape
from . import _checks
from ._registry import REQUIRED, define, public

__all__ = ["matmul", "qmatmul", "linear", "einsum"]


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


MAX_EINSUM_INPUTS = 26


def parse_einsum(equation, n_inputs: int) -> tuple[list[list[str]], list[str]]:
    """``equation`` ("bhqd,bhkd->bhqk") as (one term per input, the output term), each a
    list of letters with ``"..."`` for an ellipsis. Without ``->`` the output is the
    letters used once, in alphabetical order, after ``...`` (NumPy's and torch's rule)."""
    if not isinstance(equation, str) or not equation.strip():
        raise ValueError(f"equation must be a non-empty string, got {equation!r}")
    eq = equation.replace(" ", "")
    bad = sorted({c for c in eq if not (c.isascii() and c.isalpha()) and c not in ".,->"})
    if bad:
        raise ValueError(f"equation {equation!r}: unexpected character {bad[0]!r} "
                         "(letters, ',', '...' and '->' only)")
    if eq.count("->") > 1:
        raise ValueError(f"equation {equation!r}: more than one '->'")
    if "-" in eq.replace("->", "") or ">" in eq.replace("->", ""):
        raise ValueError(f"equation {equation!r}: a '-' or '>' outside '->'")
    lhs, arrow, rhs = eq.partition("->")
    terms = [_einsum_term(t, equation) for t in lhs.split(",")]
    if len(terms) != n_inputs:
        raise ValueError(f"equation {equation!r} has {len(terms)} input term(s) for "
                         f"{n_inputs} input(s)")
    used = [c for t in terms for c in t if c != "..."]
    ellipsis = any("..." in t for t in terms)
    if arrow:
        out = _einsum_term(rhs, equation)
        letters = [c for c in out if c != "..."]
        twice = sorted(c for c, n in Counter(letters).items() if n > 1)
        if twice:
            raise ValueError(f"equation {equation!r}: output letter {twice[0]!r} "
                             "appears twice")
        unknown = sorted(set(letters) - set(used))
        if unknown:
            raise ValueError(f"equation {equation!r}: output letter {unknown[0]!r} "
                             "is in no input")
        if ellipsis and "..." not in out:
            raise ValueError(f"equation {equation!r}: the output needs '...' when an "
                             "input has one")
        if "..." in out and not ellipsis:
            raise ValueError(f"equation {equation!r}: '...' in the output but in no "
                             "input")
    else:
        out = (["..."] if ellipsis else []) + sorted(c for c, n in Counter(used).items()
                                                     if n == 1)
    return terms, out


def _einsum_term(term: str, equation: str) -> list[str]:
    if term.count("...") > 1 or term.replace("...", "").count("."):
        raise ValueError(f"equation {equation!r}: term {term!r} has a '.' that is not "
                         "one '...'")
    head, dots, tail = term.partition("...")
    return list(head) + (["..."] if dots else []) + list(tail)


def _einsum_rule(types, attrs):
    _checks.not_quantized(*types)
    dtype = _checks.same_dtype(*types)
    if not dtype.is_float:
        raise TypeError(f"einsum needs float inputs, got {types[0]}")
    _checks.no_bfloat16(*types)
    if len(types) > MAX_EINSUM_INPUTS:
        raise ValueError(f"at most {MAX_EINSUM_INPUTS} inputs, got {len(types)}")
    terms, out = parse_einsum(attrs["equation"], len(types))
    dims, ell_shapes = {}, []
    for i, (term, t) in enumerate(zip(terms, types)):
        n_letters = len(term) - ("..." in term)
        if t.rank != n_letters and not ("..." in term and t.rank > n_letters):
            raise ValueError(f"input {i} {t} has rank {t.rank}, but its term "
                             f"{''.join(term)!r} names {n_letters} dim(s)")
        axis, own = 0, {}
        for c in term:
            if c == "...":
                width = t.rank - n_letters
                ell_shapes.append(tuple(t.shape[axis:axis + width]))
                axis += width
                continue
            d = t.shape[axis]
            axis += 1
            if c in own and not _checks.dims_equal(own[c], d):     # a diagonal: square
                raise ValueError(f"letter {c!r} is {own[c]} and {d} in input {i} {t}")
            own[c] = d
            dims[c] = _einsum_dim(c, dims.get(c, 1), d, i, t)
    ell = _checks.broadcast_shapes(*ell_shapes) if ell_shapes else ()
    shape = []
    for c in out:
        shape.extend(ell if c == "..." else (dims[c],))
    return [TensorType(dtype, tuple(shape))]



def _einsum_dim(letter, seen, d, i, t):
    """A letter's size over the inputs so far: equal sizes, or 1 beside any (broadcast, as
    torch and NumPy do)."""
    if d == 1:
        return seen
    if seen == 1 or isinstance(seen, str) and isinstance(d, int):
        return d
    if not _checks.dims_equal(seen, d):
        raise ValueError(f"letter {letter!r} is {seen} in one place and {d} in another "
                         f"(input {i} {t})")
    return seen


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

define("einsum", rule=_einsum_rule, run="linalg", inputs=("values",), variadic=True,
       attrs={"equation": REQUIRED}, kind="linalg",
       doc="Einstein summation over one or more inputs, as numpy.einsum / torch.einsum",
       rule_doc="float32/float16 inputs of one dtype; a term per input (letters, at most "
                "one '...'); a letter's sizes equal or 1 (broadcast), '...' dims broadcast; "
                "without '->' the output is the letters used once, alphabetical, after "
                "'...'; with '->' an input '...' must reach the output")


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
def einsum():  # noqa: A001 - the signature comes from the definition
    """Einstein summation as ``numpy.einsum`` / ``torch.einsum``: ``einsum([q, k],
    equation="bhqd,bhkd->bhqk")``. Repeated letters within one input take a diagonal;
    letters missing from the output are summed. Runs through NumPy with its contraction
    order (``optimize=True``), whose intermediates are no larger than the largest input
    or output."""


@public
def linear():  # noqa: A001 - the signature comes from the definition
    """``x @ w.T (+ bias)``: ``w [N, K]`` quantized (packed-block GEMV/GEMM) or float."""
