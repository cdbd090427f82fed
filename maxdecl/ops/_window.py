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
    """An int or one int per spatial dim (1 to 3 of them) -> the canonical form."""
    vals = _ints(value, what, least)
    if isinstance(value, int):
        return value
    if len(vals) not in (1, 2, 3):
        raise ValueError(f"{what} must be an int or 1 to 3 ints (one per spatial dim), "
                         f"got {value!r}")
    return vals


SAME = "same"


def is_same(value) -> bool:
    """Whether a padding attribute is TF's ``"same"`` (case-insensitive)."""
    return isinstance(value, str) and value.lower() == SAME


def same_pads(sizes, kernel, stride, dilation) -> tuple:
    """TF's SAME padding of int ``sizes``: per dim ``(before, after)`` so that the output
    is ``ceil(size / stride)``, the odd pixel after (``total = max((out - 1) * stride +
    dilation * (k - 1) + 1 - size, 0)``, ``before = total // 2``)."""
    pads = []
    for n, k, s, d in zip(sizes, kernel, stride, dilation):
        total = max((-(-n // s) - 1) * s + d * (k - 1) + 1 - n, 0)
        pads += [total // 2, total - total // 2]
    return tuple(pads)


def same_out(size, stride):
    """The output length of a SAME window: ``ceil(size / stride)`` (symbolic: the size
    itself at stride 1, else an opaque ``same(size,stride)``)."""
    if isinstance(size, int):
        return -(-size // stride)
    return size if stride == 1 else f"same({size},{stride})"


def canon_padding(value):
    """int (all sides), nd ints (before = after), 2*nd ints (before, after per dim), or
    ``"same"`` (TF's SAME, sized from the input when the node runs). One int in a list
    is a 1-D window's (both sides); two are a 2-D window's, one per dim."""
    if is_same(value):
        return SAME
    vals = _ints(value, "padding", 0)
    if isinstance(value, int):
        return value
    if len(vals) in (1, 2, 3):
        vals = tuple(v for p in vals for v in (p, p))
    elif len(vals) not in (4, 6):
        raise ValueError(f"padding must be an int, 1 to 3 ints (one per spatial dim), 4 or "
                         f"6 ints (before, after per dim) or \"same\", got {value!r}")
    return vals


def per_dim(value, nd: int, what: str) -> tuple:
    """A canonical value as ``nd`` ints."""
    if isinstance(value, int):
        return (value,) * nd
    if len(value) != nd:
        raise ValueError(f"{what} {tuple(value)} has {len(value)} values for {nd} spatial dims")
    return tuple(value)


def per_side(value, nd: int) -> tuple:
    """A canonical padding as ``2 * nd`` ints: (before, after) per spatial dim (``"same"``
    stays itself: ``same_pads`` sizes it from the input)."""
    if value == SAME:
        return SAME
    if isinstance(value, int):
        return (value,) * (2 * nd)
    if len(value) != 2 * nd:
        raise ValueError(f"padding {tuple(value)} has {len(value)} values for {nd} spatial "
                         f"dims (before and after each: {2 * nd})")
    return tuple(value)
