"""Helpers for op tests: build a one-op graph from NumPy inputs, run it, compare."""

from __future__ import annotations

import numpy as np

import maxdecl as md


def run_op(fn, *arrays, **attrs):
    """``fn(*graph_inputs, **attrs)`` on a fresh graph; returns the outputs as arrays.

    Arrays become graph inputs (so shapes are checked at run time too); ``None``
    passes through (optional inputs).
    """
    types = [md.TensorType(md.DType.from_numpy(a.dtype), a.shape)
             for a in arrays if a is not None]
    g = md.Graph("t", input_types=types)
    it = iter(g.inputs)
    vals = [None if a is None else next(it) for a in arrays]
    out = fn(*vals, **attrs)
    outs = list(out) if isinstance(out, (list, tuple)) else [out]
    g.output(outs)
    res = g.execute(*[a for a in arrays if a is not None])
    return res if len(res) > 1 else res[0]


def close(a, b, atol=1e-5, rtol=1e-5, label=""):
    a, b = np.asarray(a), np.asarray(b)
    assert a.shape == b.shape, f"{label}: shape {a.shape} vs {b.shape}"
    if a.size:
        diff = np.abs(a.astype(np.float64) - b.astype(np.float64))
        tol = atol + rtol * np.abs(b.astype(np.float64))
        bad = np.argwhere(diff > tol)
        assert not len(bad), (f"{label}: max diff {diff.max():.3g}, first mismatch at "
                              f"{tuple(bad[0])}: {a[tuple(bad[0])]} vs {b[tuple(bad[0])]}")


# byte offsets of the fp16 scales of the encodings gguf-py cannot quantize
FP16_SCALES = {"q4_k": (0, 2), "q6_k": (208,), "q2_k": (80, 82), "q3_k": (108,),
               "q5_k": (0, 2), "iq4_nl": (0,), "iq4_xs": (0,)}


def packed_blocks(enc, n, k, rng):
    """GGML bytes (n, k // be * bb) for ``enc``: gguf-py's quantizer, or random K-quant
    blocks with sane fp16 scales (gguf-py has no K-quant quantizer)."""
    from gguf import GGMLQuantizationType as GT
    from gguf import quants as gq

    from maxdecl.blocks import block_size

    be, bb = block_size(enc)
    if enc in FP16_SCALES:
        nb = k // be
        raw = rng.integers(0, 256, (n, nb, bb), dtype=np.uint8)
        for at in FP16_SCALES[enc]:
            raw[..., at:at + 2] = ((rng.standard_normal((n, nb, 1)) * 0.02)
                                   .astype(np.float16).view(np.uint8))
        return raw.reshape(n, nb * bb)
    w = rng.standard_normal((n, k)).astype(np.float32)
    return gq.quantize(w, getattr(GT, enc.upper()))


def raw_blocks(enc, n, k, rng):
    """Raw random GGML bytes (n, k // be * bb): every quant, scale and high-bit pattern,
    with each fp16 scale (d, and dmin where there is one) of either sign from fp16
    subnormals up to 4."""
    from maxdecl.blocks import block_size

    be, bb = block_size(enc)
    raw = rng.integers(0, 256, (n, k // be, bb), dtype=np.uint8)
    for at in {"q4_k": (0, 2), "q6_k": (208,), "q5_k": (0, 2), "q4_1": (0, 2),
               "q5_1": (0, 2), "q3_k": (108,), "q2_k": (80, 82), "tq2_0": (64,),
               "tq1_0": (52,)}.get(enc, (0,)):
        mag = np.exp2(rng.uniform(-24, 2, (n, k // be))) * rng.choice([-1, 1], (n, k // be))
        raw[..., at:at + 2] = mag.astype(np.float16)[..., None].view(np.uint8)
    return raw.reshape(n, -1)
