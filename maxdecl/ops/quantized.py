"""Ops on quantized weights: ``qmatmul(x, w_q) = x @ dequantize(w_q).T``.

``x`` is float32 ``[..., K]``; ``w_q`` is quantized with logical shape ``[N, K]``
(rows quantized along K, as GGML stores them); the result is float32 ``[..., N]``.
Encodings with GGML block layouts (q4_0, q5_0, q8_0, q4_k, q6_k, bf16) run numba
kernels on the packed bytes (``maxdecl.kernels.qmatmul``); any other registered
encoding is decoded a tile of rows at a time through its own ``dequantize`` and
multiplied in float32. The activations are never quantized, and no path decodes
the whole matrix.
"""

from __future__ import annotations

import numpy as np

from .. import codecs
from ..dtypes import DType, TensorType, format_shape
from ..errors import GraphError
from ._registry import apply, kernels, register

__all__ = ["qmatmul"]


def _qmatmul_infer(inputs, attrs):
    x, w = inputs
    if not w.is_quantized:
        raise TypeError(f"w must be quantized (g.quantize(...) or a weight with an encoding), "
                        f"got {w.type}")
    if x.is_quantized or x.dtype != DType.float32:
        raise TypeError(f"x must be float32, got {x.type} (cast it first)")
    n_k = w.logical_shape
    if len(n_k) != 2:
        raise ValueError(f"w {w.type} must be 2-D [N, K]")
    if x.rank == 0:
        raise ValueError(f"x {x.type} must have rank >= 1 [..., K]")
    k_x, (n, k_w) = x.shape[-1], n_k
    if not (k_x == k_w or isinstance(k_x, str) or isinstance(k_w, str)):
        raise ValueError(f"x[..., {k_x}] vs w{format_shape(n_k)}: K must match")
    return [TensorType(DType.float32, (*x.shape[:-1], n))]


_KERNELS_FOR: dict = {}   # encoding object -> whether the packed-block kernels apply


def _block_kernels(enc) -> bool:
    ok = _KERNELS_FOR.get(enc)
    if ok is None:
        kq = kernels("qmatmul")
        ok = _KERNELS_FOR[enc] = kq.has_kernel(str(enc.name), int(enc.block_elements),
                                               int(enc.block_bytes))
    return ok


def _qmatmul_run(args, attrs):
    kq = kernels("qmatmul")

    x, qt = args
    n, k = qt.shape
    enc = codecs.get(qt.encoding)
    if (x.ndim == 2 and x.shape[0] == 1 and x.shape[1] == k and n and x.dtype == np.float32
            and x.flags.c_contiguous and _block_kernels(enc)):     # decode: keep it lean
        return [kq.qmatmul_blocks(x, np.ascontiguousarray(qt.data), qt.encoding)]
    if x.shape[-1] != k:
        raise GraphError(f"x{format_shape(x.shape)} vs w{format_shape(qt.shape)}: "
                         "K must match")
    lead = x.shape[:-1]
    x2 = np.ascontiguousarray(x, dtype=np.float32).reshape(-1, k)
    if x2.shape[0] == 0 or n == 0:
        return [np.zeros((*lead, n), np.float32)]
    w = np.ascontiguousarray(qt.data)
    if _block_kernels(enc):
        out = kq.qmatmul_blocks(x2, w, qt.encoding)
    else:
        def decode(r0, r1, tile):
            tile[...] = np.asarray(enc.dequantize(w[r0:r1], (r1 - r0, k)),
                                   np.float32).reshape(r1 - r0, k)
        out = kq.tiled_matmul(x2, n, decode)
    return [out.reshape(*lead, n)]


register("qmatmul", infer=_qmatmul_infer, run=_qmatmul_run, kind="linalg")


def qmatmul(x, w_q):
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
    return apply("qmatmul", [x, w_q])[0]
