"""Limits that keep checking any spec file fast and small (see docs/spec.md, "Limits").

Every limit is a named constant here; the checks return a one-line message (or
raise ``ExprError``) that the caller reports at the offending ``file:line:col``.
A whole check (``validate_spec``) runs inside :func:`metered`, which also bounds
the work summed over every expression and every unrolled layer of all variants.

Example::

    with metered():
        check_value([0] * 10)               # fine, and charged to this check
        check_binop("**", 10, 4096)         # ExprError: ... over the limit (MAX_INT_BITS)
"""

from __future__ import annotations

import contextlib
import contextvars
import re

# -- the text -------------------------------------------------------------------------
MAX_SPEC_BYTES = 1 << 20        # a spec file; the shipped ones are ~10 KB
MAX_YAML_NODES = 50_000         # YAML nodes after expanding aliases ("billion laughs")
MAX_YAML_DEPTH = 64             # nesting of mappings and lists

# -- one expression -------------------------------------------------------------------
MAX_EXPR_CHARS = 2_000          # source text of one {expression}
MAX_EXPR_DEPTH = 64             # nesting of the parsed expression
MAX_INT_BITS = 4_096            # any integer value (2**4096 ~ 1e1233)
MAX_EXPONENT = 4_096            # |b| in a ** b; |ndigits| in round(x, ndigits)
MAX_VALUE_SIZE = 1_000_000      # characters of a string / elements of a list, nested ones
                                # counted (also the text a template renders to)
MAX_VALUE_DEPTH = 32            # nesting of lists in a value
MAX_FORMAT_WIDTH = 1_000        # width and precision in '%8.3f' % x
MAX_ITERATIONS = 65_536         # list-comprehension iterations in one expression, nested
                                # ones counted; each also charges ITERATION_COST to the check
ITERATION_COST = 4

# -- a whole check --------------------------------------------------------------------
MAX_TOTAL_SIZE = 4_000_000      # sum of the sizes of every evaluated value
MAX_REPEAT = 4_096              # one `repeat:` count
MAX_RANK = 32                   # dims of one shape (NumPy allows 64)
MAX_LAYER_DEPTH = 64            # nesting of layers, block uses included
MAX_PATH_CHARS = 1_024          # a layer path plus a name under it (weight, input, output)
MAX_UNROLLED = 65_536           # layer instances unrolled over all variants, each counting
                                # its names, inputs, attributes and shape dims


class ExprError(ValueError):
    """An expression that cannot be parsed or evaluated; the message says why."""


class Meter:
    """Work done so far in one check: evaluated value sizes and unrolled layers."""

    def __init__(self):
        self.size = 0
        self.unrolled = 0
        self.unroll_reported = False

    def charge(self, size: int) -> None:
        """Add ``size``; ExprError once the total is past MAX_TOTAL_SIZE."""
        self.size += size
        self.check()

    def check(self) -> None:
        """ExprError when the total is already past MAX_TOTAL_SIZE (then nothing more is
        evaluated, so a check does at most MAX_TOTAL_SIZE work)."""
        if self.size > MAX_TOTAL_SIZE:
            raise ExprError(f"the expressions of this spec build more than {MAX_TOTAL_SIZE:,} "
                            "characters/elements in all (limit MAX_TOTAL_SIZE)")

    def unroll(self, count: int = 1) -> str | None:
        """Count one more layer instance of ``count`` parts (names, inputs, attributes,
        dims); a message the first time the limit is passed, ``""`` after that (already
        reported), None while within it."""
        self.unrolled += count
        if self.unrolled <= MAX_UNROLLED:
            return None
        if self.unroll_reported:
            return ""
        self.unroll_reported = True
        return (f"more than {MAX_UNROLLED:,} layer instances and parts (names, inputs, "
                "attributes, dims) after unrolling repeats and blocks over all variants "
                "(limit MAX_UNROLLED); the rest is not checked")


_METER: contextvars.ContextVar = contextvars.ContextVar("maxdecl_spec_meter", default=None)


@contextlib.contextmanager
def metered():
    """Run a whole check under one fresh :class:`Meter`."""
    token = _METER.set(Meter())
    try:
        yield _METER.get()
    finally:
        _METER.reset(token)


def meter() -> Meter:
    """The meter of the running check, or a fresh one outside :func:`metered`."""
    return _METER.get() or Meter()


def check_budget() -> None:
    """ExprError when the running check has already used up MAX_TOTAL_SIZE."""
    m = _METER.get()
    if m is not None:
        m.check()


def check_path(path: tuple, names) -> str | None:
    """Message when layer ``path`` (its segments) joined with the longest of ``names``
    is over :data:`MAX_PATH_CHARS` (every unrolled instance holds such strings), or
    ``path`` nests deeper than :data:`MAX_LAYER_DEPTH`."""
    if len(path) > MAX_LAYER_DEPTH:
        return (f"layers (block uses included) nest more than {MAX_LAYER_DEPTH} deep "
                "(MAX_LAYER_DEPTH)")
    n = sum(len(str(p)) + 1 for p in path) + max((len(str(x)) for x in names), default=0)
    if n > MAX_PATH_CHARS:
        return (f"a layer path or a name under it is {n:,} characters long, over the limit of "
                f"{MAX_PATH_CHARS:,} (MAX_PATH_CHARS)")
    return None


