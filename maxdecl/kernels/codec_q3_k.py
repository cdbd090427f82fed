"""Q3_K quantizer: 256 floats -> 256 3-bit quants (hmask + 2-bit qs) + 16 6-bit scales + fp16 d.

``x = d * (sc[s] - 32) * (q - 4)`` for sub-block ``s`` (16 floats), ``q`` in 0..7.
The quantizer is GGML's ``quantize_row_q3_K_ref``: per sub-block a symmetric fit
with weights ``x**2`` refined one quant at a time (``make_q3_quants``), then signed
6-bit scales relative to the largest-magnitude one. Plain float32 without
contraction, so the bytes match GGML's.

Block layout (110 bytes): hmask[32] @0 | qs[64] @32 | scales[12] @96 | d @108.
Value ``j``: bit 2 of ``q`` is bit ``j // 32`` of ``hmask[j % 32]``; for
``j = 128g + 32k + l`` the low 2 bits are bits ``2k..2k+1`` of ``qs[32g + l]``.
Scale ``s`` (biased by 32): low nibble is nibble ``s // 8`` of byte ``s % 8``, high
2 bits are bits ``2 * (s // 4)`` of byte ``8 + s % 4``.

``error_model="numpy"``: a float division by zero gives inf/NaN as in C instead of
raising (finite inputs whose range overflows float32 reach it); helpers called from
these kernels are compiled with the same flags.
"""

from __future__ import annotations

import numpy as np
from numba import njit, prange

from .codec_common import all_finite, f32_to_f16_bits, nearest_int
from .config import CACHE, EXACT

QK_K = 256
CHUNK = 64             # blocks per prange iteration (scratch is allocated per chunk)
GROUP_MAX_EPS = 1e-15  # GGML: a group whose max |x| is below this is all zero

_HM, _QS, _SC, _D = 0, 32, 96, 108


@njit(cache=CACHE, fastmath=EXACT, error_model="numpy")
def _as_int8(v):
    """C's conversion of an int to ``int8_t`` (keep the low byte, two's complement)."""
    return ((np.int32(v) & 0xFF) ^ 0x80) - 0x80


@njit(cache=CACHE, fastmath=EXACT, error_model="numpy")
def _make_q3_quants(x, off, n, nmax, L, loff):
    """GGML ``make_q3_quants`` with ``do_rmse``: fit ``x ~ scale * (L - nmax)``.

    Starts from the plain absmax rounding, then for up to 5 passes tries moving each
    quant to its least-squares value given the others (weights ``x**2``), keeping
    the move when it improves ``sumlx**2 / suml2``. Returns ``scale``; writes
    ``L[loff:loff+n]`` (offset by ``nmax``, or all 0 for an all-zero group).
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
    iscale = -np.float32(nmax) / mx
    sumlx = np.float32(0.0)
    suml2 = np.float32(0.0)
    for i in range(n):
        v = x[off + i]
        l = max(-nmax, min(nmax - 1, nearest_int(iscale * v)))
        L[loff + i] = l
        w = v * v
        fl = np.float32(l)
        sumlx += w * v * fl
        suml2 += w * fl * fl
    for _itry in range(5):
        n_changed = 0
        for i in range(n):
            v = x[off + i]
            w = v * v
            cur = np.float32(L[loff + i])
            slx = sumlx - w * v * cur
            if slx > np.float32(0.0):
                sl2 = suml2 - w * cur * cur
                new_l = max(-nmax, min(nmax - 1, nearest_int(v * sl2 / slx)))
                if new_l != L[loff + i]:
                    fn = np.float32(new_l)
                    slx += w * v * fn
                    sl2 += w * fn * fn
                    if sl2 > np.float32(0.0) and slx * slx * suml2 > sumlx * sumlx * sl2:
                        L[loff + i] = new_l
                        sumlx = slx
                        suml2 = sl2
                        n_changed += 1
        if n_changed == 0:
            break
    for i in range(n):
        L[loff + i] += nmax
    return sumlx / suml2 if suml2 > np.float32(0.0) else np.float32(0.0)


@njit(cache=CACHE, fastmath=EXACT, error_model="numpy")
def _q3_k_block(x, table, out, L, scales):
    # x: (256,) f32 -> out: (110,) u8 (zeroed); L (256,) i8, scales (16,) f32: scratch
    max_scale = np.float32(0.0)
    amax = np.float32(0.0)
    for j in range(16):
        s = _make_q3_quants(x, 16 * j, 16, 4, L, 16 * j)
        scales[j] = s
        if abs(s) > amax:
            amax = abs(s)
            max_scale = s
    if max_scale != np.float32(0.0):
        iscale = np.float32(-32.0) / max_scale
        for j in range(16):
            l = _as_int8(nearest_int(iscale * scales[j]))    # C stores it in an int8 first
            l = max(-32, min(31, l)) + 32
            if j < 8:
                out[_SC + j] = l & 0x0F
            else:
                out[_SC + j - 8] |= np.uint8((l & 0x0F) << 4)
            out[_SC + 8 + j % 4] |= np.uint8((l >> 4) << (2 * (j // 4)))
        hd = f32_to_f16_bits(np.float32(1.0) / iscale)
    else:
        hd = f32_to_f16_bits(np.float32(0.0))
    out[_D] = hd & 0xFF
    out[_D + 1] = hd >> 8
    fd = table[hd]
    for j in range(16):
        if j < 8:
            lo = np.int32(out[_SC + j]) & 0x0F
        else:
            lo = np.int32(out[_SC + j - 8]) >> 4
        hi = (np.int32(out[_SC + 8 + j % 4]) >> (2 * (j // 4))) & 3
        sc = (lo | (hi << 4)) - 32
        d = fd * np.float32(sc)
        if d == np.float32(0.0):
            continue                     # keep the quants the search chose
        for ii in range(16):
            L[16 * j + ii] = max(-4, min(3, nearest_int(x[16 * j + ii] / d))) + 4
    for j in range(QK_K):
        q = L[j]
        if q > 3:
            out[_HM + j % 32] |= np.uint8(1 << (j // 32))
            L[j] = q - 4
    for g in range(2):
        for l in range(32):
            b = 128 * g + l
            out[_QS + 32 * g + l] = ((L[b] & 3) | ((L[b + 32] & 3) << 2) | ((L[b + 64] & 3) << 4)
                                     | ((L[b + 96] & 3) << 6))


@njit(cache=CACHE, fastmath=EXACT, error_model="numpy", parallel=True)
def _q3_k_quantize(x, table, out, bad):
    # x: (nb, 256) f32 -> out: (nb, 110) u8 zeroed, bad: (nb,) u8 (1 where a NaN/Inf was seen)
    nb = x.shape[0]
    for c in prange((nb + CHUNK - 1) // CHUNK):
        L = np.zeros(QK_K, dtype=np.int8)
        scales = np.zeros(16, dtype=np.float32)
        for i in range(c * CHUNK, min(nb, (c + 1) * CHUNK)):
            if not all_finite(x[i]):
                bad[i] = 1
                continue
            _q3_k_block(x[i], table, out[i], L, scales)
