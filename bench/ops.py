"""Op speed against torch CPU in the same run (by hand: ``python bench/ops.py``).

conv2d (ResNet-like 3x3 and 1x1 layers, batch 1 and 8; ours NHWC/RSCF, torch NCHW),
conv_transpose (a decoder's 2x upsampling, batch 1 and 8), causal attention (seq 512,
8 heads, head dim 64; torch SDPA) and layer_norm.
Both sides use 2 threads. Prints medians over repeats and ours/torch ratios; on a
shared machine compare ratios, not absolute times.
"""

from __future__ import annotations

import os
import statistics
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

import maxdecl as md  # noqa: E402

THREADS = 2
REPEATS = int(os.environ.get("REPEATS", "7"))


def median_ms(fn, repeats=REPEATS) -> float:
    fn()  # warm-up (compiles on first use)
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1e3


def graph_fn(build, *arrays):
    g = md.Graph("b", [md.TensorType(md.DType.from_numpy(a.dtype), a.shape) for a in arrays])
    g.output(build(*g.inputs))
    return lambda: g.execute(*arrays)


def main() -> None:
    torch.set_num_threads(THREADS)
    import numba
    numba.set_num_threads(THREADS)
    rng = np.random.default_rng(0)
    f32 = np.float32
    rows = []

    convs = [("3x3 64->64 56x56", 3, 64, 64, 56, 1), ("1x1 256->64 56x56", 1, 256, 64, 56, 0),
             ("3x3 128->128 28x28 s1", 3, 128, 128, 28, 1)]
    for batch in (1, 8):
        for label, k, c, f, hw, pad in convs:
            x = rng.standard_normal((batch, hw, hw, c)).astype(f32)
            w = rng.standard_normal((k, k, c, f)).astype(f32) * 0.05
            ours = median_ms(graph_fn(lambda v: md.ops.conv2d(v, w, padding=pad), x))
            tx = torch.from_numpy(x.transpose(0, 3, 1, 2).copy())
            tw = torch.from_numpy(w.transpose(3, 2, 0, 1).copy())
            with torch.no_grad():
                theirs = median_ms(lambda: F.conv2d(tx, tw, padding=pad))
            rows.append((f"conv2d b{batch} {label}", ours, theirs))

    for batch in (1, 8):     # a decoder's upsampling: 4x4, stride 2, padding 1, 64 -> 32
        x = rng.standard_normal((batch, 28, 28, 64)).astype(f32)
        w = rng.standard_normal((4, 4, 32, 64)).astype(f32) * 0.05
        ours = median_ms(graph_fn(lambda v: md.ops.conv_transpose(v, w, stride=2, padding=1), x))
        tx = torch.from_numpy(x.transpose(0, 3, 1, 2).copy())
        tw = torch.from_numpy(w.transpose(3, 2, 0, 1).copy())
        with torch.no_grad():
            theirs = median_ms(lambda: F.conv_transpose2d(tx, tw, stride=2, padding=1))
        rows.append((f"conv_transpose b{batch} 4x4 s2 64->32 28x28", ours, theirs))

    s, h, d = 512, 8, 64
    q, k, v = (rng.standard_normal((1, s, h, d)).astype(f32) for _ in range(3))
    ours = median_ms(graph_fn(md.ops.attention, q, k, v))
    tq, tk, tv = (torch.from_numpy(a.transpose(0, 2, 1, 3).copy()) for a in (q, k, v))
    with torch.no_grad():
        theirs = median_ms(lambda: F.scaled_dot_product_attention(tq, tk, tv, is_causal=True))
    rows.append(("attention causal s512 h8 d64", ours, theirs))

    x = rng.standard_normal((2048, 1024)).astype(f32)
    gam = rng.standard_normal(1024).astype(f32)
    bet = rng.standard_normal(1024).astype(f32)
    ours = median_ms(graph_fn(lambda v: md.ops.layer_norm(v, gam, bet), x))
    tx, tg, tb = (torch.from_numpy(a) for a in (x, gam, bet))
    with torch.no_grad():
        theirs = median_ms(lambda: F.layer_norm(tx, (1024,), tg, tb))
    rows.append(("layer_norm [2048, 1024]", ours, theirs))

    print(f"{'op':<36}{'ours ms':>10}{'torch ms':>10}{'ratio':>8}")
    for label, a, b in rows:
        print(f"{label:<36}{a:>10.2f}{b:>10.2f}{a / b:>8.2f}")


if __name__ == "__main__":
    main()
