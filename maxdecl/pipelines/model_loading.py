"""Spec + weights -> the weights, hyperparameters and tokenizer a model is built from.

Hyperparameters come from the weights' own metadata when the spec's ``formats``
section says where to find them (GGUF keys, HF config.json fields, the llama2.c
header), overriding the variant's values; foreign tensor names are mapped by the
spec's declared ``formats.<fmt>.tensors`` / ``transforms``.
"""

from __future__ import annotations

import os

import numpy as np

from ..errors import WeightsError
from ..tensors import TensorDict


def params_from_metadata(spec, meta: dict) -> dict:
    """Hyperparameters the weights' metadata states, by the spec's ``formats`` mapping.

    A mapped key may be a list of alternatives (the first present wins); an array
    value (such as ``tokenizer.ggml.tokens``) gives its length.
    """
    fmt = meta.get("maxdecl.format")
    if fmt == "maxdecl" and "params" not in meta and meta.get("maxdecl.source_format"):
        fmt = meta["maxdecl.source_format"]      # a re-encoded file keeps its source's metadata
    section = dict(spec.formats.get(fmt, {}) or {})
    out: dict = {}
    if fmt == "gguf":
        arch = meta.get("general.architecture", section.get("arch", ""))
        want = section.get("arch")
        allowed = want if isinstance(want, list) else [want] if want else []
        if allowed and arch not in allowed:
            raise WeightsError(f"the weights are a {arch!r} GGUF, but {spec.file} describes "
                               f"{', '.join(repr(a) for a in allowed)} "
                               "(formats.gguf.arch): use the spec for that architecture")
        keys = dict(section.get("metadata", {}) or {})
        for name, key in keys.items():
            for k in key if isinstance(key, list) else [key]:
                k = str(k).replace("{arch}", str(arch))
                if k in meta:
                    v = meta[k]
                    out[name] = len(v) if isinstance(v, (list, tuple, np.ndarray)) else v
                    break
        if "vocab" in spec.params and "vocab" not in out and "tokenizer.ggml.tokens" in meta:
            out["vocab"] = len(meta["tokenizer.ggml.tokens"])
    elif fmt == "hf":
        for name, key in dict(section.get("config", {}) or {}).items():
            for alt in key if isinstance(key, list) else [key]:
                v = _hf_config_value(alt, meta)
                if v is not None:
                    out[name] = v
                    break
    elif fmt == "llama2c":
        header = list(section.get("header", []) or [])
        fields = ["dim", "hidden_dim", "n_layers", "n_heads", "n_kv_heads", "vocab_size",
                  "seq_len"]
        for name, field in zip(header, fields):
            if field in meta:
                out[name] = meta[field]
    elif fmt == "maxdecl" and isinstance(meta.get("params"), dict):
        out.update(meta["params"])
    return {k: v for k, v in out.items() if k in spec.params}


def _hf_config_value(key, config: dict):
    """One ``formats.hf.config`` alternative: a config.json key, ``"{expression}"``
    over config keys (``"{rope_parameters['rope_theta']}"``), or a literal number.
    None when the key is absent or the expression cannot be evaluated on ``config``."""
    from ..spec.expr import ExprError, evaluate, is_template, split_template

    if isinstance(key, bool) or key is None:
        return None
    if isinstance(key, (int, float)):
        return key
    key = str(key)
    if is_template(key):
        try:
            parts = split_template(key)
            if len(parts) != 1 or not parts[0][0]:
                return None
            return evaluate(parts[0][1], config)
        except ExprError:
            return None
    return config.get(key)


def tokenizer_for(path: str, meta: dict):
    """The tokenizer that comes with the weights at ``path`` (in a GGUF, in a maxdecl
    checkpoint's metadata, or a tokenizer.json / tokenizer.bin / tokenizer.gguf beside
    them), or None."""
    from .tokenizer import load_gguf_tokenizer, load_tokenizer
    from .tokenizer_embed import tokenizer_from_metadata

    if meta.get("maxdecl.format") == "gguf":
        if "tokenizer.ggml.tokens" not in meta:
            return None          # a GGUF of weights only
        return load_gguf_tokenizer(path, meta)
    if (embedded := tokenizer_from_metadata(meta, path)) is not None:   # a checkpoint's own
        return embedded
    folder = path if os.path.isdir(path) else os.path.dirname(os.path.abspath(path))
    for name in ("tokenizer.json", "tokenizer.bin", "tokenizer.gguf"):
        cand = os.path.join(folder, name)
        if os.path.exists(cand):
            return load_tokenizer(folder if name == "tokenizer.json" else cand)
    return None


def prepare_weights(spec, weights, params: dict) -> TensorDict:
    """Map foreign tensor names to the spec's (``formats.<fmt>.tensors`` and
    ``transforms``) and add the tensors the format implies (``computed``).

    Weights with an ``absent:`` stand-in may be missing (the builder fills them)."""
    from ..weights import compute_tensors, remap

    fmt = weights.metadata.get("maxdecl.format") if hasattr(weights, "metadata") else None
    section = dict(spec.formats.get(fmt, {}) or {}) if fmt else {}
    mapped = isinstance(section.get("tensors"), dict) and section["tensors"]
    computed = section.get("computed") if isinstance(section.get("computed"), dict) else None
    if not (mapped or computed):
        return weights
    prog = spec.program(spec.variant, params, check_encodings=False)
    full = dict(prog.params)                # derived params follow the weights' own
    extra = compute_tensors(computed, full, {w.name: w.shape for w in prog.weights})
    if mapped:
        expected = [w.name for w in prog.weights if w.absent is None and w.name not in extra]
        weights = remap(weights, dict(section["tensors"]),
                        dict(section.get("transforms") or {}), full, expected=expected)
    else:                                   # a new dict sharing the arrays (no copies)
        import copy

        shallow = TensorDict(metadata=copy.deepcopy(dict(weights.metadata)))
        for name, value in weights.items():
            shallow[name] = value
        weights = shallow
    for name, value in extra.items():
        if name in weights:
            raise WeightsError(f"{name}: the weights have it and formats.{fmt}.computed "
                               "computes it; keep one")
        weights[name] = value
    return weights


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
    if variant:
        spec = spec.with_variant(variant)
    params = params_from_metadata(spec, meta)
    td = prepare_weights(spec, td, params)
    tok = tokenizer_for(path, meta) if path is not None else None
    return spec, td, params, tok
