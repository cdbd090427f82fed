"""Q6_K kernels: 256 floats -> 16 int8 sub-block scales, fp16 d and 256 6-bit quants.

``x = d * sc[s] * (q - 32)`` for sub-block ``s`` (16 floats). The quantizer is
GGML's ``quantize_row_q6_K_ref`` (``make_qx_quants`` with rmse_type 1), written in
plain float32 without contraction so that the bytes match GGML's.
"""

from __future__ import annotations

import numpy as np
from numba import njit, prange

from .codec_common import all_finite, f32_to_f16_bits, nearest_int
from .config import CACHE, EXACT

QK_K = 256
CHUNK = 64            # blocks per prange iteration (scratch is allocated per chunk)
GROUP_MAX_EPS = 1e-15  # GGML: a group whose max |x| is below this is all zero

# Byte offsets inside one 210-byte block (see maxdecl/codecs/q6_k.py for the table).
_QL, _QH, _SC, _D = 0, 128, 192, 208


@njit(cache=CACHE, fastmath=EXACT, error_model="numpy")
def _make_qx_quants(x, off, n, nmax, L, loff):
    """GGML ``make_qx_quants`` with rmse_type 1 (weights x**2): fit ``x ~ scale * (L - nmax)``.

    Returns ``scale``; writes ``L[loff:loff+n]`` (offset by ``nmax``).
    """
    mx = np.float32(0.0)
    amax = np.float32(0.0)
    for i in range(n):
        ax = abs(x[off + i])
        if ax > amax:
            amax = ax
            mx = x[off + i]
    if amax < np.float32(GROUP_MAX_EPS):
        for i in range(n):
            L[loff + i] = 0
        return np.float32(0.0)
    fnmax = np.float32(nmax)
    iscale = -fnmax / mx
    sumlx = np.float32(0.0)
    suml2 = np.float32(0.0)
    for i in range(n):
        v = x[off + i]
        l = max(-nmax, min(nmax - 1, nearest_int(iscale * v)))
        L[loff + i] = l + nmax
        w = v * v
        fl = np.float32(l)
        sumlx += w * v * fl
        suml2 += w * fl * fl
    # C: ``suml2 ? sumlx/suml2 : 0`` (a NaN suml2 counts as true)
    scale = sumlx / suml2 if suml2 != np.float32(0.0) else np.float32(0.0)
    best = scale * sumlx
    for step in range(-9, 10):
        if step == 0:
            continue
        iscale = -(fnmax + np.float32(0.1) * np.float32(step)) / mx
        sumlx = np.float32(0.0)
        suml2 = np.float32(0.0)
        for i in range(n):
            v = x[off + i]
            fl = np.float32(max(-nmax, min(nmax - 1, nearest_int(iscale * v))))
            w = v * v
            sumlx += w * v * fl
            suml2 += w * fl * fl
        if suml2 > np.float32(0.0) and sumlx * sumlx > best * suml2:
            for i in range(n):
                L[loff + i] = nmax + max(-nmax, min(nmax - 1, nearest_int(iscale * x[off + i])))
            scale = sumlx / suml2
            best = scale * sumlx
    return scale


@njit(cache=CACHE, fastmath=EXACT, error_model="numpy")
def _q6_k_block(x, table, out, L, scales):
    # x: (256,) f32 -> out: (210,) u8 (zeroed by the caller); L (256,) u8, scales (16,) f32: scratch
    max_scale = np.float32(0.0)
    max_abs_scale = np.float32(0.0)
    for ib in range(16):
        s = _make_qx_quants(x, 16 * ib, 16, 32, L, 16 * ib)
        scales[ib] = s
        if abs(s) > max_abs_scale:
            max_abs_scale = abs(s)
            max_scale = s
    if max_abs_scale < np.float32(GROUP_MAX_EPS):
        return                              # all-zero block: every byte 0 (d = +0)
    iscale = np.float32(-128.0) / max_scale
    hd = f32_to_f16_bits(np.float32(1.0) / iscale)
    out[_D] = hd & 0xFF
    out[_D + 1] = hd >> 8
    for ib in range(16):
        out[_SC + ib] = min(127, nearest_int(iscale * scales[ib])) & 0xFF  # stored as int8
    fd = table[hd]
    for j in range(16):
        s = np.int32(out[_SC + j])
        d = fd * np.float32(s - 256 if s > 127 else s)
        if d == np.float32(0.0):
            continue                        # keep the quants make_qx_quants chose
        for ii in range(16):
            L[16 * j + ii] = 32 + max(-32, min(31, nearest_int(x[16 * j + ii] / d)))
    for h in range(2):
        j = 128 * h
        for l in range(32):
            out[_QL + 64 * h + l] = (L[j + l] & 0x0F) | ((L[j + l + 64] & 0x0F) << 4)
            out[_QL + 64 * h + l + 32] = (L[j + l + 32] & 0x0F) | ((L[j + l + 96] & 0x0F) << 4)
            out[_QH + 32 * h + l] = ((L[j + l] >> 4) | ((L[j + l + 32] >> 4) << 2)
                                     | ((L[j + l + 64] >> 4) << 4) | ((L[j + l + 96] >> 4) << 6))


@njit(cache=CACHE, fastmath=EXACT, error_model="numpy", parallel=True)
def _q6_k_quantize(x, table, out, bad):
    # x: (nb, 256) f32 -> out: (nb, 210) u8 zeroed, bad: (nb,) u8 (1 where a NaN/Inf was seen)
    nb = x.shape[0]
    for c in prange((nb + CHUNK - 1) // CHUNK):
        L = np.zeros(QK_K, dtype=np.uint8)
        scales = np.zeros(16, dtype=np.float32)
        for i in range(c * CHUNK, min(nb, (c + 1) * CHUNK)):
            if not all_finite(x[i]):
                bad[i] = 1
                continue
            _q6_k_block(x[i], table, out[i], L, scales)
