"""Runtime of the linear-algebra ops (``maxdecl.ops.linalg``): matmul through NumPy's
BLAS, qmatmul and quantized linear through the packed-block kernels of ``qmatmul``."""

from __future__ import annotations

import numpy as np

from .. import codecs
from ..dtypes import format_shape
from ..tensors import QuantizedTensor
from . import fused as kf
from . import gemv, gemv_q8
from . import qmatmul as kq
from .config import GEMV_MAX_ROWS
from .step_outputs import ALL, empty, writes_into

_KERNELS_FOR: dict = {}   # encoding object -> whether the packed-block kernels apply
_ROWS_FOR: dict = {}      # encoding object -> whether an exact row decoder applies


def _block_kernels(enc) -> bool:
    ok = _KERNELS_FOR.get(enc)
    if ok is None:
        ok = _KERNELS_FOR[enc] = kq.has_kernel(str(enc.name), int(enc.block_elements),
                                               int(enc.block_bytes))
    return ok


def _row_decoder(enc) -> bool:
    ok = _ROWS_FOR.get(enc)
    if ok is None:
        ok = _ROWS_FOR[enc] = kq.has_row_decoder(str(enc.name), int(enc.block_elements),
                                                 int(enc.block_bytes))
    return ok


def qmatmul(x, qt, step=None):
    """``x @ dequantize(qt).T`` for a QuantizedTensor ``qt`` ``[N, K]`` (a decode GEMV's
    result in an array of ``step``'s, a ``StepOutputs``, where given)."""
    n, k = qt.shape
    enc = codecs.get(qt.encoding)
    data = qt.data
    if (x.ndim == 2 and 0 < x.shape[0] <= GEMV_MAX_ROWS and x.shape[1] == k and n
            and x.dtype == np.float32 and x.flags.c_contiguous and data.ndim == 2
            and data.shape[0] == n and data.dtype == np.uint8 and data.flags.c_contiguous
            and _block_kernels(enc)):
        # decode, batched decode: straight to the GEMV (the weight was checked when bound)
        out = empty(step, 0, (x.shape[0], n))
        kq.gemv(x, data.view(np.uint16) if qt.encoding == "bf16" else data, qt.encoding, out)
        return out
    if x.shape[-1] != k:
        raise ValueError(f"x{format_shape(x.shape)} vs w{format_shape(qt.shape)}: "
                         "K must match")
    lead = x.shape[:-1]
    x2 = np.ascontiguousarray(x, dtype=np.float32).reshape(-1, k)
    if x2.shape[0] == 0 or n == 0:
        return np.zeros((*lead, n), np.float32)
    w = np.ascontiguousarray(qt.data)
    if _block_kernels(enc) or _row_decoder(enc):
        out = kq.qmatmul_blocks(x2, w, qt.encoding)
    else:
        def decode(r0, r1, tile):
            tile[...] = np.asarray(enc.dequantize(w[r0:r1], (r1 - r0, k)),
                                   np.float32).reshape(r1 - r0, k)
        out = kq.tiled_matmul(x2, n, decode)
    return out.reshape(*lead, n)


def rows_matmul(x, wt):
    """``x @ wt`` for float x (..., K) and wt (K, N), each of up to GEMV_MAX_ROWS rows as
    its own vector-matrix product: a row's result does not depend on its batch-mates
    (BLAS picks other kernels for other row counts), so batched decode stays exact."""
    lead = x.shape[:-1]
    x2 = x.reshape(-1, x.shape[-1])
    if x2.shape[0] > GEMV_MAX_ROWS:
        return np.matmul(x, wt)
    out = np.empty((x2.shape[0], wt.shape[1]), np.result_type(x2, wt))
    for i in range(x2.shape[0]):
        np.matmul(x2[i], wt, out=out[i])
    return out.reshape(*lead, wt.shape[1])


@writes_into
def _linear(args, attrs, out=None):
    x, w, *bias = args
    if isinstance(w, QuantizedTensor):
        y = qmatmul(x, w, out)
    else:
        y = rows_matmul(x, w.T)          # a view: BLAS reads w transposed, no copy a call
    if bias:
        b = bias[0]
        if (isinstance(y, np.ndarray) and np.result_type(y, b) == y.dtype
                and np.broadcast_shapes(y.shape, np.shape(b)) == y.shape):
            np.add(y, b, out=y)          # the product is this call's own array
        else:
            y = y + b
    return [np.asarray(y)]


