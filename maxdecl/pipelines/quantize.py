"""``maxdecl quantize``: re-encode a checkpoint's tensors, by one encoding, a spec's rules
or a llama.cpp preset (``quant_presets``).

Tensors that cannot take an encoding (1-D norms and biases without a spec rule,
non-float tensors, last dims not a multiple of the block) stay as they are and
are listed in the summary, with bytes before/after and the RMSE of each change;
a run where no tensor takes it is refused. With ``--spec`` the source must fit the
spec (``fit.check_fit``). The output carries the tokenizer and the resolved
hyperparameters (a checkpoint, or a GGUF for ``-o X.gguf``).
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
    from .quant_presets import rules_for

    return rules_for(encoding, {}, spec)[0]


def check_selection(plan: dict, encoding: str) -> list[str]:
    """Refuse a run that would quantize nothing; return warnings for tensors a block
    size kept out (the rule chose them, their last dim is not a multiple of its block).

    Raises:
        QuantizationError: no tensor takes the encoding, naming why.
    """
    from ..errors import QuantizationError

    took = [n for n, (t, note) in plan.items() if t is not None or note.startswith("kept: already")]
    blocked = {n: note for n, (t, note) in plan.items() if "not a multiple" in note}
    by_rule = [n for n, (t, note) in plan.items() if note == "kept: spec rule"]
    if not took and len(by_rule) < len(plan):
        why = (f"{len(blocked)} have {_dims(blocked)}" if blocked else
               "none is a float tensor of rank >= 2")
        hint = (" (k-quants need K % 256 == 0: use q8_0, q5_0 or q4_0, or Q4_K_M, which falls "
                "back to q5_0/q8_0 as llama.cpp does)" if blocked else "")
        raise QuantizationError(f"--encoding {encoding}: 0 of {len(plan)} tensors quantized: "
                                f"{why}{hint}")
    if blocked:
        names = list(blocked)
        return [f"warning: {len(names)} tensor(s) kept as they were, {_dims(blocked)}: "
                f"{', '.join(names[:4])}{', ...' if len(names) > 4 else ''}"]
    return []


def _dims(blocked: dict) -> str:
    """'last dims 288, 768 not multiples of q4_k's block of 256' from plan notes."""
    import re

    found = [re.search(r"last dim (\d+) is not a multiple of (\S+)'s block of (\d+)", note)
             for note in blocked.values()]
    dims = sorted({int(m.group(1)) for m in found if m})
    encs = sorted({(m.group(2), m.group(3)) for m in found if m})
    blocks = ", ".join(f"{e}'s block of {b}" for e, b in encs)
    return f"last dim{'s' if len(dims) > 1 else ''} {', '.join(map(str, dims))} not a " \
           f"multiple of {blocks}"


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
    """Implements ``maxdecl quantize SRC -o OUT --encoding ENC [--spec SPEC]``.

    OUT is a maxdecl checkpoint carrying the tokenizer and the resolved
    hyperparameters, or a GGUF when it ends in ``.gguf`` (see ``export``).
    """
    from .. import checkpoint, codecs
    from ..weights import load_weights
    from .quant_presets import PRESETS, rules_for

    if args.encoding.lower() not in PRESETS:
        codecs.get(args.encoding)  # fail fast on an unknown encoding
    to_gguf = args.output.lower().endswith(".gguf")
    td = load_weights(args.src)
    source_meta = dict(td.metadata)
    spec, params, full = None, {}, {}
    if args.spec:
        from ..spec import load_spec
        from .fit import check_fit
        from .model_loading import params_from_metadata, prepare_weights

        spec = load_spec(args.spec)
        params = params_from_metadata(spec, source_meta)
        td = prepare_weights(spec, td, params)   # foreign names -> the spec's names
        check_fit(spec, params, td, args.src)
        full = dict(spec.program(spec.variant, params, check_encodings=False).params)
        params = {k: full[k] for k in spec.variants[spec.variant] if k in full}
    elif to_gguf and source_meta.get("maxdecl.format") != "gguf":
        from ..errors import MaxdeclError

        raise MaxdeclError(f"{args.output}: writing a GGUF from a non-GGUF source needs --spec "
                           "(its formats.gguf names the architecture and its keys)")
    rules, _label = rules_for(args.encoding, td, spec)
    encoding = args.encoding.lower()
    plan = plan_encodings(td, encoding, rules)
    for line in check_selection(plan, args.encoding):
        print(line, file=sys.stderr)
    t0 = time.perf_counter()
    out, report = quantize_tensordict(td, encoding, rules, progress=_progress_bar)
    out.metadata = carry_metadata(td.metadata, params, args.spec and spec.name)
    note = _carry_tokenizer(args.src, source_meta, out.metadata)
    if to_gguf:
        _write_gguf(args, spec, full, source_meta, out)
    else:
        checkpoint.save(out, args.output)
    dt = time.perf_counter() - t0
    width = max((len(r[0]) for r in report), default=4)
    print(f"{'tensor':<{width}}  {'from':<8} {'to':<8} {'bytes before':>13} {'after':>13}  rmse")
    for name, _shape, before, after, b0, b1, err, why in report:
        tail = f"{err:.3e}" if err is not None else why
        print(f"{name:<{width}}  {before:<8} {after:<8} {b0:>13,} {b1:>13,}  {tail}")
    kept = [r[0] for r in report if r[6] is None]
    b0, b1 = sum(r[4] for r in report), sum(r[5] for r in report)
    if note:
        print(f"warning: {note}", file=sys.stderr)
    print(f"{len(report) - len(kept)} tensors quantized, {len(kept)} kept as they were; "
          f"{b0:,} -> {b1:,} bytes ({b1 / max(b0, 1):.1%}) in {dt:.1f} s; wrote {args.output}")
    return 0


def _carry_tokenizer(src: str, source_meta: dict, meta: dict) -> str:
    """Put the source's tokenizer into ``meta`` (already there for a GGUF or a checkpoint
    that carries one; else the tokenizer file beside ``src``). Returns a note when none."""
    from .export import find_tokenizer_file
    from .tokenizer_embed import has_tokenizer, tokenizer_to_metadata

    if has_tokenizer(source_meta):
        return ""
    found = find_tokenizer_file(src)
    if found is None:
        return ("no tokenizer in the source or beside it: the output carries none "
                "(maxdecl run will need one beside it)")
    meta.update(tokenizer_to_metadata(found))
    return ""


def _write_gguf(args, spec, full: dict, source_meta: dict, out) -> None:
    """``quantize -o X.gguf``: the quantized tensors as ``maxdecl export`` writes them."""
    from ..weights.gguf_write import write_gguf
    from .export import gguf_metadata, tokenizer_keys, widen_vectors

    from ..weights.gguf_write import LLAMA_FILE_TYPES

    from .export import file_type_of

    ftype = LLAMA_FILE_TYPES.get(args.encoding.lower(), 15 if args.encoding.lower() == "q4_k_m"
                                 else file_type_of(out))
    if spec is not None:
        metadata = gguf_metadata(spec, full, source_meta, out, ftype)
    else:                          # a GGUF source: its own keys, re-typed and recomputed
        from .export import source_gguf_metadata

        metadata = source_gguf_metadata(source_meta, out, ftype)
    out = widen_vectors(out)
    keys, _ = tokenizer_keys(args.src, dict(out.metadata))
    metadata.update(keys)
    arch = metadata.pop("general.architecture")
    write_gguf(args.output, arch, metadata, out)
