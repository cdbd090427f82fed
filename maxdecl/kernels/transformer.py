"""Runtime of the transformer ops (``maxdecl.ops.transformer``): embedding rows (decoded
only for the ids gathered), the numba rope and attention kernels, and the KV cache."""

from __future__ import annotations

import math

import numpy as np

from .. import codecs
from ..tensors import QuantizedTensor
from . import attention, rope
from .attention_rows import cached_rows, check_heads, check_rows, packed_rows
from .block_rows import KINDS, gather_rows
from .kv_cache import append_kv, kv_addresses, reserve_rows
from .step_outputs import writes_into

FEW_ROWS = 16  # up to this many query rows (a decode or lookup-verify step) per sequence


@writes_into
def _embedding_run(args, attrs, out=None):
    table, ids = args
    flat = np.asarray(ids).reshape(-1).astype(np.int64, copy=False)
    vocab = table.shape[0]
    if flat.size and (flat.min() < 0 or flat.max() >= vocab):
        bad = flat.min() if flat.min() < 0 else flat.max()
        raise IndexError(f"id {bad} is out of range for a table of {vocab} rows")
    if isinstance(table, QuantizedTensor):
        k = table.shape[1]
        data = table.data
        if (flat.size <= FEW_ROWS and table.encoding in KINDS and data.ndim == 2
                and data.dtype == np.uint8 and data.flags.c_contiguous):  # decode: serially
            rows = gather_rows(data, table.encoding, k, flat, out)
        else:
            rows = codecs.get(table.encoding).dequantize(data[flat], (flat.size, k))
        return [np.asarray(rows, np.float32).reshape(ids.shape + (k,))]
    return [np.take(table, flat, axis=0).reshape(ids.shape + (table.shape[1],))]


@writes_into
def _rope_run(args, attrs, out=None):
    k = rope
    x, pos, *factors = args
    dim = attrs["dim"] or x.shape[-1]
    y = k.rope(x, pos, attrs["theta"], attrs["style"] == "neox", attrs["scale"], dim,
               factors[0] if factors else None, out)
    return [y.astype(x.dtype, copy=False)]


def _with_cache(k, v, rest):
    """(k, v, new cache or None): this step's k, v after the cached ones, if any."""
    if not rest:
        return k, v, None
    past = rest[0]
    if k.shape != v.shape or past.shape[-2:] != k.shape[-2:] or past.ndim != k.ndim + 1:
        raise ValueError(f"a kv_cache {list(past.shape)} needs k and v of one shape with its "
                         f"heads and head_dim, got k {list(k.shape)}, v {list(v.shape)}")
    new_cache = append_kv(past, k, v)
    if new_cache.ndim == 4 and new_cache.room is not None:   # plain views of the buffer
        buf, t = new_cache.room[0], new_cache.shape[1]
        return buf[0, :t], buf[1, :t], new_cache
    return new_cache[0], new_cache[1], new_cache


def _scale(attrs, d):
    return attrs["scale"] if attrs["scale"] is not None else 1.0 / math.sqrt(d)


def _rows_kernel(q, k, v) -> bool:
    """Whether q, k, v (after the cache) take attention_rows: a few rows, no batch dims,
    at least as many keys as queries (cross-attention may have fewer: the general path)."""
    return (q.ndim == 3 and k.ndim == 3 and v.ndim == 3 and q.shape[0] <= FEW_ROWS
            and k.shape[0] >= q.shape[0])


def _sinks(rest):
    """The sink logits among an attention node's optional inputs (kv_cache, sinks)."""
    return None if len(rest) < 2 else np.asarray(rest[1], np.float32).reshape(-1)


def _widened(run):
    """``run`` (an attention runtime) for k and v of different head_dims with a cache
    (multi-head latent attention's v_head_dim): the cache holds both at the wider one,
    so q, k and v are zero-padded to it (the zeros add nothing to a score and give zero
    columns), the scale is the true q . k width's, and the output is cut back to v's."""
    def call(args, *more, **kw):
        q, k, v, *rest = args
        if not rest or k.shape[-1] == v.shape[-1]:
            return run(args, *more, **kw)       # out= where the runtime gives one
        dv, width = v.shape[-1], max(k.shape[-1], v.shape[-1])
        attrs = {**more[-1], "scale": _scale(more[-1], q.shape[-1])}
        padded = [_pad_last(a, width) for a in (q, k, v)]
        outs = run(padded + rest, *more[:-1], attrs)
        if outs is None:
            return None
        return [np.ascontiguousarray(outs[0][..., :dv]), *outs[1:]]
    return call


