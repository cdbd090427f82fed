"""Generation speed: maxdecl vs llama.cpp (llama-cpp-python) on the same GGUF, same run.

Gemma 3 270M Q4_K_M, 2 threads, a 128-token prompt, 64 greedy tokens. Each engine
runs in its own process (so peak RSS is its own); prints prefill and decode
tokens/s, their ratios, peak RSS (and by phase: after imports, model load, the first
token, the generation), maxdecl's start-up time to the first token with a warm and a
cold numba cache, and the whole ``maxdecl run ... --max-new-tokens 1`` process (wall
time, peak RSS). Run by hand on an idle machine:

    python bench/generate.py [--runs 3] [--threads 2] [--activations q8] [--gemv]

``--gemv`` adds the last target's figure from the same run: each encoding's GEMV
weight bandwidth as a share of the read bandwidth of the same memory (a plain sum of the
same copies of W), and of the sum over 960 MiB at the start, one row of x, at Gemma's
head shape and at 4096 x 14336, W streamed from memory (``bench/qmatmul.py --m1`` in a
child process, in the chosen activations mode).

``--activations q8`` runs maxdecl with int8-rounded x in its decode matmuls (as
llama.cpp does; ``md.compile(..., activations="q8")``), through ``MAXDECL_ACTIVATIONS``.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import signal
import statistics
import subprocess
import sys
import tempfile
import time

# llama-cpp-python compiled for the build machine (-march=native) on a CPU with AMX
# (Intel Sapphire Rapids and later) has crashed with SIGSEGV at ldtilecfg in
# ggml_backend_amx_mul_mat on a VM; the same build without the AMX path runs.
AMX_HINT = ("\nOn a CPU with AMX, rebuild llama-cpp-python without its AMX path:\n"
            "  CMAKE_ARGS='-DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON "
            "-DGGML_F16C=ON -DGGML_AVX512=ON -DGGML_AVX512_VBMI=ON -DGGML_AVX512_VNNI=ON "
            "-DGGML_AVX512_BF16=ON -DGGML_AVX_VNNI=ON' pip install --force-reinstall "
            "--no-deps --no-cache-dir llama-cpp-python")

PROMPT = ("Once upon a time, in a small village at the edge of a great forest, there lived an "
          "old clockmaker named Elias. Every morning he opened the shutters of his shop, wound "
          "the hundred clocks that hung on its walls, and listened to them tick together like a "
          "choir. Children came to watch him work, and he told them stories about the stars, "
          "the rivers, the mountains far away, and the strange travellers who sometimes passed "
          "through the village on their way to the sea. One winter evening, when the snow lay "
          "deep on the roofs and the lamps glowed in every window, a stranger knocked at his door "
          "carrying a broken silver watch that had not ticked for a hundred years, and asked")
N_PROMPT, N_GEN = 128, 64
N_BATCH = 8               # prompts decoding together in the batched figure
PHASES = (("imports", "imports"), ("load", "model load"), ("first", "first token"),
          ("generate", "generate"))


def _peak_mb() -> float:
    """This process's peak resident memory so far (VmHWM), MB."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def _gguf_path():
    """The demo GGUF, found the way ``maxdecl run specs/gemma3.yaml`` finds it."""
    from maxdecl.weights.sources import KNOWN_SOURCES

    return KNOWN_SOURCES["gemma3"]()


def worker_maxdecl(threads: int) -> dict:
    t_start = time.perf_counter()
    import numba

    numba.set_num_threads(threads)
    import maxdecl as md
    from maxdecl.pipelines.generate import generate_ids
    from maxdecl.pipelines.sampling import Sampler

    peak = {"imports": _peak_mb()}
    model = md.load_model(os.path.join(os.path.dirname(__file__), "..", "specs", "gemma3.yaml"),
                          _gguf_path())
    peak["load"] = _peak_mb()
    session, tok = model.session, model.tokenizer
    ids = tok.encode(PROMPT, add_bos=True)[:N_PROMPT]
    first = generate_ids(session, tok, ids[:8], 1, Sampler())
    t_first = time.perf_counter() - t_start  # start-up to the first generated token
    peak["first"] = _peak_mb()
    res = generate_ids(session, tok, ids, N_GEN, Sampler(), stop_ids=())
    peak["generate"] = rss = _peak_mb()
    return {"prefill_tps": res.prefill_tps, "decode_tps": res.decode_tps,
            "first_token_s": t_first, "ids": res.ids, "first": first.ids, "rss_mb": rss,
            **{f"rss_{k}": v for k, v in peak.items()},
            **_batched(model, ids), **_lookup(model, tok, ids)}


