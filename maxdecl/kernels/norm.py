"""Normalisation kernels over the last axis, rows in parallel, float32 throughout."""

from __future__ import annotations

import numba
import numpy as np

from ._dispatch import PARALLEL_MIN_WORK, njit_twins, pick
from .config import CACHE, FASTMATH
from .step_outputs import empty, writes_into
from .vmath import dot16


@njit_twins(fastmath=FASTMATH)
def _layer_norm(x, gamma, beta, eps, out):
    # x, out: (R, D) f32; gamma, beta: (G, D) f32, row r takes gamma[r % G] (G = 1: shared;
    # G > 1: gains over x's trailing dims, e.g. one per head)
    # out = (x - mean) / sqrt(var + eps) * gamma + beta   (var: biased, two passes)
    R, D = x.shape
    G = gamma.shape[0]
    inv_d = np.float32(1) / np.float32(D)
    for r in numba.prange(R):
        g, b = gamma[r % G], beta[r % G]
        s = np.float32(0)
        for i in range(D):
            s += x[r, i]
        mean = s * inv_d
        v = np.float32(0)
        for i in range(D):
            t = x[r, i] - mean
            v += t * t
        inv = np.float32(1) / np.sqrt(v * inv_d + eps)
        for i in range(D):
            out[r, i] = (x[r, i] - mean) * inv * g[i] + b[i]


@numba.njit(cache=CACHE)
def rms_row(x, w, eps, out):
    """out = x * rsqrt(mean(x^2) + eps) * w for one row: x, w, out (D,) float32. Plain
    IEEE arithmetic in a fixed order (``vmath.dot16``), so the op's twins and the fused
    steps of ``fused_rows`` give bit-identical rows."""
    D = x.shape[0]
    inv = np.float32(1) / np.sqrt(dot16(x, x, D) * (np.float32(1) / np.float32(D)) + eps)
    for i in range(D):
        out[i] = x[i] * inv * w[i]


@njit_twins()
def _rms_norm(x, w, eps, out):
    # x, out: (R, D) f32; w: (G, D) f32, row r takes w[r % G]
    R = x.shape[0]
    G = w.shape[0]
    for r in numba.prange(R):
        rms_row(x[r], w[r % G], eps, out[r])


def _rows(x):
    x = np.ascontiguousarray(x, dtype=np.float32)
    return x.reshape(-1, x.shape[-1]) if x.size else x.reshape(0, max(x.shape[-1], 1))


def _gains(w, d):
    """A weight of x's trailing shape as (G, D) rows, row r of x taking row r % G."""
    return np.ascontiguousarray(w, dtype=np.float32).reshape(-1, d)


def layer_norm(x, gamma, beta, eps) -> np.ndarray:
    """float32 layer norm over the last axis (``beta`` may be None); gamma and beta have
    x's trailing shape (1-D: shared by every row)."""
    rows = _rows(x)
    d = x.shape[-1]
    g = _gains(gamma, d)
    b = np.zeros_like(g) if beta is None else _gains(beta, d)
    out = np.empty(rows.shape, np.float32)
    if rows.size:
        pick(_layer_norm, rows.size)(rows, g, b, np.float32(eps), out)
    return out.reshape(x.shape)


def rms_norm(x, weight, eps) -> np.ndarray:
    """float32 RMS norm over the last axis; weight has x's trailing shape."""
    rows = _rows(x)
    w = _gains(weight, x.shape[-1])
    out = np.empty(rows.shape, np.float32)
    if rows.size:
        pick(_rms_norm, rows.size)(rows, w, np.float32(eps), out)
    return out.reshape(x.shape)


def _layer_norm_run(args, attrs):
    x = args[0]
    beta = args[2] if len(args) > 2 else None
    return [layer_norm(x, args[1], beta, attrs["epsilon"]).astype(x.dtype, copy=False)]


@writes_into
def _rms_norm_run(args, attrs, out=None):
    x, w = args if len(args) > 1 else (args[0], None)
    d = x.shape[-1] if x.ndim else 0
    if w is None:                              # no weight: a gain of ones
        w = _ones(d)
    if (x.dtype == np.float32 and w.dtype == np.float32 and w.shape == (d,) and 0 < x.size
            < PARALLEL_MIN_WORK and x.flags.c_contiguous and w.flags.c_contiguous):
        y = empty(out, 0, x.shape, x.dtype)    # decode: one row, straight to the kernel
        _rms_norm[1](x.reshape(-1, d), w.reshape(1, d), np.float32(attrs["epsilon"]),
                     y.reshape(-1, d))
        return [y]
    return [rms_norm(x, w, attrs["epsilon"]).astype(x.dtype, copy=False)]


_ONES: dict = {}


def _ones(d: int) -> np.ndarray:
    """A read-only float32 vector of ``d`` ones, made once per size."""
    w = _ONES.get(d)
    if w is None:
        w = np.ones(d, np.float32)
        w.flags.writeable = False
        if len(_ONES) < 64:
            _ONES[d] = w
    return w


def _group_norm_run(args, attrs):
    x, gamma, *rest = args
    beta = rest[0] if rest else None
    last = attrs["channels_last"]
    xf = np.asarray(x, np.float32)
    if not last:
        xf = np.moveaxis(xf, 1, -1)
    n, c, g = xf.shape[0], xf.shape[-1], attrs["groups"]
    v = xf.reshape(n, -1, g, c // g)
    mean = v.mean(axis=(1, 3), keepdims=True)
    var = np.square(v - mean).mean(axis=(1, 3), keepdims=True)
    y = ((v - mean) / np.sqrt(var + np.float32(attrs["epsilon"]))).reshape(xf.shape)
    y = y * np.asarray(gamma, np.float32)
    if beta is not None:
        y = y + np.asarray(beta, np.float32)
    if not last:
        y = np.moveaxis(y, -1, 1)
    return [np.ascontiguousarray(y, dtype=x.dtype)]


def _batch_norm_run(args, attrs):
    x, mean, var, *affine = args
    shape = (-1,) if attrs["channels_last"] else (-1,) + (1,) * (x.ndim - 2)
    f32 = [np.asarray(a, np.float32).reshape(shape) for a in (mean, var, *affine)]
    y = ((np.asarray(x, np.float32) - f32[0])
         * (np.float32(1) / np.sqrt(f32[1] + np.float32(attrs["epsilon"]))))
    if len(f32) > 2:
        y = y * f32[2]
    if len(f32) > 3:
        y = y + f32[3]
    return [np.ascontiguousarray(y, dtype=x.dtype)]


def _normalize_run(args, attrs):
    """x / max(||x||_p, epsilon) along ``axis`` in float32 (torch's F.normalize)."""
    x = args[0]
    xf = np.asarray(x, np.float32)
    p, axis = attrs["p"], attrs["axis"]
    if p == 2.0:
        norm = np.sqrt(np.sum(xf * xf, axis=axis, keepdims=True))
    elif p == 1.0:
        norm = np.sum(np.abs(xf), axis=axis, keepdims=True)
    else:
        norm = np.sum(np.abs(xf) ** np.float32(p), axis=axis, keepdims=True) ** np.float32(1 / p)
    y = xf / np.maximum(norm, np.float32(attrs["epsilon"]))
    return [np.ascontiguousarray(y, dtype=x.dtype)]


RUN = {"layer_norm": _layer_norm_run, "rms_norm": _rms_norm_run,
       "group_norm": _group_norm_run, "batch_norm": _batch_norm_run,
       "normalize": _normalize_run}  # ops/norm.py
