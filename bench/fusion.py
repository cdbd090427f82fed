"""md.compile's fusion, fused against unfused, by hand: ``python bench/fusion.py [--steps 128]
[--threads 2]``.

Gemma 3 270M Q4_K_M: one graph compiled twice (``fuse=True`` / ``fuse=False``), a prefill
of the bench prompt (128 tokens) each, then ``--steps`` greedy decode steps with the two
plans alternating step by step (each its own KV cache, the same tokens), so drift in
the machine's speed falls on both. Prints calls per step, the median and minimum
milliseconds per decode step of each, and whether the prefill's and every step's
logits are bit-identical (they must be).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=128)
    ap.add_argument("--threads", type=int, default=2)
    a = ap.parse_args()
    import numba

    numba.set_num_threads(a.threads)
    import numpy as np

    from generate import N_PROMPT, PROMPT, _gguf_path
    import maxdecl as md
    from maxdecl.pipelines.batching import BatchRunner

    spec = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "specs", "gemma3.yaml")
    model = md.load_model(spec, _gguf_path())
    runs = {f: md.compile(model.graph, model.weights, fuse=f) for f in (True, False)}
    names, outs = runs[True].input_names, runs[True].output_names
    zero = BatchRunner(runs[True]).zero_state()
    ids = model.tokenizer.encode(PROMPT, add_bos=True)[:N_PROMPT]
    state, logits = {}, {}

    def step(f, feed):
        o = runs[f](*(feed[n] for n in names))
        state[f] = {k: o[outs.index(k)] for k in zero}
        logits[f] = o[outs.index("logits")]

    for f in runs:
        step(f, {"tokens": np.array(ids), "positions": np.arange(len(ids)),
                 "logit_rows": np.array([len(ids) - 1]), **zero})
    same = logits[True].tobytes() == logits[False].tobytes()
    times = {True: [], False: []}
    tok, pos = int(np.argmax(logits[True][-1])), len(ids)
    for s in range(a.steps):
        for f in ((True, False) if s % 2 else (False, True)):
            t = time.perf_counter()
            step(f, {"tokens": np.array([tok]), "positions": np.array([pos]),
                     "logit_rows": np.array([0]), **state[f]})
            times[f].append((time.perf_counter() - t) * 1e3)
        same &= logits[True].tobytes() == logits[False].tobytes()
        tok, pos = int(np.argmax(logits[True][-1])), pos + 1
    for f in (True, False):
        calls = sum(s.kind != "reshape" for s in runs[f].steps)
        med = statistics.median(times[f])
        print(f"fuse={f!s:5} {calls} calls/step: median {med:.2f} ms/step "
              f"({1e3 / med:.1f} steps/s), min {min(times[f]):.2f} ms "
              f"({a.steps} steps, {a.threads} threads)")
    print(f"logits bit-identical (prefill and every step): {same}")


if __name__ == "__main__":
    main()
