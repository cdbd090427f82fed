"""Attention for a few query rows of several sequences at once (decode, batched decode,
prompt-lookup verify), each sequence reading its own KV cache in place.

One call serves a whole batch: the rows of all sequences are one ``(R, Hq, D)`` array,
each row tagged with its sequence and absolute position, and each sequence's keys and
values stay where they are (their addresses are passed, checked here, and viewed in
the kernel), so a batched step makes one parallel call per layer instead of one per
sequence. A lone sequence goes through the same kernel, and every (row, head) task runs
the same code whatever the batch, so a row's output does not depend on its batch-mates.
Masks, scores and softmax are those of ``attention.py``. A decode step whose caches have
room (``cached_rows``) writes its new keys and values into them and attends in the same
call, with the same numbers.
"""

from __future__ import annotations

import math

import numba
import numpy as np
from numba import types
from numba.extending import intrinsic

from ._dispatch import njit_twins, pick
from .aligned import address
from .attention import _key_range, _softmax_inplace, head_values
from .config import CACHE, FASTMATH
from .step_outputs import empty
from .vmath import dot16, prefetch


@intrinsic
def _f32_pointer(typingctx, addr):
    """The float32 pointer at the integer address ``addr`` (of a live, checked array)."""
    if not isinstance(addr, types.Integer):
        return None

    def codegen(context, builder, sig, args):
        return builder.inttoptr(args[0], context.get_value_type(sig.return_type))

    return types.CPointer(types.float32)(addr), codegen


# A step's keys and values are usually out of the caches (the layer's weights streamed
# through them since): each loop prefetches the row PREFETCH_ROWS ahead.
PREFETCH_ROWS = 4


# No fastmath here: LLVM may inline this into each kernel that calls it, and under
# fastmath each caller vectorised the sums its own way (the twins gave results 1 ulp
# apart, depending on what was compiled first). The scores are ``dot16`` sums and the
# softmax adds in key order, so every twin, task split and caller gives the same bits
# (tested); the products over the values vectorise as they are (no reduction).
@numba.njit(cache=CACHE)
def _attend(q, i, h0, nh, hk, k, v, pos, out, scale, causal, window, slopes, softcap, sinks):
    # out[i, h] <- softmax(scale * q[i, h] . k[lo:hi, hk]) @ v[lo:hi, hk] for the nh query
    # heads h0.. of key/value head hk. Each key and value row is read once for all of
    # them; every head's sums run in the same order whatever nh.
    D = q.shape[2]
    Dv = v.shape[2]
    hkv = k.shape[1]
    lo, hi = _key_range(pos, k.shape[0], causal, window)
    acc = np.zeros((nh, Dv), np.float32)
    n = hi - lo
    if n > 0:
        qs = np.empty((nh, D), np.float32)
        for g in range(nh):
            for d in range(D):
                qs[g, d] = q[i, h0 + g, d] * scale
        sc = np.empty((nh, n), np.float32)
        for j in range(n):
            kr = k[lo + j, hk]
            ahead = ((lo + j + PREFETCH_ROWS) * hkv + hk) * D
            for c in range(0, D, 16):               # the key row PREFETCH_ROWS ahead
                prefetch(k, ahead + c)
            for g in range(nh):
                t = dot16(qs[g], kr, D)
                if softcap > 0:
                    t = softcap * math.tanh(t / softcap)
                t += slopes[h0 + g] * np.float32(lo + j - pos)
                sc[g, j] = t
        for g in range(nh):
            _softmax_inplace(sc[g], n, sinks[h0 + g])
        for j in range(n):
            vr = v[lo + j, hk]
            ahead = ((lo + j + PREFETCH_ROWS) * hkv + hk) * Dv
            for c in range(0, Dv, 16):
                prefetch(v, ahead + c)
            for g in range(nh):
                p = sc[g, j]
                for e in range(Dv):
                    acc[g, e] += p * vr[e]
    for g in range(nh):
        for e in range(Dv):
            out[i, h0 + g, e] = acc[g, e]


