"""Runtime of the transformer ops (``maxdecl.ops.transformer``): embedding rows (decoded
only for the ids gathered), the numba rope and attention kernels, and the KV cache."""

from __future__ import annotations

import math

import numpy as np

from .. import codecs
from ..tensors import QuantizedTensor
from . import attention, rope
from .kv_cache import append_kv


def _embedding_run(args, attrs):
    table, ids = args
    flat = np.asarray(ids).reshape(-1).astype(np.int64, copy=False)
    vocab = table.shape[0]
    if flat.size and (flat.min() < 0 or flat.max() >= vocab):
        bad = flat.min() if flat.min() < 0 else flat.max()
        raise IndexError(f"id {bad} is out of range for a table of {vocab} rows")
    if isinstance(table, QuantizedTensor):
        k = table.shape[1]
        rows = codecs.get(table.encoding).dequantize(table.data[flat], (flat.size, k))
        return [np.asarray(rows, np.float32).reshape(ids.shape + (k,))]
    return [np.take(table, flat, axis=0).reshape(ids.shape + (table.shape[1],))]


def _rope_run(args, attrs):
    k = rope
    x, pos, *factors = args
    dim = attrs["dim"] or x.shape[-1]
    out = k.rope(x, pos, attrs["theta"], attrs["style"] == "neox", attrs["scale"], dim,
                 factors[0] if factors else None)
    return [out.astype(x.dtype, copy=False)]


def _attention_run(args, attrs):
    kern = attention
    q, k, v, *rest = args
    new_cache = None
    if rest:
        past = rest[0]
        if k.shape != v.shape or past.shape[-2:] != k.shape[-2:] or past.ndim != k.ndim + 1:
            raise ValueError(f"a kv_cache {list(past.shape)} needs k and v of one shape with its "
                             f"heads and head_dim, got k {list(k.shape)}, v {list(v.shape)}")
        new_cache = append_kv(past, k, v)
        k, v = new_cache[0], new_cache[1]
    *qb, s, hq, d = q.shape
    t = k.shape[-3]
    batch = tuple(qb)
    q3 = q.reshape((-1, s, hq, d))
    if k.shape[:-3] == batch and v.shape[:-3] == batch:     # the usual case: no broadcast
        k3 = k.reshape((-1,) + k.shape[-3:])
        v3 = v.reshape((-1,) + v.shape[-3:])
    else:
        k3 = np.broadcast_to(k, batch + k.shape[-3:]).reshape((-1,) + k.shape[-3:])
        v3 = np.broadcast_to(v, batch + v.shape[-3:]).reshape((-1,) + v.shape[-3:])
    scale = attrs["scale"] if attrs["scale"] is not None else 1.0 / math.sqrt(d)
    out = kern.attention(q3, k3, v3, scale, attrs["causal"], attrs["sliding_window"],
                         attrs["alibi_slopes"], attrs["softcap"], t - s)
    out = out.reshape(batch + (s, hq, v.shape[-1])).astype(q.dtype, copy=False)
    return [out] if new_cache is None else [out, new_cache]


RUN = {"embedding": _embedding_run, "rope": _rope_run, "attention": _attention_run}
