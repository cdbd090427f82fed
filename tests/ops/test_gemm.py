"""The GEMM path of qmatmul (M > 16 rows, ``maxdecl/kernels/gemm.py``), both vector widths.

The 8-lane (AVX2) and 16-lane (AVX-512) kernels are compiled explicitly, so both are
checked on any CPU (LLVM splits 16-lane vectors where AVX-512 is missing). References
are float64 ``x @ gguf.quants.dequantize(bytes).T``; the bound is float32 rounding
relative to ``|x| @ |W|.T``, as in test_qmatmul.py.
"""

import ctypes
import mmap
import zlib

import numpy as np
import pytest
from gguf import GGMLQuantizationType as GT
from gguf import quants as gq

from maxdecl.kernels import gemm as kg
from maxdecl.kernels.block_rows import KINDS, LAYOUTS
from maxdecl.kernels.gemv import _target_has
from ophelp import packed_blocks

FAST = ["q4_0", "q5_0", "q8_0", "q4_k", "q6_k", "bf16"]
TOL = 2e-6


def _check(enc, x, data, out):
    w = gq.dequantize(data, getattr(GT, enc.upper())).astype(np.float64)
    x64 = x.astype(np.float64)
    ref, scale = x64 @ w.T, np.abs(x64) @ np.abs(w).T
    bound = (np.abs(out - ref) / np.maximum(scale, 1e-30)).max()
    assert bound <= TOL, f"{enc} {x.shape} x {w.shape}: error {bound:.2e} of |x||W|"


@pytest.mark.parametrize("lanes", [8, 16])
@pytest.mark.parametrize("enc", FAST)
def test_gemm_matches_gguf_reference(enc, lanes):
    """Ragged M (partial and half panels), ragged N (partial tiles and chunks)."""
    rng = np.random.default_rng(zlib.crc32(f"{enc}/{lanes}".encode()))
    be = LAYOUTS[enc][0]
    for m, n, k in ((17, 37, 2 * max(be, 32)), (33, 70, 3 * max(be, 32)),
                    (100, 97, 4 * max(be, 32)), (200, 1, max(be, 32))):
        data = packed_blocks(enc, n, k, rng)
        x = rng.standard_normal((m, k)).astype(np.float32)
        out = np.full((m, n), np.nan, np.float32)
        kg.gemm(KINDS[enc], x, data, out, lanes)
        _check(enc, x, data, out)


@pytest.mark.parametrize("lanes, mr, rb", [(8, 4, 16), (16, 8, 32), (16, 12, 48), (8, 6, 12)])
def test_gemm_every_m_and_ragged_k(lanes, mr, rb):
    """bf16 (one value per block) lets K be anything: K not a multiple of the lanes or of
    the K slice, every M from 17 to 70 and a few up to 200, with other tile shapes."""
    rng = np.random.default_rng(lanes * 100 + mr)
    n, k = 45, 141
    data = packed_blocks("bf16", n, k, rng)
    for m in [*range(17, 71), 95, 128, 129, 200]:
        x = rng.standard_normal((m, k)).astype(np.float32)
        out = np.full((m, n), np.nan, np.float32)
        kg.gemm(KINDS["bf16"], x, data, out, lanes, mr, rb)
        _check("bf16", x, data, out)


def test_default_lanes_follow_the_target():
    assert kg.default_lanes() == (16 if _target_has("avx512f") else 8)


def _guarded(shape, dtype):
    """A C array whose last byte is followed by an unreadable page: a kernel that reads
    past it crashes instead of passing."""
    nbytes = int(np.prod(shape)) * np.dtype(dtype).itemsize
    page = mmap.PAGESIZE
    size = (nbytes + page - 1) // page * page + page
    buf = mmap.mmap(-1, size)
    base = ctypes.addressof(ctypes.c_char.from_buffer(buf))
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mprotect.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    assert libc.mprotect(base + size - page, page, 0) == 0      # PROT_NONE
    start = size - page - nbytes
    arr = np.frombuffer(buf, dtype, count=int(np.prod(shape)), offset=start).reshape(shape)
    return arr, buf


@pytest.mark.parametrize("lanes", [8, 16])
@pytest.mark.parametrize("enc", ["q5_0", "q4_k", "bf16"])
def test_gemm_reads_nothing_past_x_and_w(enc, lanes):
    rng = np.random.default_rng(9)
    be = LAYOUTS[enc][0]
    m, n, k = 41, 23, (256 if be > 1 else 73)
    data = packed_blocks(enc, n, k, rng)
    x = rng.standard_normal((m, k)).astype(np.float32)
    gx, keep_x = _guarded(x.shape, np.float32)
    gw, keep_w = _guarded(data.shape, np.uint8)
    gx[...] = x
    gw[...] = data
    out = np.empty((m, n), np.float32)
    kg.gemm(KINDS[enc], gx, gw, out, lanes)
    _check(enc, x, data, out)
    assert keep_x and keep_w          # the mappings live until here


@pytest.mark.parametrize("lanes", [8, 16])
@pytest.mark.parametrize("enc", FAST)
def test_gemm_decodes_weights_bit_for_bit(enc, lanes):
    """x = identity: every output is one weight times 1 plus zeros, so out.T must equal
    gguf-py's dequantize exactly (raw blocks: every quant and high-bit pattern, fp16
    scales of both signs from subnormals up)."""
    rng = np.random.default_rng(11)
    be, bb = LAYOUTS[enc]
    n, k = 37, (512 if be > 1 else 96)
    raw = rng.integers(0, 256, (n, k // be, bb), dtype=np.uint8)
    for at in {"q4_k": (0, 2), "q6_k": (208,), "bf16": ()}.get(enc, (0,)):
        mag = np.exp2(rng.uniform(-24, 2, (n, k // be))) * rng.choice([-1, 1], (n, k // be))
        raw[..., at:at + 2] = mag.astype(np.float16)[..., None].view(np.uint8)
    data = raw.reshape(n, -1)
    want = gq.dequantize(data, getattr(GT, enc.upper()))
    if enc == "bf16":
        want = np.where(np.isfinite(want), want, 0).astype(np.float32)
        data = want.view(np.uint32).__rshift__(16).astype(np.uint16).view(np.uint8).reshape(n, -1)
        want = gq.dequantize(data, GT.BF16)
    out = np.empty((k, n), np.float32)
    kg.gemm(KINDS[enc], np.eye(k, dtype=np.float32), data, out, lanes)
    np.testing.assert_array_equal(out.T, want)
