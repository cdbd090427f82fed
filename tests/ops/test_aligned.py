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
