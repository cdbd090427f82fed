"""Runtime of ``interpolate``: one spatial axis at a time (the last first, as torch's
separable kernels nest them), each output sample a weighted sum of gathered input
samples, in float32. The source positions and weights follow torch's
``area_pixel_compute_source_index`` and its cubic coefficients (a = -0.75)."""

from __future__ import annotations

import numpy as np

from ..ops.interpolate import out_size, spatial_axes

_F = np.float32
CUBIC_A = _F(-0.75)


def _step(n_in: int, n_out: int, factor, align_corners: bool):
    """The sampling step (input units per output unit) as torch computes it, float32."""
    if align_corners:
        return _F((n_in - 1) / (n_out - 1)) if n_out > 1 else _F(0)
    if factor is not None and factor > 0:
        return _F(1.0 / factor)
    return _F(n_in) / _F(n_out)


def _source(n_in, n_out, factor, align_corners, cubic):
    """Real source position of every output sample (float32)."""
    step = _step(n_in, n_out, factor, align_corners)
    dst = np.arange(n_out, dtype=_F)
    if align_corners:
        return step * dst
    src = step * (dst + _F(0.5)) - _F(0.5)
    return src if cubic else np.maximum(src, _F(0))


def _taps(mode, n_in, n_out, factor, align_corners):
    """(indices, weights) per tap: each a length-n_out array (weights None: one tap)."""
    last = n_in - 1
    if mode in ("nearest", "nearest-exact"):
        step = _step(n_in, n_out, factor, False)
        dst = np.arange(n_out, dtype=_F)
        if mode == "nearest-exact":
            dst = dst + _F(0.5)
        if mode == "nearest" and n_out == n_in:
            idx = np.arange(n_out)
        elif mode == "nearest" and n_out == 2 * n_in:
            idx = np.arange(n_out) >> 1
        else:
            idx = np.minimum(np.floor(dst * step).astype(np.int64), last)
        return [(idx, None)]
    src = _source(n_in, n_out, factor, align_corners, mode == "cubic")
    base = np.floor(src)
    if mode == "linear":
        i0 = np.minimum(base.astype(np.int64), last)
        lam = np.clip(src - i0.astype(_F), _F(0), _F(1)).astype(_F)
        i1 = np.where(i0 < last, i0 + 1, i0)
        return [(i0, _F(1) - lam), (i1, lam)]
    t = (src - base).astype(_F)
    a = CUBIC_A
    near = lambda x: ((a + _F(2)) * x - (a + _F(3))) * x * x + _F(1)             # noqa: E731
    far = lambda x: ((a * x - _F(5) * a) * x + _F(8) * a) * x - _F(4) * a     # noqa: E731
    u = _F(1) - t
    weights = (far(t + _F(1)), near(t), near(u), far(u + _F(1)))
    i = base.astype(np.int64)
    return [(np.clip(i - 1 + k, 0, last), w) for k, w in enumerate(weights)]


AA_CUBIC_A = -0.5          # the antialiased bicubic filter's a (PIL's, torch's)


def _aa_filter(mode, x):
    """The antialiasing filter at float64 offsets ``x``: a triangle (linear) or the cubic
    convolution kernel with a = -0.5, rounded once to float32."""
    x = np.abs(x)
    if mode == "linear":
        return np.where(x < 1.0, 1.0 - x, 0.0).astype(_F)
    a = AA_CUBIC_A
    near = ((a + 2.0) * x - (a + 3.0)) * x * x + 1.0
    far = (((x - 5.0) * x + 8.0) * x - 4.0) * a
    return np.where(x < 1.0, near, np.where(x < 2.0, far, 0.0)).astype(_F)


def _taps_aa(mode, n_in, n_out, factor):
    """torch's antialiased resampling (``antialias=True``): output i averages the inputs
    under the filter stretched by the scale when it shrinks (support ``scale`` for
    linear, ``2 scale`` for cubic, each tap weighted at its distance / scale from the
    centre ``scale (i + 0.5)``), the weights normalised to sum 1; a tap past ``xsize``
    weighs nothing. Returned as tap lists with a validity mask."""
    scale = _step(n_in, n_out, factor, False)
    half = 1.0 if mode == "linear" else 2.0
    support = _F(half * scale) if scale >= 1 else _F(half)
    invscale = _F(1.0 / float(scale)) if scale >= 1 else _F(1)
    center = (np.float64(scale) * (np.arange(n_out) + 0.5)).astype(_F)
    xmin = np.maximum((center - np.float64(support) + 0.5).astype(np.int64), 0)
    xsize = np.minimum((center + np.float64(support) + 0.5).astype(np.int64), n_in) - xmin
    taps = int(xsize.max())
    weights = [_aa_filter(mode, ((j + xmin) - center.astype(np.float64) + 0.5)
                          * np.float64(invscale)) for j in range(taps)]
    valid = [j < xsize for j in range(taps)]
    total = np.zeros(n_out, _F)
    for w, ok in zip(weights, valid):
        total = (total + np.where(ok, w, _F(0))).astype(_F)
    norm = np.where(total != 0, total, _F(1))
    return [(np.minimum(j + xmin, n_in - 1), np.where(ok, w / norm, _F(0)).astype(_F), ok)
            for j, (w, ok) in enumerate(zip(weights, valid))]


