"""Rotary position embedding: rotate feature pairs by position-dependent angles."""

from __future__ import annotations

import functools

import numba
import numpy as np

from ._dispatch import njit_twins, pick
from .step_outputs import empty


@njit_twins()
def _rope(x, cos, sin, out, neox):
    # x, out: (B, S, H, Dh) f32; cos, sin: (S, half) f32; rotates the first 2*half features
    # normal (GGML): pairs (2i, 2i+1); neox (HF): pairs (i, i + half); the rest pass through
    B, S, H, Dh = x.shape
    half = cos.shape[1]
    for t in numba.prange(B * S):
        b = t // S
        s = t % S
        for h in range(H):
            for i in range(half):
                c = cos[s, i]
                sn = sin[s, i]
                if neox:
                    j0, j1 = i, i + half
                else:
                    j0, j1 = 2 * i, 2 * i + 1
                a = x[b, s, h, j0]
                e = x[b, s, h, j1]
                out[b, s, h, j0] = a * c - e * sn
                out[b, s, h, j1] = a * sn + e * c
            for j in range(2 * half, Dh):
                out[b, s, h, j] = x[b, s, h, j]


@functools.lru_cache(maxsize=64)
def _inv_freq(theta: float, dim: int) -> np.ndarray:
    """theta ** (-2i / dim) for i < dim // 2, in float64 (cached: decode calls it per layer)."""
    inv = theta ** (-np.arange(dim // 2, dtype=np.float64) * 2.0 / dim)
    inv.setflags(write=False)
    return inv


@functools.lru_cache(maxsize=16)
def _cos_sin(theta: float, scale: float, dim: int, positions: bytes, factors: bytes | None):
    """float32 cos and sin tables (S, dim // 2) for int64 ``positions`` (as bytes) and
    float32 frequency divisors ``factors`` (as bytes; None: all ones).

    Cached: in one step every layer rotates q and k at the same positions."""
    pos = np.frombuffer(positions, dtype=np.int64).astype(np.float64)
    inv = _inv_freq(theta, dim)
    if factors is not None:
        f = np.frombuffer(factors, dtype=np.float32).astype(np.float64)
        if not np.all(np.isfinite(f) & (f != 0)):
            raise ValueError(f"freq_factors must be finite and non-zero, got {f.tolist()}")
        inv = inv / f
    ang = (pos / scale)[:, None] * inv[None, :]
    cos, sin = np.cos(ang).astype(np.float32), np.sin(ang).astype(np.float32)
    cos.setflags(write=False)
    sin.setflags(write=False)
    return cos, sin


def rope(x, positions, theta, neox, scale, dim, freq_factors=None, step=None) -> np.ndarray:
    """x: (..., S, H, Dh) f32, positions: (S,) int, or x's leading dims (..., S) (a
    position per row) -> rotated float32 copy (in an array of ``step``'s, a
    ``StepOutputs``, where given).

    Angle of pair i at position p: ``(p / scale) * theta ** (-2i / dim) / freq_factors[i]``
    (factors default to 1), computed in float64 and rounded to float32 cos/sin.
    """
    x = np.ascontiguousarray(x, dtype=np.float32)
    if x.ndim < 3:
        raise ValueError(f"rope: x must be [..., seq, heads, head_dim], got shape {x.shape}")
    S, H, Dh = x.shape[-3:]
    pos = np.ascontiguousarray(positions, dtype=np.int64)
    shape = x.shape
    if pos.ndim > 1 and pos.shape == x.shape[:-2]:      # a position per row: one long row
        x = x.reshape(1, -1, H, Dh)
        pos, S = pos.reshape(-1), x.shape[1]
    if pos.shape != (S,):
        raise ValueError(f"rope: positions{list(pos.shape)} must be [{S}], or x's leading "
                         f"dims {list(x.shape[:-2])}, one per position of x{list(x.shape)}")
    dim = int(dim)
    if not 0 <= dim <= Dh:
        raise ValueError(f"rope: rotated dims {dim} must be in [0, head_dim {Dh}]")
    factors = None
    if freq_factors is not None:
        f = np.ascontiguousarray(freq_factors, dtype=np.float32).reshape(-1)
        if f.size != dim // 2:
            raise ValueError(f"rope: freq_factors has {f.size} values, expected {dim // 2} "
                             "(one per rotated pair)")
        factors = f.tobytes()
    cos, sin = _cos_sin(float(theta), float(scale), int(dim), pos.tobytes(), factors)
    x4 = x.reshape(-1, S, H, Dh)
    out = empty(step, 0, shape).reshape(x4.shape)
    if out.size:
        pick(_rope, out.size)(x4, cos, sin, out, bool(neox))
    return out.reshape(shape)