@njit_twins(fastmath=FASTMATH)
def _attention_rows(q, rows, seqs, hkv, out, scale, causal, window, slopes, softcap, per,
                    sinks):
    # q: (R, Hq, D) f32; rows[i] = (sequence, absolute position) of query row i;
    # seqs[s] = (address of the keys, of the values, length T) of sequence s: keys
    # (T, hkv, D) and values (T, hkv, Dv) float32, C order. A task: row i, ``per``
    # query heads sharing one key/value head (``per`` divides Hq // hkv).
    R, Hq, D = q.shape
    Dv = out.shape[2]
    group = Hq // hkv
    tasks = Hq // per
    for task in numba.prange(R * tasks):
        i = task // tasks
        h0 = (task % tasks) * per
        s = rows[i, 0]
        k = numba.carray(_f32_pointer(seqs[s, 0]), (seqs[s, 2], hkv, D))
        v = numba.carray(_f32_pointer(seqs[s, 1]), (seqs[s, 2], hkv, Dv))
        _attend(q, i, h0, per, h0 // group, k, v, rows[i, 1], out, scale, causal, window,
                slopes, softcap, sinks)


@njit_twins(fastmath=FASTMATH)
def _attention_cached(q, k, v, dst, out, scale, causal, window, slopes, softcap, per, sinks):
    # A decode step in one call: each sequence's new rows of k, v (R, Hkv, D) f32, the
    # sequences one after another, written into its cache buffers (dst[s] = (keys
    # address, values address, first position, rows), room checked by the caller), then
    # every (row, query-head group) task of _attention_rows over the grown caches.
    R, Hq, D = q.shape
    hkv = k.shape[1]
    Dv = out.shape[2]
    seq = np.empty(R, np.int64)
    pos = np.empty(R, np.int64)
    r = 0
    for s in range(dst.shape[0]):
        first, n = dst[s, 2], dst[s, 3]
        kd = numba.carray(_f32_pointer(dst[s, 0]), (first + n, hkv, D))
        vd = numba.carray(_f32_pointer(dst[s, 1]), (first + n, hkv, Dv))
        for j in range(n):
            for h in range(hkv):
                for e in range(D):
                    kd[first + j, h, e] = k[r, h, e]
                for e in range(Dv):
                    vd[first + j, h, e] = v[r, h, e]
            seq[r] = s
            pos[r] = first + j
            r += 1
    group = Hq // hkv
    tasks = Hq // per
    for task in numba.prange(R * tasks):
        i = task // tasks
        h0 = (task % tasks) * per
        s = seq[i]
        t = dst[s, 2] + dst[s, 3]
        kk = numba.carray(_f32_pointer(dst[s, 0]), (t, hkv, D))
        vv = numba.carray(_f32_pointer(dst[s, 1]), (t, hkv, Dv))
        _attend(q, i, h0, per, h0 // group, kk, vv, pos[i], out, scale, causal, window,
                slopes, softcap, sinks)


# Multiply-adds (query heads x head_dim x keys, all rows) from which a step whose rows
# and key/value heads are fewer than the threads spreads its query heads over the
# threads (a head's numbers are the same on any thread). Measured, Gemma 3 270M decode
# (4 query heads, 1 key/value head, 128-192 keys; 2 threads), alternating runs of
# bench/profile_ops.py: 87 and 76 us a call serially, 62 and 54 us spread.
SPREAD_MIN_WORK = 1 << 16
def _f32_c(a) -> np.ndarray:
    if not (isinstance(a, np.ndarray) and a.dtype == np.float32 and a.flags.c_contiguous):
        a = np.ascontiguousarray(a, dtype=np.float32)
    return a


