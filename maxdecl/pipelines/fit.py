"""Do a TensorDict's tensors fit a spec? One check, shared by ``quantize`` and ``export``.

The weights fit when every weight the spec declares (and cannot stand in for, see
``absent:``) is present with its declared shape, and nothing else is present.
"""

from __future__ import annotations

from ..errors import WeightsError

__all__ = ["check_fit"]


def check_fit(spec, params: dict, td, source: str) -> None:
    """Raise one line naming the missing, unexpected and misshapen tensors, if any.

    ``params``: the hyperparameters read from the weights (they decide the shapes).

    Raises:
        WeightsError: ``"SRC does not fit SPEC (variant V): 2 missing: a, b; 1 unexpected: c"``.
    """
    prog = spec.program(spec.variant, params, check_encodings=False)
    declared = {w.name: w for w in prog.weights}
    missing = [n for n, w in declared.items()
               if (w.absent is None or w.required) and n not in td]
    unexpected = [n for n in td.keys() if n not in declared]
    misshapen = []
    for name, w in declared.items():
        if name in td:
            shape = tuple(int(d) for d in td[name].shape)    # logical, also when quantized
            want = tuple(int(d) for d in w.shape)
            if shape != want:
                misshapen.append(f"{name} {list(shape)} (spec: {list(want)})")
    parts = [f"{len(v)} {label}: {_few(v)}" for label, v in
             (("missing", missing), ("unexpected", unexpected), ("misshapen", misshapen)) if v]
    if parts:
        raise WeightsError(f"{source} does not fit {spec.file} (variant {spec.variant}, "
                           f"{len(declared)} weights declared): " + "; ".join(parts))


def _few(names: list, n: int = 4) -> str:
    more = f", ... (+{len(names) - n})" if len(names) > n else ""
    return ", ".join(names[:n]) + more
