"""The expression language: what it computes and what it refuses."""

import math

import pytest

from maxdecl.spec.expr import ExprError, alibi_slopes, evaluate, render, split_template

ENV = {"dim": 4096, "n_heads": 32, "i": 5, "window": 512, "rope_local": 1e4,
       "rope_global": 1e6, "eps": 1e-5, "sizes": [1, 2, 3], "cfg": {"a": 7}}


@pytest.mark.parametrize("text, want", [
    ("dim // n_heads", 128),
    ("dim / n_heads", 128.0),
    ("2 ** 3 ** 2", 512),
    ("-dim % 7", (-4096) % 7),
    ("dim ** 0.5", 64.0),
    ("None if (i + 1) % 6 == 0 else window", None),
    ("rope_global if (i + 1) % 6 == 0 else rope_local", 1e6),
    ("1 < 2 <= 2 < 1", False),
    ("not (dim > 1 and n_heads < 2) or False", True),
    ("[dim, dim, dim]", [4096, 4096, 4096]),
    ("[dim] * 3", [4096, 4096, 4096]),
    ("sizes[-1]", 3),
    ("cfg['a']", 7),
    ("min(3, max(1, 2)) + int(2.7) + float(1)", 5.0),
    ("sqrt(16)", 4.0),
    ("3 in sizes", True),
    ("None", None),
    ("True and 'x'", "x"),
    ("range(3)", [0, 1, 2]),
    ("range(n_heads // 8, 10, 3)", [4, 7]),
    ("round(sin(0.5) ** 2 + cos(0.5) ** 2, 9)", 1.0),
])
def test_evaluates(text, want):
    assert evaluate(text, ENV) == want


@pytest.mark.parametrize("text, fragment", [
    ("__import__('os').system('ls')", "unknown function"),
    ("dim.__class__", "Attribute is not allowed"),
    ("(lambda: 1)()", "unknown function"),
    ("[x for x in sizes]", "ListComp is not allowed"),
    ("open('/etc/passwd')", "unknown function 'open'"),
    ("dimm + 1", "did you mean 'dim'?"),
    ("1 if True else nope", "undefined name 'nope'"),
    ("2 ** 100000", "exponent"),
    ("[0] * 10 ** 9", "too long"),
    ("dim +", "invalid expression"),
    ("sizes[1:2]", "Slice is not allowed"),
    ("1 / 0", "division by zero"),
    ("{1: 2}", "Dict is not allowed"),
    ("f'{dim}'", "JoinedStr is not allowed"),
    ("range(10 ** 9)", "MAX_VALUE_SIZE"),
    ("range(1.5)", "range takes 1 to 3 integers"),
])
def test_refuses(text, fragment):
    with pytest.raises(ExprError) as e:
        evaluate(text, ENV)
    assert fragment in str(e.value)


def test_render_keeps_type_of_whole_expressions_and_interpolates_parts():
    assert render("{dim // n_heads}", ENV) == 128
    assert render("blk.{i}.attn_q", ENV) == "blk.5.attn_q"
    assert render("neox", ENV) == "neox"
    assert render(["{dim}", "seq", 3], ENV) == [4096, "seq", 3]
    assert render("{{literal}} {i}", ENV) == "{literal} 5"
    assert split_template("a{[1, [2]]}b") == [(False, "a"), (True, "[1, [2]]"), (False, "b")]
    with pytest.raises(ExprError, match="unclosed"):
        render("blk.{i", ENV)


def _mpt_gen_slopes(n_heads, alibi_bias_max=8):
    """MPT's gen_slopes (llm-foundry), in plain Python."""
    _n = 2 ** math.ceil(math.log2(n_heads))
    m = [(k + 1) * (alibi_bias_max / _n) for k in range(_n)]
    slopes = [1.0 / 2 ** x for x in m]
    if _n != n_heads:
        slopes = (slopes[1::2] + slopes[::2])[:n_heads]
    return slopes


@pytest.mark.parametrize("n_heads", [1, 4, 8, 12, 24, 32, 40])
def test_alibi_slopes_match_mpt(n_heads):
    got = alibi_slopes(n_heads, 8.0)
    want = _mpt_gen_slopes(n_heads, 8)
    assert len(got) == n_heads
    assert all(math.isclose(a, b, rel_tol=1e-12) for a, b in zip(got, want))
    assert evaluate("alibi_slopes(n_heads, 8)", ENV) == alibi_slopes(32, 8)
