"""A small, safe expression language for spec strings: ``"{dim // n_heads}"``.

Expressions are parsed with :mod:`ast` and evaluated by walking a whitelist of
node types; nothing is ever passed to ``eval``. Supported:

* literals: ints, floats, strings, ``True``/``False``/``None``, lists, tuples;
* names: hyperparameters, derived params, loop indices, block params;
* ``+ - * / // % **``, unary ``- + not``, comparisons (chained), ``and``/``or``,
  ``x if c else y``, subscripts (``sizes[0]``);
* list comprehensions over lists, strings and dicts (``[n if t == "attn" else 0 for t
  in layer_types]``), at most MAX_ITERATIONS iterations per evaluation;
* calls of whitelisted functions only (see ``FUNCTIONS``).

A whole-string expression ``"{expr}"`` keeps its type (int, float, list, None);
a string that mixes text and ``{expr}`` parts is interpolated (``"blk.{i}"``).

Example::

    >>> evaluate("dim // n_heads", {"dim": 4096, "n_heads": 32})
    128
    >>> render("blk.{i}.attn_q", {"i": 3})
    'blk.3.attn_q'
"""

from __future__ import annotations

import ast
import contextvars
import functools
import math
import operator
import statistics
import struct

from . import budgets
from .budgets import ExprError

__all__ = ["ExprError", "FUNCTIONS", "alibi_slopes", "evaluate", "is_template",
           "llama3_rope_factors", "names", "parse", "render", "split_template",
           "template_names"]


def alibi_slopes(n_heads, max_bias=8.0) -> list:
    """ALiBi head slopes as MPT and llama.cpp define them.

    With ``n = 2**floor(log2(n_heads))``: head ``h < n`` gets ``m0**(h+1)`` with
    ``m0 = 2**(-max_bias/n)``; the remaining heads get ``m1**(2*(h-n)+1)`` with
    ``m1 = 2**(-max_bias/2/n)`` (equal to MPT's ``gen_slopes``).

    >>> alibi_slopes(4, 8.0)
    [0.25, 0.0625, 0.015625, 0.00390625]
    """
    n_heads = int(n_heads)
    budgets.check_count("alibi_slopes: n_heads", n_heads)
    if n_heads <= 0:
        raise ExprError(f"alibi_slopes: n_heads must be positive, got {n_heads}")
    n = 2 ** int(math.floor(math.log2(n_heads)))
    m0 = 2.0 ** (-float(max_bias) / n)
    m1 = 2.0 ** (-float(max_bias) / 2.0 / n)
    return [m0 ** (h + 1) if h < n else m1 ** (2 * (h - n) + 1) for h in range(n_heads)]