def check_rows(q_shapes: list, ks: list, vs: list, slopes, sinks=None) -> None:
    """ValueError unless every sequence's q ``(S_i, Hq, D)``, k ``(T_i, Hkv, D)`` and v
    ``(T_i, Hkv, Dv)`` agree in heads and sizes, with S_i <= T_i and Hkv dividing Hq."""
    hq, d = q_shapes[0][1:]
    hkv, dv = ks[0].shape[1], vs[0].shape[2]
    for qs, k, v in zip(q_shapes, ks, vs):
        if (len(qs) != 3 or k.ndim != 3 or v.ndim != 3 or tuple(qs[1:]) != (hq, d)
                or k.shape[1:] != (hkv, d) or v.shape[1:] != (hkv, dv)
                or k.shape[0] != v.shape[0] or qs[0] > k.shape[0]):
            shapes = ", ".join(f"q{list(qs)} k{list(k.shape)} v{list(v.shape)}"
                               for qs, k, v in zip(q_shapes, ks, vs))
            raise ValueError(f"attention: sequences must agree in heads and head_dim, with "
                             f"k and v of one length at least q's: {shapes}")
    check_heads(hq, hkv, slopes, sinks)


def check_heads(hq: int, hkv: int, slopes, sinks=None) -> None:
    """ValueError unless the ``hkv`` key/value heads divide the ``hq`` query heads and
    ALiBi ``slopes`` and attention ``sinks`` (or None) have one per query head."""
    if hq and (hkv == 0 or hq % hkv):
        raise ValueError(f"attention: query heads {hq} must be a multiple of key/value "
                         f"heads {hkv}")
    if slopes is not None and np.size(slopes) != hq:
        raise ValueError(f"attention: {np.size(slopes)} alibi slopes for {hq} query heads")
    if sinks is not None and np.size(sinks) != hq:
        raise ValueError(f"attention: {np.size(sinks)} sink logits for {hq} query heads")


def attention_rows(qs: list, ks: list, vs: list, scale: float, causal: bool, window,
                   slopes, softcap, sinks=None) -> list:
    """Per sequence i: q ``(S_i, Hq, D)``, k ``(T_i, Hkv, D)``, v ``(T_i, Hkv, Dv)`` (the
    queries are the last S_i of the T_i positions) -> outs ``(S_i, Hq, Dv)`` float32."""
    if not qs:
        return []
    check_rows([q.shape for q in qs], ks, vs, slopes, sinks)
    sizes = [x.shape[0] for x in qs]
    out = packed_rows(_f32_c(qs[0] if len(qs) == 1 else np.concatenate(qs)), sizes, ks, vs,
                      scale, causal, window, slopes, softcap, sinks=sinks)
    if len(qs) == 1:
        return [out]
    outs, start = [], 0
    for s in sizes:
        outs.append(out[start:start + s])
        start += s
    return outs


def packed_rows(q: np.ndarray, sizes: list, ks: list, vs: list, scale: float, causal: bool,
                window, slopes, softcap, addresses: list | None = None,
                sinks=None) -> np.ndarray:
    """``attention_rows`` on the query rows of every sequence one after another in ``q``
    ``(sum sizes, Hq, D)`` float32 C order (``check_rows`` done by the caller) ->
    ``(sum sizes, Hq, Dv)`` float32. ``addresses``: each sequence's (keys, values) data
    addresses when the caller knows them (a KV cache records its buffer's), else None."""
    hkv, dv = ks[0].shape[1], vs[0].shape[2]
    lengths = [k.shape[0] for k in ks]
    if addresses is None or any(a is None for a in addresses):
        ks = [_f32_c(k) for k in ks]          # a copy, if any, lives to the kernel call
        vs = [_f32_c(v) for v in vs]
        addresses = [(address(k), address(v)) for k, v in zip(ks, vs)]
    seqs = np.array([(ak, av, t) for (ak, av), t in zip(addresses, lengths)], np.int64)
    return table_rows(q, sizes, seqs, hkv, dv, scale, causal, window, slopes, softcap, sinks)


