"""Codec speed against gguf-py's NumPy implementation, measured in the same run.

Run by hand on an idle machine:  python bench/codecs.py [--elements N ...] [--repeat 5]

Default sizes: 512 x 4096 (an 8 MB output, the size of most tensors of a small
model) and 4096 x 4096 (64 MB, a Llama-7B projection).
Prints the median time of each side, the ratio gguf-py / ours, and our GB/s
(float32 bytes made or read). Dequantize is timed twice: into a new array (what
``enc.dequantize(q, shape)`` returns; for tensors this large the kernel's page
faults of fresh memory cost as much as the decoding) and into a reused buffer
(``out=``). Both sides are checked to produce identical results before timing.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))   # run from a checkout


def _median(fn, repeat):
    """(median, min, max) wall seconds and the median CPU seconds (all threads) of ``fn()``."""
    times, cpu = [], []
    for _ in range(repeat):
        c = time.process_time()
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
        cpu.append(time.process_time() - c)
    return statistics.median(times), min(times), max(times), statistics.median(cpu)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--elements", type=int, nargs="+", default=[1 << 21, 1 << 24])
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--ref-repeat", type=int, default=3)
    ap.add_argument("--only", nargs="*", default=None, help="encodings to run (default: all)")
    ap.add_argument("--threads", type=int, default=None, help="numba threads (default: all)")
    args = ap.parse_args()

    import numba

    if args.threads:
        numba.set_num_threads(args.threads)
    from gguf import GGMLQuantizationType as T
    from gguf import quants as gq

    for elements in args.elements:
        _run_size(args, elements, numba, T, gq)
        print()


def _run_size(args, elements, numba, T, gq) -> None:
    from maxdecl import codecs

    k = 4096
    rows = elements // k
    x = np.random.default_rng(0).standard_normal((rows, k)).astype(np.float32)
    print(f"{rows} x {k} float32 = {x.size / 1e6:.1f}M elements, numba threads "
          f"{numba.get_num_threads()}; times are medians of {args.repeat} (ours) / "
          f"{args.ref_repeat} (gguf-py) runs, [min-max]")
    print("ratio: gguf-py / ours median wall time; cpu ratio: the same for CPU time summed over "
          "threads\n(the fairer figure on a shared machine); GB/s: float32 bytes made or read")
    print(f"{'encoding':8} {'op':10} {'ours ms':>18} {'gguf-py ms':>20} {'ratio':>7} "
          f"{'cpu ratio':>9} {'ours GB/s':>9}")

    def fmt(t):
        return f"{t[0] * 1e3:8.1f} [{t[1] * 1e3:4.0f}-{t[2] * 1e3:4.0f}]"

    @numba.njit(parallel=True)
    def fill(out):
        for i in numba.prange(out.shape[0]):
            for j in range(out.shape[1]):
                out[i, j] = np.float32(j)

    def fresh_fill():
        fill(np.empty(x.shape, dtype=np.float32))

    fresh_fill()
    floor = _median(fresh_fill, args.repeat)
    print(f"{'floor':8} {'np.empty + numba fill of the output':38} {fmt(floor)}   "
          f"(no dequantize can beat this) {x.nbytes / floor[0] / 1e9:6.2f} GB/s")
    buf = np.empty(x.shape, dtype=np.float32)
    floor = _median(lambda: fill(buf), args.repeat)
    print(f"{'floor':8} {'numba fill of a reused buffer':38} {fmt(floor)}   "
          f"(no dequantize out= can beat this) {x.nbytes / floor[0] / 1e9:6.2f} GB/s")

    for name in args.only or ["bf16", "q4_0", "q5_0", "q8_0", "q4_k", "q6_k"]:
        enc = codecs.get(name)
        qt = getattr(T, name.upper())
        q = enc.quantize(x)                       # also compiles / loads the kernels
        ref_dq = gq.dequantize(q, qt).reshape(x.shape)
        assert np.array_equal(enc.dequantize(q, x.shape).view(np.uint32),
                              ref_dq.view(np.uint32)), name
        ours = _median(lambda e=enc, q=q: e.dequantize(q, x.shape), args.repeat)
        into = _median(lambda e=enc, q=q: e.dequantize(q, x.shape, out=buf), args.repeat)
        ref = _median(lambda q=q, t=qt: gq.dequantize(q, t), args.ref_repeat)
        print(f"{name:8} {'dequantize':10} {fmt(ours)} {fmt(ref):>20} {ref[0] / ours[0]:6.1f}x "
              f"{ref[3] / ours[3]:8.1f}x {x.nbytes / ours[0] / 1e9:9.2f}")
        print(f"{name:8} {'  ... out=':10} {fmt(into)} {'(same)':>20} {ref[0] / into[0]:6.1f}x "
              f"{ref[3] / into[3]:8.1f}x {x.nbytes / into[0] / 1e9:9.2f}")
        ours = _median(lambda e=enc: e.quantize(x), args.repeat)
        try:
            assert np.array_equal(gq.quantize(x, qt), q), name
            ref = _median(lambda t=qt: gq.quantize(x, t), args.ref_repeat)
            ref_s, ratio = fmt(ref), f"{ref[0] / ours[0]:6.1f}x"
            cpu_ratio = f"{ref[3] / ours[3]:8.1f}x"
        except NotImplementedError:
            ref_s, ratio, cpu_ratio = "(no gguf-py quantizer)", "-", "-"
        print(f"{name:8} {'quantize':10} {fmt(ours)} {ref_s:>20} {ratio:>7} {cpu_ratio:>9} "
              f"{x.nbytes / ours[0] / 1e9:9.2f}")

if __name__ == "__main__":
    main()
