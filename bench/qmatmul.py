"""GEMV speed, by hand: ``python bench/qmatmul.py [--quick] [--threads N] [--cpu-time] [--gemma]``.

For q4_0, q5_0, q8_0, q4_k and q6_k (``--encodings`` takes any of GGML's types here, e.g.
q5_k,q4_1,q5_1,q3_k,q2_k,iq4_xs) at (N, K) = (262144, 640) (Gemma 3's tied output head)
and (4096, 14336), with M = 1 and 8 rows of x, each with float32 x and with int8-rounded
x (``--activations``, default both; ``md.compile(..., activations="q8")``): median time
of ``qmatmul`` (through the op's run), effective weight bandwidth (packed bytes of W / time) as a
share of the read bandwidth of the same memory (a numba parallel sum of the very copies
of W the row's calls read, read just before and just after the calls, so that both see
the same memory and the same moments of a shared machine: column ``bw``; with
``--warm``, a sum over 960 MiB of float32 as before session 25), what 8 rows cost
against one, and the ratio against
numpy's float32 matmul on weights decoded beforehand (4-7x the bytes), same run.

``--gemma`` times instead the decode GEMVs (M=1) of Gemma 3 270M Q4_K_M at exactly its
shapes: q5_0 (1024, 640), (256, 640), (2048, 640) x2 and q8_0 (256, 640) per layer over
18 layers, and the tied q8_0 output matrix (262144, 640) once, each layer with its own
weights (as in the model, so the 42.6 MB of q5_0 does not sit in cache), and prints the
per-token total.

By default each timed call reads a different copy of W, the copies together twice the
last-level cache (``--warm``: one copy, as before session 23), so every figure is a read
from memory: with one copy, a 33-178 MB matrix partly stays in a large L3 (480 MB on the
VMs measured) and the share can pass 100%. The yardstick reads the same copies: on the
VMs measured, memory reads at different speeds in different places (a plain sum of one
40 MB copy of W read 25-30 GB/s, of another allocated minutes later 35-37, and the GEMV
followed it, 27-30 against 31-35), so a sum of other memory (the 960 MiB of float32
summed at the start, printed first) measures something else. A row's calls start untimed
(one read of every copy, at least 30 ms) and are timed for at least 0.25 s (21 calls at
least).

The plain sum is the strongest read of memory measured here. Walks with software
prefetch, as the GEMV reads (1 or 4 runs a chunk, 1-32 KB ahead), read 36.3-37.2 GB/s
against the plain sum's 37.2-37.4, each of 12 arrays of 200 MiB read in turn. Read one
after another from the same array, they had seemed faster (43-48 GB/s), but that was
the second read finding the array in the 480 MB L3.

On a shared machine, 2-thread wall times swing with the scheduler; for a steadier
comparison run one thread on CPU time:
``OPENBLAS_NUM_THREADS=1 python bench/qmatmul.py --threads 1 --cpu-time``.
"""

from __future__ import annotations

import argparse
import functools
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

ENCODINGS = ["q4_0", "q5_0", "q8_0", "q4_k", "q6_k"]
# (N, K): Gemma 3's tied output head (K = 768 for the K-quants, whose rows are whole
# 256-value super-blocks), and a 7B-class FFN down projection; both larger than the
# last-level cache, so every call streams W from memory
SHAPES = [(262144, 640), (4096, 14336)]


CLOCK = time.perf_counter


def _llc_bytes():
    """The last-level cache's size in bytes (sysfs), or 256 MiB where it is not known."""
    best = 0
    base = "/sys/devices/system/cpu/cpu0/cache"
    for name in sorted(os.listdir(base)) if os.path.isdir(base) else ():
        try:
            with open(os.path.join(base, name, "size")) as f:
                text = f.read().strip()
        except OSError:
            continue
        scale = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(text[-1:].upper(), 1)
        digits = text.rstrip("KMGkmg")
        if digits.isdigit():
            best = max(best, int(digits) * scale)
    return best or (256 << 20)


def _rotating(copies):
    """A function that returns the next of ``copies`` on each call, in turn."""
    state = [0]

    def take():
        state[0] = (state[0] + 1) % len(copies)
        return copies[state[0]]
    return take


def _timeit(fn, reps, warm=True):
    """(median, min, max) seconds of ``reps`` calls (after one warm-up call if ``warm``)."""
    if warm:
        fn()
    ts = []
    for _ in range(reps):
        t = CLOCK()
        fn()
        ts.append(CLOCK() - t)
    return float(np.median(ts)), min(ts), max(ts)


