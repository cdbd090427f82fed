"""Seeded random weights for any spec: ``md.random_weights(spec, variant=None, seed=0)``."""

from __future__ import annotations

import numpy as np

from ..tensors import QuantizedTensor, TensorDict


def random_weights(spec, variant: str | None = None, seed: int = 0) -> TensorDict:
    """Seeded random weights for every weight ``spec`` declares, in the spec's encodings.

    Norm-like 1-D weights are ``1 + 0.1 * N(0, 1)``, matrices ``N(0, 1 / fan_in)``, so
    activations stay in range through many layers. A weight whose ``absent:`` stand-in
    is a fill value (such as RoPE frequency divisors) is left out: the builder fills it.

    Args:
        spec: a spec file path or a ``Spec`` (``md.load_spec``).
        variant: the variant whose shapes to use (default: the spec's selected one).
        seed: the seed of NumPy's ``default_rng``; the same seed gives the same bytes.

    Returns:
        a TensorDict that ``md.build(spec, weights=td, variant=variant)`` accepts.

    Raises:
        SpecError: the spec is invalid or has no such variant.

    Example::

        td = md.random_weights("specs/mlp.yaml")
        md.checkpoint.save(td, "mlp.safetensors")
    """
    from ..spec import Spec, load_spec

    if not isinstance(spec, Spec):
        spec = load_spec(spec)
    return program_weights(spec.program(variant or spec.variant), seed)


def program_weights(prog, seed: int = 0) -> TensorDict:
    """``random_weights`` for an unrolled spec (a ``Program``)."""
    from .. import codecs

    rng = np.random.default_rng(seed)
    td = TensorDict()
    for w in prog.weights:
        shape = tuple(int(d) for d in w.shape)
        if w.absent is not None and w.absent.kind == "fill" and not w.required:
            continue
        if w.dtype != "float32":                # integer or bool weights: small values
            from ..dtypes import DType

            td[w.name] = rng.integers(0, 2 if w.dtype == "bool" else 4, shape).astype(
                DType.parse(w.dtype).numpy)
            continue
        if len(shape) <= 1:                 # gains (and scalars) near 1
            x = (1.0 + 0.1 * rng.standard_normal(shape)).astype(np.float32)
        else:
            x = (rng.standard_normal(shape) / np.sqrt(shape[-1])).astype(np.float32)
        enc = (w.encoding or "f32").lower()
        if enc in ("f32", "f16", "none"):
            td[w.name] = x
        else:
            e = codecs.get(enc)
            td[w.name] = QuantizedTensor(e.quantize(x), shape, e.name)
    return td
