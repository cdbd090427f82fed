"""Rename foreign weights to a spec's names and apply its declared transforms.

A spec declares, per foreign format, a name mapping and transforms::

    tensors:                                     # source pattern -> target pattern
      "model.embed_tokens.weight": "token_embd.weight"
      "model.layers.{i}.self_attn.q_proj.weight": "blk.{i}.attn_q.weight"
      "model.rotary_emb.inv_freq": null          # null: drop this source tensor
      "text_model.*": null                       # *: any text (null targets only)
    transforms:                                  # glob on the *target* name -> transforms
      "blk.*.attn_q.weight": {permute_qk: n_heads}
      "blk.*.attn_k.weight": {permute_qk: n_kv_heads}
      "blk.*.attn_norm.weight": {add: 1.0}

A target may also be ``{split: [target, ...], axis: a, sizes: [...]}``: the source
is cut along ``axis`` (default 0) into consecutive parts, equal ones or of ``sizes``
(ints or param names, one may be -1: the rest), one per target, as transformers 5
saves an MoE's gate and up projections as one ``gate_up_proj [E, 2F, D]``::

      "model.layers.{i}.mlp.experts.gate_up_proj":
        {split: ["blk.{i}.ffn_gate_exps.weight", "blk.{i}.ffn_up_exps.weight"], axis: 1}

QuantizedTensors split along any axis but the last (their blocks). ``interleaved: true``
takes every n-th entry instead, part k from entry k (gate and up columns that alternate,
gpt-oss's ``gate_up_proj[..., ::2]`` and ``[..., 1::2]``).

``{i}`` (any ``{name}``) matches a non-negative integer and is substituted into
the target. One placeholder the target does not use **stacks**: the matching tensors
(indices 0..n-1, all present) become one tensor with a new first axis in index
order, as GGUF stores mixture-of-experts weights::

      "model.layers.{i}.block_sparse_moe.experts.{e}.w1.weight": "blk.{i}.ffn_gate_exps.weight"

Transforms, applied in declaration order (after stacking):

- ``permute_qk: n`` -- Hugging Face Llama stores each head's q/k rows as two
  halves (rotate-half rope); GGUF / Meta interleave them in pairs. Rows of head
  ``h`` are reshaped to ``(n, 2, rows_per_head // 2, ...)`` and axes 1, 2 swapped,
  as llama.cpp's ``convert_hf_to_gguf.py`` does (``n`` = n_kv_heads for k).
  Works on arrays and on QuantizedTensors (whole rows move).
- ``add: c`` -- ``w + c`` in float32 (Gemma: HF stores ``w``, GGUF ``1 + w``).
- ``transpose: true`` -- swap the two axes of a 2-D tensor (arrays, bf16);
  ``transpose: [2, 0, 1]`` -- the axes of an array of any rank in that order
  (``np.transpose``: HF gpt-oss's experts ``[E, D, F]`` to GGUF's ``[E, F, D]`` is
  ``[0, 2, 1]``).
- ``exp: true`` -- ``exp(w)``; ``scale: c`` -- ``c * w`` (float32). Mamba's
  ``A = -exp(A_log)`` is ``{exp: true, scale: -1.0}``.
- ``squeeze: axis`` (or a list of axes) -- drop axes of size 1 (torch's depthwise ``[C, 1, K]`` conv
  filters are ``[C, K]`` in GGUF); ``unsqueeze: axis`` -- insert one (torch's
  ``Conv1d`` filters ``[F, C, K]`` as the ``[F, C, 1, K]`` of a height-1 ``conv2d``).
- ``reshape: [a, b, ...]`` -- a new shape of as many elements (one entry may be -1;
  a packed tensor keeps its last axis): DBRX's experts ``[E * F, D]`` as ``[E, F, D]``.
- ``permute_rows: {shape: [a, b, ...], order: [...]}`` -- the rows (first axis) seen
  as an array of ``shape`` (one entry may be -1), its axes put in ``order``, flattened
  back: fused projections whose row blocks differ between formats. HF BLOOM's
  ``query_key_value`` rows are ``[n_heads, 3, head_dim]``, llama.cpp's ``[3, n_heads,
  head_dim]``: ``{shape: [n_heads, 3, -1], order: [1, 0, 2]}``. ``permute_qk: n`` is
  ``{shape: [n, 2, -1], order: [0, 2, 1]}``. Whole rows move (QuantizedTensors too).
- ``drop_rows: n`` -- the rows from n on: tables whose first rows no input reaches,
  which llama.cpp's converter cuts off (RoBERTa's positions start at pad_token_id + 1).
- ``regroup_rows: {groups: g, sizes: [a, b, ...]}`` -- the rows in ``g`` equal groups,
  each cut into sections of ``a``, ``b``, ... rows (one may be -1: the rest); the result
  is section 0 of every group, then section 1 of every group, ...: Falcon-40B's
  ``query_key_value`` (per kv head: its query heads, its key, its value) to llama.cpp's
  q | k | v is ``{groups: n_kv_heads, sizes: [-1, head_dim, head_dim]}``. Whole rows move.

A transform value that is a string names a parameter in ``params``
(``n_heads`` or ``"{n_heads}"``), so may each entry of ``permute_rows``' ``shape``
and ``regroup_rows``' ``groups`` and ``sizes``.

A spec may also declare tensors a foreign format does not store but implies
(``computed``: spec weight name -> number or ``"{expression}"`` over the params);
``compute_tensors`` evaluates them, e.g. Llama 3.1's RoPE divisors from config.json.
"""

