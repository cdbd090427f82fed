"""Mixture-of-experts decode against a dense model of the same active size, same run.

Run by hand:  python bench/moe.py [--dim 512] [--layers 4] [--experts 8] [--used 2]
              [--ffn 512] [--tokens 32] [--repeat 3]

The MoE model is specs/mixtral.yaml with ``--experts`` experts of width ``--ffn``,
``--used`` per token; the dense one is specs/llama3.yaml with one MLP of width
``used * ffn``: both do the same multiply-adds per token. Both get seeded random
weights in their specs' encodings (q4_k, q6_k down projections). Prints, per model,
the weight bytes a decode step reads (every matrix but the embedding table, whose one
row is counted; for the experts only the ``used`` chosen of each layer: the kernel
reads no other expert's blocks), the median decode tokens/s, and the MoE / dense
ratios. The MoE model holds ``experts / used`` times the MLP bytes of the dense one.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))   # run from a checkout


def _model(spec_name, params):
    import maxdecl as md
    from maxdecl.pipelines.model_loading import random_weights

    spec = md.load_spec(str(ROOT / "specs" / f"{spec_name}.yaml"), "tiny")
    prog = spec.program("tiny", params)
    td = random_weights(prog)
    graph = md.build(spec, weights=td, variant="tiny", params=params)
    return graph, td, prog


def _bytes_per_token(td, prog, params) -> tuple[int, int]:
    """(bytes one decode step reads, bytes held), from the weights' sizes."""
    read = held = 0
    for name, value in td.items():
        n = int(value.nbytes)
        held += n
        if name == "token_embd.weight":
            n //= value.shape[0]                      # one row
        elif name.endswith("_exps.weight"):
            n = n * params["n_expert_used"] // params["n_expert"]   # the chosen experts only
        read += n
    return read, held


def _decode_tps(graph, td, n_prompt, n_tokens, repeat) -> float:
    """Median over ``repeat`` runs of the decode tokens/s after an ``n_prompt`` prefill."""
    import maxdecl as md

    run = md.compile(graph, td)
    names = [v.name for v in graph.inputs]
    outs = list(graph.output_names)
    states = [n for n in names if n in outs]
    rng = np.random.default_rng(0)

    def step(tokens, start, state):
        feed = {"tokens": np.asarray(tokens, np.int64),
                "positions": np.arange(start, start + len(tokens), dtype=np.int64),
                "logit_rows": np.array([len(tokens) - 1], np.int64), **state}
        res = dict(zip(outs, run(*(feed[n] for n in names))))
        return {n: res[n] for n in states}

    rates = []
    for _ in range(repeat):
        ids = rng.integers(0, 256, n_prompt + n_tokens)
        state = step(ids[:n_prompt], 0, {v.name: np.zeros(
            tuple(0 if isinstance(d, str) else d for d in v.shape), np.float32)
            for v in graph.inputs if v.name in states})
        times = []
        for pos in range(n_prompt, n_prompt + n_tokens):
            t = time.perf_counter()
            state = step(ids[pos:pos + 1], pos, state)
            times.append(time.perf_counter() - t)
        rates.append(len(times) / sum(times))
    return statistics.median(rates)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dim", type=int, default=512)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--experts", type=int, default=8)
    ap.add_argument("--used", type=int, default=2)
    ap.add_argument("--ffn", type=int, default=512, help="width of one expert (multiple of 256)")
    ap.add_argument("--prompt", type=int, default=8)
    ap.add_argument("--tokens", type=int, default=32)
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()

    common = dict(dim=args.dim, n_layers=args.layers, n_heads=8, n_kv_heads=4, vocab=512,
                  context=args.prompt + args.tokens + 8)
    moe_params = dict(common, ffn_dim=args.ffn, n_expert=args.experts, n_expert_used=args.used)
    dense_params = dict(common, ffn_dim=args.used * args.ffn)
    rows = []
    for label, spec, params in (("moe", "mixtral", moe_params), ("dense", "llama3", dense_params)):
        graph, td, prog = _model(spec, params)
        read, held = _bytes_per_token(td, prog, {**params, "n_expert": params.get("n_expert", 1),
                                                 "n_expert_used": params.get("n_expert_used", 1)})
        _decode_tps(graph, td, args.prompt, 2, 1)          # compile the kernels first
        tps = _decode_tps(graph, td, args.prompt, args.tokens, args.repeat)
        rows.append((label, read, held, tps))
        print(f"{label:>5}: {read / 2**20:7.2f} MiB read per token of {held / 2**20:7.2f} MiB "
              f"held, {tps:7.1f} tokens/s (median of {args.repeat})")
    (_, r_moe, h_moe, t_moe), (_, r_dense, h_dense, t_dense) = rows
    print(f"moe / dense: bytes read per token {r_moe / r_dense:.2f}x, bytes held "
          f"{h_moe / h_dense:.2f}x, tokens/s {t_moe / t_dense:.2f}x")


if __name__ == "__main__":
    main()