def check_repeat(n: int) -> str | None:
    """Message when a repeat count is over :data:`MAX_REPEAT`."""
    if n > MAX_REPEAT:
        return f"repeat count {n:,} is over the limit of {MAX_REPEAT:,} (MAX_REPEAT)"
    return None


# -- values ---------------------------------------------------------------------------

def size_of(v, depth: int = 0) -> int:
    """Characters + elements of ``v`` (nested lists counted in full); ExprError past
    :data:`MAX_VALUE_SIZE`, :data:`MAX_VALUE_DEPTH` or :data:`MAX_INT_BITS`."""
    if isinstance(v, str):
        n = max(1, len(v))
    elif isinstance(v, bool) or v is None or isinstance(v, float):
        return 1
    elif isinstance(v, int):
        if v.bit_length() > MAX_INT_BITS:
            raise ExprError(f"integer with {v.bit_length():,} bits is over the limit of "
                            f"{MAX_INT_BITS:,} bits (MAX_INT_BITS)")
        return 1
    elif isinstance(v, (list, tuple, dict)):
        if depth >= MAX_VALUE_DEPTH:
            raise ExprError(f"value nested more than {MAX_VALUE_DEPTH} lists deep "
                            "(MAX_VALUE_DEPTH)")
        _size_check(len(v))
        items = v.values() if isinstance(v, dict) else v
        types = set(map(type, items))
        if types <= _SCALARS:                        # fast path (C speed) for flat lists
            if int in types and type(None) not in types:
                size_of(int(max(map(abs, items))))  # the largest integer's bits
            return max(1, len(v))
        n = 0
        for e in items:
            n += size_of(e, depth + 1)
            _size_check(n)
    else:
        raise ExprError(f"a value of type {type(v).__name__} is not allowed "
                        "(expressions give numbers, strings, booleans, None or lists)")
    _size_check(n)
    return max(1, n)


_SCALARS = {int, float, bool, type(None)}


def _size_check(n: int) -> None:
    if n > MAX_VALUE_SIZE:
        raise ExprError(f"value is too long: more than {MAX_VALUE_SIZE:,} characters/elements "
                        "(MAX_VALUE_SIZE)")


def check_value(v):
    """``v`` after checking its size (and charging it to the running check); ExprError."""
    n = size_of(v)
    m = _METER.get()
    if m is not None:
        m.charge(n)
    return v


def charge(n: int) -> None:
    """Charge ``n`` units of work to the running check, if any; ExprError past
    MAX_TOTAL_SIZE."""
    m = _METER.get()
    if m is not None:
        m.charge(n)


def check_binop(op: str, a, b) -> None:
    """Refuse ``a <op> b`` before computing it when the result would be over a limit."""
    if op == "**":
        if isinstance(b, (int, float)) and not isinstance(b, bool) and abs(b) > MAX_EXPONENT:
            raise ExprError(f"exponent {b} is over the limit of {MAX_EXPONENT} (MAX_EXPONENT)")
        if _is_int(a) and _is_int(b) and b > 0 and (a.bit_length() - 1) * b > MAX_INT_BITS:
            raise ExprError(f"{a} ** {b} would have about {a.bit_length() * b:,} bits, over "
                            f"the limit of {MAX_INT_BITS:,} (MAX_INT_BITS)")
    elif op == "*":
        if _is_int(a) and _is_int(b) and a.bit_length() + b.bit_length() > MAX_INT_BITS + 1:
            raise ExprError(f"product would have about {a.bit_length() + b.bit_length():,} "
                            f"bits, over the limit of {MAX_INT_BITS:,} (MAX_INT_BITS)")
        for seq, n in ((a, b), (b, a)):
            if isinstance(seq, (list, str)) and _is_int(n) and len(seq) * n > MAX_VALUE_SIZE:
                raise ExprError(f"result is too long: {len(seq):,} * {n:,} is over "
                                f"{MAX_VALUE_SIZE:,} characters/elements (MAX_VALUE_SIZE)")
    elif op == "+":
        if isinstance(a, (list, str)) and isinstance(b, (list, str)) \
                and len(a) + len(b) > MAX_VALUE_SIZE:
            raise ExprError(f"result is too long: {len(a) + len(b):,} characters/elements, "
                            f"over {MAX_VALUE_SIZE:,} (MAX_VALUE_SIZE)")
    elif op == "%" and isinstance(a, str):
        check_format(a)


# %[(key)][flags][width][.precision][length]type
_FORMAT = re.compile(r"%(?:\([^)]*\))?[-#0 +]*(\*|\d+)?(?:\.(\*|\d*))?")


def check_format(fmt: str) -> None:
    """Refuse ``%``-format widths/precisions over :data:`MAX_FORMAT_WIDTH` and ``*``."""
    for m in _FORMAT.finditer(fmt):
        for g in m.groups():
            if g == "*":
                raise ExprError("'*' width or precision in a %-format is not supported")
            if g and int(g) > MAX_FORMAT_WIDTH:
                raise ExprError(f"%-format width/precision {int(g):,} is over the limit of "
                                f"{MAX_FORMAT_WIDTH:,} (MAX_FORMAT_WIDTH)")


def check_count(what: str, n) -> None:
    """Refuse an integer argument that sizes a result (list length, digits) past
    :data:`MAX_VALUE_SIZE`."""
    if _is_int(n) and abs(n) > MAX_VALUE_SIZE:
        raise ExprError(f"{what} {n:,} is over the limit of {MAX_VALUE_SIZE:,} "
                        "(MAX_VALUE_SIZE)")


def _is_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)
