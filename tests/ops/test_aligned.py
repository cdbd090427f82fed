"""64-byte aligned buffers (kernels.aligned) and the GEMV's aligned copy of x."""

import numpy as np
from hypothesis import given, settings, strategies as st

from maxdecl.kernels.aligned import empty_aligned, rows_aligned


@settings(max_examples=60, deadline=None, derandomize=True)
@given(st.lists(st.integers(1, 40), min_size=1, max_size=4),
       st.sampled_from([np.float32, np.float16, np.int64, np.uint8]))
def test_empty_aligned_shape_dtype_and_boundary(shape, dtype):
    a = empty_aligned(tuple(shape), dtype)
    assert a.shape == tuple(shape) and a.dtype == dtype and a.flags.c_contiguous
    assert a.ctypes.data % 64 == 0
    a[...] = 1                                   # writable, and the whole extent is there
    assert a.sum(dtype=np.float64) == a.size


def test_gemv_aligns_misaligned_rows_without_changing_numbers():
    """x rows off a 64-byte boundary are copied to aligned ones; same bits either way."""
    import maxdecl as md
    from maxdecl.kernels import gemv

    rng = np.random.default_rng(3)
    e = md.codecs.get("q8_0")
    w = e.quantize(rng.standard_normal((40, 256)).astype(np.float32))
    buf = np.empty(8 * 256 + 16, np.float32)
    off = (-buf.ctypes.data % 64) // 4 + 4      # rows start 16 bytes past a boundary
    x = buf[off:off + 8 * 256].reshape(8, 256)
    x[...] = rng.standard_normal((8, 256))
    assert not rows_aligned(x) and rows_aligned(gemv.aligned_rows(x))
    a, b = np.empty((8, 40), np.float32), np.empty((8, 40), np.float32)
    gemv.gemv(x, w, "q8_0", a)
    gemv.gemv(np.ascontiguousarray(x).copy(), w, "q8_0", b)
    assert a.tobytes() == b.tobytes()


def test_gemv_aligns_a_single_long_misaligned_row():
    """One x row off a 64-byte boundary and longer than ONE_ROW_BYTES is copied too (a
    short one is read in place): same bits as the row read from an aligned buffer."""
    import maxdecl as md
    from maxdecl.kernels import gemv

    rng = np.random.default_rng(4)
    k = gemv.ONE_ROW_BYTES // 4 + 32
    w = md.codecs.get("q5_0").quantize(rng.standard_normal((24, k)).astype(np.float32))
    buf = np.empty(k + 16, np.float32)
    off = (-buf.ctypes.data % 64) // 4 + 4      # the row starts 16 bytes past a boundary
    x = buf[off:off + k].reshape(1, k)
    x[...] = rng.standard_normal((1, k))
    got = gemv.aligned_rows(x)
    assert not rows_aligned(x) and rows_aligned(got) and got.tobytes() == x.tobytes()
    aligned = empty_aligned((1, k))
    aligned[...] = x
    assert gemv.aligned_rows(aligned) is aligned
    short = buf[off:off + 640].reshape(1, 640)   # in L1: read where it is
    assert gemv.aligned_rows(short) is short
    a, b = np.empty((1, 24), np.float32), np.empty((1, 24), np.float32)
    gemv.gemv(x, w, "q5_0", a)
    gemv.gemv(aligned, w, "q5_0", b)
    assert a.tobytes() == b.tobytes()