def _timeit_modes(fn, modes, var, reps, warm=1):
    """``_timeit`` of ``fn`` under each value of the context variable ``var`` in
    ``modes``, the modes' calls taken in turn, after ``warm`` untimed rounds:
    [(median, min, max)] in ``modes`` order."""
    ts = {mode: [] for mode in modes}
    for i in range(reps + warm):
        for mode in modes:
            token = var.set(mode)
            try:
                t = CLOCK()
                fn()
                if i >= warm:
                    ts[mode].append(CLOCK() - t)
            finally:
                var.reset(token)
    return [(float(np.median(ts[m])), min(ts[m]), max(ts[m])) for m in modes]


def _bracketed(fn, probe, calls=3):
    """``fn()``'s result, and the read bandwidth of ``probe`` (``_bandwidth_probe``)
    around it: the median of ``calls`` reads just before and ``calls`` just after. (Read
    between the timed calls instead, a 960 MiB sum took 3-5% off the GEMV's speed.)"""
    read, nbytes = probe

    def times():
        out = []
        for _ in range(calls):
            t = CLOCK()
            read()
            out.append(CLOCK() - t)
        return out

    before = times()
    result = fn()
    return result, nbytes / float(np.median(before + times()))


@functools.cache
def _parallel_sum():
    """A numba parallel sum of a 1-D array (each thread one sequential stream: 64 chunks
    under prange, each summed over its own slice; indexing the array with the chunk's
    bounds instead measured ~6 GB/s, not vectorised), compiled on first use."""
    import numba

    from maxdecl.kernels.config import CACHE, FASTMATH

    @numba.njit(cache=CACHE, parallel=True, fastmath=FASTMATH)
    def _psum(a):
        chunks = 64
        size = a.shape[0] // chunks
        parts = np.zeros(chunks, a.dtype)
        for c in numba.prange(chunks):
            blk = a[c * size:(c + 1) * size]
            s = parts[c]
            for i in range(blk.shape[0]):
                s += blk[i]
            parts[c] = s
        return parts.sum()
    return _psum