def _pad_last(a, width):
    """``a`` with zeros after its last axis's entries up to ``width``."""
    if a.shape[-1] == width:
        return a
    out = np.zeros(a.shape[:-1] + (width,), a.dtype)
    out[..., :a.shape[-1]] = a
    return out


def _window(attrs) -> int | None:
    """The kernels' window argument: W > 0 a sliding window, -C chunks of C, None none."""
    chunk = attrs.get("chunk")
    return -int(chunk) if chunk else attrs["sliding_window"]


def _attention_run(args, attrs, out=None):
    kern = attention
    q, k, v, *rest = args
    sinks = _sinks(rest)
    if (rest and q.ndim == 3 and k.ndim == 3 and v.ndim == 3 and q.shape[0] <= FEW_ROWS
            and k.shape[0] == q.shape[0] == v.shape[0]):   # decode: as one batched sequence
        y, caches = _attention_batch([q, k, v, [rest[0]], *rest[1:]], [q.shape[0]], attrs,
                                     out)
        return [y, caches[0]]
    k, v, new_cache = _with_cache(k, v, rest[:1])
    if _rows_kernel(q, k, v):
        check_rows([q.shape], [k], [v], attrs["alibi_slopes"], sinks)
        out = packed_rows(np.ascontiguousarray(q, dtype=np.float32), [q.shape[0]], [k], [v],
                          _scale(attrs, q.shape[-1]), attrs["causal"], _window(attrs),
                          attrs["alibi_slopes"], attrs["softcap"],
                          [kv_addresses(new_cache) if new_cache is not None else None],
                          sinks=sinks)
        out = out.astype(q.dtype, copy=False)
        return [out] if new_cache is None else [out, new_cache]
    *qb, s, hq, d = q.shape
    t = k.shape[-3]
    batch = tuple(qb)
    nb = math.prod(batch)           # not -1: numpy cannot infer it when S or T is 0
    q3 = q.reshape((nb, s, hq, d))
    if k.shape[:-3] == batch and v.shape[:-3] == batch:     # the usual case: no broadcast
        k3 = k.reshape((nb,) + k.shape[-3:])
        v3 = v.reshape((nb,) + v.shape[-3:])
    else:
        k3 = np.broadcast_to(k, batch + k.shape[-3:]).reshape((nb,) + k.shape[-3:])
        v3 = np.broadcast_to(v, batch + v.shape[-3:]).reshape((nb,) + v.shape[-3:])
    scale = _scale(attrs, d)
    out = kern.attention(q3, k3, v3, scale, attrs["causal"], _window(attrs),
                         attrs["alibi_slopes"], attrs["softcap"], t - s, sinks)
    out = out.reshape(batch + (s, hq, v.shape[-1])).astype(q.dtype, copy=False)
    return [out] if new_cache is None else [out, new_cache]


def _attention_batch(args, rows, attrs, out=None):
    """``attention`` of a batched step in one kernel call, or None when a sequence needs
    the general path. q, k, v hold every sequence's rows one after another (axis -3);
    the kv caches are one per sequence. Returns ``[out, [cache per sequence]]`` (out in
    an array of ``out``'s, a ``StepOutputs``, where given and the caches have room)."""
    q, k, v, *rest = args
    if not (rest and q.ndim == 3 and k.ndim == 3 and v.ndim == 3 and max(rows) <= FEW_ROWS):
        return None
    sinks = _sinks(rest)
    if q.shape[2] == k.shape[2]:
        check_heads(q.shape[1], k.shape[1], attrs["alibi_slopes"], sinks)
        grown = reserve_rows(rest[0], k, v, rows)     # the steady state: room in place
        if grown is not None:
            dst, caches = grown
            y = cached_rows(np.ascontiguousarray(q, dtype=np.float32), k, v, dst,
                            _scale(attrs, q.shape[-1]), attrs["causal"], _window(attrs),
                            attrs["alibi_slopes"], attrs["softcap"], sinks, out)
            return [y.astype(q.dtype, copy=False), caches]
    caches, keys, values, start = [], [], [], 0
    for n, past in zip(rows, rest[0]):
        kk, vv, cache = _with_cache(k[start:start + n], v[start:start + n], [past])
        keys.append(kk)
        values.append(vv)
        caches.append(cache)
        start += n
    check_rows([(n,) + q.shape[1:] for n in rows], keys, values, attrs["alibi_slopes"], sinks)
    out = packed_rows(np.ascontiguousarray(q, dtype=np.float32), list(rows), keys, values,
                      _scale(attrs, q.shape[-1]), attrs["causal"], _window(attrs),
                      attrs["alibi_slopes"], attrs["softcap"],
                      [kv_addresses(c) for c in caches], sinks=sinks)
    return [out.astype(q.dtype, copy=False), caches]


