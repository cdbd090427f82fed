"""The Ray Data form of ``maxdecl batch``: the same rows, spread over model replicas.

The input lines become a Ray dataset; ``map_batches`` runs them through ``ModelWorker``,
an actor class that loads the model once per worker (``--ray-workers`` of them) and
decodes each batch of rows with continuous batching; the results stream back in input
order (``preserve_order``) and are appended to the output as they arrive. Without an
address a local Ray starts; with one (``ray start --head`` on a cluster) the job runs
there, which is how it scales past one machine: Ray places the workers on the nodes.
"""

from __future__ import annotations

import json

from ..errors import MaxdeclError


class ModelWorker:
    """A Ray Data actor: the model loaded once, batches of rows run through it."""

    def __init__(self, spec, weights, variant, parallel):
        from ..serve import open_server

        self.server = open_server(spec, weights, variant, parallel)

    def __call__(self, batch: dict) -> dict:
        from . import run_rows

        rows = [json.loads(line) for line in batch["row"]]
        results = run_rows(self.server, rows)
        return {"result": [json.dumps(r) for r in results]}


def run_on_ray(args, rows: list[dict], write) -> None:
    """Run ``rows`` on Ray Data (``args.ray``: an address, or "" for a local Ray)."""
    try:
        import ray
        import ray.data
    except ImportError:
        raise MaxdeclError("maxdecl batch --ray needs the 'ray' extra: "
                           "pip install 'maxdecl[ray]'") from None
    if args.ray_workers < 1:
        raise MaxdeclError(f"--ray-workers must be >= 1, got {args.ray_workers}")
    started = not ray.is_initialized()
    if started:
        if args.ray:
            ray.init(address=args.ray, log_to_driver=False)
        else:
            ray.init(num_cpus=max(2, args.ray_workers), include_dashboard=False,
                     log_to_driver=False)
    try:
        ctx = ray.data.DataContext.get_current()
        ctx.execution_options.preserve_order = True
        ds = ray.data.from_items([{"row": json.dumps(r)} for r in rows])
        ds = ds.map_batches(ModelWorker, fn_constructor_args=(
                                _abs(args.spec), _abs(args.weights), args.variant,
                                args.parallel),
                            batch_size=max(1, args.parallel * 4), batch_format="numpy",
                            concurrency=args.ray_workers, num_cpus=1)
        for item in ds.iter_rows():
            write(json.loads(item["result"]))
    finally:
        if started:
            ray.shutdown()


def _abs(path):
    import os

    return None if path is None else os.path.abspath(path)