from __future__ import annotations

import fnmatch
import re

import numpy as np

from ..errors import WeightsError
from ..tensors import QuantizedTensor, TensorDict

__all__ = ["remap", "permute_qk", "permute_rows", "regroup_rows", "drop_rows",
           "compute_tensors", "TRANSFORMS"]

_PLACEHOLDER = re.compile(r"\{([A-Za-z_][A-Za-z0-9_]*)\}")


_MAX_PLACEHOLDERS = 8   # {i}-style parts in one source pattern


_MAX_STARS = 2          # ``*`` wildcards in one source pattern
_STAR = "_star{}"       # the regex group of the k-th ``*`` of a source


def _is_pattern(source: str) -> bool:
    return bool(_PLACEHOLDER.search(source)) or "*" in source


def _literal(text: str, stars: list) -> str:
    """``text`` as a regex, each ``*`` a group matching any run of characters (``stars``
    counts them across the pattern: the k-th is group ``_star{k}``)."""
    parts = text.split("*")
    out = [re.escape(parts[0])]
    for part in parts[1:]:
        out.append(f"(?P<{_STAR.format(len(stars))}>.*)" + re.escape(part))
        stars.append(1)
    return "".join(out)


def _fill(target: str, m) -> str:
    """``target`` with its ``{i}`` placeholders and ``*`` filled from the match ``m`` of
    its source: the k-th ``*`` gets the text the source's k-th ``*`` matched."""
    out = _PLACEHOLDER.sub(lambda p: str(int(m.group(p.group(1)))), target)
    if "*" not in out:
        return out
    parts = out.split("*")
    return parts[0] + "".join(m.group(_STAR.format(k)) + p for k, p in enumerate(parts[1:]))


def _compile(source: str) -> re.Pattern:
    """The regex of a mapping source such as ``model.layers.{i}.mlp.weight``. Two
    placeholders must be separated by text that is not all digits (``{a}{b}`` or
    ``{a}1{b}`` could split a number many ways: matching would backtrack without bound);
    a ``*`` (at most _MAX_STARS) matches any run of characters."""
    if source.count("*") > _MAX_STARS:
        raise WeightsError(f"mapping {source[:80]!r}: more than {_MAX_STARS} '*'")
    parts, last, seen, stars = [], 0, set(), []
    found = list(_PLACEHOLDER.finditer(source))
    if len(found) > _MAX_PLACEHOLDERS:
        raise WeightsError(f"mapping {source[:80]!r}: more than {_MAX_PLACEHOLDERS} "
                           "placeholders")
    for m in found:
        between = source[last:m.start()]
        if last and (not between or between.isdigit()):
            raise WeightsError(f"mapping {source[:80]!r}: placeholders must be separated by "
                               "text with a non-digit, e.g. '{i}.{j}'")
        parts.append(_literal(between, stars))
        name = m.group(1)
        if name.startswith("_star"):
            raise WeightsError(f"mapping {source[:80]!r}: placeholder {{{name}}} is reserved "
                               "(names starting _star stand for '*')")
        parts.append(f"(?P={name})" if name in seen else f"(?P<{name}>0|[1-9][0-9]*)")
        seen.add(name)
        last = m.end()
    parts.append(_literal(source[last:], stars))
    return re.compile("".join(parts), re.DOTALL)


