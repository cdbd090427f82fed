"""Symbolic dims: an ``int``, a declared name (``"seq"``) or a polynomial of names.

A dim string such as ``"past+seq"`` or ``"2*seq"`` is read as a polynomial with
integer coefficients over its names; anything else a string may hold (``"seq[1:]"``)
is one opaque name. Rules compare dims as polynomials:

* two dims over the **same names** are equal only when they are the same
  polynomial (``seq + 1 != seq``, ``256 != 264``, ``4*seq == seq*4``);
* dims over **different names** (``seq`` vs ``past``, ``seq`` vs ``4``) may be equal
  for some sizes: the rule keeps the symbol and the runtime checks the sizes.

Plain Python, no NumPy: the spec layer (``maxdecl validate``) uses it.
"""

from __future__ import annotations

import functools
import re

_TERM = re.compile(r"^\s*(?:(\d+)\s*\*\s*)?([A-Za-z_][A-Za-z0-9_]*(?:\s*\*\s*[A-Za-z_][A-Za-z0-9_]*)*)"
                   r"\s*$|^\s*(\d+)\s*$")


def poly(d) -> dict:
    """``{monomial: coefficient}`` of a dim; a monomial is a sorted tuple of names."""
    return dict(_poly(d)) if isinstance(d, str) else _int_poly(d)


def _int_poly(d) -> dict:
    if isinstance(d, bool) or not isinstance(d, int):
        raise TypeError(f"dim {d!r} must be an int or a str")
    return {(): d} if d else {}


@functools.lru_cache(maxsize=4096)
def _poly(d: str) -> tuple:
    return tuple(_parse(d).items())


def _parse(d) -> dict:
    if isinstance(d, bool):
        raise TypeError(f"dim {d!r} must be an int or a str")
    if isinstance(d, int):
        return {(): d} if d else {}
    if not isinstance(d, str):
        raise TypeError(f"dim {d!r} must be an int or a str")
    out: dict = {}
    for part in _split_sum(d):
        sign, text = part
        m = _TERM.match(text)
        if m is None:
            _add(out, *_opaque_term(text, sign))
        elif m.group(3) is not None:
            _add(out, (), sign * int(m.group(3)))
        else:
            coeff = int(m.group(1) or 1)
            names = tuple(sorted(n.strip() for n in m.group(2).split("*")))
            _add(out, names, sign * coeff)
    return out


def _opaque_term(text: str, sign: int) -> tuple:
    """(monomial, coefficient) of a product holding opaque factors: ``24*n*win(s,10,5,1,0,0)``
    is 24 times the names ``n`` and ``win(...)`` (factors split at top-level ``*``, so a
    conv's output length multiplies and divides like any name); a text that is no such
    product is one opaque name."""
    factors, depth, start = [], 0, 0
    for i, ch in enumerate(text):
        if ch in "([":
            depth += 1
        elif ch in ")]":
            depth -= 1
        elif ch == "*" and depth == 0:
            factors.append(text[start:i].strip())
            start = i + 1
    factors.append(text[start:].strip())
    if len(factors) == 1 or not all(factors):
        return (text.strip(),), sign
    coeff, names = sign, []
    for f in factors:
        if f.isdigit():
            coeff *= int(f)
        else:
            names.append(f)
    return tuple(sorted(names)), coeff


def _split_sum(text: str) -> list:
    """Top-level ``+``/``-`` terms of ``text`` (brackets keep their contents whole)."""
    parts, depth, start, sign = [], 0, 0, 1
    for i, ch in enumerate(text):
        if ch in "([":
            depth += 1
        elif ch in ")]":
            depth -= 1
        elif ch in "+-" and depth == 0 and i > start and text[start:i].strip():
            parts.append((sign, text[start:i]))
            sign, start = (1 if ch == "+" else -1), i + 1
    parts.append((sign, text[start:]))
    return parts


def _add(acc: dict, mono: tuple, coeff: int) -> None:
    c = acc.get(mono, 0) + coeff
    if c:
        acc[mono] = c
    else:
        acc.pop(mono, None)


def dim(p: dict):
    """A polynomial back to a dim: an int when constant, else a canonical string."""
    if not p:
        return 0
    if set(p) == {()}:
        return p[()]
    terms = []
    for mono in sorted(p, key=lambda m: (len(m) == 0, m)):
        c = p[mono]
        body = "*".join(mono)
        if not mono:
            text = str(abs(c))
        else:
            text = body if abs(c) == 1 else f"{abs(c)}*{body}"
        terms.append(("-" if c < 0 else "+", text))
    out = ("-" if terms[0][0] == "-" else "") + terms[0][1]
    for sign, text in terms[1:]:
        out += f"{sign}{text}"
    return out


def add(*dims):
    """The sum of dims (``add("past", "seq") == "past+seq"``)."""
    acc: dict = {}
    for d in dims:
        for mono, c in poly(d).items():
            _add(acc, mono, c)
    return dim(acc)


def mul(*dims):
    """The product of dims (``mul(4, "seq") == "4*seq"``)."""
    acc: dict = {(): 1}
    for d in dims:
        nxt: dict = {}
        for m1, c1 in acc.items():
            for m2, c2 in poly(d).items():
                _add(nxt, tuple(sorted(m1 + m2)), c1 * c2)
        acc = nxt
    return dim(acc)


def names(d) -> frozenset:
    """The symbol names a dim mentions."""
    return frozenset(n for mono in poly(d) for n in mono)


def differ(a, b) -> bool:
    """True when ``a`` and ``b`` can never be equal: both over the same names
    (or both ints) and not the same polynomial."""
    pa, pb = poly(a), poly(b)
    if pa == pb:
        return False
    return names(a) == names(b)


def may_equal(a, b) -> bool:
    """True unless ``differ(a, b)``: symbols are trusted to match at run time."""
    return not differ(a, b)


def divide(a, b):
    """``a / b`` when every term of ``a`` divides by the monomial ``b``; else None."""
    pa, pb = poly(a), poly(b)
    if len(pb) != 1:
        return a if pb == pa and pa else None
    ((mb, cb),) = pb.items()
    out: dict = {}
    for ma, ca in pa.items():
        rest = list(ma)
        for n in mb:
            if n not in rest:
                return None
            rest.remove(n)
        if ca % cb:
            return None
        _add(out, tuple(rest), ca // cb)
    return dim(out)


def evaluate(d, sizes: dict) -> int | None:
    """The size of ``d`` given ``{name: size}``, or None when a name is unbound."""
    total = 0
    for mono, c in poly(d).items():
        term = c
        for n in mono:
            if n not in sizes:
                return None
            term *= sizes[n]
        total += term
    return total
