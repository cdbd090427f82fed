"""maxdecl: neural networks declared as YAML specs, run on numba kernels.

Public names load lazily, so ``import maxdecl`` (and ``maxdecl validate``) stays
light: NumPy loads with the graph, numba only when a kernel first runs.
"""

from __future__ import annotations

import importlib

__version__ = "0.1.0"

from .errors import (GraphError, InputError, MaxdeclError, QuantizationError, SpecError,
                     WeightsError)

_LAZY = {
    "DType": ("dtypes", "DType"),
    "TensorType": ("dtypes", "TensorType"),
    "Graph": ("graph", "Graph"),
    "Value": ("graph", "Value"),
    "Node": ("graph", "Node"),
    "format_system_stack": ("graph", "format_system_stack"),
    "TensorDict": ("tensors", "TensorDict"),
    "TensorMap": ("tensors", "TensorMap"),
    "QuantizedTensor": ("tensors", "QuantizedTensor"),
    "load_spec": ("spec", "load_spec"),
    "validate_spec": ("spec", "validate_spec"),
    "SpecProblem": ("spec", "SpecProblem"),
    "SCHEMA": ("spec.schema", "SCHEMA"),
    "build": ("builder", "build"),
    "compile": ("runtime", "compile"),
    "CompiledGraph": ("runtime", "CompiledGraph"),
    "PerSequence": ("runtime", "PerSequence"),
    "load_weights": ("weights", "load_weights"),
    "load_tokenizer": ("pipelines.tokenizer_embed", "load_tokenizer"),
    "load_model": ("model", "load_model"),
    "Model": ("model", "Model"),
    "generate": ("model", "generate"),
    "random_weights": ("weights.random", "random_weights"),
    "ops": ("ops", None),
    "codecs": ("codecs", None),
    "checkpoint": ("checkpoint", None),
}

__all__ = ["GraphError", "InputError", "MaxdeclError", "QuantizationError", "SpecError",
           "WeightsError",
           *_LAZY]


def __getattr__(name: str):
    try:
        module, attr = _LAZY[name]
    except KeyError:
        raise AttributeError(f"module 'maxdecl' has no attribute {name!r}") from None
    mod = importlib.import_module(f".{module}", __name__)
    value = mod if attr is None else getattr(mod, attr)
    globals()[name] = value
    return value


def __dir__():
    return sorted(set(globals()) | set(_LAZY))
