"""The parts of the spec JSON Schema generated from the op definitions and encodings.

Editors (yaml-language-server, VS Code) complete what a schema lists: op names, each
op's attribute names with their doc and default, and encoding names. They are given
as ``examples`` and as per-op ``properties`` (never ``enum`` or
``additionalProperties: false``), so user ops registered with
``md.ops.register_custom`` and user encodings stay valid, and wrong names keep the
semantic checker's messages ("unknown attribute 'epsilom'; did you mean 'epsilon'?").
``maxdecl schema`` prints the result; a test keeps ``maxdecl/schema/spec.schema.json``
equal to it.
"""

from __future__ import annotations

import copy

from ..blocks import FLOAT_STORAGE, GGML_BLOCKS
from ..ops._registry import REGISTRY, REQUIRED, spec_ops


def _attr_schema(opdef, name, default) -> dict:
    out = {"description": f"{opdef.name} attribute" + ("" if default is REQUIRED else
                                                        f" (default {default!r})")}
    if default is not REQUIRED and isinstance(default, (bool, int, float, str)):
        out["default"] = default
    return out


def generate(base: dict) -> dict:
    """``base`` with the generated parts (op names, per-op attributes, encodings) filled in."""
    schema = copy.deepcopy(base)
    defs = schema["$defs"]
    ops = [n for n in spec_ops() if REGISTRY[n].kind != "custom"]
    layer = defs["layer"]
    layer["properties"]["op"]["examples"] = ops
    layer["allOf"] = [
        {"if": {"properties": {"op": {"const": n}}, "required": ["op"]},
         "then": {"properties": {"attrs": {"properties": {
             k: _attr_schema(REGISTRY[n], k, v) for k, v in REGISTRY[n].attrs.items()}}}}}
        for n in ops if REGISTRY[n].attrs]
    defs["encoding"]["examples"] = sorted({*FLOAT_STORAGE, *GGML_BLOCKS})
    return schema
