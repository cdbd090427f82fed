"""Window attributes of ops whose spatial rank comes from the input (pools, conv_transpose).

``normalize`` cannot see the input's rank, so it stores a canonical form and the rule
(and the runtime) expands it by the rank:

* canonical form: an int stays an int (every spatial dim, every side); a sequence
  becomes a tuple with one value per spatial dim, d first, and ``padding`` one pair
  (before, after) per dim: ``padding=(1, 2)`` is stored as ``(1, 1, 2, 2)``. A tuple
  keeps its length, so one written for 2 dims on 3-D input is an error, as in torch.
* ``per_dim`` / ``per_side`` expand a canonical value for ``nd`` spatial dims and say
  so when a tuple was written for another number of dims.

Plain Python, no NumPy (the spec checker runs the rules).
"""

from __future__ import annotations


def _ints(value, what: str, least: int) -> tuple:
    vals = (value,) if isinstance(value, int) else tuple(value) \
        if isinstance(value, (list, tuple)) else None
    if not vals or any(not isinstance(v, int) or isinstance(v, bool) or v < least
                       for v in vals):
        kind = "positive" if least > 0 else "non-negative"
        raise ValueError(f"{what} must be a {kind} int or one per spatial dim, got {value!r}")
    return vals


def canon(value, what: str, least: int = 1):
    """An int or one int per spatial dim (2 or 3 of them) -> the canonical form."""
    vals = _ints(value, what, least)
    if isinstance(value, int):
        return value
    if len(vals) not in (2, 3):
        raise ValueError(f"{what} must be an int or 2 or 3 ints (one per spatial dim), "
                         f"got {value!r}")
    return vals


def canon_padding(value):
    """int (all sides), nd ints (before = after) or 2*nd ints (before, after per dim)."""
    vals = _ints(value, "padding", 0)
    if isinstance(value, int):
        return value
    if len(vals) in (2, 3):
        vals = tuple(v for p in vals for v in (p, p))
    elif len(vals) not in (4, 6):
        raise ValueError(f"padding must be an int, 2 or 3 ints (one per spatial dim) or 4 or "
                         f"6 ints (before, after per dim), got {value!r}")
    return vals


def per_dim(value, nd: int, what: str) -> tuple:
    """A canonical value as ``nd`` ints."""
    if isinstance(value, int):
        return (value,) * nd
    if len(value) != nd:
        raise ValueError(f"{what} {tuple(value)} has {len(value)} values for {nd} spatial dims")
    return tuple(value)


def per_side(value, nd: int) -> tuple:
    """A canonical padding as ``2 * nd`` ints: (before, after) per spatial dim."""
    if isinstance(value, int):
        return (value,) * (2 * nd)
    if len(value) != 2 * nd:
        raise ValueError(f"padding {tuple(value)} has {len(value)} values for {nd} spatial "
                         f"dims (before and after each: {2 * nd})")
    return tuple(value)
