"""Write ``ggml_quants2_golden.npz``: GGML's reference bytes for Q5_K, Q3_K, Q2_K, IQ4_NL, IQ4_XS.

Run by hand where ``llama_cpp`` (llama-cpp-python, which ships ``libggml-base.so``)
is installed::

    python tests/codecs/make_ggml_golden2.py

The tests only read the npz. Inputs: the 34 rows of ``ggml_kquants_golden.npz``
plus the rows of ``extra_rows()``; each row is one 256-float super-block (eight
32-float blocks for IQ4_NL).

IQ4_NL caveat: for a 32-float block whose max |x| is below 1e-15, this GGML build
leaves the quant indices uninitialised (stack garbage or the previous block's), so
``ref_bytes`` sets them to 0 as current GGML does (``d`` is 0 there either way).
"""

from __future__ import annotations

import ctypes
import os
from pathlib import Path

import numpy as np

HERE = Path(__file__).parent
OUT = HERE / "ggml_quants2_golden.npz"
GROUP_MAX_EPS = 1e-15

# name -> (GGML reference function, floats per block, bytes per block)
SPEC = {
    "q5_k": ("quantize_row_q5_K_ref", 256, 176),
    "q3_k": ("quantize_row_q3_K_ref", 256, 110),
    "q2_k": ("quantize_row_q2_K_ref", 256, 84),
    "iq4_nl": ("quantize_row_iq4_nl_ref", 32, 18),
    "iq4_xs": ("quantize_row_iq4_xs_ref", 256, 136),
    "q4_k": ("quantize_row_q4_K_ref", 256, 144),
    "q6_k": ("quantize_row_q6_K_ref", 256, 210),
    "q4_1": ("quantize_row_q4_1_ref", 32, 20),
    "q5_1": ("quantize_row_q5_1_ref", 32, 24),
    "tq1_0": ("quantize_row_tq1_0_ref", 256, 54),
    "tq2_0": ("quantize_row_tq2_0_ref", 256, 66),
}


def load_ggml():
    """ctypes handle on llama_cpp's ``libggml-base.so`` (raises ImportError without it)."""
    import llama_cpp

    path = os.path.join(os.path.dirname(llama_cpp.__file__), "lib", "libggml-base.so")
    lib = ctypes.CDLL(path)
    for fn, _, _ in SPEC.values():
        f = getattr(lib, fn)
        f.restype = None
        f.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64]
    return lib


def ref_bytes(lib, name: str, x: np.ndarray) -> np.ndarray:
    """GGML's reference bytes for ``x`` (any shape, size a multiple of the block) -> (nb, bytes)."""
    fn, be, bb = SPEC[name]
    flat = np.ascontiguousarray(x, dtype=np.float32).reshape(-1)
    out = np.zeros((flat.size // be, bb), dtype=np.uint8)
    getattr(lib, fn)(flat.ctypes.data, out.ctypes.data, flat.size)
    if name == "iq4_nl":   # uninitialised indices in all-(near-)zero blocks: use 0 (see above)
        zero = np.abs(flat.reshape(-1, be)).max(axis=1) < np.float32(GROUP_MAX_EPS)
        out[zero, 2:] = 0
    return out


def extra_rows() -> np.ndarray:
    """Rows added to the K-quant golden inputs: normals, exact ties, tiny/huge mixtures."""
    rng = np.random.default_rng(20240611)
    k = 256
    rows = [rng.standard_normal((16, k))]                          # 16 plain normal rows
    rows.append(rng.integers(-8, 8, (2, k)) * 0.25)                # exact ties on a grid
    rows.append(rng.integers(0, 4, (1, k)).astype(np.float64))     # 0..3 exactly
    rows.append(np.tile(np.array([-1.0, 1.0]), k // 2)[None])      # +-1 alternating
    mixed = rng.standard_normal((2, k)) * 1e-20
    mixed[:, ::37] = rng.standard_normal((2, mixed[:, ::37].shape[1])) * 1e3
    rows.append(mixed)                                             # tiny with a few huge
    half = rng.standard_normal((1, k))
    half[:, :128] = 0.0
    rows.append(half)                                              # zero half, normal half
    sub = rng.standard_normal((1, k)) * 1e-38                      # near/below FLT_MIN
    rows.append(sub)
    per_block = rng.standard_normal((1, k)) * np.repeat(10.0 ** np.arange(-16, 0, 2), 32)
    rows.append(per_block)                                         # scales 1e-16 .. 1e-2
    rows.append(rng.uniform(-3e38, 3e38, (1, k)))                  # max - min overflows to inf
    return np.concatenate(rows).astype(np.float32)


def main() -> None:
    lib = load_ggml()
    base = np.load(HERE / "ggml_kquants_golden.npz")["x"]
    x = np.concatenate([base, extra_rows()]).astype(np.float32)
    data = {"x": x}
    for name in SPEC:
        data[name] = ref_bytes(lib, name, x)
    np.savez_compressed(OUT, **data)
    print(OUT, x.shape, OUT.stat().st_size, "bytes")


if __name__ == "__main__":
    main()
