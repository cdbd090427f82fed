"""Q5_K, Q3_K, Q2_K, IQ4_NL and IQ4_XS quantizer kernels: byte-identical to GGML's reference.

The golden bytes in ``ggml_quants2_golden.npz`` come from llama.cpp's compiled
``quantize_row_*_ref`` functions (see ``make_ggml_golden2.py``). Where
``llama_cpp`` is installed, a further test compares against the library directly.
"""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

HERE = Path(__file__).parent
GOLDEN = HERE / "ggml_quants2_golden.npz"

# name -> (kernel module, kernel function, floats per block, bytes per block)
KERNELS = {
    "q5_k": ("maxdecl.kernels.codec_q5_k", "_q5_k_quantize", 256, 176),
    "q3_k": ("maxdecl.kernels.codec_q3_k", "_q3_k_quantize", 256, 110),
    "q2_k": ("maxdecl.kernels.codec_q2_k", "_q2_k_quantize", 256, 84),
    "iq4_nl": ("maxdecl.kernels.codec_iq4", "_iq4_nl_quantize", 32, 18),
    "iq4_xs": ("maxdecl.kernels.codec_iq4", "_iq4_xs_quantize", 256, 136),
}
NAMES = list(KERNELS)
# and the older quantizers, checked on the same rows (huge finite values included)
KERNELS.update({
    "q4_k": ("maxdecl.kernels.codec_q4_k", "_q4_k_quantize", 256, 144),
    "q6_k": ("maxdecl.kernels.codec_q6_k", "_q6_k_quantize", 256, 210),
    "q4_1": ("maxdecl.kernels.codec_legacy", "_q4_1_quantize", 32, 20),
    "q5_1": ("maxdecl.kernels.codec_legacy", "_q5_1_quantize", 32, 24),
    "tq1_0": ("maxdecl.kernels.codec_legacy", "_tq1_0_quantize", 256, 54),
    "tq2_0": ("maxdecl.kernels.codec_legacy", "_tq2_0_quantize", 256, 66),
})
ALL_NAMES = list(KERNELS)


def quantize(name, x):
    """Run our kernel on ``x`` (any shape, size a multiple of the block) -> (bytes, bad)."""
    import importlib

    from maxdecl.codecs._blocks import fp16_to_fp32_table

    mod, fn, be, bb = KERNELS[name]
    kernel = getattr(importlib.import_module(mod), fn)
    blocks = np.ascontiguousarray(x, dtype=np.float32).reshape(-1, be)
    out = np.zeros((blocks.shape[0], bb), dtype=np.uint8)
    bad = np.zeros(blocks.shape[0], dtype=np.uint8)
    kernel(blocks, fp16_to_fp32_table(), out, bad)
    return out, bad


def assert_same_blocks(ours, ref, what):
    diff = np.nonzero((ours != ref).any(axis=1))[0]
    assert diff.size == 0, (
        f"{what}: {diff.size} of {ref.shape[0]} blocks differ from GGML, "
        f"blocks {diff[:20].tolist()}; "
        f"first: ours {ours[diff[0]].tolist()} vs GGML {ref[diff[0]].tolist()}")


@pytest.fixture(scope="module")
def golden():
    return np.load(GOLDEN)


