"""``maxdecl batch``: run a JSONL file of prompts through a model, locally or on Ray.

Input, one JSON object a line: ``{"id": ..., "prompt": ...}`` plus optional fields
named as in OpenAI's completions API (``max_tokens``, ``temperature``, ``top_p``,
``top_k``, ``min_p``, ``seed``, ``stop``). Output, one a line: ``{"id", "text", "ids",
"finish_reason"}``, or ``{"id", "error"}`` for a row that failed (the job goes on).
Each result line is written and flushed as its row finishes, and a rerun skips the
ids already in the output, so a killed job resumes where it stopped.

Locally the rows run through one process's continuous batching (``--parallel``
sequences decode together). With ``--ray [ADDRESS]`` the same rows run on Ray Data:
the lines are read into a dataset, ``map_batches`` sends them to an actor class that
loads the model once per worker, and the results come back in input order.
"""

from __future__ import annotations

import json
import os
import sys

from ..errors import MaxdeclError

FIELDS = ("max_tokens", "temperature", "top_p", "top_k", "min_p", "seed", "stop")
DEFAULTS = {"max_tokens": 16, "temperature": 0.0}    # greedy unless a row asks otherwise


def read_rows(path: str) -> list[dict]:
    """The input rows; a line that is not a JSON object becomes a row that fails."""
    rows = []
    with open(path, encoding="utf-8", errors="replace") as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except (ValueError, RecursionError) as e:
                rows.append({"id": f"line {n}", "_error": f"not JSON: {str(e)[:80]}"})
                continue
            if not isinstance(row, dict) or "id" not in row:
                rows.append({"id": row.get("id", f"line {n}") if isinstance(row, dict)
                             else f"line {n}", "_error": "expected an object with an 'id'"})
                continue
            rows.append(row)
    return rows


def done_ids(path: str) -> set:
    """Ids already in an output file (lines that do not parse are ignored)."""
    out = set()
    if not os.path.exists(path):
        return out
    with open(path, encoding="utf-8", errors="replace") as f:
        for line in f:
            try:
                row = json.loads(line)
            except ValueError:
                continue
            if isinstance(row, dict) and "id" in row:
                out.add(_key(row["id"]))
    return out


def _key(i) -> str:
    return json.dumps(i, sort_keys=True)


def run_rows(server, rows: list[dict], on_result=None) -> list[dict]:
    """Results of ``rows`` through ``server``'s engine, in input order; ``on_result(r)``
    sees each one as soon as it and the rows before it are done."""
    from ..serve.app import BadRequest, sampling_from

    handles = []
    for row in rows:
        if "_error" in row:
            handles.append(("error", row["_error"]))
            continue
        body = {**DEFAULTS, **{k: row[k] for k in FIELDS if k in row},
                "prompt": row.get("prompt")}
        try:
            params = sampling_from(body)
            ids = server.prompt_ids(body, chat=False)
            h = server.engine.submit(ids, server.make_sampler(params, ids),
                                     params["max_tokens"], params["stop"])
            handles.append(("ok", h))
        except (BadRequest, MaxdeclError) as e:
            handles.append(("error", str(e)))
    out = []
    for row, (kind, h) in zip(rows, handles):
        if kind == "error":
            out.append({"id": row["id"], "error": h})
        else:
            try:
                c = h.wait()
                out.append({"id": row["id"], "text": c.text, "ids": c.ids,
                            "finish_reason": c.finish_reason})
            except MaxdeclError as e:
                out.append({"id": row["id"], "error": str(e)})
        if on_result is not None:
            on_result(out[-1])
    return out


def _progress(done: int, total: int) -> None:
    width = 30
    fill = width * done // max(total, 1)
    print(f"\r[{'#' * fill}{'.' * (width - fill)}] {done}/{total}", end="",
          file=sys.stderr, flush=True)
    if done == total:
        print(file=sys.stderr)


def batch_cli(args) -> int:
    """Implements ``maxdecl batch`` (see ``maxdecl batch --help``)."""
    if not 1 <= args.parallel <= 256:
        raise MaxdeclError(f"--parallel must be in 1..256, got {args.parallel}")
    rows = read_rows(args.input)
    seen = done_ids(args.output)
    todo = [r for r in rows if _key(r["id"]) not in seen]
    print(f"maxdecl batch: {len(rows)} rows, {len(rows) - len(todo)} already in "
          f"{args.output}, {len(todo)} to run" + (" on Ray" if args.ray is not None else ""),
          file=sys.stderr, flush=True)
    if not todo:
        return 0
    results = []
    with open(args.output, "a", encoding="utf-8") as f:
        def write(r):
            f.write(json.dumps(r) + "\n")
            f.flush()
            results.append(r)
            if sys.stderr.isatty():
                _progress(len(results), len(todo))

        if args.ray is not None:
            from .ray_job import run_on_ray

            run_on_ray(args, todo, write)
        else:
            from ..serve import open_server

            server = open_server(args.spec, args.weights, args.variant, args.parallel)
            try:
                run_rows(server, todo, write)
            finally:
                server.engine.close()
    failed = sum(1 for r in results if "error" in r)
    print(f"maxdecl batch: wrote {len(results)} results ({failed} failed) to {args.output}",
          file=sys.stderr)
    return 0
