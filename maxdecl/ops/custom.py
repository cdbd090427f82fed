"""User ops: ``@md.ops.register_custom(name)`` and ``md.ops.custom(name, inputs, out_types)``.

A custom op is a Python function over NumPy arrays (plain NumPy or a numba kernel)
that returns one array or a tuple of arrays. Registering it adds an ``OpDef`` and an
``OpSig`` under ``name``, so a YAML spec uses it exactly like a built-in op (by its
registered name; a spec never names a Python import path). Packages ship ops through
the ``maxdecl.ops`` entry-point group: the loader imports the entry point's module,
whose ``@register_custom`` calls do the rest.

Output types come from, in order: ``out_types`` given at the call (Python) or as an
attribute (YAML: a list of ``{dtype: float32, shape: [seq, 16]}``), else the ``infer``
rule given to ``register_custom``. Without either, building the node fails and says so.

Example::

    @md.ops.register_custom("swiglu", inputs=("gate", "up"), infer=lambda g, u: g)
    def swiglu(gate, up):
        return gate / (1 + np.exp(-gate)) * up

    (y,) = md.ops.custom("swiglu", [g_val, u_val])
"""

from __future__ import annotations

from ..dtypes import DType, TensorType, format_shape
from ..errors import GraphError
from ._registry import REGISTRY, apply, define, undefine

__all__ = ["custom", "register_custom", "unregister_custom"]

_CUSTOM: set[str] = set()


def _as_type(t):
    if isinstance(t, TensorType):
        return t
    if isinstance(t, dict):
        return TensorType(t["dtype"], tuple(t["shape"]))
    if isinstance(t, (tuple, list)) and len(t) == 2:
        return TensorType(t[0], tuple(t[1]))
    raise TypeError(f"an output type must be a md.TensorType, {{dtype, shape}} or "
                    f"(dtype, shape), got {t!r}")


def _types(result) -> list:
    if isinstance(result, (list, tuple)) and not (
            len(result) == 2 and isinstance(result[1], (list, tuple))
            and not isinstance(result[0], (TensorType, dict, list, tuple))):
        return [_as_type(t) for t in result]
    return [_as_type(result)]


def register_custom(name: str, *, inputs=None, attrs=None, infer=None, outputs=None):
    """Decorator: register ``fn(*arrays, **attrs) -> array | tuple[array, ...]`` as op ``name``.

    Args:
        name: the op name (also its YAML op type); must not clash with a registered op.
        inputs: names of the positional inputs (fixes the arity); None = any number.
        attrs: attribute names -> defaults, passed to ``fn`` as keyword arguments.
        infer: optional shape rule ``infer(*input_types, **attrs)`` returning one
            ``md.TensorType`` (or ``(dtype, shape)``) or a list of them.
        outputs: number of outputs when fixed (checked at build and run time).

    Raises:
        GraphError: the name is taken.
    """
    attr_defaults = dict(attrs or {})
    if "out_types" in attr_defaults:
        raise GraphError(f"custom op {name!r}: 'out_types' is a reserved attribute")

    def deco(fn):
        if name in REGISTRY:
            raise GraphError(f"op {name!r} is already registered")

        def normalize(a):
            out = dict(a)
            if out.get("out_types") is not None:
                out["out_types"] = tuple(_types(out["out_types"]))
            return out

        def infer_fn(vals, a):
            kw = {k: v for k, v in a.items() if k != "out_types"}
            if a.get("out_types") is not None:
                types = list(a["out_types"])
            elif infer is not None:
                types = _types(infer(*vals, **kw))
            else:
                raise ValueError(f"custom op {name!r} has no infer rule: pass out_types")
            if outputs is not None and len(types) != outputs:
                raise ValueError(f"custom op {name!r} declares {outputs} outputs, "
                                 f"got {len(types)} output types")
            return types

        def run(args, a):
            import numpy as np

            kw = {k: v for k, v in a.items() if k != "out_types"}
            result = fn(*args, **kw)
            arrays = [np.asarray(r) for r in
                      (result if isinstance(result, (tuple, list)) else [result])]
            if a.get("out_types") is not None:
                expected = list(a["out_types"])
            else:  # the infer rule on the run-time types
                expected = infer_fn([TensorType(DType.from_numpy(x.dtype), x.shape)
                                     for x in args], a)
            _check_outputs(name, arrays, expected)
            return arrays

        define(name, rule=infer_fn, run=run, normalize=normalize, kind="custom",
               inputs=tuple(inputs) if inputs is not None else ("values",),
               variadic=inputs is None, attrs={**attr_defaults, "out_types": None},
               outputs=outputs if outputs is not None else _outputs_from_types,
               doc=(fn.__doc__ or f"custom op {name}").strip().splitlines()[0])
        _CUSTOM.add(name)
        fn.op_name = name
        return fn

    return deco


def _outputs_from_types(n_inputs, attrs):
    types = attrs.get("out_types")
    return None if types is None else len(types)


def _check_outputs(name, arrays, expected) -> None:
    if len(arrays) != len(expected):
        raise ValueError(f"custom op {name!r} returned {len(arrays)} arrays, declared "
                         f"{len(expected)}")
    for i, (arr, t) in enumerate(zip(arrays, expected)):
        ok = (arr.dtype == t.dtype.numpy and arr.ndim == len(t.shape)
              and all(isinstance(d, str) or d == n for d, n in zip(t.shape, arr.shape)))
        if not ok:
            raise ValueError(f"custom op {name!r}: output {i} is {arr.dtype.name}"
                             f"{format_shape(arr.shape)}, declared {t}")


def unregister_custom(name: str) -> None:
    """Remove a custom op (tests, plugin reloads); built-in ops cannot be removed."""
    if name not in _CUSTOM:
        raise GraphError(f"{name!r} is not a registered custom op")
    _CUSTOM.discard(name)
    undefine(name)


def custom(name: str, inputs, out_types=None, **attrs) -> list:
    """Add a node of custom op ``name`` on ``inputs``; returns the list of its outputs.

    ``out_types`` (a md.TensorType or a list of them) overrides the op's ``infer`` rule.
    The outputs are checked against these types when the graph runs.
    """
    if out_types is not None:
        out_types = [out_types] if isinstance(out_types, TensorType) else list(out_types)
    return apply(name, list(inputs), out_types=out_types, **attrs)