def _batched(model, ids) -> dict:
    """N_BATCH prompts (prefixes of the bench prompt) decoding N_GEN tokens together, one
    joining per step (its prefill) as the runner admits them: tokens/s over the steps where
    all N_BATCH decode and none is admitted, and over every decode step of the job (the
    ramp in and out included); the ids equal each prompt's solo."""
    import numpy as np

    from maxdecl.pipelines.batching import BatchRunner, Request

    runner = BatchRunner(model.compiled, max_batch=N_BATCH)
    reqs = [Request(ids[:N_PROMPT - 8 * k], lambda row: int(np.argmax(row)), N_GEN)
            for k in range(N_BATCH)]
    for r in reqs:
        runner.add(r)
    full_tokens, full_s = 0, 0.0
    while runner.busy:
        full = runner.decoding == N_BATCH and not runner.waiting
        before = sum(len(r.ids) for r in reqs)
        t = time.perf_counter()
        runner.step()
        if full:
            full_s += time.perf_counter() - t
            full_tokens += sum(len(r.ids) for r in reqs) - before
    steps = sum(r.decode_s for r in reqs)
    return {"batch_decode_tps": full_tokens / full_s,
            "batch_job_tps": sum(len(r.ids) - 1 for r in reqs) / steps}


def _lookup(model, tok, ids) -> dict:
    """Prompt lookup (``lookup=8``) against plain greedy decoding, same run: the bench
    prompt and a repetitive one (a numbered list)."""
    listing = tok.encode("".join(f"{i}. item number {i}\n" for i in range(1, 30)),
                         add_bos=True)[:N_PROMPT]
    out = {}
    for name, prompt in (("story", ids), ("list", listing)):
        plain = model.generate(prompt, N_GEN)
        fast = model.generate(prompt, N_GEN, lookup=8)
        assert fast.ids == plain.ids, "lookup must give the plain greedy ids"
        out[f"lookup_{name}_speedup"] = (len(fast.ids) / fast.decode_s) / \
            (len(plain.ids) / plain.decode_s)
        out[f"lookup_{name}_accept"] = fast.accepted / max(fast.drafted, 1)
    return out


def worker_llama(threads: int) -> dict:
    import numpy as np
    from llama_cpp import Llama

    peak = {"imports": _peak_mb()}
    llm = Llama(model_path=str(_gguf_path()), n_threads=threads, n_threads_batch=threads,
                n_ctx=512, n_batch=512, verbose=False)
    peak["load"] = _peak_mb()
    ids = llm.tokenize(PROMPT.encode(), add_bos=True)[:N_PROMPT]
    n_vocab = llm.n_vocab()
    llm.reset()
    t0 = time.perf_counter()
    llm.eval(ids)
    t1 = time.perf_counter()
    out = []
    for k in range(N_GEN):
        # logits of the last evaluated token (only that row is computed)
        last = np.ctypeslib.as_array(llm._ctx.get_logits(), shape=(n_vocab,))
        tok = int(last.argmax())
        out.append(tok)
        if k == 0:
            peak["first"] = _peak_mb()      # the first token comes from the prefill
        llm.eval([tok])
    t2 = time.perf_counter()
    peak["generate"] = _peak_mb()
    return {"prefill_tps": len(ids) / (t1 - t0), "decode_tps": N_GEN / (t2 - t1), "ids": out,
            "rss_mb": peak["generate"], **{f"rss_{k}": v for k, v in peak.items()}}