def _masked_attention_run(args, attrs):
    q, k, v, mask, *rest = args
    k, v, new_cache = _with_cache(k, v, rest[:1])
    out = masked_attention(q, k, v, mask, _scale(attrs, q.shape[-1]), attrs["causal"],
                           _window(attrs), attrs["alibi_slopes"], attrs["softcap"],
                           _sinks(rest))
    out = out.astype(q.dtype, copy=False)
    return [out] if new_cache is None else [out, new_cache]


def masked_attention(q, k, v, mask, scale, causal, window, slopes, softcap,
                     sinks=None) -> np.ndarray:
    """Attention with a float (added) or bool (keys allowed) ``mask`` broadcasting to the
    scores ``[..., Hq, S, T]``, in float32 NumPy: q ``[..., S, Hq, D]``, k, v ``[..., T,
    Hkv, D|Dv]`` (k, v after the cache; their batch dims broadcast to q's); ``sinks``:
    None or one logit per query head joining each softmax's denominator."""
    *qb, s, hq, _ = q.shape
    t, hkv = k.shape[-3], k.shape[-2]
    qf = np.moveaxis(np.asarray(q, np.float32), -2, -3) * np.float32(scale)
    kf = np.moveaxis(np.asarray(k, np.float32), -2, -3)
    vf = np.moveaxis(np.asarray(v, np.float32), -2, -3)
    if hq != hkv:                                       # query head h reads h // group
        kf = np.repeat(kf, hq // hkv, axis=-3)
        vf = np.repeat(vf, hq // hkv, axis=-3)
    scores = np.matmul(qf, np.swapaxes(kf, -1, -2))    # [..., Hq, S, T]
    want = tuple(scores.shape)
    if tuple(np.broadcast_shapes(np.shape(mask), want)) != want:
        raise ValueError(f"mask {list(np.shape(mask))} does not broadcast to the scores "
                         f"{list(want)} (a batched step cannot cut a mask per sequence)")
    if softcap:
        scores = np.float32(softcap) * np.tanh(scores / np.float32(softcap))
    pos = (t - s) + np.arange(s)[:, None]              # absolute position of each query
    j = np.arange(t)[None, :]
    if slopes is not None:
        scores = scores + (np.asarray(slopes, np.float32)[:, None, None]
                           * (j - pos).astype(np.float32))
    visible = np.ones((s, t), bool)
    if causal:
        visible &= j <= pos
    if window and window > 0:
        visible &= (pos - j < window) & ((j - pos < window) | bool(causal))
    elif window:                                        # chunks of -window keys
        visible &= (pos // -window) == (j // -window)
    mask = np.asarray(mask)
    if mask.dtype == np.bool_:
        visible = visible & mask
    else:
        scores = scores + mask.astype(np.float32, copy=False)
    scores = np.where(visible, scores, -np.inf).astype(np.float32, copy=False)
    top = np.max(scores, axis=-1, keepdims=True, initial=-np.inf)   # T may be 0
    sink = None
    if sinks is not None:
        if np.size(sinks) != hq:
            raise ValueError(f"masked_attention: {np.size(sinks)} sink logits for {hq} "
                             f"query heads")
        sink = np.asarray(sinks, np.float32).reshape(hq, 1, 1)
        top = np.maximum(top, sink)
    top = np.where(np.isfinite(top), top, np.float32(0))
    e = np.where(np.isneginf(scores), np.float32(0), np.exp(scores - top))
    total = e.sum(axis=-1, keepdims=True)
    if sink is not None:
        total = total + np.exp(sink - top)
    p = e / np.where(total > 0, total, np.float32(1))
    out = np.matmul(p, np.broadcast_to(vf, tuple(qb) + vf.shape[-3:]))   # [..., Hq, S, Dv]
    return np.ascontiguousarray(np.moveaxis(out, -3, -2))


RUN = {"embedding": _embedding_run, "rope": _rope_run,
       "attention": writes_into(_widened(_attention_run)),
       "masked_attention": _widened(_masked_attention_run)}
# ops whose sequences of a batched step run in one call (runtime._per_sequence)
# (``fn(args, rows, attrs)``: row inputs of all sequences together, states per sequence;
# returns the outputs with each state output a list, one per sequence, or None)
RUN_BATCH = {"attention": writes_into(_widened(_attention_batch))}