def permute_qk(w, n_heads: int):
    """Hugging Face q/k rows (halves per head) -> GGUF/Meta rows (interleaved pairs).

    ``w`` has ``n_heads * head_dim`` rows (axis 0); within each head, row
    ``half * head_dim/2 + j`` moves to row ``2 * j + half``.
    """
    if isinstance(w, QuantizedTensor):
        if len(w.shape) < 2:
            raise WeightsError(f"permute_qk: a {w.encoding} tensor needs rows to permute, "
                               f"got shape {list(w.shape)}")
        return QuantizedTensor(permute_qk(w.data, n_heads), w.shape, w.encoding)
    w = np.asarray(w)
    rows = w.shape[0] if w.ndim else 0
    if n_heads <= 0 or rows % (2 * n_heads):
        raise WeightsError(f"permute_qk: {rows} rows cannot be split into {n_heads} heads "
                           "of an even size")
    out = w.reshape(n_heads, 2, rows // n_heads // 2, *w.shape[1:]).swapaxes(1, 2)
    return np.ascontiguousarray(out).reshape(w.shape)


def _add(w, c):
    base = w.dequantize() if isinstance(w, QuantizedTensor) else np.asarray(w, np.float32)
    return (base + np.float32(c)).astype(np.float32)


def _transpose(w, flag):
    if isinstance(flag, list):                 # a permutation of the axes (any rank)
        return _permute_axes(w, flag)
    if not flag:
        return w
    if isinstance(w, QuantizedTensor):
        if w.encoding != "bf16" or len(w.shape) != 2:
            raise WeightsError(f"transpose: a {w.encoding} tensor of shape {list(w.shape)} "
                               "cannot be transposed in its packed form")
        u16 = np.ascontiguousarray(w.data).view("<u2").reshape(w.shape)
        t = np.ascontiguousarray(u16.T)
        return QuantizedTensor(t.view(np.uint8).reshape(t.shape[0], -1), t.shape, "bf16")
    w = np.asarray(w)
    if w.ndim != 2:
        raise WeightsError(f"transpose: expects a 2-D tensor, got shape {list(w.shape)}")
    return np.ascontiguousarray(w.T)


def _permute_axes(w, perm: list):
    if isinstance(w, QuantizedTensor):
        raise WeightsError(f"transpose: a {w.encoding} tensor cannot have its axes permuted "
                           "in its packed form")
    w = np.asarray(w)
    if (any(isinstance(p, bool) or not isinstance(p, int) for p in perm)
            or sorted(p % max(w.ndim, 1) for p in perm) != list(range(w.ndim))):
        raise WeightsError(f"transpose: {perm} is not a permutation of the {w.ndim} axes of "
                           f"a tensor of shape {list(w.shape)}")
    return np.ascontiguousarray(np.transpose(w, perm))


def _float(w) -> np.ndarray:
    return w.dequantize() if isinstance(w, QuantizedTensor) else np.asarray(w, np.float32)


def _exp(w, flag):
    return np.exp(_float(w)).astype(np.float32) if flag else w


def _scale(w, c):
    return (_float(w) * np.float32(c)).astype(np.float32)


def _squeeze(w, axis):
    shape = tuple(w.shape)
    axes = axis if isinstance(axis, (list, tuple)) else [axis]
    if not axes or any(isinstance(a, bool) or not isinstance(a, (int, np.integer)) for a in axes):
        raise WeightsError(f"squeeze: an axis or a list of axes, got {axis!r}")
    at = sorted({int(a) % len(shape) if -len(shape) <= int(a) < len(shape) else -1
                 for a in axes}, reverse=True)
    if at[-1] < 0 or any(shape[a] != 1 for a in at):
        raise WeightsError(f"squeeze: axes {list(axes)} of shape {list(shape)} are not all "
                           f"of size 1")
    new = tuple(d for i, d in enumerate(shape) if i not in at)
    if isinstance(w, QuantizedTensor):
        if at[0] == len(shape) - 1:
            raise WeightsError("squeeze: cannot drop the packed last axis")
        return QuantizedTensor(w.data.reshape(*new[:-1], -1), new, w.encoding)
    return np.asarray(w).reshape(new)


def _unsqueeze(w, axis):
    shape = tuple(w.shape)
    axis = int(axis)
    if not -len(shape) - 1 <= axis <= len(shape):
        raise WeightsError(f"unsqueeze: axis {axis} is out of range for shape {list(shape)}")
    at = axis % (len(shape) + 1)
    if isinstance(w, QuantizedTensor):
        if at == len(shape):
            raise WeightsError("unsqueeze: cannot add an axis after the packed last axis")
        new = shape[:at] + (1,) + shape[at:]
        return QuantizedTensor(w.data.reshape(*new[:-1], -1), new, w.encoding)
    return np.expand_dims(np.asarray(w), at)


def permute_rows(w, shape, order):
    """``w`` with its rows (first axis) viewed as ``shape`` (one entry may be -1),
    those axes reordered by ``order`` and flattened back (see the module doc)."""
    rows = int(w.shape[0]) if len(w.shape) else 0
    whole = [isinstance(v, (int, np.integer)) and not isinstance(v, bool)
             for v in (*shape, *order)]
    if not all(whole) or not all(-1 <= d <= max(rows, 1) for d in shape):
        raise WeightsError(f"permute_rows: shape {shape} and order {order} must be whole "
                           f"numbers, the sizes within the {rows} rows")
    shape = [int(d) for d in shape]
    order = [int(a) for a in order]
    if sorted(order) != list(range(len(shape))) or not shape:
        raise WeightsError(f"permute_rows: order {order} is not a permutation of the "
                           f"{len(shape)} axes of shape {shape}")
    if shape.count(-1) > 1 or any(d == 0 or d < -1 for d in shape):
        raise WeightsError(f"permute_rows: shape {shape} needs positive sizes (one may be -1)")
    known = int(np.prod([d for d in shape if d != -1], dtype=np.int64))
    if -1 in shape:
        if known == 0 or rows % known:
            raise WeightsError(f"permute_rows: {rows} rows do not fit shape {shape}")
        shape[shape.index(-1)] = rows // known
    elif known != rows:
        raise WeightsError(f"permute_rows: {rows} rows do not fit shape {shape}")
    if isinstance(w, QuantizedTensor):
        return QuantizedTensor(permute_rows(w.data, shape, order), w.shape, w.encoding)
    w = np.asarray(w)
    out = w.reshape(*shape, *w.shape[1:]).transpose(*order, *range(len(shape), w.ndim - 1
                                                                     + len(shape)))
    return np.ascontiguousarray(out).reshape(w.shape)


def drop_rows(w, n):
    """``w`` without its first ``n`` rows (packed rows too)."""
    rows = int(w.shape[0]) if len(w.shape) else 0
    if not isinstance(n, (int, np.integer)) or isinstance(n, bool) or not 0 <= n < rows:
        raise WeightsError(f"drop_rows: {n!r} is not a row count below the {rows} rows")
    n = int(n)
    if isinstance(w, QuantizedTensor):
        return QuantizedTensor(w.data[n:], (rows - n, *w.shape[1:]), w.encoding)
    return np.ascontiguousarray(np.asarray(w)[n:])


def regroup_rows(w, groups, sizes):
    """``w``'s rows in ``groups`` equal groups cut into sections of ``sizes`` rows (one
    may be -1), reassembled section by section across the groups (see the module doc)."""
    rows = int(w.shape[0]) if len(w.shape) else 0
    if not all(isinstance(v, (int, np.integer)) and not isinstance(v, bool)
               for v in (groups, *sizes)):
        raise WeightsError(f"regroup_rows: groups {groups!r} and sizes {sizes!r} must be "
                           "whole numbers")
    groups, sizes = int(groups), [int(v) for v in sizes]
    if groups < 1 or rows % groups or not sizes or sizes.count(-1) > 1 or min(sizes) < -1:
        raise WeightsError(f"regroup_rows: {rows} rows cannot be cut into {groups} groups "
                           f"of sections {sizes} (one size may be -1)")
    per = rows // groups
    given = list(sizes)
    if -1 in sizes:
        sizes[sizes.index(-1)] = per - (sum(sizes) + 1)
    if min(sizes) < 0 or sum(sizes) != per:
        fixed = sum(v for v in given if v != -1)
        raise WeightsError(f"regroup_rows: sections {given} do not fit the {per} rows of "
                           f"each of {groups} groups ({rows} rows in all; the given sections "
                           f"take {fixed})")
    if isinstance(w, QuantizedTensor):
        return QuantizedTensor(regroup_rows(w.data, groups, sizes), w.shape, w.encoding)
    w = np.asarray(w)
    g = w.reshape(groups, per, *w.shape[1:])
    cuts = np.cumsum([0, *sizes])
    return np.concatenate([g[:, a:b].reshape(-1, *w.shape[1:]) for a, b in
                           zip(cuts[:-1], cuts[1:])], axis=0).reshape(w.shape)


def _groups_arg(arg, params, where):
    """``(groups, sizes)`` of a ``regroup_rows`` value, param names resolved."""
    if (not isinstance(arg, dict) or set(arg) != {"groups", "sizes"}
            or not isinstance(arg["sizes"], list)):
        raise WeightsError(f"{where}: expects {{groups: n, sizes: [...]}} (a list), "
                           f"got {arg!r}")
    return (_param(arg["groups"], params, where),
            [_param(d, params, where) for d in arg["sizes"]])


def _rows_arg(arg, params, where):
    """``(shape, order)`` of a ``permute_rows`` value, param names in ``shape`` resolved."""
    if (not isinstance(arg, dict) or set(arg) != {"shape", "order"}
            or not isinstance(arg["shape"], list) or not isinstance(arg["order"], list)):
        raise WeightsError(f"{where}: expects {{shape: [...], order: [...]}} (lists), "
                           f"got {arg!r}")
    return [_param(d, params, where) for d in arg["shape"]], arg["order"]


def _shape_arg(arg, params, where):
    """A ``reshape`` value: a list of ints and param names (one may be -1)."""
    if not isinstance(arg, list) or not arg:
        raise WeightsError(f"{where}: expects a shape list, got {arg!r}")
    return [_param(d, params, where) for d in arg]


def _reshape(w, shape):
    """``w`` with a new shape of as many elements (one entry may be -1); a packed tensor
    keeps its last axis, whose blocks cannot be cut."""
    dims = [int(d) for d in shape]
    old = tuple(int(d) for d in w.shape)
    size = int(np.prod(old, dtype=np.int64))
    if dims.count(-1) > 1 or any(d < -1 for d in dims):
        raise WeightsError(f"reshape: {dims}: at most one -1 and no other negative dim")
    known = int(np.prod([d for d in dims if d != -1], dtype=np.int64))
    if -1 in dims:
        if known == 0 or size % known:
            raise WeightsError(f"reshape: {list(old)} does not divide into {dims}")
        dims[dims.index(-1)] = size // known
    if int(np.prod(dims, dtype=np.int64)) != size:
        raise WeightsError(f"reshape: {list(old)} ({size} elements) cannot be {dims}")
    if isinstance(w, QuantizedTensor):
        if not dims or dims[-1] != old[-1]:
            raise WeightsError(f"reshape: a packed {w.encoding} tensor keeps its last axis "
                               f"({old[-1]}), got {dims}")
        return QuantizedTensor(w.data.reshape(*dims[:-1], -1), tuple(dims), w.encoding)
    return np.asarray(w).reshape(dims)


_ARGS = {"permute_rows": _rows_arg, "regroup_rows": _groups_arg,   # not one scalar
         "reshape": _shape_arg}

TRANSFORMS = {
    "permute_qk": lambda w, n: permute_qk(w, int(n)),
    "permute_rows": lambda w, arg: permute_rows(w, *arg),
    "regroup_rows": lambda w, arg: regroup_rows(w, *arg),
    "drop_rows": drop_rows,
    "add": _add,
    "transpose": _transpose,
    "exp": _exp,
    "scale": _scale,
    "squeeze": _squeeze,
    "unsqueeze": _unsqueeze,
    "reshape": _reshape,
}


def _stack(target: str, parts: list):
    """``[(index, source name, value)]`` -> one value with a new first axis, by index."""
    parts.sort(key=lambda p: p[0])
    idx = [p[0] for p in parts]
    if idx != list(range(len(parts))):
        raise WeightsError(f"{target}: stacking {parts[0][1]!r} and the rest needs indices "
                           f"0..{len(parts) - 1} once each, got {idx}")
    values = [p[2] for p in parts]
    first = values[0]
    if any(tuple(v.shape) != tuple(first.shape) for v in values):
        raise WeightsError(f"{target}: stacked tensors differ in shape "
                           f"({sorted({tuple(v.shape) for v in values})})")
    if isinstance(first, QuantizedTensor):
        if any(not isinstance(v, QuantizedTensor) or v.encoding != first.encoding
               for v in values):
            raise WeightsError(f"{target}: stacked tensors differ in encoding")
        return QuantizedTensor(np.stack([v.data for v in values]),
                               (len(values), *first.shape), first.encoding)
    if any(isinstance(v, QuantizedTensor) for v in values):
        raise WeightsError(f"{target}: stacked tensors differ in encoding")
    return np.stack([np.asarray(v) for v in values])


def _without_prefix(name: str, prefixes, exact: dict, patterns: list) -> str:
    """``name``, or ``name`` without the first of ``prefixes`` after which a mapping entry
    matches it (checkpoints that nest the same model under another module). Entries
    without ``*`` are tried first, the whole name before the stripped one; then the
    ``*`` patterns, the stripped name first (``"*": "*"`` would match any name whole)."""
    def known(n, star):
        return (not star and n in exact) or any(
            rx.fullmatch(n) for rx, key, _ in patterns if ("*" in key) == star)

    for star in (False, True):
        if not star and known(name, star):
            return name
        for p in prefixes:
            if name.startswith(p) and known(name[len(p):], star):
                return name[len(p):]
        if star and known(name, star):
            return name
    return name


def _split_targets(source: str, target) -> list[str]:
    """The target names of one mapping entry: a string, a fallback's name, or a split's
    list (checked)."""
    if isinstance(target, str):
        return [target]
    if isinstance(target, dict) and set(target) == {"fallback"}:
        if not isinstance(target["fallback"], str) or not target["fallback"]:
            raise WeightsError(f"mapping {source!r}: a fallback target is one spec name, got "
                               f"{target['fallback']!r}")
        return [target["fallback"]]
    if isinstance(target, dict) and set(target) == {"name", "when"}:
        if not (isinstance(target["name"], str) and target["name"]
                and isinstance(target["when"], str)):
            raise WeightsError(f"mapping {source!r}: a conditional target is {{name: spec "
                               f"name, when: \"{{expression}}\"}}, got {target!r}")
        return [target["name"]]
    if not isinstance(target, dict) or set(target) - {"split", "axis", "sizes", "interleaved"} \
            or not isinstance(target.get("split"), list) or len(target["split"]) < 2 \
            or not all(isinstance(t, str) and t for t in target["split"]):
        raise WeightsError(f"mapping {source!r}: target must be a string, null or "
                           f"{{split: [two or more names], axis: a, sizes: [...]}}, got "
                           f"{target!r}")
    if not set(_PLACEHOLDER.findall(source)) <= set().union(
            *(_PLACEHOLDER.findall(t) for t in target["split"])):
        raise WeightsError(f"mapping {source!r}: a split's targets must use every "
                           "placeholder of the source (no stacking)")
    return list(target["split"])


def _when_target(target: dict, m, params: dict, source: str):
    """A ``{name, when}`` entry's spec name for the tensor that matched (``m``: its
    placeholders' values, None for an exact name), or None when ``when`` is false
    (the tensor is dropped, as by a ``null`` entry)."""
    from ..spec.expr import ExprError, render

    values = {} if m is None else {k: int(v) for k, v in m.groupdict().items()
                                   if not k.startswith("_star")}
    try:
        keep = render(target["when"], {**params, **values})
    except ExprError as e:
        raise WeightsError(f"mapping {source!r}: when {target['when']!r}: {e}") from None
    if not isinstance(keep, bool):
        raise WeightsError(f"mapping {source!r}: when {target['when']!r} gives {keep!r}, "
                           "expected true or false")
    return target["name"] if keep else None


def _split_part(value, k: int, rule: dict, params: dict):
    """Part ``k`` of ``value`` cut along ``rule['axis']`` as the split ``rule`` says."""
    n = len(rule["split"])
    axis = rule.get("axis", 0)
    shape = tuple(value.shape)
    if not isinstance(axis, int) or isinstance(axis, bool) or not -len(shape) <= axis < len(shape):
        raise WeightsError(f"axis {axis!r} is not an axis of a {len(shape)}-D tensor")
    axis %= len(shape)
    total = shape[axis]
    raw = rule.get("sizes")
    if rule.get("interleaved"):                # part k: every n-th entry from k
        if raw is not None or total % n:
            raise WeightsError(f"an interleaved split cuts {total} along axis {axis} into "
                               f"{n} equal parts, no sizes")
        cut = [slice(None)] * len(shape)
        cut[axis] = slice(k, None, n)
        return _cut(value, tuple(cut), axis, total // n)
    if raw is None:
        if total % n:
            raise WeightsError(f"{total} along axis {axis} does not cut into {n} equal parts")
        sizes = [total // n] * n
    else:
        sizes = [_param(v, params, "split sizes") for v in raw]
        if len(sizes) != n or not all(isinstance(v, int) and not isinstance(v, bool)
                                      for v in sizes):
            raise WeightsError(f"sizes {raw!r}: {n} ints (or params) expected")
        if sizes.count(-1) > 1 or any(v < -1 for v in sizes):
            raise WeightsError(f"sizes {sizes}: at most one -1, the rest >= 0")
        if -1 in sizes:
            sizes[sizes.index(-1)] = total - (sum(sizes) + 1)
        if sum(sizes) != total or min(sizes) < 0:
            raise WeightsError(f"sizes {sizes} do not add up to {total} along axis {axis}")
    start = sum(sizes[:k])
    cut = [slice(None)] * len(shape)
    cut[axis] = slice(start, start + sizes[k])
    return _cut(value, tuple(cut), axis, sizes[k])


def _cut(value, index: tuple, axis: int, size: int):
    """``value[index]`` (a slice along ``axis`` of ``size`` entries) as a C-order copy;
    a QuantizedTensor keeps its blocks (any axis but its last)."""
    shape = tuple(value.shape)
    if isinstance(value, QuantizedTensor):
        if axis == len(shape) - 1:
            raise WeightsError("a quantized tensor splits along any axis but its last "
                               "(the blocks)")
        data = np.ascontiguousarray(np.asarray(value.data)[index])
        return QuantizedTensor(data, shape[:axis] + (size,) + shape[axis + 1:], value.encoding)
    return np.ascontiguousarray(np.asarray(value)[index])


def _param(value, params: dict, where: str):
    if isinstance(value, str):
        key = value[1:-1] if value.startswith("{") and value.endswith("}") else value
        if key not in params:
            raise WeightsError(f"{where}: unknown parameter {value!r} "
                               f"(known: {', '.join(sorted(params)) or 'none'})")
        return params[key]
    return value


def _same_tensor(a, b) -> bool:
    """The same encoding, shape and bytes (a checkpoint that saved one tensor twice)."""
    if isinstance(a, QuantizedTensor) or isinstance(b, QuantizedTensor):
        return (isinstance(a, QuantizedTensor) and isinstance(b, QuantizedTensor)
                and a.encoding == b.encoding and tuple(a.shape) == tuple(b.shape)
                and np.array_equal(np.asarray(a.data), np.asarray(b.data)))
    a, b = np.asarray(a), np.asarray(b)
    return a.dtype == b.dtype and a.shape == b.shape and np.array_equal(a, b)


def _fmt_names(names: list[str], limit: int = 5) -> str:
    shown = ", ".join(names[:limit])
    return f"{len(names)} ({shown}{', ...' if len(names) > limit else ''})"


def remap(td, tensors: dict, transforms: dict | None = None, params: dict | None = None,
          expected=None, prefixes=(), known=None) -> TensorDict:
    """Rename ``td``'s tensors by the ``tensors`` patterns and apply ``transforms``.

    Args:
        td: source TensorDict (e.g. Hugging Face names).
        tensors: ``{source pattern: target pattern or None}``; ``{i}`` matches an integer,
            ``*`` (in a source whose target is None) any text.
        transforms: ``{glob on target name: {transform: value, ...}}``.
        params: values for transform parameters given by name (``n_heads``).
        expected: optional target names that must all be produced.
        known: optional every target name the model has (required or not): a source a
            pattern maps to any other name is reported as unexpected, with its target.
        prefixes: prefixes a source name may carry before the names ``tensors`` lists
            (``"vision_model."``): a name no entry matches is tried without each, in
            order.

    Returns:
        A new TensorDict with target names; untransformed values are shared with
        ``td`` (no copy); ``metadata`` is a copy of ``td.metadata``.

    Raises:
        WeightsError: one error listing every source tensor no pattern maps
            ("unexpected") and every expected target not produced ("missing"),
            first few of each with counts; or a transform that does not apply.

    Example::

        hf = md.load_weights("llama-hf/")
        td = remap(hf, {"model.layers.{i}.self_attn.q_proj.weight": "blk.{i}.attn_q.weight"},
                   {"blk.*.attn_q.weight": {"permute_qk": "n_heads"}}, {"n_heads": 32})
    """
    transforms = transforms or {}
    params = params or {}
    exact = {s: t for s, t in tensors.items() if not _is_pattern(s)}
    # patterns in the order written: the first that matches a name takes it
    patterns = [(_compile(s), s, t) for s, t in tensors.items() if _is_pattern(s)]
    for s, t in tensors.items():
        if t is None:
            continue
        named = t["name"] if isinstance(t, dict) and set(t) == {"name", "when"} else t
        if "*" in s and (not isinstance(named, str) or named.count("*") != s.count("*")):
            raise WeightsError(f"mapping {s!r} -> {t!r}: a '*' pattern keeps its text: the "
                               "target is one name with as many '*' ({name, when} or null, "
                               "to drop)")
        if "*" in str(named) and "*" not in s:
            raise WeightsError(f"mapping {s!r} -> {t!r}: a '*' in the target needs one in "
                               "the source")
        for one in _split_targets(s, t):
            extra = set(_PLACEHOLDER.findall(one)) - set(_PLACEHOLDER.findall(s))
            if extra:
                raise WeightsError(f"mapping {s!r} -> {one!r}: target uses "
                                   f"{{{sorted(extra)[0]}}} which the source pattern does "
                                   "not capture")

    renamed: dict[str, str] = {}      # target -> source
    stacked: dict[str, list] = {}     # target -> [(index, source)]
    unexpected: list[str] = []
    split_of: dict[str, tuple] = {}   # target -> (part index, split rule)
    matched: dict[str, str] = {}      # source name -> the mapping key it matched
    fallback: dict[str, str] = {}     # target -> source, taken when nothing else maps there
    for name in td.keys():
        stack_at, m = None, None
        bare = _without_prefix(name, prefixes, exact, patterns) if prefixes else name
        if bare in exact:
            target = exact[bare]
            matched[name] = bare
            if isinstance(target, dict) and "when" in target:
                target = _when_target(target, None, params, bare)
        else:
            for rx, key, t in patterns:
                m = rx.fullmatch(bare)
                if m:
                    matched[name] = key
                    if isinstance(t, dict) and "when" in t:    # a name, or dropped
                        t = _when_target(t, m, params, key)
                    if t is None or not isinstance(t, str):
                        target = t
                        break
                    target = _fill(t, m)
                    free = [k for k in rx.groupindex
                            if "{" + k + "}" not in t and not k.startswith("_star")]
                    if len(free) == 1:          # two or more: ambiguous, no stacking
                        stack_at = int(m.group(free[0]))
                    break
            else:
                unexpected.append(name)
                continue
        if target is None:
            continue
        if isinstance(target, dict) and "fallback" in target:   # only if nothing else maps
            one = target["fallback"]
            if m is not None:
                one = _PLACEHOLDER.sub(lambda p: str(int(m.group(p.group(1)))), one)
            fallback.setdefault(one, name)
            continue
        if not isinstance(target, str):        # a split: one target per part
            rule = tensors[matched[name]]
            names = [_PLACEHOLDER.sub(lambda p: str(int(m.group(p.group(1)))), t)
                     if m is not None else t for t in rule["split"]]
            for k, part in enumerate(names):
                if part in renamed:
                    raise WeightsError(f"mapping: {renamed[part]!r} and {name!r} both map "
                                       f"to {part!r}")
                renamed[part] = name
                split_of[part] = (k, rule)
            continue
        if stack_at is not None:
            stacked.setdefault(target, []).append((stack_at, name))
            if target not in renamed:
                renamed[target] = name
            continue
        if target in renamed:
            if _same_tensor(td[renamed[target]], td[name]):
                continue            # one tensor saved twice (T5's tied shared / embed_tokens)
            raise WeightsError(f"mapping: {renamed[target]!r} and {name!r} both map to "
                               f"{target!r} and differ")
        renamed[target] = name
    for target, name in fallback.items():
        renamed.setdefault(target, name)

    missing = [t for t in (expected or ()) if t not in renamed]
    if known is not None:       # mapped, but to a name the model has no weight of
        unexpected += [f"{src} (as {t})" for t, src in renamed.items()
                       if t not in known]
    if missing or unexpected:
        parts = []
        if missing:
            parts.append(f"missing {_fmt_names(missing)}")
        if unexpected:
            parts.append(f"unexpected {_fmt_names(unexpected)}")
        raise WeightsError("weights do not match the spec's mapping: " + "; ".join(parts))

    import copy

    out = TensorDict(metadata=copy.deepcopy(getattr(td, "metadata", {})))
    for target, source in renamed.items():
        if target in stacked:
            value = _stack(target, [(i, src, td[src]) for i, src in stacked[target]])
        else:
            value = td[source]
        if target in split_of:
            k, rule = split_of[target]
            try:
                value = _split_part(value, k, rule, params)
            except (WeightsError, ValueError, TypeError) as e:
                raise WeightsError(f"{target} (from {source}): split: {e}") from None
        for glob, spec in transforms.items():
            if not fnmatch.fnmatchcase(target, glob):
                continue
            if not isinstance(spec, dict):
                raise WeightsError(f"transforms {glob!r}: a mapping of transform: value "
                                   f"expected, got {spec!r}")
            for kind, raw in spec.items():
                where = f"{target} (from {source}): {kind}"
                if kind not in TRANSFORMS:
                    raise WeightsError(f"{where}: unknown transform (known: "
                                       f"{', '.join(TRANSFORMS)})")
                arg = _ARGS.get(kind, _param)(raw, params, where)
                try:
                    value = TRANSFORMS[kind](value, arg)
                except (WeightsError, ValueError, TypeError) as e:
                    raise WeightsError(f"{target} (from {source}): {e}") from None
        out[target] = value
    return out


def compute_tensors(computed: dict, params: dict, shapes: dict) -> dict:
    """Evaluate a spec's ``computed`` table: ``{weight name: value or "{expr}"}``.

    Each value is evaluated over ``params``; None adds nothing, a number fills the
    weight's shape (from ``shapes``), a list gives all its elements in order.

    Returns:
        ``{weight name: float32 ndarray}`` for the entries that gave a value.

    Raises:
        WeightsError: an expression that does not evaluate, or a list of the wrong
            size. A name the spec declares no weight of here (a weight only some
            configurations have) is skipped; ``maxdecl validate`` reports one that no
            variant declares.

    Example::

        compute_tensors({"rope_freqs.weight": "{[1.0] * (head_dim // 2)}"},
                        {"head_dim": 4}, {"rope_freqs.weight": (2,)})
    """
    from ..spec.expr import ExprError, render

    out = {}
    for name, raw in (computed or {}).items():
        if name not in shapes:          # a weight only other configurations declare
            continue
        try:
            value = render(raw, params)
        except ExprError as e:
            raise WeightsError(f"computed {name!r}: {e}") from None
        if value is None:
            continue
        shape = tuple(int(d) for d in shapes[name])
        try:
            arr = None if isinstance(value, (str, bool)) else np.asarray(value, np.float32)
        except (TypeError, ValueError):
            arr = None
        if arr is None or (arr.ndim and arr.size != int(np.prod(shape))):
            raise WeightsError(f"computed {name!r}: expected a number or a list of "
                               f"{int(np.prod(shape))} numbers for shape {list(shape)}, "
                               f"got {value!r}")
        out[name] = np.ascontiguousarray(np.broadcast_to(arr, shape) if arr.ndim == 0
                                         else arr.reshape(shape))
    return out
