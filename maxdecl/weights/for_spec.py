"""Weights for a spec: its ``formats`` applied to a loaded file.

``md.load_weights(path, spec=SPEC)`` loads any weights file, then ``load_for_spec``
reads the spec's hyperparameters from the file's metadata
(``params_from_metadata``: GGUF keys, HF ``config.json`` fields, the llama2.c header),
renames and transforms its tensors and adds the computed ones (``prepare_weights``),
and returns a TensorDict whose ``params`` ``md.build(spec, weights=td)`` uses.
"""

from __future__ import annotations

import copy

import numpy as np

from ..errors import WeightsError
from ..spec import Spec, budgets, load_spec
from ..spec.decls import POp
from ..spec.expr import ExprError, evaluate, is_template, names, render, split_template
from ..spec.semantic import variant_env
from ..tensors import QuantizedTensor, TensorDict
from .strings import StringArray

__all__ = ["load_for_spec", "params_from_metadata", "prepare_weights"]


def params_from_metadata(spec, meta: dict) -> dict:
    """Hyperparameters the weights' metadata states, by the spec's ``formats`` mapping.

    A mapped key may be a list of alternatives (the first present wins); an array
    gives its length for a param whose variant value is an int (a count: the vocab from
    ``tokenizer.ggml.tokens``), else a list (llama.cpp's per-layer values).
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
                const = metadata_constant(k)
                if const is not None:           # llama.cpp's default when no key is there
                    out[name] = const[0]
                    break
                k = str(k).replace("{arch}", str(arch))
                if k in meta:
                    count = spec.params.get(name)
                    out[name] = _metadata_value(k, meta[k], not isinstance(count, int)
                                                or isinstance(count, bool))
                    break
        if "vocab" in spec.params and "vocab" not in out and "tokenizer.ggml.tokens" in meta:
            out["vocab"] = len(meta["tokenizer.ggml.tokens"])
    elif fmt == "hf":
        config = _config_view(meta, section.get("config_roots") or ())
        for name, key in dict(section.get("config", {}) or {}).items():
            for alt in key if isinstance(key, list) else [key]:
                v = _hf_config_value(alt, config)
                if v is not None or _hf_constant(alt):   # "{None}": None, not the variant's
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
    out = {k: v for k, v in out.items() if k in spec.params}
    refuse_unsupported(spec, fmt, section, out)
    return out


def metadata_constant(alt):
    """``(value,)`` when a ``gguf.metadata`` alternative is a constant ``"{expr}"`` (the
    value llama.cpp assumes when the file has no key: ``"{[]}"``, ``"{False}"``), else
    None for a key name (``"{arch}.x"`` is a key)."""
    if not isinstance(alt, str) or "{arch}" in alt or not is_template(alt):
        return None
    parts = split_template(alt)
    if len(parts) != 1 or not parts[0][0]:
        return None
    try:
        return (evaluate(parts[0][1], {}),)
    except ExprError as e:
        raise WeightsError(f"gguf.metadata alternative {alt!r}: {e}") from None


def _metadata_value(key: str, v, as_list: bool):
    """A GGUF metadata value as a param: a scalar as it is; an array as a list of Python
    scalars (``as_list``; at most budgets.MAX_VALUE_SIZE items) or as its length."""
    if not isinstance(v, (list, tuple, np.ndarray, StringArray)):
        return v
    if not as_list:
        return len(v)
    if len(v) > budgets.MAX_VALUE_SIZE:
        raise WeightsError(f"metadata {key!r}: an array of {len(v):,} values is over the "
                           f"limit of {budgets.MAX_VALUE_SIZE:,} for a param (MAX_VALUE_SIZE)")
    if isinstance(v, StringArray):
        return [v[i] for i in range(len(v))]
    if isinstance(v, np.ndarray):
        return v.tolist()
    return [x.item() if isinstance(x, np.generic) else x for x in v]


def refuse_unsupported(spec, fmt, section: dict, params: dict) -> None:
    """WeightsError when a ``formats.<fmt>.refuse`` rule holds for these weights'
    params (the variant's, then what the metadata states): a checkpoint the spec would
    run with wrong results (a rope scaling it does not model, say) fails loudly."""
    rules = section.get("refuse") if isinstance(section, dict) else None
    if not isinstance(rules, list) or not rules:
        return
    env, problems = variant_env(spec, spec.variant, params)
    for rule in rules:
        when, why = rule.get("when"), rule.get("why", "")
        try:
            hit = _rule_holds(when, env)
            message = render(why, env) if hit else ""
        except ExprError as e:
            if problems:            # a param these weights' values broke: the real cause
                p = problems[0]
                raise WeightsError(f"{spec.file}:{p.line}:{p.col}: {p.path}: {p.message} (with "
                                   f"the params of these {fmt} weights)") from None
            raise WeightsError(f"{spec.file}: formats.{fmt}.refuse {when!r}: {e}") from None
        if hit:
            raise WeightsError(f"these {fmt} weights do not fit {spec.file}: {message} "
                               f"(formats.{fmt}.refuse: {when})")


def _rule_holds(when, env) -> bool:
    """A ``refuse`` rule's ``"{expression}"`` over ``env``: True or False (ExprError
    for anything else)."""
    value = render(when, env)
    if not isinstance(value, bool):
        raise ExprError(f"gives {value!r}, expected true or false")
    return value


def _config_view(config: dict, roots) -> dict:
    """config.json as ``formats.hf.config`` reads it: the keys of each ``config_roots``
    mapping (``text_config``) over the top level's, in order; a root the file lacks, or
    one that is not a mapping, adds nothing."""
    for root in roots if isinstance(roots, (list, tuple)) else ():
        sub = config.get(root)
        if isinstance(sub, dict):
            config = {**config, **sub}
    return config


def _hf_constant(alt) -> bool:
    """Whether a ``formats.hf.config`` alternative is an expression over no key (``"{None}"``,
    ``"{[]}"``): its value, None included, is the param's for every HF checkpoint."""
    if not isinstance(alt, str) or not is_template(alt):
        return False
    try:
        parts = split_template(alt)
        return len(parts) == 1 and parts[0][0] and not names(parts[0][1])
    except ExprError:
        return False


