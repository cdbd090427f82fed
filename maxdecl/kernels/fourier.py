"""Runtime of ``fft``, ``rfft`` and ``irfft`` (``maxdecl.ops.fourier``): numpy's pocketfft
in single precision (complex64 for float32 input), parts split to float32."""

from __future__ import annotations

import numpy as np


def _parts(z) -> list:
    return [np.ascontiguousarray(z.real, dtype=np.float32),
            np.ascontiguousarray(z.imag, dtype=np.float32)]


def _fft_run(args, attrs):
    re = np.asarray(args[0], np.float32)
    z = re if len(args) < 2 else re + np.complex64(1j) * np.asarray(args[1], np.float32)
    z = np.asarray(z, np.complex64)
    f = np.fft.ifftn if attrs["inverse"] else np.fft.fftn
    return _parts(f(z, axes=attrs["axes"], norm=attrs["norm"]))


def _rfft_run(args, attrs):
    x = np.asarray(args[0], np.float32)
    return _parts(np.fft.rfft(x, n=attrs["n"], axis=attrs["axis"], norm=attrs["norm"]))


def _irfft_run(args, attrs):
    re, im = (np.asarray(a, np.float32) for a in args)
    if re.shape != im.shape:
        raise ValueError(f"irfft: re {list(re.shape)} and im {list(im.shape)} differ")
    n = attrs["n"] if attrs["n"] is not None else 2 * (re.shape[attrs["axis"]] - 1)
    z = np.asarray(re + np.complex64(1j) * im, np.complex64)
    out = np.fft.irfft(z, n=n, axis=attrs["axis"], norm=attrs["norm"])
    return [np.ascontiguousarray(out, dtype=np.float32)]


RUN = {"fft": _fft_run, "rfft": _rfft_run, "irfft": _irfft_run}
