"""Transformer ops: ``embedding``, ``rope`` and ``attention`` (numba kernels).

Layouts follow Hugging Face / llama.cpp activations: ``[..., seq, heads, head_dim]``.
Float math is float32; outputs take the dtype of the float input (``x`` / ``q``).
"""

from __future__ import annotations

from ..dtypes import DType, TensorType, format_shape
from . import _checks
from ._registry import define, public

__all__ = ["embedding", "rope", "attention"]


# -- embedding --------------------------------------------------------------------------
def _embedding_rule(inputs, attrs):
    table, ids = inputs
    _checks.int_input(ids, "ids")
    if table.rank != 2:
        raise ValueError(f"table must be [vocab, dim], got {table.type}")
    if table.is_quantized:
        return [TensorType(DType.float32, ids.shape + (table.logical_shape[1],))]
    return [TensorType(table.dtype, ids.shape + (table.shape[1],))]


define("embedding", rule=_embedding_rule, run="transformer", inputs=("table", "ids"),
       kind="transformer", packed=("table",), doc="rows of table (float or quantized) picked by integer ids",
       rule_doc="table [vocab, dim] (quantized gives float32), ids integer -> [*ids, dim]")


@public
def embedding():  # noqa: A001 - the signature comes from the definition
    """Rows of ``table`` ``[vocab, dim]`` picked by integer ``ids``: ``[*ids.shape, dim]``.

    A quantized table (``g.quantize`` / a quantized weight) dequantizes only the rows
    it gathers and gives float32.
    """


# -- rope -------------------------------------------------------------------------------
def _normalize_rope(attrs):
    style = str(attrs["style"]).lower()
    if style not in ("normal", "neox"):
        raise ValueError(f"style must be 'normal' (GGML adjacent pairs) or 'neox' (halves), "
                         f"got {attrs['style']!r}")
    dim = attrs["dim"]
    return {**attrs, "theta": float(attrs["theta"]), "scale": float(attrs["scale"]),
            "style": style, "dim": None if dim is None else int(dim)}