def _spawn(engine: str, threads: int, env=None) -> dict:
    cmd = [sys.executable, __file__, "--worker", engine, "--threads", str(threads)]
    out = subprocess.run(cmd, capture_output=True, text=True, env=env, check=False)
    if out.returncode:
        why = out.stderr[-3000:]
        if out.returncode < 0:
            why += f"\n(killed by {signal.Signals(-out.returncode).name})"
        if engine == "llama" and out.returncode == -signal.SIGSEGV:
            why += AMX_HINT
        raise SystemExit(f"{engine} worker failed:\n{why}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def _cli_first_token(threads: int, runs: int) -> tuple[list[float], list[float]]:
    """Wall seconds and peak RSS (MB) of the README's command generating one token,
    whole process."""
    spec = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "specs", "gemma3.yaml")
    cmd = [sys.executable, "-m", "maxdecl", "run", spec, "--prompt", "Once upon a time",
           "--max-new-tokens", "1"]
    env = dict(os.environ, NUMBA_NUM_THREADS=str(threads))
    # a warm start has the bytecode cache too: Python writes it on first import (pip at
    # install), unless PYTHONDONTWRITEBYTECODE is set, as on some CI machines
    import compileall

    import maxdecl
    compileall.compile_dir(os.path.dirname(maxdecl.__file__), quiet=1)
    subprocess.run(cmd, capture_output=True, env=env, check=True)      # fill the cache
    times, peaks = [], []
    for _ in range(runs):
        with tempfile.TemporaryFile() as err:
            t = time.perf_counter()
            proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=err, env=env)
            _, status, usage = os.wait4(proc.pid, 0)     # this child's own peak RSS
            times.append(time.perf_counter() - t)
            proc.returncode = os.waitstatus_to_exitcode(status)
            if proc.returncode:
                err.seek(0)
                raise SystemExit("maxdecl run failed:\n"
                                 + err.read().decode(errors="replace")[-3000:])
        peaks.append(usage.ru_maxrss / 1024)
    return times, peaks