def _hf_config_value(key, config: dict):
    """One ``formats.hf.config`` alternative: a config.json key, ``"{expression}"``
    over config keys (``"{rope_parameters['rope_theta']}"``), or a literal number.
    None when the key is absent or the expression cannot be evaluated on ``config``."""
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
            return evaluate(parts[0][1], config, strict=False)   # keys of a branch not taken
                                                               # may be absent
        except ExprError:
            return None
    return config.get(key)


def prepare_weights(spec, weights, params: dict) -> TensorDict:
    """Map foreign tensor names to the spec's (``formats.<fmt>.tensors`` and
    ``transforms``) and add the tensors the format implies (``computed``).

    Weights with an ``absent:`` stand-in may be missing (the builder fills them)."""
    fmt = weights.metadata.get("maxdecl.format") if hasattr(weights, "metadata") else None
    if fmt == "safetensors" and isinstance(spec.formats.get("hf"), dict):
        # a lone .safetensors file (a torch state_dict, an HF model.safetensors without
        # its folder): formats.hf names its tensors, unless they are the spec's own
        own = {w.name for w in spec.program(spec.variant, params, check_encodings=False).weights}
        if not set(weights.keys()) <= own:
            fmt = "hf"
    section = dict(spec.formats.get(fmt, {}) or {}) if fmt else {}
    mapped = isinstance(section.get("tensors"), dict) and section["tensors"]
    computed = section.get("computed") if isinstance(section.get("computed"), dict) else None
    if not (mapped or computed):
        return weights
    from .mapping import compute_tensors, remap

    prog = spec.program(spec.variant, params, check_encodings=False)
    full = dict(prog.params)                # derived params follow the weights' own
    extra = compute_tensors(computed, full, {w.name: w.shape for w in prog.weights})
    if mapped:
        expected = [w.name for w in prog.weights
                    if (w.absent is None or w.required) and w.name not in extra]
        weights = remap(weights, dict(section["tensors"]),
                        dict(section.get("transforms") or {}), full, expected=expected,
                        prefixes=tuple(section.get("prefixes") or ()),
                        known={w.name for w in prog.weights} | set(extra))
    else:                                   # a new dict sharing the arrays (no copies)
        shallow = TensorDict(metadata=copy.deepcopy(dict(weights.metadata)))
        for name, value in weights.items():
            shallow[name] = value
        weights = shallow
    for name, value in extra.items():
        if name in weights:
            raise WeightsError(f"{name}: the weights have it and formats.{fmt}.computed "
                               "computes it; keep one")
        weights[name] = value
    _widen_bf16(prog, weights)
    return weights


def _widen_bf16(prog, weights) -> None:
    """bf16 tensors that some op reads as a plain tensor (a norm's gain, a bias, an
    elementwise operand: any input not in its op's ``packed`` inputs) become float32,
    exactly, in place; a bf16 matrix only ``linear``/``embedding``-like inputs read stays
    packed. Hugging Face checkpoints are mostly bf16, their norms and biases too."""
    from ..ops import _registry

    plain = set()
    for step in prog.steps:
        if not isinstance(step, POp):
            continue
        opdef = _registry.get(step.op)
        names = list(opdef.inputs) + list(opdef.optional)
        for k, ref in enumerate(step.inputs):
            if ref.kind == "weight" and (k >= len(names) or names[k] not in opdef.packed):
                plain.add(ref.target)
    for name in plain:
        t = weights[name] if name in weights else None
        if isinstance(t, QuantizedTensor) and t.encoding == "bf16":
            weights[name] = t.dequantize()


def load_for_spec(td: TensorDict, spec, variant: str | None = None) -> TensorDict:
    """Weights for ``spec`` (a path or ``Spec``) from a loaded TensorDict: names,
    transforms and computed tensors of its ``formats`` applied, hyperparameters read
    from ``td.metadata``. ``md.load_weights(path, spec=SPEC)`` loads, then calls this.

    Returns:
        A TensorDict named as the spec's weights (arrays shared with ``td`` where
        untransformed); ``.params`` holds the spec params the file states
        (``md.build(spec, weights=td)`` uses them) and ``.variant`` the variant they
        complete.

    Raises:
        WeightsError: the tensors do not fit the spec's mapping (missing/unexpected
            tensors listed). SpecError: an invalid spec.

    Example::

        td = md.load_weights("bert-hf/", spec="specs/bert.yaml")
        g = md.build("specs/bert.yaml", weights=td)       # hidden size etc. from config.json
    """
    if not isinstance(spec, Spec):
        spec = load_spec(spec, variant)
    elif variant:
        spec = spec.with_variant(variant)
    params = params_from_metadata(spec, dict(td.metadata))
    out = prepare_weights(spec, td, params)
    if out is td:                            # nothing renamed: a new dict, arrays shared
        out = TensorDict(metadata=dict(td.metadata))
        for name, value in td.items():
            out[name] = value
    out.params = dict(params)
    out.variant = spec.variant
    out.mapped_for = spec.name
    return out