@writes_into
def linear_group(args, attrs, out=None):
    """``linear`` of one x by ``attrs["n"]`` weights of one kind and K (a fused group,
    ``maxdecl.fusion``): ``[x, w_1..w_n, (b_1..b_n)] -> [x @ w_i.T (+ b_i) for each i]``,
    each output bit-identical to ``_linear([x, w_i(, b_i)])``. Quantized weights with
    block kernels run as one ``fused.qmatmul_group`` call over all rows of x."""
    n = attrs["n"]
    x, ws, bs = args[0], args[1:n + 1], args[n + 1:]
    w0 = ws[0]
    if (x.ndim == 2 and 0 < x.shape[0] <= GEMV_MAX_ROWS and x.dtype == np.float32
            and x.flags.c_contiguous):                          # decode, batched decode
        prepared = _gemv_group(ws, attrs)
        if prepared is not None and x.shape[1] == w0.shape[1]:
            packed, offs, cols, enc = prepared
            whole = empty(out, ALL, (x.shape[0], int(offs[-1])))
            gemv_q8.run_group(enc, x, packed, offs, whole)
            ys = [whole[:, a:b] for a, b in cols]
            for y, b in zip(ys, bs):
                np.add(y, b, out=y)
            return ys
    if isinstance(w0, QuantizedTensor) and _block_kernels(codecs.get(w0.encoding)):
        k = w0.shape[1]
        if x.shape[-1] != k:
            raise ValueError(f"x{format_shape(x.shape)} vs w{format_shape(w0.shape)}: "
                             "K must match")
        flat = x.ndim == 2 and x.dtype == np.float32 and x.flags.c_contiguous  # decode
        x2 = x if flat else np.ascontiguousarray(x, dtype=np.float32).reshape(-1, k)
        if x2.shape[0] and all(w.shape[0] for w in ws):
            ys = kf.qmatmul_group(x2, [np.ascontiguousarray(w.data) for w in ws],
                                  w0.encoding)
            if not flat:
                lead = x.shape[:-1]
                ys = [y.reshape(*lead, w.shape[0]) for y, w in zip(ys, ws)]
            for y, b in zip(ys, bs):            # the kernel's own outputs: add in place
                np.add(y, b, out=y)
            return ys
    if bs:
        return [_linear([x, w, b], attrs)[0] for w, b in zip(ws, bs)]
    return [_linear([x, w], attrs)[0] for w in ws]


def _gemv_group(ws, attrs):
    """(packed weights, column offsets, column bounds, encoding) of a fused group of
    quantized weights of one encoding with a group GEMV (``gemv.GEMV_GROUP``), else
    None. Made on the step's first call and kept in its ``attrs`` (a fused step's own
    dict): the weights are bound, the same objects every call, so a decode step skips
    re-checking and re-packing them."""
    kept = attrs.get("_gemv")
    if kept is not None and len(kept[0]) == len(ws) and all(a is b for a, b in zip(kept[0], ws)):
        return kept[1]
    enc = getattr(ws[0], "encoding", None)
    prepared = None
    if (enc in gemv.GEMV_GROUP and all(isinstance(w, QuantizedTensor) and w.encoding == enc
                                       and w.data.ndim == 2 and w.data.dtype == np.uint8
                                       and w.shape[1] == ws[0].shape[1] and w.shape[0]
                                       for w in ws)):
        packed = tuple(np.ascontiguousarray(w.data) for w in ws)
        offs = gemv.offsets(tuple(int(w.shape[0]) for w in ws))
        bounds = offs.tolist()
        prepared = (packed, offs, list(zip(bounds[:-1], bounds[1:])), enc)
    attrs["_gemv"] = (tuple(ws), prepared)
    return prepared


def einsum(args, attrs):
    """``numpy.einsum`` with its contraction order; float16 is summed in float32 (as
    torch on CPU). A fresh C-order array: never a view of an input."""
    dtype = args[0].dtype
    xs = [a.astype(np.float32) for a in args] if dtype == np.float16 else args
    out = np.asarray(np.einsum(attrs["equation"], *xs, optimize=True))
    if (out.dtype != dtype or not out.flags.c_contiguous
            or any(np.may_share_memory(out, a) for a in args)):
        return [np.array(out, dtype=dtype, order="C")]      # ascontiguousarray: 0-d -> 1-d
    return [out]


RUN = {
    "einsum": einsum,
    "matmul": lambda args, attrs: [np.asarray(np.matmul(args[0], args[1]))],
    "qmatmul": lambda args, attrs: [qmatmul(args[0], args[1])],
    "linear": _linear,
}
