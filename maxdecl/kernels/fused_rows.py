"""Row kernels for the elementwise steps ``md.compile`` fuses (``maxdecl.fusion``).

Each computes what its nodes compute one by one, bit for bit: an RMS norm through the
same compiled row function as the ``rms_norm`` op (``norm.rms_row``), a float32 add or
multiply rounded on its own (no fastmath here, so nothing is contracted into an FMA),
and an activation through the same element function as its op
(``activations.*_one``). A fused step saves the calls, the allocations and the Python
between them, which dominate a one-token decode step.
"""

from __future__ import annotations

import numba
import numpy as np

from ._dispatch import njit_twins, pick
from .activations import gelu, gelu_one, gelu_tanh, gelu_tanh_one, silu, silu_one
from .norm import _ones, _rms_norm_run, rms_row
from .step_outputs import empty, writes_into


@njit_twins()
def _norm_add_norm(x, w1, eps1, pre, r, w2, eps2, post, total, normed):
    # x, r, total, normed: (R, D) f32; w1, w2: (D,) f32.
    # total = (rms_norm(x, w1) if pre else x) + r; normed = rms_norm(total, w2) if post
    for i in numba.prange(x.shape[0]):
        t = total[i]
        if pre:
            rms_row(x[i], w1, eps1, t)
            for j in range(t.shape[0]):
                t[j] = t[j] + r[i, j]
        else:
            for j in range(t.shape[0]):
                t[j] = x[i, j] + r[i, j]
        if post:
            rms_row(t, w2, eps2, normed[i])


@njit_twins(error_model="numpy")
def _act_mul(a, sa, b, sb, kind, out):
    # a, b: (n,) f32 C order holding R rows of D values, row r at r*sa (r*sb) -- a gate
    # and an up projection may be column slices of one grouped call's output, whose
    # rows are not adjacent; out: (R, D) f32. out = act(a) * b with act 0 silu,
    # 1 gelu_tanh, 2 gelu (erf). The rows are read as unit-stride runs of a 1-D array:
    # the same loop over a strided 2-D view did not vectorise (128 x 2048, one thread,
    # gelu_tanh: 2.1 ms against 0.28).
    d = out.shape[1]
    for r in numba.prange(out.shape[0]):
        ar, br, o = a[r * sa:r * sa + d], b[r * sb:r * sb + d], out[r]
        if kind == 0:
            for i in range(d):
                o[i] = silu_one(ar[i]) * br[i]
        elif kind == 1:
            for i in range(d):
                o[i] = gelu_tanh_one(ar[i]) * br[i]
        else:
            for i in range(d):
                o[i] = np.float32(gelu_one(ar[i])) * br[i]


def rows_flat(x) -> tuple:
    """A 2-D float32 array whose rows are contiguous (``x.strides[1] == 4``) as ``(flat,
    row_stride)``: a 1-D C-order view from its first element to its last, and the
    distance between row starts in elements. Only the elements of ``x`` are read
    through it; the span between its rows lies inside the buffer ``x`` views."""
    rows, d = x.shape
    if x.flags.c_contiguous:
        return x.reshape(-1), d
    step = x.strides[0] // 4 if rows > 1 else d
    span = (rows - 1) * step + d
    return np.lib.stride_tricks.as_strided(x, shape=(span,), strides=(4,),
                                           writeable=False), step


ACTIVATIONS = {"silu": 0, "gelu_tanh": 1, "gelu": 2}
# An element of act(a) * b counts as this many units of ``PARALLEL_MIN_WORK`` (an exp,
# tanh or erf and a few multiplies, against one add for the unit): a prefill's 128 x
# 2048 gelu_tanh runs on both threads (Gemma 3 270M, bench/profile_ops.py: act_mul
# 405 -> 239 us a call, 18 a prefill); a decode step's one row stays serial.
ACT_COST = 8


_F32 = np.dtype(np.float32)


def _rows_of(x, r):
    """x and r as (rows, D) float32 C-order views when both are float32 C-order arrays of
    one shape with a non-empty last axis, else None."""
    if not (isinstance(x, np.ndarray) and isinstance(r, np.ndarray) and x.dtype is _F32
            and r.dtype is _F32 and x.shape == r.shape and x.ndim and x.shape[-1]
            and x.flags.c_contiguous and r.flags.c_contiguous):
        return None
    if x.ndim == 2:
        return x, r
    d = x.shape[-1]
    return x.reshape(-1, d), r.reshape(-1, d)