def test_golden_file_shapes(golden):
    from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType as T  # noqa: N817

    x = golden["x"]
    assert x.dtype == np.float32 and x.shape[1] == 256
    for name, (_, _, be, bb) in KERNELS.items():
        assert GGML_QUANT_SIZES[getattr(T, name.upper())] == (be, bb)
        assert golden[name].shape == (x.size // be, bb)


@pytest.mark.parametrize("name", ALL_NAMES)
def test_bytes_equal_ggml_golden(name, golden):
    out, bad = quantize(name, golden["x"])
    assert not bad.any()
    assert_same_blocks(out, golden[name], name)


@pytest.mark.parametrize("name", ALL_NAMES)
def test_non_finite_blocks_flagged(name, golden):
    be = KERNELS[name][2]
    x = golden["x"].reshape(-1, be).copy()
    nb = x.shape[0]
    hit = {1: np.nan, 4: np.inf, 7: -np.inf, nb - 1: np.nan}
    for b, v in hit.items():
        x[b, (5 * b) % be] = v
    out, bad = quantize(name, x)
    expect = np.zeros(nb, dtype=np.uint8)
    expect[list(hit)] = 1
    np.testing.assert_array_equal(bad, expect)
    ok = expect == 0
    assert_same_blocks(out[ok], golden[name][ok], f"{name} (finite blocks next to flagged ones)")


def _baseline(name, x):
    """A plain min/max or absmax quantizer at the same number of bits per value."""
    def asym(b, levels):
        lo, hi = b.min(1, keepdims=True), b.max(1, keepdims=True)
        s = (hi - lo) / levels
        return np.round((b - lo) / s) * s + lo

    def sym(b, lo_q, hi_q):
        s = np.abs(b).max(1, keepdims=True) / -lo_q
        return np.clip(np.round(b / s), lo_q, hi_q) * s

    if name == "q5_k":
        return asym(x.reshape(-1, 32), 31)
    if name == "q2_k":
        return asym(x.reshape(-1, 16), 3)
    if name == "q3_k":
        return sym(x.reshape(-1, 16), -4, 3)
    return sym(x.reshape(-1, 32), -8, 7)       # iq4_*: q4_0-like absmax at 4 bits


@pytest.mark.parametrize("name", NAMES)
def test_round_trip_beats_simple_baseline(name, rng):
    gguf_quants = pytest.importorskip("gguf.quants")
    from gguf import GGMLQuantizationType as T  # noqa: N817

    x = rng.standard_normal((64, 1024)).astype(np.float32)
    out, _ = quantize(name, x)
    y = gguf_quants.dequantize(out.reshape(64, -1), getattr(T, name.upper())).reshape(x.shape)
    rmse = np.sqrt(np.mean((y - x) ** 2))
    rmse_base = np.sqrt(np.mean((_baseline(name, x).reshape(x.shape) - x) ** 2))
    assert rmse <= rmse_base * 1.05, (rmse, rmse_base)


def test_kernels_compile_lazily():
    """Importing the kernel modules compiles nothing (first call does)."""
    code = (
        "import maxdecl.kernels.codec_q5_k as a, maxdecl.kernels.codec_q3_k as b, "
        "maxdecl.kernels.codec_q2_k as c, maxdecl.kernels.codec_iq4 as d\n"
        "fs = [a._q5_k_quantize, b._q3_k_quantize, c._q2_k_quantize, "
        "d._iq4_nl_quantize, d._iq4_xs_quantize]\n"
        "assert all(not f.signatures for f in fs), [f.signatures for f in fs]\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def _load_golden_script():
    path = HERE / "make_ggml_golden2.py"
    spec = importlib.util.spec_from_file_location("make_ggml_golden2", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _random_kinds(rng, n):
    k = 256
    return {
        "normal": rng.standard_normal((n, k)),
        "shifted": rng.uniform(-1.0, 3.0, (n, k)),
        "heavy": rng.standard_t(2, (n, k)) * 0.02,
        "sparse": rng.standard_normal((n, k)) * (rng.random((n, k)) < 0.1),
        "one_signed": np.abs(rng.standard_normal((n, k))),
        "ties": rng.integers(-8, 8, (n, k)) * 0.5,
        "scaled": rng.standard_normal((n, k)) * 10.0 ** rng.uniform(-12, 8, (n, 1)),
        "lognormal": rng.standard_normal((n, k)) * np.exp(rng.standard_normal((n, k)) * 3),
        "denormal": rng.standard_normal((n, k)) * 10.0 ** rng.uniform(-45, -30, (n, 1)),
        "huge": rng.uniform(-1.0, 1.0, (n, k)) * 10.0 ** rng.uniform(3, 38.5, (n, 1)),
        "block_scales": rng.standard_normal((n, k)) * np.repeat(
            10.0 ** rng.uniform(-20, 5, (n, 8)), 32, axis=1),
    }


@pytest.mark.parametrize("name", ALL_NAMES)
def test_bytes_equal_llama_cpp_on_random_data(name):
    pytest.importorskip("llama_cpp")
    script = _load_golden_script()
    lib = script.load_ggml()
    rng = np.random.default_rng(97)
    for kind, x in _random_kinds(rng, 200).items():
        x = x.astype(np.float32)
        ours, bad = quantize(name, x)
        assert not bad.any()
        assert_same_blocks(ours, script.ref_bytes(lib, name, x), f"{name} on {kind} data")
