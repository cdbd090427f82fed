"""``maxdecl quantize``: re-encode a checkpoint's tensors, by one encoding or a spec's rules.

Tensors that cannot take an encoding (1-D norms and biases without a spec rule,
non-float tensors, last dims not a multiple of the block) stay as they are and
are listed in the summary, with bytes before/after and the RMSE of each change.
"""

from __future__ import annotations

import sys
import time

import numpy as np

from ..errors import MaxdeclError
from ..tensors import QuantizedTensor, TensorDict

UNQUANTIZED = {"f32", "f16", "none"}


def plan_encodings(td: TensorDict, encoding: str, rules=None) -> dict:
    """Name -> (target encoding or None, reason) for every tensor of ``td``.

    ``rules(name)`` (from a spec) overrides ``encoding`` per tensor name.
    """
    from .. import codecs

    plan = {}
    for name, t in td.items():
        target = rules(name) if rules is not None else encoding
        if target is None or str(target).lower() in UNQUANTIZED:
            plan[name] = (None, "kept: spec rule" if rules is not None else "kept")
            continue
        enc = codecs.get(target)
        shape = t.shape
        is_float = isinstance(t, QuantizedTensor) or np.issubdtype(t.dtype, np.floating)
        if not is_float:
            plan[name] = (None, f"kept: {t.dtype} is not a float tensor")
        elif rules is None and len(shape) < 2:
            plan[name] = (None, "kept: 1-D (norm/bias)")
        elif not shape or shape[-1] % enc.block_elements:
            plan[name] = (None, f"kept: last dim {shape[-1] if shape else 0} is not a multiple "
                                f"of {enc.name}'s block of {enc.block_elements}")
        elif isinstance(t, QuantizedTensor) and t.encoding == enc.name:
            plan[name] = (None, f"kept: already {enc.name}")
        else:
            plan[name] = (enc.name, "")
    return plan


def quantize_tensordict(td: TensorDict, encoding: str, rules=None, progress=None):
    """Quantize ``td`` by ``encoding`` (or per-name ``rules``); returns (TensorDict, report).

    report rows: (name, shape, before, after, bytes_before, bytes_after, rmse or None, note).
    """
    from .. import codecs

    plan = plan_encodings(td, encoding, rules)
    out, report = TensorDict(), []
    for i, (name, t) in enumerate(td.items()):
        target, note = plan[name]
        before = t.encoding if isinstance(t, QuantizedTensor) else t.dtype.name
        if target is None:
            out[name] = t
            report.append((name, tuple(t.shape), before, before, t.nbytes, t.nbytes, None, note))
        else:
            x = (t.dequantize() if isinstance(t, QuantizedTensor)
                 else np.ascontiguousarray(t, dtype=np.float32))
            enc = codecs.get(target)
            try:
                q = QuantizedTensor(enc.quantize(x), x.shape, enc.name)
            except MaxdeclError as e:
                raise MaxdeclError(f"{name}: {e}") from None
            err = float(np.sqrt(np.mean((q.dequantize() - x).astype(np.float64) ** 2)))
            out[name] = q
            report.append((name, tuple(t.shape), before, enc.name, t.nbytes, q.nbytes, err, ""))
        if progress:
            progress(i + 1, len(td), name)
    return out, report


def spec_rules(spec, encoding: str):
    """Per-name encoding: the spec's glob overrides first, else ``encoding`` (which
    takes the place of the spec's default)."""
    import fnmatch

    def rule(name):
        for glob, enc, _ in spec.encoding_overrides:
            if fnmatch.fnmatchcase(name, glob):
                return spec.encoding_for(name)
        return encoding
    return rule


def carry_metadata(meta: dict, params: dict, spec_name=None) -> dict:
    """The source's metadata plus what a later run needs: its format, the spec's
    hyperparameters read from it, and the spec's name."""
    out = {k: v for k, v in dict(meta).items() if k != "maxdecl.format"}
    out["maxdecl.source_format"] = meta.get("maxdecl.format", "")
    if params:
        out["params"] = dict(params)
    if spec_name:
        out["spec"] = spec_name
    return out


def _progress_bar(done, total, name, stream=None, width=30):
    stream = stream or sys.stderr
    fill = int(width * done / max(total, 1))
    stream.write(f"\r[{'#' * fill}{'.' * (width - fill)}] {done}/{total} {name[:40]:<40}")
    if done == total:
        stream.write("\n")
    stream.flush()


def quantize_cli(args) -> int:
    """Implements ``maxdecl quantize SRC -o OUT --encoding ENC [--spec SPEC]``."""
    from .. import checkpoint, codecs
    from ..weights import load_weights

    codecs.get(args.encoding)  # fail fast on an unknown encoding
    td = load_weights(args.src)
    rules, params = None, {}
    if args.spec:
        from ..spec import load_spec
        from .model_loading import params_from_metadata, prepare_weights

        spec = load_spec(args.spec)
        params = params_from_metadata(spec, dict(td.metadata))
        td = prepare_weights(spec, td, params)   # foreign names -> the spec's names
        rules = spec_rules(spec, args.encoding)
    t0 = time.perf_counter()
    out, report = quantize_tensordict(td, args.encoding, rules, progress=_progress_bar)
    out.metadata = carry_metadata(td.metadata, params, args.spec and spec.name)
    checkpoint.save(out, args.output)
    dt = time.perf_counter() - t0
    width = max((len(r[0]) for r in report), default=4)
    print(f"{'tensor':<{width}}  {'from':<8} {'to':<8} {'bytes before':>13} {'after':>13}  rmse")
    for name, _shape, before, after, b0, b1, err, note in report:
        tail = f"{err:.3e}" if err is not None else note
        print(f"{name:<{width}}  {before:<8} {after:<8} {b0:>13,} {b1:>13,}  {tail}")
    kept = [r[0] for r in report if r[6] is None]
    b0, b1 = sum(r[4] for r in report), sum(r[5] for r in report)
    print(f"{len(report) - len(kept)} tensors quantized, {len(kept)} kept as they were; "
          f"{b0:,} -> {b1:,} bytes ({b1 / max(b0, 1):.1%}) in {dt:.1f} s; wrote {args.output}")
    return 0