def _along(x, axis, taps):
    shape = [1] * x.ndim
    shape[axis] = -1
    out = None
    for idx, w, *ok in taps:
        term = np.take(x, idx, axis=axis)
        if w is not None:
            term = term * w.reshape(shape)
        if ok:                          # an antialiasing tap past the window adds nothing
            term = np.where(ok[0].reshape(shape), term, _F(0))
        out = term if out is None else out + term
    return out


def _per_dim(value, nd):
    if value is None:
        return (None,) * nd
    return tuple(value) if isinstance(value, tuple) else (value,) * nd


def _run(args, attrs):
    x, *like = args
    axes = spatial_axes(x.ndim, attrs["channels_last"])
    sizes = _per_dim(attrs["size"], len(axes))
    if like:
        sizes = tuple(like[0].shape[ax] for ax in axes)
    factors = _per_dim(attrs["scale_factor"], len(axes))
    y = np.asarray(x, _F)
    for ax, size, factor in reversed(list(zip(axes, sizes, factors))):
        n_in = y.shape[ax]
        n_out = size if size is not None else out_size(n_in, factor)
        if n_in < 1 or n_out < 1:
            raise ValueError(f"interpolate of an axis of {n_in} samples to {n_out}: both "
                             f"must be at least 1")
        taps = (_taps_aa(attrs["mode"], n_in, n_out, factor) if attrs.get("antialias")
                else _taps(attrs["mode"], n_in, n_out, factor, attrs["align_corners"]))
        y = _along(y, ax, taps)
    return [np.ascontiguousarray(y, dtype=x.dtype)]


def _reflect(coord, twice_low, twice_high):
    """torch's reflect_coordinates: ``coord`` mirrored into [low, high]."""
    if twice_low == twice_high:
        return np.zeros_like(coord)
    low = _F(twice_low / 2)
    span = _F((twice_high - twice_low) / 2)
    c = np.abs(coord - low)
    extra = np.fmod(c, span)
    flips = np.floor(c / span)
    return np.where(np.fmod(flips, 2) == 0, extra + low, span - extra + low).astype(_F)


def _grid_coords(coord, size, padding, align_corners):
    """A grid axis in [-1, 1] as source pixel coordinates (torch's CPU kernel: unnormalize,
    then border clamping or reflection), float32."""
    if align_corners:
        c = (coord + _F(1)) * _F((size - 1) / 2)
    else:
        c = (coord + _F(1)) * _F(size / 2) - _F(0.5)
    if padding == "border":
        c = np.clip(c, _F(0), _F(size - 1))
    elif padding == "reflection":
        c = (_reflect(c, 0, 2 * (size - 1)) if align_corners
             else _reflect(c, -1, 2 * size - 1))
        c = np.clip(c, _F(0), _F(size - 1))
    return c.astype(_F, copy=False)


def _grid_run(args, attrs):
    x, grid = args
    x = np.asarray(x, _F)
    if not attrs["channels_last"]:
        x = np.moveaxis(x, 1, -1)                   # [N, H, W, C]
    n, h, w, c = x.shape
    g = np.asarray(grid, _F)
    if g.shape[0] != n:
        raise ValueError(f"grid_sample: grid batch {g.shape[0]} for x batch {n}")
    ix = _grid_coords(g[..., 0], w, attrs["padding_mode"], attrs["align_corners"])
    iy = _grid_coords(g[..., 1], h, attrs["padding_mode"], attrs["align_corners"])
    batch = np.arange(n).reshape(n, 1, 1)

    def tap(yy, xx):
        """x at integer points (any), zero where outside (or x empty); [N, Ho, Wo, C]."""
        ok = (xx >= 0) & (xx < w) & (yy >= 0) & (yy < h)
        if not (h and w):
            return np.zeros(xx.shape + (c,), _F), ok
        vals = x[batch, np.clip(yy, 0, max(h - 1, 0)), np.clip(xx, 0, max(w - 1, 0))]
        return np.where(ok[..., None], vals, _F(0)), ok

    if attrs["mode"] == "nearest":
        out, _ = tap(np.rint(iy).astype(np.int64), np.rint(ix).astype(np.int64))
    else:
        x0, y0 = np.floor(ix), np.floor(iy)
        e, s = ix - x0, iy - y0                    # east and south weights' deltas
        wd, nd = _F(1) - e, _F(1) - s
        xi, yi = x0.astype(np.int64), y0.astype(np.int64)
        out = None
        for (dy, dx), weight in (((0, 0), nd * wd), ((0, 1), nd * e), ((1, 0), s * wd),
                                 ((1, 1), s * e)):
            vals, _ = tap(yi + dy, xi + dx)
            term = vals * weight[..., None]
            out = term if out is None else out + term
    if not attrs["channels_last"]:
        out = np.moveaxis(out, -1, 1)
    return [np.ascontiguousarray(out, dtype=args[0].dtype)]


RUN = {"interpolate": _run, "grid_sample": _grid_run}
