"""Spec + weights -> the weights, hyperparameters and tokenizer a model is built from.

Hyperparameters come from the weights' own metadata when the spec's ``formats``
section says where to find them (GGUF keys, HF config.json fields, the llama2.c
header), overriding the variant's values; foreign tensor names are mapped by the
spec's declared ``formats.<fmt>.tensors`` / ``transforms``.
"""

from __future__ import annotations

import os

from ..errors import WeightsError
from ..weights.for_spec import params_from_metadata, prepare_weights  # noqa: F401 (moved)


def tokenizer_for(path: str, meta: dict):
    """The tokenizer that comes with the weights at ``path`` (in a GGUF, in a maxdecl
    checkpoint's metadata, or a tokenizer.json / tokenizer.bin / tokenizer.gguf beside
    them), or None."""
    from .tokenizer import load_gguf_tokenizer, load_tokenizer

    if meta.get("maxdecl.format") == "gguf":
        if "tokenizer.ggml.tokens" not in meta:
            return None          # a GGUF of weights only
        return load_gguf_tokenizer(path, meta)
    from .tokenizer_embed import tokenizer_from_metadata

    if (embedded := tokenizer_from_metadata(meta, path)) is not None:   # a checkpoint's own
        return embedded
    folder = path if os.path.isdir(path) else os.path.dirname(os.path.abspath(path))
    for name in ("tokenizer.json", "tokenizer.bin", "tokenizer.gguf"):
        cand = os.path.join(folder, name)
        if os.path.exists(cand):
            return load_tokenizer(folder if name == "tokenizer.json" else cand)
    return None


def open_weights(spec, weights, variant=None):
    """Load and map the weights for ``spec`` (a Spec).

    Args:
        spec: the Spec.
        weights: a path or a TensorDict (None is the caller's business: see
            ``weights.sources.default_weights`` and ``weights.random``).
        variant: a variant to select before the weights' metadata overrides it.

    Returns:
        (spec with the variant selected, TensorDict with the spec's names, hyperparameters
        read from the metadata, the tokenizer found beside a path or None).
    """
    from ..weights import load_weights

    path = os.fspath(weights) if isinstance(weights, (str, os.PathLike)) else None
    td = load_weights(path) if path is not None else weights
    meta = dict(getattr(td, "metadata", {}) or {})
    mapped_for = getattr(td, "mapped_for", None)
    if mapped_for is not None:            # md.load_weights(path, spec=...) mapped it already
        if mapped_for != spec.name:
            raise WeightsError(f"these weights were mapped for spec {mapped_for!r}, not "
                               f"{spec.name!r} ({spec.file}): load them without spec= or "
                               "with this spec")
        spec = spec.with_variant(variant or td.variant or spec.variant)
        return spec, td, dict(td.params), None
    if variant:
        spec = spec.with_variant(variant)
    params = params_from_metadata(spec, meta)
    td = prepare_weights(spec, td, params)
    tok = tokenizer_for(path, meta) if path is not None else None
    return spec, td, params, tok
