"""Checks every weights loader shares: bounded JSON and array shapes that fit in memory.

Example::

    header = load_json("m.safetensors: header", raw)      # WeightsError on bad input
    check_shape("m.safetensors: tensor 'a'", [0, 2**61, 2**61], 4)   # WeightsError
"""

from __future__ import annotations

import json

from ..errors import WeightsError

MAX_JSON_DEPTH = 64           # nesting of objects/arrays in a JSON header or config.json
MAX_NDIM = 32                 # dimensions of one tensor (NumPy allows 64)
MAX_ELEMENT_BYTES = 1 << 62   # bytes a shape may span, zero dims counted as 1


def _no_duplicates(pairs):
    out = {}
    for k, v in pairs:
        if k in out:
            raise _Duplicate(k)
        out[k] = v
    return out


class _Duplicate(ValueError):
    pass


def load_json(where: str, raw: bytes):
    """Parse JSON ``raw``: UTF-8, no duplicate keys, nesting at most MAX_JSON_DEPTH.

    Raises:
        WeightsError: ``"{where}: ..."`` naming what is wrong.
    """
    try:
        text = bytes(raw).decode("utf-8")
    except UnicodeDecodeError as e:
        raise WeightsError(f"{where}: not valid JSON: not UTF-8 (byte 0x{raw[e.start]:02x} "
                           f"at offset {e.start})") from None
    try:
        value = json.loads(text, object_pairs_hook=_no_duplicates)
    except _Duplicate as e:
        raise WeightsError(f"{where}: key {e.args[0]!r} appears twice") from None
    except RecursionError:
        raise WeightsError(f"{where}: JSON nested more than {MAX_JSON_DEPTH} deep "
                           "(MAX_JSON_DEPTH)") from None
    except ValueError as e:
        raise WeightsError(f"{where}: not valid JSON: {e}") from None
    _check_depth(where, value)
    return value


def _check_depth(where: str, value) -> None:
    stack = [(value, 1)]
    while stack:
        v, d = stack.pop()
        if isinstance(v, (dict, list)):
            if d > MAX_JSON_DEPTH:
                raise WeightsError(f"{where}: JSON nested more than {MAX_JSON_DEPTH} deep "
                                   "(MAX_JSON_DEPTH)")
            stack.extend((e, d + 1) for e in (v.values() if isinstance(v, dict) else v))


def check_shape(where: str, shape, itemsize: int = 1) -> tuple:
    """``shape`` as a tuple of ints when NumPy can hold it: at most MAX_NDIM
    non-negative dims whose product (zeros counted as 1) times ``itemsize`` stays under
    MAX_ELEMENT_BYTES, so a zero cannot hide a huge dim and nothing overflows int64.

    Raises:
        WeightsError: ``"{where}: ..."``.
    """
    if not isinstance(shape, (list, tuple)) or len(shape) > MAX_NDIM or not all(
            type(d) is int and d >= 0 for d in shape):
        raise WeightsError(f"{where}: corrupted shape {_short(shape)} (at most {MAX_NDIM} "
                           "non-negative integers)")
    span = itemsize
    for d in shape:
        span *= max(d, 1)
        if span > MAX_ELEMENT_BYTES:
            raise WeightsError(f"{where}: shape {_short(shape)} is too large (more than "
                               f"2**62 bytes even with zero dims counted as 1)")
    return tuple(shape)


def _short(v) -> str:
    s = repr(v)
    return s if len(s) <= 80 else s[:77] + "..."
