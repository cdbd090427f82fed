"""Prefill GEMM speed, by hand: ``python bench/gemm.py [--m 128] [--threads 1] [--cpu-time]``.

Times ``maxdecl.kernels.gemm.gemm`` (qmatmul's path for M > 16 rows) at the weight
shapes of Gemma 3 270M Q4_K_M (random blocks, sane fp16 scales), for each vector width
(16 lanes: AVX-512 tile; 8 lanes: AVX2 tile), the widths interleaved call by call so
both see the same machine; prints the median per call, GFLOP/s and the total over one
prefill (each shape times its calls per prefill). On a shared machine, compare with
``--threads 1 --cpu-time`` (2-thread wall times wait on the scheduler).
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

# (encoding, N, K, calls per prefill) of Gemma 3 270M Q4_K_M's linear layers
SHAPES = [("q5_0", 2048, 640, 36), ("q5_0", 256, 640, 27), ("q4_k", 640, 1024, 18),
          ("q5_0", 1024, 640, 18), ("q6_k", 640, 2048, 9), ("q4_k", 640, 2048, 9),
          ("q8_0", 256, 640, 9)]


def _packed(enc, n, k, rng):
    from maxdecl.kernels.block_rows import LAYOUTS

    be, bb = LAYOUTS[enc]
    nb = k // be
    raw = rng.integers(0, 256, (n, nb, bb), dtype=np.uint8)
    fp16 = (rng.random((n, nb, 2)) * 0.01 + 0.001).astype(np.float16).view(np.uint8)
    at = {"q4_k": slice(0, 4), "q6_k": slice(208, 210)}.get(enc, slice(0, 2))
    raw[..., at] = fp16.reshape(n, nb, 4)[..., :at.stop - at.start]
    return raw.reshape(n, nb * bb)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--m", type=int, default=128, help="rows of x (prompt tokens)")
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--reps", type=int, default=15)
    ap.add_argument("--lanes", default="16,8")
    ap.add_argument("--cpu-time", action="store_true", help="process CPU time (use 1 thread)")
    a = ap.parse_args(argv)
    import numba

    from maxdecl.kernels import gemm as kg
    from maxdecl.kernels.block_rows import KINDS

    if a.threads:
        numba.set_num_threads(a.threads)
    clock = time.process_time if a.cpu_time else time.perf_counter
    lanes = [int(v) for v in a.lanes.split(",")]
    rng = np.random.default_rng(0)
    total = dict.fromkeys(lanes, 0.0)
    flops = 0
    print(f"M={a.m} threads={numba.get_num_threads()} load average "
          f"{' '.join(f'{v:.1f}' for v in os.getloadavg())}")
    for enc, n, k, calls in SHAPES:
        w = _packed(enc, n, k, rng)
        x = rng.standard_normal((a.m, k)).astype(np.float32)
        out = np.empty((a.m, n), np.float32)
        ts = {ln: [] for ln in lanes}
        for ln in lanes:
            kg.gemm(KINDS[enc], x, w, out, ln)                      # compile / warm
        for _ in range(a.reps):
            for ln in lanes:
                t = clock()
                kg.gemm(KINDS[enc], x, w, out, ln)
                ts[ln].append(clock() - t)
        line = f"{enc} {n:5} x {k:5}"
        for ln in lanes:
            med = float(np.median(ts[ln]))
            total[ln] += med * calls
            line += f"   {ln} lanes {med * 1e6:7.0f} us {2 * a.m * n * k / med / 1e9:5.0f} GFLOP/s"
        flops += 2 * a.m * n * k * calls
        print(line, flush=True)
    print("per prefill: " + ", ".join(f"{ln} lanes {t * 1e3:.1f} ms ({flops / t / 1e9:.0f} GFLOP/s)"
                                      for ln, t in total.items()))


if __name__ == "__main__":
    main()
