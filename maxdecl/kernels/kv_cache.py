"""KV-cache values that grow without copying the past on every step.

The attention op is pure: it takes the cache ``[2, ..., T_past, Hkv, D]`` and returns a
new one with this step's k, v appended. Copying the whole past each step costs more than
the attention itself at decode, so the new cache is a view at the front of a larger
buffer (capacity doubling), and the next step writes into the free room after it.
Writing there never changes what an existing value shows; if two steps branch from the
same past (the room after it is already taken), the second one copies.
"""

from __future__ import annotations

import numpy as np

from .aligned import address, empty_aligned

MIN_ROOM = 64  # positions allocated at least when a cache buffer is (re)made
_F32 = np.dtype(np.float32)


class KVCache(np.ndarray):
    """An ndarray ``[2, ..., T, Hkv, D]`` that knows the buffer it sits at the front of."""

    # (buffer, [positions filled], buffer address), set on the views append_kv and
    # truncate_kv return; slices and copies of a cache see this class default (numpy does
    # not carry an instance's attributes to its views), so they do not own the room
    room = None


def append_kv(past: np.ndarray, k: np.ndarray, v: np.ndarray) -> np.ndarray:
    """``concat(past, stack([k, v]))`` along the sequence axis (-3), in place when
    ``past`` is the newest view of its buffer and the buffer has room."""
    t, s = past.shape[-3], k.shape[-3]
    room = getattr(past, "room", None)
    if room is not None and room[1][0] == t and t + s <= room[0].shape[-3]:
        buf = room[0]
    else:
        cap = max(2 * (t + s), MIN_ROOM)
        # 64-byte aligned: the attention kernels read every key and value row in vectors
        # (measured, Gemma 3 decode attention at 160 positions: 26 -> 23 us a call)
        buf = empty_aligned(past.shape[:-3] + (cap,) + past.shape[-2:], past.dtype)
        buf[..., :t, :, :] = past
        room = (buf, [t], address(buf))
    if buf.ndim == 4:                  # [2, T, Hkv, D]: plain indexing is cheaper
        buf[0, t:t + s] = k
        buf[1, t:t + s] = v
        out = buf[:, :t + s].view(KVCache)
    else:
        buf[0, ..., t:t + s, :, :] = k
        buf[1, ..., t:t + s, :, :] = v
        out = buf[..., :t + s, :, :].view(KVCache)
    room[1][0] = t + s
    out.room = room
    return out


def reserve_rows(pasts: list, k: np.ndarray, v: np.ndarray, sizes: list) -> tuple | None:
    """A batched step's appends in place, one sequence after another in ``k`` and ``v``
    ``(sum sizes, Hkv, D)`` float32: ``(dst, caches)``, or None (then ``append_kv``
    each) unless every past is the newest float32 ``[2, T, Hkv, D]`` view of its own
    buffer with room for its rows. ``dst[i]`` = (keys address, values address, T,
    sizes[i]): where to write sequence i's rows; ``caches[i]``: the grown view, recorded
    as the buffer's newest, whose new rows the caller writes
    (``attention_rows.cached_rows``)."""
    if not (k.dtype == np.float32 and v.dtype == np.float32 and k.ndim == 3
            and k.shape == v.shape):
        return None
    rooms, seen, heads = [], set(), k.shape[1:]
    for past, n in zip(pasts, sizes):
        room = getattr(past, "room", None)      # only views of the buffer's ndim have one
        if room is None or id(room) in seen:
            return None
        buf, t = room[0], past.shape[1]
        if (room[1][0] != t or t + n > buf.shape[1] or buf.ndim != 4 or buf.dtype is not _F32
                or buf.shape[2:] != heads):
            return None
        seen.add(id(room))
        rooms.append((room, t, n))
    dst = np.array([x for room, t, n in rooms
                    for x in (room[2], room[2] + room[0].strides[0], t, n)],
                   np.int64).reshape(-1, 4)
    caches = []
    for room, t, n in rooms:
        room[1][0] = t + n
        grown = room[0][:, :t + n].view(KVCache)
        grown.room = room
        caches.append(grown)
    return dst, caches


def kv_addresses(cache) -> tuple | None:
    """``(address of cache[0], of cache[1])`` for a float32 ``[2, T, Hkv, D]`` KVCache view
    at the front of its buffer, read from the buffer's record (``address`` of a fresh view
    costs microseconds a call); None for any other array."""
    room = getattr(cache, "room", None)
    if room is None or cache.ndim != 4 or room[0].ndim != 4 or cache.dtype != np.float32:
        return None
    return room[2], room[2] + room[0].strides[0]


def truncate_kv(cache: np.ndarray, length: int) -> np.ndarray:
    """The first ``length`` positions of ``cache`` (axis -3): a rejected draft rolled
    back. A KVCache view keeps its buffer, so the next step appends in place there."""
    room = getattr(cache, "room", None)
    out = cache[..., :length, :, :].view(KVCache)
    if room is not None and room[1][0] == cache.shape[-3]:
        room[1][0] = length
        out.room = room
    return out
