"""Where a generation step's time goes, op by op (run by hand; not a speed test).

Gemma 3 270M Q4_K_M, 2 threads: runs a prefill of the bench prompt (128 tokens) and
``--tokens`` decode steps with every op's ``run`` wrapped in a timer, then prints per
op (qmatmul per encoding and weight shape) the calls per step, milliseconds per step
and microseconds per call, for the prefill and for the mean decode step (fused calls
of ``md.compile`` as ``linear_group``; ``MAXDECL_FUSE=0`` for the unfused plan). With
``--batch N`` it then profiles the batched step of ``bench/generate.py``'s N-prompt figure
(the steps where all N decode together). The timer adds about a microsecond per call.

    python bench/profile_ops.py [--tokens 32] [--threads 2] [--batch 8]
"""

from __future__ import annotations

import argparse
import collections
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))


class _Timed:
    """Wraps an op's run: adds its wall time to ``totals[key]``."""

    def __init__(self, name, run, totals, calls):
        self.name, self.run, self.totals, self.calls = name, run, totals, calls

    def __call__(self, args, attrs):
        key = self.name
        weight = args[1] if len(args) > 1 else None
        if key in ("qmatmul", "linear") and hasattr(weight, "encoding"):
            key = f"{key} {weight.encoding} {list(weight.shape)}"
        elif key == "linear_group" and hasattr(weight, "encoding"):   # fused siblings
            ns = "+".join(str(w.shape[0]) for w in args[1:attrs["n"] + 1])
            key = f"{key} {weight.encoding} [{ns}, {weight.shape[1]}]"
        t = time.perf_counter()
        out = self.run(args, attrs)
        self.totals[key] += time.perf_counter() - t
        self.calls[key] += 1
        return out


class _TimedBatch(_Timed):
    """Wraps an op's batch runner (``fn(args, rows, attrs)``)."""

    def __call__(self, args, rows, attrs):
        t = time.perf_counter()
        out = self.run(args, rows, attrs)
        self.totals[self.name] += time.perf_counter() - t
        self.calls[self.name] += 1
        return out


def _report(title, totals, calls, steps, wall):
    print(f"\n{title}: {wall / steps * 1e3:.2f} ms per step, "
          f"ops {sum(totals.values()) / steps * 1e3:.2f} ms, "
          f"{sum(calls.values()) / steps:.1f} calls")
    print(f"  {'op':36} {'calls':>7} {'ms':>8} {'us/call':>9}")
    for key in sorted(totals, key=lambda k: -totals[k]):
        print(f"  {key:36} {calls[key] / steps:7.1f} {totals[key] / steps * 1e3:8.3f} "
              f"{totals[key] / calls[key] * 1e6:9.1f}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", type=int, default=32)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--batch", type=int, default=0, help="also profile N prompts decoding "
                    "together (0: skip)")
    a = ap.parse_args()
    import numba

    numba.set_num_threads(a.threads)
    from generate import N_PROMPT, PROMPT, _gguf_path
    from maxdecl import fusion
    from maxdecl.ops import _registry
    import maxdecl as md
    from maxdecl.pipelines.generate import generate_ids
    from maxdecl.pipelines.sampling import Sampler

    spec = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "specs", "gemma3.yaml")
    totals, calls = collections.defaultdict(float), collections.Counter()
    # md.compile takes each op's runtime from the registry's runner cache: time them all
    for name, op in _registry.REGISTRY.items():
        _registry._RUNNERS[name] = _Timed(name, op.runner(), totals, calls)
        batched = op.batch_runner()                      # a batched step's one call
        if batched is not None:
            _registry._BATCH_RUNNERS[name] = _TimedBatch(f"{name} (batched)", batched,
                                                         totals, calls)
    for kind in ("linear_group", "norm_chain", "act_mul"):  # md.compile's fused calls
        fusion._RUNNERS[kind] = _Timed(kind, fusion.runner(kind), totals, calls)
    model = md.load_model(spec, _gguf_path())
    session, tok = model.session, model.tokenizer
    ids = tok.encode(PROMPT, add_bos=True)[:N_PROMPT]
    generate_ids(session, tok, ids, 4, Sampler(), stop_ids=())          # warm up
    totals.clear()
    calls.clear()
    try:
        t = time.perf_counter()
        generate_ids(session, tok, ids, 1, Sampler(), stop_ids=())     # the prefill alone
        wall_pre = time.perf_counter() - t
        pre_t, pre_c = dict(totals), dict(calls)
        _report(f"prefill of {len(ids)} tokens", totals, calls, 1, wall_pre)
        totals.clear()
        calls.clear()
        res = generate_ids(session, tok, ids, a.tokens + 1, Sampler(), stop_ids=())
        # this run's prefill is counted too: take the prefill-alone figures out
        for k in list(totals):
            totals[k] = max(totals[k] - pre_t.get(k, 0.0), 0.0)
            calls[k] -= pre_c.get(k, 0)
            if calls[k] <= 0:
                del totals[k], calls[k]
        _report(f"decode, mean of {a.tokens} steps", totals, calls, a.tokens,
                res.decode_seconds)
        if a.batch > 1:
            _profile_batch(model, ids, a.batch, a.tokens, totals, calls)
    finally:
        _registry._RUNNERS.clear()
        _registry._BATCH_RUNNERS.clear()
        fusion._RUNNERS.clear()
    print(f"\ndecode {res.decode_tps:.1f} tokens/s with the timers in place")


def _profile_batch(model, ids, n, tokens, totals, calls) -> None:
    """``n`` prefixes of the bench prompt decoding ``tokens`` tokens together: the op
    times of the steps where all ``n`` decode and none joins."""
    import numpy as np

    from maxdecl.pipelines.batching import BatchRunner, Request

    runner = BatchRunner(model.compiled, max_batch=n)
    for k in range(n):
        runner.add(Request(ids[:len(ids) - 8 * k], lambda row: int(np.argmax(row)), tokens))
    steps, wall = 0, 0.0
    step_t, step_c = collections.defaultdict(float), collections.Counter()
    while runner.busy:
        full = runner.decoding == n and not runner.waiting
        totals.clear()
        calls.clear()
        t = time.perf_counter()
        runner.step()
        if full:
            wall += time.perf_counter() - t
            steps += 1
            for k, v in totals.items():
                step_t[k] += v
                step_c[k] += calls[k]
    if steps:
        _report(f"{n} prompts decoding together, mean of {steps} steps ({n} tokens a step)",
                step_t, step_c, steps, wall)


if __name__ == "__main__":
    main()
