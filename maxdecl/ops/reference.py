"""The op reference, generated from the op definitions (``maxdecl ops``, ``docs/ops.md``)."""

from __future__ import annotations

import importlib
import inspect

from ._registry import REGISTRY, REQUIRED

_KINDS = [("elementwise", "Elementwise"), ("shape", "Shape"), ("reduction", "Reductions"),
          ("linalg", "Linear algebra"), ("norm", "Normalization"),
          ("transformer", "Transformer"), ("conv", "Convolution"), ("pool", "Pooling"),
          ("resample", "Resampling"), ("ssm", "State-space"), ("rnn", "Recurrent"),
          ("fourier", "Fourier transforms")]


def _attr(name, default) -> str:
    return f"`{name}` (required)" if default is REQUIRED else f"`{name}` = `{default!r}`"


def _outputs(opdef) -> str:
    return opdef.outputs_doc or ("varies" if callable(opdef.outputs) else str(opdef.outputs))


def _details(name: str) -> list:
    """The paragraphs of ``md.ops.<name>``'s docstring after its summary, up to its
    example: what the attributes mean, in the function's own words."""
    fn = getattr(importlib.import_module("maxdecl.ops"), name, None)
    doc = inspect.getdoc(fn) if callable(fn) else None
    keep = []
    for para in (doc or "").split("\n\n")[1:]:
        if para.lstrip().startswith("Example"):
            break
        if para.lstrip().startswith(("Args:\n", "Returns:", "Raises:")):
            continue                    # a Google-style block: the lines above say it
        keep.append(para.replace("``", "`"))
    return ["\n\n".join(keep), ""] if keep else []


def reference_markdown() -> str:
    """Markdown: every built-in op by kind, with inputs, attributes, outputs and type rule."""
    lines = ["# Op reference", "",
             "Generated from the op definitions (`maxdecl ops`); a test keeps this file "
             "current. An input marked `?` is optional; `...` takes a list of values. "
             "Dims are ints or symbolic names (polynomials of the names in `dims:`, such as "
             "`past+seq`).", ""]
    for kind, title in _KINDS:
        ops = sorted(n for n, d in REGISTRY.items() if d.kind == kind)
        if not ops:
            continue
        lines += [f"## {title}", ""]
        for name in ops:
            d = REGISTRY[name]
            ins = ", ".join([f"{i}..." if d.variadic else i for i in d.inputs]
                            + [f"{i}?" for i in d.optional])
            lines += [f"### `{name}({ins})`", "", d.doc[:1].upper() + d.doc[1:] + ".", ""]
            lines += _details(name)
            attrs = ", ".join(_attr(k, v) for k, v in d.attrs.items()) or "none"
            lines += [f"- attributes: {attrs}", f"- outputs: {_outputs(d)}",
                      f"- type rule: {d.rule_doc}"]
            if d.sequence_axis is not None:
                state = ", ".join(f"`{i}` (carried as output {j})" for i, j in d.state.items())
                lines += [f"- in a batch of sequences (`rows=`): mixes positions along axis "
                          f"{d.sequence_axis}, so it runs once per sequence on its own rows"
                          + (f" and state: {state}" if state else "")]
            lines += [""]
    return "\n".join(lines).rstrip() + "\n"