def llama3_rope_factors(head_dim, theta, factor, low_freq_factor, high_freq_factor,
                       original_context) -> list:
    """Per-frequency RoPE divisors of Llama 3.1 / 3.2 (``rope_type: llama3``).

    For pair ``i`` of ``head_dim // 2``, with ``inv = theta ** (-2i / head_dim)`` and
    ``wavelen = 2 pi / inv``: 1 when ``wavelen < original_context / high_freq_factor``,
    ``factor`` when ``wavelen > original_context / low_freq_factor``, else
    ``1 / ((1 - s) / factor + s)`` with ``s = (original_context / wavelen -
    low_freq_factor) / (high_freq_factor - low_freq_factor)``. These are the values
    llama.cpp's converter stores as ``rope_freqs.weight``; rope divides each rotation
    frequency by its factor.

    >>> llama3_rope_factors(4, 10000.0, 8.0, 1.0, 4.0, 64)
    [1.0, 8.0]
    """
    head_dim, theta, factor = int(head_dim), float(theta), float(factor)
    low, high, ctx = float(low_freq_factor), float(high_freq_factor), float(original_context)
    budgets.check_count("llama3_rope_factors: head_dim", head_dim)
    if head_dim <= 0 or head_dim % 2 or theta <= 0 or factor <= 0 or ctx <= 0:
        raise ExprError(f"llama3_rope_factors: needs an even head_dim > 0 and theta, factor, "
                        f"original_context > 0; got {head_dim}, {theta}, {factor}, {ctx}")
    out = []
    for i in range(head_dim // 2):
        wavelen = 2.0 * math.pi * theta ** (2.0 * i / head_dim)
        if wavelen < ctx / high:
            out.append(1.0)
        elif wavelen > ctx / low:
            out.append(factor)
        else:
            smooth = (ctx / wavelen - low) / (high - low)
            out.append(1.0 / ((1.0 - smooth) / factor + smooth))
    return out


def _round(x, ndigits=None):
    if isinstance(ndigits, int) and abs(ndigits) > budgets.MAX_EXPONENT:
        raise ExprError(f"ndigits {ndigits} is over the limit of {budgets.MAX_EXPONENT} "
                        "(MAX_EXPONENT)")
    return round(x) if ndigits is None else round(x, ndigits)


def _int(x, *base):
    if isinstance(x, str) and len(x) > budgets.MAX_INT_BITS:
        raise ExprError(f"int() of a {len(x):,}-character string (limit MAX_INT_BITS)")
    return int(x, *base)


def _range(*args):
    """``list(range(...))`` (integers; at most MAX_VALUE_SIZE of them)."""
    if not 1 <= len(args) <= 3 or not all(isinstance(a, int) and not isinstance(a, bool)
                                          for a in args):
        raise ExprError(f"range takes 1 to 3 integers, got {list(args)!r}")
    r = range(*args)
    budgets.check_count("range: length", len(r))
    return list(r)


def _typeof(x) -> str:
    """The kind of a value: "bool", "int", "float", "str", "list", "dict" or "none"
    (config.json keys whose type varies by checkpoint: an int or a string pattern)."""
    if x is None:
        return "none"
    for t, name in ((bool, "bool"), (int, "int"), (float, "float"), (str, "str"),
                    ((list, tuple), "list"), (dict, "dict")):
        if isinstance(x, t):
            return name
    return type(x).__name__


def _fold(name, symbol, combine):
    """``name(xs, start)`` over a list of numbers, each step checked against the integer
    budget as ``a <symbol> b`` is."""
    def fold(xs, start=0 if symbol == "+" else 1):
        if not isinstance(xs, (list, tuple)) or not all(
                isinstance(v, (int, float)) and not isinstance(v, bool) for v in (*xs, start)):
            raise ExprError(f"{name} takes a list of numbers, got {xs!r}")
        total = start
        for v in xs:
            budgets.check_binop(symbol, total, v)
            total = combine(total, v)
        return total
    return fold


# sum(sizes[:k]) as sum([sizes[j] for j in range(k)]); a hop length as prod(ratios)
_sum = _fold("sum", "+", lambda a, b: a + b)
_prod = _fold("prod", "*", lambda a, b: a * b)


def _truth(name, pick):
    """``all`` / ``any`` over a list of bools (a test per layer:
    ``all([taps[i] < taps[i + 1] for i in range(len(taps) - 1)])``)."""
    def test(xs):
        if not isinstance(xs, (list, tuple)) or not all(isinstance(v, bool) for v in xs):
            raise ExprError(f"{name} takes a list of true/false values, got {xs!r}")
        return pick(xs)
    return test


def _sorted(xs):
    """``sorted(xs)``: a list of numbers or of strings in ascending order (Python's)."""
    if not isinstance(xs, (list, tuple)) or not (
            all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in xs)
            or all(isinstance(v, str) for v in xs)):
        raise ExprError(f"sorted takes a list of numbers or of strings, got {xs!r}")
    budgets.charge(len(xs) + 1)
    return sorted(xs)


def _float32(x):
    """``x`` rounded to the nearest float32 (as a Python float): a table that torch builds
    in float32 step by step (a frequency, then its angle) reproduced exactly."""
    if isinstance(x, bool) or not isinstance(x, (int, float)):
        raise ExprError(f"float32 takes a number, got {x!r}")
    try:
        return struct.unpack("<f", struct.pack("<f", x))[0]
    except (OverflowError, struct.error):
        raise ExprError(f"float32({x!r}): out of float32's range") from None