def _rope_rule(inputs, attrs):
    x, pos, *factors = inputs
    _checks.float_input(x)
    _checks.no_bfloat16(x)
    _checks.int_input(pos, "positions")
    if x.rank < 3:
        raise ValueError(f"x must be [..., seq, heads, head_dim], got {format_shape(x.shape)}")
    per_row = pos.rank == x.rank - 2 and pos.rank > 1 and all(
        _checks.dims_equal(a, b) for a, b in zip(pos.shape, x.shape[:-2]))
    if not per_row and (pos.rank != 1 or not _checks.dims_equal(pos.shape[0], x.shape[-3])):
        raise ValueError(f"positions{format_shape(pos.shape)} must be [seq] with seq = "
                         f"{x.shape[-3]}, or x's leading dims {format_shape(x.shape[:-2])} "
                         f"(a position per row: left padding) (x{format_shape(x.shape)})")
    hd = x.shape[-1]
    dim = attrs["dim"]
    if not isinstance(hd, int):
        raise ValueError(f"head_dim of x{format_shape(x.shape)} must be static")
    rot = hd if dim is None else dim
    if rot <= 0 or rot % 2 or rot > hd:
        raise ValueError(f"rotated dim {rot} must be even and in 2..{hd} (head_dim)")
    if attrs["theta"] <= 0 or attrs["scale"] <= 0:
        raise ValueError(f"theta ({attrs['theta']}) and scale ({attrs['scale']}) must be > 0")
    if factors:
        f = factors[0]
        _checks.float_input(f, "freq_factors")
        _checks.no_bfloat16(f)
        if f.rank != 1 or not _checks.dims_equal(f.shape[0], rot // 2):
            raise ValueError(f"freq_factors{format_shape(f.shape)} must be [{rot // 2}] "
                             f"(one per rotated pair of x{format_shape(x.shape)})")
    return [x]


define("rope", rule=_rope_rule, run="transformer", inputs=("x", "positions"),
       call_order=("theta", "style", "scale", "dim", "freq_factors"),
       optional=("freq_factors",),
       attrs={"theta": 10000.0, "style": "normal", "scale": 1.0, "dim": None},
       normalize=_normalize_rope, kind="transformer",
       doc="rotary position embedding on x[..., seq, heads, head_dim]; freq_factors[dim // 2] "
           "divide the rotation frequencies; the angles and their cos and sin are computed "
           "in float64, then rounded to float32",
       rule_doc="x float [..., seq, heads, head_dim] (head_dim static), positions integer [seq] "
                "or x's leading dims [..., seq] (a position per row), freq_factors "
                "[dim // 2]; out: the type of x")


@public
def rope():  # noqa: A001 - the signature comes from the definition
    """Rotary position embedding on ``x`` ``[..., seq, heads, head_dim]``.

    Pair ``i`` (of ``dim // 2``, default ``head_dim // 2``) at position ``p`` rotates by
    ``(p / scale) * theta ** (-2i / dim) / freq_factors[i]`` (factors default to 1;
    llama.cpp's ``rope_freqs``, Llama 3.1 scaling). ``style="normal"``: pairs
    ``(x[2i], x[2i+1])`` (GGML's default rope); ``"neox"``: pairs ``(x[i], x[i + dim/2])``
    (Hugging Face's ``rotate_half``). ``dim``: how many leading features of each head
    rotate (partial rotary, HF's ``partial_rotary_factor * head_dim``); features past
    ``dim`` pass through unchanged. ``scale``: linear position scaling (positions are
    divided by it, HF's ``rope_scaling`` of type ``linear``).

    Most Hugging Face checkpoints (Llama, Qwen2, Gemma, Phi-3, ...) rotate halves: run
    them with ``style: neox``. llama.cpp's converter reorders Llama-family q/k rows so
    that GGUF files rotate adjacent pairs (``normal``); a spec that reads both formats
    keeps ``normal`` and gives the HF weights the ``permute_qk`` transform (spec.md,
    Foreign formats), as ``specs/llama3.yaml`` does. Some rotate adjacent pairs in HF
    too (Cohere's ``repeat_interleave`` / ``x[..., ::2]``, GPT-J's
    ``rotate_every_two``, the dense GLM-4's partial rotary, ``Glm4ForCausalLM``):
    ``normal``, no ``permute_qk``; GLM-4 MoE (``Glm4MoeForCausalLM``) rotates halves,
    ``neox``. ``dim`` must be even and in 2..head_dim.

    Example::

        q = md.ops.rope(q, positions, theta=500000.0, style="neox")
    """


# -- attention --------------------------------------------------------------------------
def _normalize_attention(attrs):
    out = dict(attrs)
    out["causal"] = bool(attrs["causal"])
    out["scale"] = None if attrs["scale"] is None else float(attrs["scale"])
    w = attrs["sliding_window"]
    if w is not None and (not isinstance(w, int) or isinstance(w, bool) or w < 0):
        raise ValueError(f"sliding_window must be a positive int, 0 or None (no window), "
                         f"got {w!r}")
    out["sliding_window"] = w or None
    c = attrs["chunk"]
    if c is not None and (not isinstance(c, int) or isinstance(c, bool) or c < 0):
        raise ValueError(f"chunk must be a positive int, 0 or None (no chunks), got {c!r}")
    out["chunk"] = c or None
    if out["chunk"] and out["sliding_window"]:
        raise ValueError("sliding_window and chunk exclude each other: give one")
    out["alibi_slopes"] = (None if attrs["alibi_slopes"] is None
                           else tuple(float(s) for s in attrs["alibi_slopes"]))
    cap = attrs["softcap"]
    if cap is not None and float(cap) <= 0:
        raise ValueError(f"softcap must be > 0 or None, got {cap!r}")
    out["softcap"] = None if cap is None else float(cap)
    return out


def _attention_rule(inputs, attrs):
    q, k, v, *rest = inputs
    cache = rest[0] if rest else None
    sinks = rest[1] if len(rest) > 1 else None
    for val, what in ((q, "q"), (k, "k"), (v, "v")) + (((cache, "kv_cache"),) if rest else ()):
        _checks.float_input(val, what)
    _checks.no_bfloat16(q)
    _checks.same_dtype(q, k, v, *rest[:1])
    if q.rank < 3 or k.rank != q.rank or v.rank != q.rank:
        raise ValueError(f"q, k, v must share a rank >= 3 ([..., seq, heads, head_dim]); got "
                         f"q{format_shape(q.shape)}, k{format_shape(k.shape)}, "
                         f"v{format_shape(v.shape)}")
    *qb, s, hq, d = q.shape
    *kb, t, hkv, dk = k.shape
    *vb, tv, hv, dv = v.shape
    batch = _checks.broadcast_shapes(tuple(qb), tuple(kb), tuple(vb))
    if tuple(batch) != tuple(qb):
        raise ValueError(f"k/v batch dims {format_shape(kb)} must broadcast to q's "
                         f"{format_shape(qb)}")
    if not _checks.dims_equal(d, dk):
        raise ValueError(f"q head_dim {d} != k head_dim {dk} (q{format_shape(q.shape)}, "
                         f"k{format_shape(k.shape)})")
    if not (_checks.dims_equal(t, tv) and _checks.dims_equal(hkv, hv)):
        raise ValueError(f"k{format_shape(k.shape)} and v{format_shape(v.shape)} must share "
                         "seq and heads")
    if not (isinstance(hq, int) and isinstance(hkv, int)) or hkv < 1 or hq % hkv:
        raise ValueError(f"query heads {hq} must be a multiple of kv heads {hkv}")
    slopes = attrs["alibi_slopes"]
    if slopes is not None and len(slopes) != hq:
        raise ValueError(f"alibi_slopes has {len(slopes)} values, expected one per query "
                         f"head ({hq})")
    if sinks is not None:
        _checks.float_input(sinks, "sinks")
        if sinks.rank != 1 or not _checks.dims_equal(sinks.shape[0], hq):
            raise ValueError(f"sinks{format_shape(sinks.shape)} must be [{hq}]: one logit "
                             f"per query head")
    out = TensorType(q.dtype, (*qb, s, hq, dv))
    if cache is None:
        return [out]
    two, *cb, tp, ch, cd = cache.shape if cache.rank >= 4 else (None,) * 4
    width = dk
    if not _checks.dims_equal(dk, dv):      # both kept at the wider head_dim
        if not (isinstance(dk, int) and isinstance(dv, int)):
            raise ValueError(f"a kv_cache for k and v of different head_dims needs both "
                             f"known, got {dk} and {dv}")
        width = max(dk, dv)
    want = f"[2, {', '.join(str(x) for x in kb)}{', ' if kb else ''}T_past, {hkv}, {width}]"
    if (cache.rank != k.rank + 1 or two != 2 or tuple(cb) != tuple(kb)
            or not _checks.dims_equal(ch, hkv) or not _checks.dims_equal(cd, width)):
        raise ValueError(f"kv_cache{format_shape(cache.shape)} must be {want}")
    new = TensorType(q.dtype, (2, *kb, _checks.add_dims(tp, t), hkv, width))
    return [out, new]


_ATTENTION_ATTRS = {"causal": True, "scale": None, "sliding_window": None, "chunk": None,
                    "alibi_slopes": None, "softcap": None}
define("attention", rule=_attention_rule, run="transformer", inputs=("q", "k", "v"),
       optional=("kv_cache", "sinks"), attrs=dict(_ATTENTION_ATTRS),
       outputs=lambda n, attrs: 2 if n >= 4 else 1, normalize=_normalize_attention,
       outputs_doc="out; with `kv_cache` also the new cache",
       sequence_axis=-3, sequence_inputs=("q", "k", "v"), state={"kv_cache": 1},
       kind="transformer",
       doc="grouped-query attention on [..., seq, heads, head_dim]; with kv_cache also "
           "returns the new cache",
       rule_doc="q [..., S, Hq, D], k [..., T, Hkv, D], v [..., T, Hkv, Dv], Hq a multiple of "
                "Hkv, one float dtype; kv_cache [2, ..., T_past, Hkv, W] with W = max(D, "
                "Dv); sinks [Hq] -> out [..., S, Hq, Dv] (and cache [2, ..., T_past + T, "
                "Hkv, W])")


@public
def attention():  # noqa: A001 - the signature comes from the definition
    """Scaled dot-product attention with grouped-query heads.

    q ``[..., S, Hq, D]``, k ``[..., T, Hkv, D]``, v ``[..., T, Hkv, Dv]`` (Hq a multiple
    of Hkv; query head h reads kv head ``h // (Hq // Hkv)``). The leading dims of k and
    v broadcast to q's, not the other way (a learned query shared by a batch is brought
    to it with ``expand_as`` first). Query i sits at absolute position
    ``T_total - S + i``, which matters only to ``causal`` and ``sliding_window``: with
    ``causal: false`` S and T are free, so q may come from another source than k and v
    (cross-attention, an attention-pooling probe). Scores: ``s = (q . k) * scale`` (default
    ``1/sqrt(D)``), then ``softcap * tanh(s / softcap)``, then ``+ slope_h * (j - i)``
    (ALiBi); a query at i sees key j when ``j <= i`` (causal) and ``i - j < W``
    (``sliding_window``); without ``causal`` the window is two-sided, ``|i - j| < W``
    (ModernBERT's local attention over ``local_attention // 2`` either side is ``W =
    local_attention // 2 + 1``). ``chunk``: an int C (None or 0: none), chunk-local
    attention (Llama 4's ``attention_chunk_size``): a query at i sees key j only when
    ``i // C == j // C`` (and ``j <= i`` when causal); it excludes ``sliding_window``. A
    query that sees no key gives zeros.

    ``alibi_slopes``: a list of Hq floats (slope_h for query head h), e.g. the
    expression ``alibi_slopes(n_heads, 8.0)``; HF's BLOOM adds ``slope_h * j``, which
    the softmax makes the same as ``slope_h * (j - i)``. ``softcap``: a float (0 or
    None: none). ``sliding_window``: an int W (None or 0: none).

    With ``kv_cache`` ``[2, ..., T_past, Hkv, D]`` (k and v stacked; T_past may be 0),
    the keys are the cache followed by this step's k, v, and the op returns
    ``(out, new_cache)`` with ``new_cache`` ``[2, ..., T_past + T, Hkv, D]``;
    without it, returns ``out`` ``[..., S, Hq, Dv]``. Keys and values of different
    widths (multi-head latent attention's ``v_head_dim``, MiniCPM3, DeepSeek-V2 in
    transformers' layout) share a cache of the wider one, ``max(D, Dv)``, each zero-padded
    there; the output is ``[..., S, Hq, Dv]`` and the default scale ``1/sqrt(D)``.

    ``sinks`` ``[Hq]`` (after ``kv_cache``): one learned logit per query head that joins
    every softmax's denominator and takes no value (gpt-oss's attention sinks: the
    probabilities of ``softmax([s_0 .. s_T, sink_h])`` without the last). It comes
    after the cache in ``in:``; a graph without a cache passes an empty one (a
    ``[2, 0, Hkv, D]`` input or constant) to reach it.

    Example::

        out, cache = md.ops.attention(q, k, v, kv_cache=cache)
        out, cache = md.ops.attention(q, k, v, cache, sinks)
    """


# -- attention with a mask -------------------------------------------------------------
def _masked_attention_rule(inputs, attrs):
    q, k, v, mask, *rest = inputs
    outs = _attention_rule([q, k, v, *rest], attrs)
    *qb, s, hq, _ = q.shape
    t = k.shape[-3]
    if rest and rest[0].rank >= 4:
        t = _checks.add_dims(rest[0].shape[-3], t)
    if mask.dtype not in (q.dtype, DType.bool):
        raise TypeError(f"mask must be bool or q's dtype {q.dtype}, got {mask}")
    scores = (*qb, hq, s, t)
    try:
        fits = tuple(_checks.broadcast_shapes(mask.shape, scores)) == scores
    except ValueError:
        fits = False
    if not fits:
        raise ValueError(f"mask{format_shape(mask.shape)} must broadcast to the scores "
                         f"{format_shape(scores)} ([..., heads, queries, keys], the keys "
                         "after the cache's)")
    return outs


define("masked_attention", rule=_masked_attention_rule, run="transformer",
       inputs=("q", "k", "v", "mask"), optional=("kv_cache", "sinks"),
       attrs=dict(_ATTENTION_ATTRS),
       outputs=lambda n, attrs: 2 if n >= 5 else 1, normalize=_normalize_attention,
       outputs_doc="out; with `kv_cache` also the new cache",
       sequence_axis=-3, sequence_inputs=("q", "k", "v"), state={"kv_cache": 1},
       kind="transformer",
       doc="attention with an additive (float) or allowed-keys (bool) mask over the "
           "scores [..., heads, queries, keys]",
       rule_doc="as attention; mask bool or q's dtype, broadcasting to "
                "[..., Hq, S, T_past + T]")


@public
def masked_attention():  # noqa: A001 - the signature comes from the definition
    """``attention`` with a mask on the scores, as torch's
    ``scaled_dot_product_attention(attn_mask=...)``.

    ``mask`` broadcasts to the scores ``[..., Hq, S, T]`` (T: the keys after the
    cache's): a float mask is added to them after the scale, soft-capping and ALiBi (T5's
    relative position bias ``[heads, S, T]``, a padding mask of 0 and -inf ``[batch, 1,
    1, T]``); a bool mask says which keys each query may see (True: may). ``causal``,
    ``sliding_window``, ``chunk``, ``alibi_slopes`` and ``softcap`` apply as in ``attention``
    (``causal`` defaults to True: set it false for an encoder); a key must pass the mask
    and the causal and window rules both, so a band plus a few global keys (Longformer)
    is a mask alone, without ``sliding_window``. A query that sees no key
    (every key False, -inf, or outside the causal or window mask) gives zeros (torch
    gives NaN); a large finite negative mask (transformers' ``finfo.min``) still counts
    as seen, so a query whose keys all get it averages them as torch does. ``sinks``
    (after ``kv_cache``) as in ``attention``. A 0-d ``0.0`` constant is a mask that
    masks nothing, so one block serves a tower with a padding mask and one without; the
    tower without one runs faster through ``attention``.
    Runs a plain float32 path, not the fused attention kernels, and refuses a batched
    step (``rows=``: the mask cannot be cut per sequence).
    """


__all__ += ["masked_attention"]