def _strided_rows(a, b):
    """2-D float32 a and b of one shape whose rows are contiguous (column slices of one
    grouped linear's output) as they are, else None."""
    if (isinstance(a, np.ndarray) and isinstance(b, np.ndarray) and a.dtype is _F32
            and b.dtype is _F32 and a.shape == b.shape and a.shape[0] and a.shape[1]
            and a.strides[1] == 4 and b.strides[1] == 4
            and all(x.shape[0] == 1 or (x.strides[0] % 4 == 0 and x.strides[0] >= 4 * x.shape[1])
                    for x in (a, b))):
        return a, b
    return None


def _gain(w, d):
    """A norm weight as the kernel's (d,) float32 row (None: ones), or None when it is
    some other shape or type (the unfused path handles it)."""
    if w is None:
        return _ones(d)
    if (isinstance(w, np.ndarray) and w.shape == (d,) and w.dtype is _F32
            and w.flags.c_contiguous):
        return w
    return None


def _gains(attrs, w1, w2, d):
    """Both kernel gains, checked once per weight pair and width and kept in the step's
    own ``attrs`` (bound weights are the same objects every call); None: unfused."""
    kept = attrs.get("_gains")
    if kept is not None and kept[0] is w1 and kept[1] is w2 and kept[2] == d:
        return kept[3]
    g1, g2 = _gain(w1, d), _gain(w2, d)
    gains = None if g1 is None or g2 is None else (g1, g2, np.float32(attrs["eps1"]),
                                                    np.float32(attrs["eps2"]))
    attrs["_gains"] = (w1, w2, d, gains)
    return gains


@writes_into
def norm_chain(args, attrs, out=None):
    """A fused ``[rms_norm ->] add [-> rms_norm]`` step (``maxdecl.fusion``): args
    ``[x, r, (w1), (w2)]`` -> ``[sum (, its norm)]``, the values the nodes give."""
    pre, post = attrs["pre"], attrs["post"]
    x, r = args[0], args[1]
    at = 2
    w1 = w2 = None
    if pre and attrs["w1"]:
        w1, at = args[2], 3
    if post and attrs["w2"]:
        w2 = args[at]
    rows = _rows_of(x, r)
    gains = None if rows is None else _gains(attrs, w1, w2, x.shape[-1])
    if gains is not None:
        total = empty(out, 0, x.shape, x.dtype)
        normed = empty(out, 1, x.shape, x.dtype) if post else total
        g1, g2, eps1, eps2 = gains
        xr, rr = rows
        pick(_norm_add_norm, x.size)(xr, g1, eps1, pre, rr, g2, eps2, post,
                                     total.reshape(xr.shape), normed.reshape(xr.shape))
        return [total, normed] if post else [total]
    # the nodes one by one (other dtypes, broadcasting, per-head weights)
    t = _rms_norm_run([x] + ([w1] if w1 is not None else []), {"epsilon": attrs["eps1"]})[0] \
        if pre else x
    total = np.asarray(np.add(t, r) if attrs["first"] else np.add(r, t))
    if not post:
        return [total]
    return [total, _rms_norm_run([total] + ([w2] if w2 is not None else []),
                                 {"epsilon": attrs["eps2"]})[0]]


_UNFUSED = {"silu": silu, "gelu": gelu, "gelu_tanh": gelu_tanh}


@writes_into
def act_mul(args, attrs, out=None):
    """A fused ``act(a) * b`` step (``maxdecl.fusion``): args ``[a, b]`` -> ``[product]``,
    the value the two nodes give (``attrs["first"]``: the activation was the mul's first
    operand)."""
    a, b = args
    rows = _rows_of(a, b) if a.ndim != 2 else _strided_rows(a, b)
    if rows is not None:
        y = empty(out, 0, a.shape)
        (fa, sa), (fb, sb) = rows_flat(rows[0]), rows_flat(rows[1])
        pick(_act_mul, a.size * ACT_COST)(fa, sa, fb, sb, ACTIVATIONS[attrs["act"]],
                                          y.reshape(rows[0].shape))
        return [y]
    y = _UNFUSED[attrs["act"]](a)
    return [np.asarray(np.multiply(y, b) if attrs["first"] else np.multiply(b, y))]