def _bandwidth_probe(mib):
    """(sum, bytes): a function that reads ``mib`` MiB of float32 with ``_parallel_sum``,
    and the bytes it reads."""
    psum = _parallel_sum()
    a = np.ones((mib << 20) // 4, np.float32)
    return (lambda: psum(a)), a.nbytes


def _copies_probe(copies):
    """(sum, bytes): a function that reads every one of ``copies`` (the W copies of a
    table row, each a C-contiguous uint8 array) with ``_parallel_sum`` of its 64-bit
    words (random bytes read as float32 would hold NaNs and subnormals, whose adds are
    slow), in turn, and the bytes it reads: the read bandwidth of the very memory the
    row's GEMV calls read."""
    psum = _parallel_sum()
    words = [c.reshape(-1)[:c.size // 8 * 8].view(np.uint64) for c in copies]

    def read():
        for w in words:
            psum(w)
    return read, sum(w.nbytes for w in words)


def _read_bandwidth(mib, reps=7, probe=None):
    """(median, min, max) bytes/s of ``_bandwidth_probe(mib)`` (or of ``probe``)."""
    fn, nbytes = probe or _bandwidth_probe(mib)
    med, lo, hi = _timeit(fn, reps)
    return nbytes / med, nbytes / hi, nbytes / lo


def _packed(enc, n, k, rng):
    """Random packed blocks with finite, moderate fp16 scales (values do not affect speed)."""
    from maxdecl import codecs

    e = codecs.get(enc)
    nb = k // e.block_elements
    raw = rng.integers(0, 256, (n, nb, e.block_bytes), dtype=np.uint8)
    fp16 = (rng.random((n, nb, 2)) * 0.01 + 0.001).astype(np.float16).view(np.uint8)
    # byte offsets of each encoding's fp16 scales
    at = {"q4_0": (0,), "q8_0": (0,), "q5_0": (0,), "q4_k": (0, 2), "q5_k": (0, 2),
          "q4_1": (0, 2), "q5_1": (0, 2), "q6_k": (208,), "q2_k": (80, 82), "q3_k": (108,),
          "iq4_nl": (0,), "iq4_xs": (0,), "tq1_0": (52,), "tq2_0": (64,)}.get(enc, ())
    for i, o in enumerate(at):
        raw[..., o:o + 2] = fp16[..., 2 * i:2 * i + 2]
    return raw.reshape(n, nb * e.block_bytes)


def _packed_bytes(enc, n, k):
    """Bytes of an (n, k) matrix of ``enc`` blocks."""
    from maxdecl import codecs

    e = codecs.get(enc)
    return n * (k // e.block_elements) * e.block_bytes


# Gemma 3 270M Q4_K_M decode GEMVs: (encoding, N, K, calls per token = distinct matrices)
GEMMA = [("q5_0", 1024, 640, 18), ("q5_0", 256, 640, 18), ("q5_0", 2048, 640, 36),
         ("q8_0", 256, 640, 18), ("q8_0", 262144, 640, 1)]


def gemma(run, reps):
    """Median per-call time of each Gemma decode GEMV shape, cycling through its layers."""
    import maxdecl as md

    rng = np.random.default_rng(0)
    x = rng.standard_normal((1, 640)).astype(np.float32)
    head = (f"{'enc':5} {'N':>6} {'K':>4} {'calls':>5} {'us/call':>9} {'IQR us':>15} "
            f"{'W GB/s':>7} {'ms/token':>9}")
    print(head)
    print("-" * len(head))
    total = {}
    for enc, n, k, calls in GEMMA:
        qts = [md.QuantizedTensor(_packed(enc, n, k, rng), (n, k), enc) for _ in range(calls)]
        run([x, qts[0]], {})                                  # compile / warm
        passes = max(3, reps // calls)
        ts = []
        for _ in range(passes):
            for qt in qts:
                t = CLOCK()
                run([x, qt], {})
                ts.append(CLOCK() - t)
        med = float(np.median(ts))
        q1, q3 = np.percentile(ts, [25, 75])
        tok = med * calls
        total[enc] = total.get(enc, 0.0) + tok
        print(f"{enc:5} {n:6} {k:4} {calls:5} {med * 1e6:9.1f} {q1 * 1e6:7.1f}-{q3 * 1e6:7.1f} "
              f"{qts[0].data.nbytes / med / 1e9:7.1f} {tok * 1e3:9.2f}", flush=True)
        del qts
    print("per token: " + ", ".join(f"{e} {v * 1e3:.2f} ms" for e, v in total.items())
          + f", total {sum(total.values()) * 1e3:.2f} ms")


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="4096 x 14336 only, fewer repeats")
    ap.add_argument("--threads", type=int, default=None, help="numba threads (default: all)")
    ap.add_argument("--encodings", default=",".join(ENCODINGS))
    ap.add_argument("--gemma", action="store_true",
                    help="time the Gemma 3 270M decode GEMV shapes (q5_0, q8_0) instead")
    ap.add_argument("--reps", type=int, default=200,
                    help="--gemma: timed calls per shape (at least 3 passes over its layers)")
    ap.add_argument("--cpu-time", action="store_true",
                    help="time with process CPU time (meaningful with --threads 1)")
    ap.add_argument("--warm", action="store_true",
                    help="time one copy of W (which may stay in a large last-level cache)")
    ap.add_argument("--m1", action="store_true", help="one row of x only")
    ap.add_argument("--activations", choices=["f32", "q8", "both"], default="both",
                    help="x as float32 (exact), int8-rounded (md.compile(..., "
                    "activations='q8')), or both in turn")
    args = ap.parse_args(argv)
    global CLOCK
    CLOCK = time.process_time if args.cpu_time else time.perf_counter

    import numba
    from gguf import GGMLQuantizationType as GT
    from gguf import quants as gq

    import maxdecl as md
    from maxdecl.kernels.config import ACTIVATION_MODE
    from maxdecl.ops import _registry

    if args.threads:
        numba.set_num_threads(args.threads)
    run = _registry.get("qmatmul").runner()
    rng = np.random.default_rng(0)
    print(f"threads: {numba.get_num_threads()}  clock: {CLOCK.__name__}  load average: "
          f"{' '.join(f'{v:.1f}' for v in os.getloadavg())}")
    if args.gemma:
        gemma(run, args.reps)
        print(f"load average at the end: {' '.join(f'{v:.1f}' for v in os.getloadavg())}")
        return
    llc = _llc_bytes()
    stream = 0 if args.warm else 2 * llc          # bytes of W copies read in turn
    bw_mib = max(512, stream >> 20)
    probe = _bandwidth_probe(bw_mib)
    bw, bw_lo, bw_hi = _read_bandwidth(bw_mib, probe=probe)
    print(f"read bandwidth (numba prange sum, {bw_mib} MiB f32): {bw / 1e9:.1f} GB/s "
          f"(spread {bw_lo / 1e9:.1f}-{bw_hi / 1e9:.1f}); a row's %bw is against "
          + ("this sum" if args.warm else "such a sum of the very W copies its calls read")
          + ", read just before and after them (column bw)")
    print("W: one copy (--warm)" if args.warm else
          f"W: copies read in turn, {stream >> 20} MiB in all (twice the "
          f"{llc >> 20} MiB last-level cache)")
    print()
    modes = ["f32", "q8"] if args.activations == "both" else [args.activations]
    head = (f"{'enc':5} {'N':>6} {'K':>5} {'W MB':>6} {'M':>2} {'x':>3} {'ours ms':>8} "
            f"{'spread':>15} {'W GB/s':>7} {'bw':>5} {'%bw':>5} {'numpy ms':>9} {'x numpy':>7}")
    print(head)
    print("-" * len(head))
    shapes = SHAPES[1:] if args.quick else SHAPES
    results = []
    for enc in args.encodings.split(","):
        for n, k in shapes:
            if md.codecs.get(enc).block_elements == 256 and k % 256:
                k = (k + 255) // 256 * 256           # K-quants: 262144 x 768
            data = _packed(enc, n, k, rng)
            copies = [data] + [data.copy() for _ in range(-(-stream // data.nbytes) - 1)]
            qts = _rotating([md.QuantizedTensor(c, (n, k), enc) for c in copies])
            w_f32 = gq.dequantize(data, getattr(GT, enc.upper()))   # baseline operand
            row_probe = probe if args.warm else _copies_probe(copies)
            for m in (1,) if args.m1 else (1, 8):
                x = rng.standard_normal((m, k)).astype(np.float32)
                reps = 5 if args.quick else 21
                reps = max(reps, len(copies) + 1)
                # the modes' calls alternate, so that both see the machine's same moments;
                # untimed first, one read of every copy and at least 30 ms: the first
                # calls after the yardstick's sums ran slower (4096 x 14336 q6_k, medians
                # of 10 calls: 1.45, 1.43, then 1.36-1.39 ms; 31 calls timed from the
                # first: 1.51 ms, against 1.39 ms for 151)
                warm = max(-(-len(copies) // len(modes)), 1)

                def calls(x=x, qts=qts, reps=reps, warm=warm):
                    t0 = CLOCK()
                    run([x, qts()], {})
                    one = max(CLOCK() - t0, 1e-4)
                    # and at least 0.25 s of timed calls a mode, so that a median is not
                    # of one short phase of a shared machine (the yardstick's 6 sums take
                    # 0.15 s)
                    return _timeit_modes(lambda: run([x, qts()], {}), modes, ACTIVATION_MODE,
                                         max(reps, int(0.25 / one)), warm + int(0.03 / one))
                timed, bw_now = _bracketed(calls, row_probe)
                tb, _, _ = _timeit(lambda: x @ w_f32.T, 3)
                for mode, (t, lo, hi) in zip(modes, timed):
                    wbw = data.nbytes / t
                    pct = f"{100 * wbw / bw_now:4.0f}%" if m == 1 else "    -"
                    print(f"{enc:5} {n:6} {k:5} {data.nbytes / 1e6:6.1f} {m:2} {mode:>3} "
                          f"{t * 1e3:8.2f} {lo * 1e3:7.2f}-{hi * 1e3:7.2f} {wbw / 1e9:7.1f} "
                          f"{bw_now / 1e9:5.1f} {pct} {tb * 1e3:9.2f} {tb / t:7.2f}", flush=True)
                    results.append((enc, n, k, m, mode, t, wbw / bw_now))
            w_f32 = qts = copies = None          # free before the next encoding
    for mode in modes:
        one = {(e, n, k): (t, r) for e, n, k, m, md_, t, r in results if m == 1 and md_ == mode}
        print(f"\n{mode} x: GEMV weight bandwidth / read bandwidth (target >= 85%): "
              + ", ".join(f"{e} {n}x{k} {100 * r:.0f}%" for (e, n, k), (t, r) in one.items()))
        if not args.warm:
            sizes = {(e, n, k): _packed_bytes(e, n, k) for (e, n, k) in one}
            print(f"{mode} x: GEMV weight bandwidth / the first line's read bandwidth "
                  f"({bw / 1e9:.1f} GB/s, other memory): " + ", ".join(
                      f"{e} {n}x{k} {100 * sizes[(e, n, k)] / t / bw:.0f}%"
                      for (e, n, k), (t, r) in one.items()))
        if args.m1:
            continue
        print(f"{mode} x: 8 rows cost (x one row's time): "
              + ", ".join(f"{e} {n}x{k} {t8 / one[(e, n, k)][0]:.2f}"
                          for e, n, k, m, md_, t8, _ in results if m == 8 and md_ == mode))
    if len(modes) == 2:
        t_of = {(e, n, k, m, md_): t for e, n, k, m, md_, t, _ in results}
        print("q8 x speed-up over f32 x: " + ", ".join(
            f"{e} {n}x{k} M={m} {t_of[(e, n, k, m, 'f32')] / t:.2f}x"
            for (e, n, k, m, md_), t in t_of.items() if md_ == "q8"))
    print(f"load average at the end: {' '.join(f'{v:.1f}' for v in os.getloadavg())}")


if __name__ == "__main__":
    main()