def _paired(label: str, ours: list, theirs: list) -> None:
    """Run i of each engine ran back to back: the median of their per-run ratios is steadier
    than the ratio of medians when the machine's speed drifts between runs."""
    ratios = [a / b for a, b in zip(ours, theirs)]
    print(f"    {label}, run by run: llama.cpp {[round(b, 1) for b in theirs]}, ratios "
          f"{[round(r, 2) for r in ratios]}, median {statistics.median(ratios):.2f}x")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--worker", choices=["maxdecl", "llama"])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--activations", choices=["f32", "q8"],
                    help="maxdecl's GEMV activations (default: MAXDECL_ACTIVATIONS, else f32)")
    ap.add_argument("--gemv", action="store_true",
                    help="also print each encoding's GEMV share of the read bandwidth")
    a = ap.parse_args()
    if a.activations:
        os.environ["MAXDECL_ACTIVATIONS"] = a.activations      # every worker inherits it
    if a.worker:
        fn = worker_maxdecl if a.worker == "maxdecl" else worker_llama
        print(json.dumps(fn(a.threads)))
        return
    cli, cli_rss = _cli_first_token(a.threads, max(3, a.runs))
    cold_env = dict(os.environ, NUMBA_CACHE_DIR=tempfile.mkdtemp(prefix="numba-cold-"))
    cold = _spawn("maxdecl", a.threads, cold_env)
    runs = {"maxdecl": [], "llama.cpp": []}
    for _ in range(a.runs):
        runs["maxdecl"].append(_spawn("maxdecl", a.threads))
        try:
            runs["llama.cpp"].append(_spawn("llama", a.threads))
        except SystemExit as e:
            print(f"llama.cpp unavailable: {str(e)[-1500:]}")
            runs["llama.cpp"] = []
            break

    def med(engine, key):
        vals = [r[key] for r in runs[engine]]
        return statistics.median(vals) if vals else float("nan")

    print(f"Gemma 3 270M Q4_K_M, {a.threads} threads, prompt {N_PROMPT}, gen {N_GEN}, "
          f"{a.runs} runs (medians; spread in brackets); maxdecl activations "
          f"{os.environ.get('MAXDECL_ACTIVATIONS') or 'f32'}")
    for key, label in (("prefill_tps", "prefill tokens/s"), ("decode_tps", "decode tokens/s"),
                       ("rss_mb", "peak RSS MB")):
        m, l = med("maxdecl", key), med("llama.cpp", key)
        spread = [round(r[key], 1) for r in runs["maxdecl"]]
        print(f"  {label:<17} maxdecl {m:8.1f} {spread}  llama.cpp {l:8.1f}  ratio {m / l:5.2f}x")
        if key != "rss_mb" and len(runs["llama.cpp"]) > 1:
            _paired(label, [r[key] for r in runs["maxdecl"]], [r[key] for r in runs["llama.cpp"]])
    print("  peak RSS MB after   " + "".join(f"{label:>13}" for _, label in PHASES))
    for engine in runs:
        print(f"    {engine:<16}" + "".join(f"{med(engine, f'rss_{k}'):13.1f}" for k, _ in PHASES))
    m, l = med("maxdecl", "rss_mb"), med("llama.cpp", "rss_mb")
    print(f"  peak RSS: maxdecl {m:.1f} MB = {m / l:.2f}x llama.cpp's {l:.1f} MB (target <= 1.10x)")
    b, l1 = med("maxdecl", "batch_decode_tps"), med("llama.cpp", "decode_tps")
    print(f"  {N_BATCH} prompts decoding together (steps where all {N_BATCH} decode): {b:.1f} "
          f"tokens/s in all ({b / med('maxdecl', 'decode_tps'):.2f}x maxdecl's one stream, "
          f"{b / l1:.2f}x llama.cpp's one stream)")
    if len(runs["llama.cpp"]) > 1:
        _paired(f"{N_BATCH} prompts together / llama.cpp one stream",
                [r["batch_decode_tps"] for r in runs["maxdecl"]],
                [r["decode_tps"] for r in runs["llama.cpp"]])
    j = med("maxdecl", "batch_job_tps")
    print(f"    the whole job, joining one a step and finishing one a step: {j:.1f} tokens/s "
          f"in all ({j / l1:.2f}x llama.cpp's one stream)")
    for name in ("story", "list"):
        print(f"  prompt lookup (8 drafts) on the {name} prompt: decode "
              f"{med('maxdecl', f'lookup_{name}_speedup'):.2f}x plain greedy, "
              f"{100 * med('maxdecl', f'lookup_{name}_accept'):.0f}% of drafts accepted "
              "(same ids)")
    print(f"  start-up to first token: warm cache {med('maxdecl', 'first_token_s'):.2f} s, "
          f"cold cache {cold['first_token_s']:.2f} s")
    print(f"  `maxdecl run specs/gemma3.yaml --max-new-tokens 1` wall time, process start to "
          f"exit (warm cache): median {statistics.median(cli):.2f} s {[round(t, 2) for t in cli]} "
          f"(target <= 0.80 s); peak RSS {statistics.median(cli_rss):.1f} MB")
    if runs["llama.cpp"]:
        a_ids, b_ids = runs["maxdecl"][0]["ids"], runs["llama.cpp"][0]["ids"]
        same = next((i for i, (x, y) in enumerate(zip(a_ids, b_ids)) if x != y), len(a_ids))
        print(f"  greedy ids agree for the first {same} of {len(a_ids)} tokens")
    if a.gemv:
        _gemv_shares(a.threads)


def _gemv_shares(threads):
    """Print ``bench/qmatmul.py --m1``'s yardstick and share lines for this run's mode."""
    mode = os.environ.get("MAXDECL_ACTIVATIONS") or "f32"
    script = os.path.join(os.path.dirname(os.path.abspath(__file__)), "qmatmul.py")
    out = subprocess.run([sys.executable, script, "--m1", "--threads", str(threads),
                          "--activations", mode], capture_output=True, text=True, check=True)
    for line in out.stdout.splitlines():
        if line.startswith(("read bandwidth", "W: ", f"{mode} x: GEMV")):
            print("  " + line)


if __name__ == "__main__":
    main()