def spread_per(group: int, tasks_per_head: int, threads: int) -> int:
    """Query heads per task when a step's rows and key/value heads (``tasks_per_head``
    tasks at one head group each) are fewer than the threads: the largest divisor of
    ``group`` that still gives every thread a task (1 when none does). Measured, Gemma 3
    270M decode attention (4 query heads over 1 key/value head, 176 keys, 2 threads),
    kernel alone: 11.4 us a call with a task per query head, 10.1 with two heads a task
    (each thread reads K and V once, not twice)."""
    for per in range(group, 0, -1):
        if group % per == 0 and tasks_per_head * (group // per) >= threads:
            return per
    return 1


def _split(twins, rows: int, hq: int, hkv: int, work: int) -> tuple:
    """(kernel, query heads per task) for ``rows`` query rows: a task per row and
    key/value head (its query heads read each K, V row once), or, when that leaves a
    thread idle on a parallel call, the fewest tasks that keep every thread busy (the
    most query heads a task whose count divides the group)."""
    threads = numba.get_num_threads()
    idle = rows * hkv < threads
    kernel = twins[0] if idle and hq > hkv and work >= SPREAD_MIN_WORK else pick(twins, work)
    per = hq // hkv
    if idle and kernel is twins[0]:
        per = spread_per(hq // hkv, rows * hkv, threads)
    return kernel, per


def table_rows(q: np.ndarray, sizes: list, seqs: np.ndarray, hkv: int, dv: int,
               scale: float, causal: bool, window, slopes, softcap,
               sinks=None) -> np.ndarray:
    """``packed_rows`` with each sequence's keys and values given as one row of ``seqs``
    ``(S, 3)`` int64: (keys address, values address, length T), buffers of ``(T, hkv,
    D)`` and ``(T, hkv, dv)`` float32 in C order that the caller keeps alive (a KV cache
    whose shapes it checked). ``sinks``: None or one logit per query head that joins
    each softmax's denominator (gpt-oss)."""
    hq, d = q.shape[1:]
    lengths = seqs[:, 2].tolist()
    rows = np.array([(s, t - n + i) for s, (n, t) in enumerate(zip(sizes, lengths))
                     for i in range(n)], np.int64).reshape(-1, 2)
    out = np.empty((q.shape[0], hq, dv), np.float32)
    if out.size:
        work = hq * d * sum(n * t for n, t in zip(sizes, lengths))
        kernel, per = _split(_attention_rows, q.shape[0], hq, hkv, work)
        kernel(q, rows, seqs, hkv, out, np.float32(scale), bool(causal), int(window or 0),
               head_values(slopes, hq, 0.0), np.float32(softcap or 0.0), per,
               head_values(sinks, hq, -np.inf))
    return out


def cached_rows(q: np.ndarray, k: np.ndarray, v: np.ndarray, dst: np.ndarray, scale: float,
                causal: bool, window, slopes, softcap, sinks=None, step=None) -> np.ndarray:
    """A decode step's attention on caches with room: each sequence's rows of ``k``,
    ``v`` ``(R, Hkv, D)`` float32 (one after another, as ``q`` ``(R, Hq, D)``) appended
    to its buffers per ``dst`` (``kv_cache.reserve_rows``), then ``table_rows`` over
    the grown caches, in one kernel call with the same numbers (the result in an array
    of ``step``'s, a ``StepOutputs``, where given)."""
    hq, d = q.shape[1:]
    hkv = k.shape[1]
    out = empty(step, 0, (q.shape[0], hq, v.shape[2]))
    if out.size:
        sizes = dst[:, 3]
        work = hq * d * int(sizes @ (dst[:, 2] + sizes))
        kernel, per = _split(_attention_cached, q.shape[0], hq, hkv, work)
        kernel(q, k, v, dst, out, np.float32(scale), bool(causal), int(window or 0),
               head_values(slopes, hq, 0.0), np.float32(softcap or 0.0), per,
               head_values(sinks, hq, -np.inf))
    return out