def _zip(*lists):
    """``zip(a, b, ...)`` as a list of lists, as long as the shortest (pairs to walk
    together: ``[d % h == 0 for d, h in zip(dims, heads)]``)."""
    if not lists or not all(isinstance(xs, (list, tuple, str)) for xs in lists):
        raise ExprError(f"zip takes lists, got {', '.join(repr(x)[:40] for x in lists)}")
    n = min(len(xs) for xs in lists)
    count = _ITERATIONS.get() or [0]           # each pair counts as a comprehension step
    count[0] += n
    if count[0] > budgets.MAX_ITERATIONS:
        raise ExprError(f"zip of {n:,} items: more than {budgets.MAX_ITERATIONS:,} "
                        "iterations in one expression (MAX_ITERATIONS)")
    budgets.charge(n * (len(lists) + 1))
    return [list(t) for t in zip(*lists)]


def _make_divisible(v, divisor, min_value=None):
    """The channel count rule of MobileNet, MobileViT and EfficientNet (transformers'
    ``make_divisible``): ``v`` rounded to the nearest multiple of ``divisor`` (at least
    ``min_value``, default ``divisor``), one ``divisor`` more if that lost over 10%."""
    nums = (v, divisor) + (() if min_value is None else (min_value,))
    if not all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in nums) \
            or divisor <= 0:
        raise ExprError(f"make_divisible takes numbers and a positive divisor, got "
                        f"{v!r}, {divisor!r}")
    low = divisor if min_value is None else min_value
    out = max(low, int(v + divisor / 2) // divisor * divisor)
    return int(out + divisor if out < 0.9 * v else out)


def _text(name, method):
    """``name(s)``: a string method of one string (``lower``, ``upper``, ``strip``)."""
    def apply(s):
        if not isinstance(s, str):
            raise ExprError(f"{name} takes a string, got {s!r}"[:200])
        budgets.charge(len(s) + 1)
        return method(s)
    return apply


def _split_text(s, sep=None):
    """``split(s, sep)``: Python's ``s.split(sep)`` (``sep`` None or absent: runs of
    whitespace); a config value that packs a list into one string, ``"p2c|c2p"``."""
    if not isinstance(s, str) or not (sep is None or (isinstance(sep, str) and sep)):
        raise ExprError(f"split takes a string and a non-empty separator string, got "
                        f"{s!r}, {sep!r}"[:200])
    budgets.charge(2 * len(s) + 1)
    return s.split(sep)


def _normal_icdf(p):
    """The standard normal distribution's quantile (torch's ``Normal(0, 1).icdf(p)``,
    scipy's ``ndtri``) for ``0 < p < 1``: Gemma 3n's activation-sparsity cutoff."""
    if isinstance(p, bool) or not isinstance(p, (int, float)) or not 0 < p < 1:
        raise ExprError(f"normal_icdf takes a probability strictly between 0 and 1, got {p!r}")
    return statistics.NormalDist().inv_cdf(p)


CONSTANTS = {"pi": math.pi}   # names every expression sees (a param cannot take them)

FUNCTIONS = {
    "range": _range, "zip": _zip, "make_divisible": _make_divisible, "typeof": _typeof, "sum": _sum, "prod": _prod, "sin": math.sin, "cos": math.cos,
    "min": min, "max": max, "abs": abs, "round": _round, "int": _int, "float": float,
    "bool": bool, "len": len, "sqrt": math.sqrt, "exp": math.exp, "log": math.log,
    "log2": math.log2, "ceil": math.ceil, "floor": math.floor, "float32": _float32,
    "erf": math.erf, "normal_icdf": _normal_icdf, "all": _truth("all", all),
    "any": _truth("any", any), "sorted": _sorted, "lower": _text("lower", str.lower),
    "upper": _text("upper", str.upper), "strip": _text("strip", str.strip), "split": _split_text,
    "alibi_slopes": alibi_slopes, "llama3_rope_factors": llama3_rope_factors,
}

_BINOPS = {
    ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul,
    ast.Div: operator.truediv, ast.FloorDiv: operator.floordiv, ast.Mod: operator.mod,
    ast.Pow: operator.pow,
}
_UNARY = {ast.USub: operator.neg, ast.UAdd: operator.pos, ast.Not: operator.not_}
_CMP = {
    ast.Eq: operator.eq, ast.NotEq: operator.ne, ast.Lt: operator.lt, ast.LtE: operator.le,
    ast.Gt: operator.gt, ast.GtE: operator.ge, ast.In: lambda a, b: a in b,
    ast.NotIn: lambda a, b: a not in b,
}
_SYMBOL = {ast.Add: "+", ast.Sub: "-", ast.Mult: "*", ast.Div: "/", ast.FloorDiv: "//",
           ast.Mod: "%", ast.Pow: "**"}


_ALLOWED = (
    ast.Constant, ast.Name, ast.Load, ast.List, ast.Tuple, ast.BinOp, ast.UnaryOp,
    ast.BoolOp, ast.Compare, ast.IfExp, ast.Subscript, ast.Slice, ast.Call, ast.ListComp,
    ast.comprehension, ast.Store,
    *(op for op in (*_BINOPS, *_UNARY, *_CMP, ast.And, ast.Or)),
)


@functools.lru_cache(maxsize=4096)
def parse(text: str) -> ast.AST:
    """Parse ``text`` as one expression and check every node against the whitelist
    (also in branches that are never evaluated); ExprError otherwise."""
    if len(text) > budgets.MAX_EXPR_CHARS:
        raise ExprError(f"expression too long ({len(text):,} characters; the limit is "
                        f"{budgets.MAX_EXPR_CHARS:,}, MAX_EXPR_CHARS)")
    try:
        tree = ast.parse(text.strip(), mode="eval").body
    except (SyntaxError, ValueError) as e:     # ValueError: a NUL byte in the source
        hint = ("; it spans lines: in a `>-` block every line needs the same indent "
                "(a more-indented line keeps its newline)") if "\n" in text.strip() else ""
        raise ExprError(f"invalid expression {text.strip()!r}: {getattr(e, 'msg', e)}"
                        f"{hint}") from None
    except (RecursionError, MemoryError):
        raise ExprError(f"expression nested too deeply (limit {budgets.MAX_EXPR_DEPTH}, "
                        "MAX_EXPR_DEPTH)") from None
    _check_depth(tree)
    for node in ast.walk(tree):
        if not isinstance(node, _ALLOWED):
            raise ExprError(f"{text.strip()!r}: {type(node).__name__} is not allowed in "
                            "expressions")
        if isinstance(node, ast.Call) and (not isinstance(node.func, ast.Name)
                                           or node.func.id not in FUNCTIONS):
            fname = node.func.id if isinstance(node.func, ast.Name) else ast.unparse(node.func)
            raise ExprError(f"unknown function {fname!r} in {text.strip()!r} (allowed: "
                            f"{', '.join(sorted(FUNCTIONS))})")
        if isinstance(node, ast.comprehension) and (
                node.is_async or not all(isinstance(n, (ast.Name, ast.Tuple, ast.Store))
                                         for n in ast.walk(node.target))):
            raise ExprError(f"{text.strip()!r}: a comprehension binds names only "
                            f"(`for x in xs`, `for a, b in pairs`)")
        if isinstance(node, ast.comprehension) and any(
                isinstance(n, ast.Name) and n.id in CONSTANTS for n in ast.walk(node.target)):
            raise ExprError(f"{text.strip()!r}: a comprehension cannot bind the constant "
                            f"{sorted(CONSTANTS)[0]!r}")
    return tree


def _check_depth(tree) -> None:
    stack = [(tree, 1)]
    while stack:
        node, d = stack.pop()
        if d > budgets.MAX_EXPR_DEPTH:
            raise ExprError(f"expression nested more than {budgets.MAX_EXPR_DEPTH} deep "
                            "(MAX_EXPR_DEPTH)")
        stack.extend((c, d + 1) for c in ast.iter_child_nodes(node))


@functools.lru_cache(maxsize=4096)
def names(text: str) -> frozenset:
    """Variable names an expression reads (function names and the names a comprehension
    binds excluded)."""
    tree = parse(text)
    funcs = {id(n.func) for n in ast.walk(tree) if isinstance(n, ast.Call)}
    bound = {n.id for c in ast.walk(tree) if isinstance(c, ast.comprehension)
             for n in ast.walk(c.target) if isinstance(n, ast.Name)}
    return frozenset(n.id for n in ast.walk(tree)
                     if isinstance(n, ast.Name) and id(n) not in funcs and n.id not in bound
                     and n.id not in CONSTANTS)


def evaluate(text: str, env: dict, strict: bool = True):
    """Value of expression ``text`` with the variables in ``env``.

    Every name must be defined, even in a branch that is not taken; with
    ``strict=False`` only the names the evaluation reaches (``formats.hf.config``
    expressions over a config.json that may lack a key).
    """
    read = names(text)
    for name in sorted(read) if strict else ():
        if name not in env:
            raise ExprError(f"undefined name {name!r} in {text.strip()!r}" + _hint(name, env))
    key = _memo_key(text, read, env) if strict else None
    if key is not None:
        hit = _MEMO.get(key)
        if hit is not None:
            budgets.check_budget()
            return budgets.check_value(list(hit[0]) if hit[1] else hit[0])
    tree = parse(text)
    token = _ITERATIONS.set([0])
    try:
        budgets.check_budget()
        value = budgets.check_value(_eval(tree, env, text))
        if key is not None:
            _remember(key, value)
        return value
    except ExprError as e:
        if text.strip() in str(e):
            raise
        raise ExprError(f"{text.strip()!r}: {e}") from None
    finally:
        _ITERATIONS.reset(token)


# Results of expressions over plain values (numbers, strings, bools, None), keyed by the
# text and the values of the names it reads: a layer repeated 60 times, or a spec checked
# in every variant, evaluates its shapes and names once per distinct set of values.
_MEMO: dict = {}
_MEMO_MAX = 16384
_PLAIN = (int, float, str, bool, type(None))


def _memo_key(text: str, read: frozenset, env) -> tuple | None:
    vals = []
    for n in sorted(read):
        v = env[n]
        if not isinstance(v, _PLAIN) or (isinstance(v, str) and len(v) > 256):
            return None                         # lists, config dicts: evaluated each time
        vals.append((type(v), repr(v) if isinstance(v, float) else v))   # -0.0, nan
    return text, tuple(vals)


def _remember(key, value) -> None:
    if isinstance(value, list):
        if len(value) > 4096 or not all(isinstance(v, _PLAIN) for v in value):
            return                              # bounded: at most 16384 x 4096 items
        entry = (tuple(value), True)            # a flat list: a fresh copy per hit
    elif isinstance(value, _PLAIN) and not (isinstance(value, str) and len(value) > 4096):
        entry = (value, False)
    else:
        return
    if len(_MEMO) >= _MEMO_MAX:
        _MEMO.clear()
    _MEMO[key] = entry


# comprehension iterations of the running evaluation (a one-element list)
_ITERATIONS: contextvars.ContextVar = contextvars.ContextVar("maxdecl_expr_iterations",
                                                             default=None)


def _comprehension(node, env, text):
    """``[elt for target in iter if cond ...]``: each generator's names bound in a scope
    over ``env``; at most MAX_ITERATIONS iterations in one evaluation, nested ones
    counted, each charged to the running check."""
    out, size = [], [0]
    count = _ITERATIONS.get() or [0]

    def run(gens, scope):
        if not gens:
            v = _eval(node.elt, scope, text)
            size[0] += 1 + (budgets.size_of(v) if isinstance(v, (list, tuple, str)) else 0)
            if size[0] > budgets.MAX_VALUE_SIZE:
                raise ExprError(f"{text.strip()!r}: the list is longer than "
                                f"{budgets.MAX_VALUE_SIZE:,} elements (MAX_VALUE_SIZE)")
            out.append(v)
            return
        gen = gens[0]
        items = _eval(gen.iter, scope, text)
        if not isinstance(items, (list, tuple, str, dict)):
            raise ExprError(f"{text.strip()!r}: a comprehension runs over a list, string or "
                            f"dict, not {type(items).__name__}")
        inner = dict(scope)       # this clause's names over the enclosing ones (one copy
        for item in items:        # per loop, not per item: lookups stay one dict probe)
            count[0] += 1
            if count[0] > budgets.MAX_ITERATIONS:
                raise ExprError(f"{text.strip()!r}: comprehensions run more than "
                                f"{budgets.MAX_ITERATIONS:,} iterations (MAX_ITERATIONS)")
            budgets.charge(budgets.ITERATION_COST)
            inner.update(_bind(gen.target, item, text))
            if all(_eval(c, inner, text) for c in gen.ifs):
                run(gens[1:], inner)

    run(node.generators, env)
    return _sized(out)


def _bind(target, value, text) -> dict:
    if isinstance(target, ast.Name):
        return {target.id: value}
    if not isinstance(value, (list, tuple)) or len(value) != len(target.elts):
        raise ExprError(f"{text.strip()!r}: cannot unpack {value!r} into "
                        f"{len(target.elts)} names")
    out = {}
    for t, v in zip(target.elts, value):
        out.update(_bind(t, v, text))
    return out


def _eval(node, env, text):
    if isinstance(node, ast.Constant):
        if isinstance(node.value, (int, float, str, bool)) or node.value is None:
            return node.value
        raise ExprError(f"{text!r}: constant {node.value!r} is not allowed")
    if isinstance(node, ast.Name):
        if node.id in CONSTANTS:
            return CONSTANTS[node.id]
        if node.id in env:
            return env[node.id]
        raise ExprError(f"undefined name {node.id!r} in {text.strip()!r}" + _hint(node.id, env))
    if isinstance(node, (ast.List, ast.Tuple)):
        return _sized([_eval(e, env, text) for e in node.elts])
    if isinstance(node, ast.ListComp):
        return _comprehension(node, env, text)
    if isinstance(node, ast.BinOp) and type(node.op) in _BINOPS:
        a, b = _eval(node.left, env, text), _eval(node.right, env, text)
        budgets.check_binop(_SYMBOL[type(node.op)], a, b)
        try:
            return _sized(_BINOPS[type(node.op)](a, b))
        except (ArithmeticError, TypeError, ValueError) as e:
            if isinstance(e, ExprError):
                raise
            raise ExprError(f"{text.strip()!r}: {e}") from None
    if isinstance(node, ast.UnaryOp) and type(node.op) in _UNARY:
        v = _eval(node.operand, env, text)
        try:
            return _UNARY[type(node.op)](v)
        except TypeError as e:
            raise ExprError(f"{text.strip()!r}: {e}") from None
    if isinstance(node, ast.BoolOp):
        is_and = isinstance(node.op, ast.And)
        v = None
        for e in node.values:
            v = _eval(e, env, text)
            if bool(v) != is_and:
                return v
        return v
    if isinstance(node, ast.Compare):
        left = _eval(node.left, env, text)
        for op, right_node in zip(node.ops, node.comparators):
            right = _eval(right_node, env, text)
            try:
                ok = _CMP[type(op)](left, right)
            except TypeError as e:
                raise ExprError(f"{text.strip()!r}: {e}") from None
            if not ok:
                return False
            left = right
        return True
    if isinstance(node, ast.IfExp):
        cond = _eval(node.test, env, text)
        return _eval(node.body if cond else node.orelse, env, text)
    if isinstance(node, ast.Subscript):
        seq = _eval(node.value, env, text)
        if isinstance(node.slice, ast.Slice):           # xs[a:b], xs[::-1]: a list or string
            bounds = [None if b is None else _eval(b, env, text)
                      for b in (node.slice.lower, node.slice.upper, node.slice.step)]
            if not isinstance(seq, (list, tuple, str)) or not all(
                    b is None or (isinstance(b, int) and not isinstance(b, bool))
                    for b in bounds):
                raise ExprError(f"{text.strip()!r}: a slice takes a list or string and int "
                                f"bounds, got {type(seq).__name__} and {bounds}")
            if bounds[2] == 0:
                raise ExprError(f"{text.strip()!r}: a slice step of 0")
            part = seq[slice(*bounds)]
            return _sized(list(part) if isinstance(part, tuple) else part)
        idx = _eval(node.slice, env, text)
        try:
            return seq[idx]
        except (IndexError, TypeError, KeyError) as e:
            raise ExprError(f"{text.strip()!r}: {e}") from None
    if isinstance(node, ast.Call):
        if not isinstance(node.func, ast.Name) or node.func.id not in FUNCTIONS:
            fname = node.func.id if isinstance(node.func, ast.Name) else ast.unparse(node.func)
            raise ExprError(f"unknown function {fname!r} in {text.strip()!r} (allowed: "
                            f"{', '.join(sorted(FUNCTIONS))})")
        if node.keywords:
            raise ExprError(f"{text.strip()!r}: keyword arguments are not supported")
        args = [_eval(a, env, text) for a in node.args]
        try:
            return _sized(FUNCTIONS[node.func.id](*args))
        except ExprError:
            raise
        except (ArithmeticError, TypeError, ValueError) as e:
            raise ExprError(f"{text.strip()!r}: {node.func.id}: {e}") from None
    raise ExprError(f"{text.strip()!r}: {type(node).__name__} is not allowed in expressions")


def _sized(v):
    budgets.size_of(v)
    return v


def _hint(name: str, env: dict) -> str:
    import difflib

    close = difflib.get_close_matches(name, [k for k in env if not k.startswith("_")], n=1)
    return f"; did you mean {close[0]!r}?" if close else ""


# -- strings with {expr} parts ---------------------------------------------------------

def split_template(s: str) -> list[tuple[bool, str]]:
    """Split ``"blk.{i}.x"`` into ``[(False, "blk."), (True, "i"), (False, ".x")]``.

    ``{{`` and ``}}`` stand for literal braces. Brackets inside an expression nest.
    """
    return list(_split_cached(s)) if len(s) <= 4096 else _split(s)   # bounded cache


@functools.lru_cache(maxsize=8192)
def _split_cached(s: str) -> tuple:
    return tuple(_split(s))


def _split(s: str) -> list:
    parts, buf, i, n = [], [], 0, len(s)
    while i < n:
        c = s[i]
        if c in "{}" and i + 1 < n and s[i + 1] == c:
            buf.append(c)
            i += 2
            continue
        if c == "}":
            raise ExprError(f"unmatched '}}' in {s!r}")
        if c != "{":
            buf.append(c)
            i += 1
            continue
        depth, j = 1, i + 1
        while j < n and depth:
            depth += {"{": 1, "}": -1}.get(s[j], 0)
            j += 1
        if depth:
            raise ExprError(f"unclosed '{{' in {s!r}")
        if buf:
            parts.append((False, "".join(buf)))
            buf = []
        inner = s[i + 1:j - 1]
        if not inner.strip():
            raise ExprError(f"empty '{{}}' in {s!r}")
        parts.append((True, inner))
        i = j
    if buf:
        parts.append((False, "".join(buf)))
    return parts


def is_template(value) -> bool:
    """True for a string with at least one ``{expr}`` part."""
    return isinstance(value, str) and "{" in value and any(e for e, _ in _safe_split(value))


def _safe_split(s):
    try:
        return split_template(s)
    except ExprError:
        return [(True, s)]


def render(value, env: dict):
    """Evaluate a spec value: ``"{e}"`` -> value of e (typed); ``"a{e}b"`` -> str;
    lists are rendered element-wise (a new list, charged to the running check's
    budgets.MAX_TOTAL_SIZE); anything else is returned unchanged."""
    if isinstance(value, list):
        budgets.check_budget()
        return budgets.check_value(_render_list(value, env))
    if not isinstance(value, str) or "{" not in value and "}" not in value:
        return value
    parts = split_template(value)
    if len(parts) == 1 and parts[0][0]:
        return evaluate(parts[0][1], env)
    out, n = [], 0
    for is_expr, t in parts:
        out.append(_to_text(evaluate(t, env)) if is_expr else t)
        n += len(out[-1])
        if n > budgets.MAX_VALUE_SIZE:
            raise ExprError(f"{value[:60]!r}...: renders to more than "
                            f"{budgets.MAX_VALUE_SIZE:,} characters (MAX_VALUE_SIZE)")
    return budgets.check_value("".join(out))


def _render_list(value: list, env: dict) -> list:
    return [_render_list(v, env) if isinstance(v, list) else render(v, env) for v in value]


def _to_text(v) -> str:
    if isinstance(v, float) and v.is_integer():
        return str(int(v))
    return str(v)


def template_names(value) -> set[str]:
    """Names read by every ``{expr}`` in ``value`` (recursing into lists)."""
    if isinstance(value, list):
        return set().union(*(template_names(v) for v in value)) if value else set()
    if not isinstance(value, str) or "{" not in value:
        return set()
    out = set()
    for is_expr, t in split_template(value):
        if is_expr:
            out |= names(t)
    return out
