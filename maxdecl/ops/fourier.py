"""Discrete Fourier transforms on real and imaginary parts held as two float32 values
(graphs have no complex dtype): ``fft`` (complex to complex, over one or more axes,
forward or inverse), ``rfft`` (real to the non-negative frequencies) and ``irfft``
(back to real). Norms as numpy and torch: ``backward`` (the inverse divides by n),
``ortho`` (both by sqrt(n)), ``forward`` (the forward divides by n).

FNet's mixing is the real part of ``fft`` over the sequence and hidden axes; an FFT
convolution (Hyena, FNO) is ``irfft`` of the product of two ``rfft``s, the complex
product written with ``mul``, ``sub`` and ``add``. Runtime: ``maxdecl.kernels.fourier``.
"""

from __future__ import annotations

from ..dtypes import DType, TensorType, format_shape
from . import _checks
from ._registry import define, public

__all__ = ["fft", "rfft", "irfft"]

NORMS = ("backward", "ortho", "forward")


def _float32(*pairs) -> None:
    for v, what in pairs:
        if v.is_quantized or v.dtype != DType.float32:
            raise TypeError(f"{what} must be float32, got {v.type}")


def _norm(attrs) -> None:
    if attrs["norm"] not in NORMS:
        raise ValueError(f"norm must be one of {', '.join(NORMS)}, got {attrs['norm']!r}")


def _normalize_axes(attrs):
    axes = attrs["axes"]
    axes = (axes,) if isinstance(axes, int) else tuple(axes)
    return {**attrs, "axes": axes, "inverse": bool(attrs["inverse"])}


def _fft_rule(types, attrs):
    re, *im = types
    _float32((re, "re"), *((v, "im") for v in im))
    _norm(attrs)
    if im and (im[0].rank != re.rank or not all(
            _checks.dims_equal(a, b) for a, b in zip(re.shape, im[0].shape))):
        raise ValueError(f"im{format_shape(im[0].shape)} must have re's shape "
                         f"{format_shape(re.shape)}")
    axes = attrs["axes"]
    if not axes:
        raise ValueError("axes must name at least one axis")
    norm_axes = [_checks.valid_axis(a, re.rank) for a in axes]
    if len(set(norm_axes)) != len(norm_axes):
        raise ValueError(f"axes {list(axes)} repeat an axis")
    return [re, TensorType(DType.float32, re.shape)]


def _half(n):
    """floor(n / 2) + 1: the rfft length of an axis of n (an opaque dim when symbolic)."""
    if isinstance(n, int):
        return n // 2 + 1
    from .conv import window_out

    return window_out(n, 1, 2, 1, 0, 1)


def _rfft_rule(types, attrs):
    (x,) = types
    _float32((x, "x"))
    _norm(attrs)
    axis = _checks.valid_axis(attrs["axis"], x.rank)
    n = attrs["n"]
    if n is not None and (isinstance(n, bool) or not isinstance(n, int) or n < 1):
        raise ValueError(f"n must be a positive int, got {n!r}")
    shape = list(x.shape)
    shape[axis] = _half(shape[axis] if n is None else n)
    out = TensorType(DType.float32, tuple(shape))
    return [out, out]


def _irfft_rule(types, attrs):
    re, im = types
    _float32((re, "re"), (im, "im"))
    _norm(attrs)
    if re.rank != im.rank or not all(_checks.dims_equal(a, b)
                                     for a, b in zip(re.shape, im.shape)):
        raise ValueError(f"re{format_shape(re.shape)} and im{format_shape(im.shape)} must "
                         f"have one shape")
    axis = _checks.valid_axis(attrs["axis"], re.rank)
    n = attrs["n"]
    if n is None:
        m = re.shape[axis]
        if not isinstance(m, int):
            raise ValueError(f"n (the output length) must be given for a symbolic axis "
                             f"{m!r}")
        n = 2 * (m - 1)
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ValueError(f"n must be a positive int, got {n!r}")
    shape = list(re.shape)
    shape[axis] = n
    return [TensorType(DType.float32, tuple(shape))]


define("fft", rule=_fft_rule, run="fourier", inputs=("re",), optional=("im",),
       attrs={"axes": (-1,), "inverse": False, "norm": "backward"},
       normalize=_normalize_axes, kind="fourier", outputs=2,
       outputs_doc="re, im of the transform",
       doc="discrete Fourier transform over axes of the complex values re + i im (im "
           "absent: 0), as numpy.fft.fftn / torch.fft.fftn (ifftn with `inverse`); "
           "norm backward, ortho or forward",
       rule_doc="re, im float32 of one shape; axes distinct and in range; out: re's type, "
                "twice")
define("rfft", rule=_rfft_rule, run="fourier", inputs=("x",),
       attrs={"axis": -1, "n": None, "norm": "backward"}, kind="fourier", outputs=2,
       outputs_doc="re, im of frequencies 0 .. n // 2",
       doc="discrete Fourier transform of real x along axis, the non-negative frequencies "
           "only (numpy.fft.rfft, torch.fft.rfft); `n` pads x with zeros or cuts it to "
           "that length first (default: the axis's); norm backward, ortho or forward",
       rule_doc="x float32; n None or a positive int; out: x's type with axis n // 2 + 1 "
                "long, twice")
define("irfft", rule=_irfft_rule, run="fourier", inputs=("re", "im"),
       attrs={"axis": -1, "n": None, "norm": "backward"}, kind="fourier",
       doc="the real signal of length n whose rfft is re + i im along axis "
           "(numpy.fft.irfft, torch.fft.irfft); n defaults to 2 * (m - 1), always even, so "
           "give n for an odd length; norm backward, ortho or forward",
       rule_doc="re, im float32 of one shape; n a positive int (needed when the axis is "
                "symbolic or the length odd); out: the axis n long")


@public
def fft():  # noqa: A001 - the signature comes from the definition
    """Discrete Fourier transform of ``re + i im`` over ``axes`` (``im`` None: real
    input); returns ``(re, im)`` float32, as ``torch.fft.fftn`` (``inverse``:
    ``ifftn``). FNet's token mixing is ``fft(x, axes=(-2, -1))[0]``.

    Example::

        re, im = md.ops.fft(x, axes=(-2, -1))
    """


@public
def rfft():  # noqa: A001 - the signature comes from the definition
    """The non-negative frequencies of the transform of real ``x`` along ``axis``:
    ``(re, im)`` with that axis ``n // 2 + 1`` long, as ``torch.fft.rfft``.

    Example::

        re, im = md.ops.rfft(signal, axis=-1)
    """


@public
def irfft():  # noqa: A001 - the signature comes from the definition
    """The real signal of length ``n`` whose ``rfft`` is ``re + i im`` along ``axis``,
    as ``torch.fft.irfft`` (``n`` defaults to ``2 * (m - 1)``).

    Example::

        y = md.ops.irfft(re, im, axis=-1, n=2048)
    """
