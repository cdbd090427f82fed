"""Every limit of maxdecl/spec/budgets.py: refused quickly, with a message naming it."""

import re
import time

import pytest

import maxdecl as md
from maxdecl.spec import budgets
from maxdecl.spec.expr import ExprError, evaluate, render

ENV = {"x": "a" * 1000, "n": 4, "big": 2**4000}


@pytest.mark.parametrize("text, limit", [
    ("(10**4096)**4096", "MAX_INT_BITS"),
    ("2**4096", "MAX_INT_BITS"),
    ("big * big", "MAX_INT_BITS"),
    ("9**9**9", "MAX_EXPONENT"),
    ("2.0 ** 10000", "MAX_EXPONENT"),
    ("round(123, -10**7)", "MAX_EXPONENT"),
    ("int('9' * 5000)", "MAX_INT_BITS"),
    ("'a' * 1000001", "MAX_VALUE_SIZE"),
    ("x * 1001", "MAX_VALUE_SIZE"),
    ("[0] * 10**9", "MAX_VALUE_SIZE"),
    ("[[0] * 1000000] * 1000000", "MAX_VALUE_SIZE"),
    ("'a' * 1000000 + 'a'", "MAX_VALUE_SIZE"),
    ("[x] * 1001", "MAX_VALUE_SIZE"),
    ("'%s' % [[0] * 100000] * 11", "MAX_VALUE_SIZE"),
    ("'%999999999d' % 1", "MAX_FORMAT_WIDTH"),
    ("'%.999999999f' % 1.0", "MAX_FORMAT_WIDTH"),
    ("'%-01001s' % 'a'", "MAX_FORMAT_WIDTH"),
    ("'%*d' % [5, 1]", "'*' width"),
    ("alibi_slopes(10**9)", "MAX_VALUE_SIZE"),
    ("llama3_rope_factors(10**9, 1e4, 8.0, 1.0, 4.0, 64)", "MAX_VALUE_SIZE"),
    ("-" * 100 + "1", "MAX_EXPR_DEPTH"),
    ("1 + " * 700 + "1", "MAX_EXPR_CHARS"),
    ("(-8) ** 0.5", "complex"),
    ("[i for i in range(65537)]", "MAX_ITERATIONS"),
    ("[[j for j in range(1000)] for i in range(1000)]", "MAX_ITERATIONS"),
    ("[x for i in range(2000)]", "MAX_VALUE_SIZE"),
])
def test_expression_limits(text, limit):
    t0 = time.perf_counter()
    with pytest.raises(ExprError, match=limit.replace("*", r"\*")):
        evaluate(text, ENV)
    assert time.perf_counter() - t0 < 1.0


def test_limits_allow_ordinary_values():
    assert evaluate("2**4095 > 0", {}) is True
    assert evaluate("'%8.3f' % 1.5", {}) == "   1.500"
    assert len(evaluate("[0] * 1000000", {})) == 1_000_000
    assert len(evaluate("alibi_slopes(64)", {})) == 64
    assert evaluate("round(1234, -2)", {}) == 1200


def test_comprehensions_charge_the_whole_check():
    """Each comprehension stays under MAX_ITERATIONS, but together they are charged to
    the check's MAX_TOTAL_SIZE, so a spec of many of them still stops early."""
    t0 = time.perf_counter()
    with budgets.metered(), pytest.raises(ExprError, match="MAX_TOTAL_SIZE"):
        for k in range(100):
            evaluate(f"[i + {k} for i in range(60000)]", {})
    assert time.perf_counter() - t0 < 10.0


def test_value_depth():
    env = {"v": 0}
    with pytest.raises(ExprError, match="MAX_VALUE_DEPTH"):
        for _ in range(40):
            env["v"] = evaluate("[v]", env)


def test_template_render_length():
    with pytest.raises(ExprError, match="MAX_VALUE_SIZE"):
        render("{x}{x}", {"x": "a" * 600_000})


def test_total_size_is_bounded_per_check():
    with budgets.metered():
        with pytest.raises(ExprError, match="MAX_TOTAL_SIZE"):
            for _ in range(budgets.MAX_TOTAL_SIZE // 999_999 + 2):
                evaluate("'a' * 999999", {})
        with pytest.raises(ExprError, match="MAX_TOTAL_SIZE"):   # and then nothing runs
            evaluate("1", {})
    assert evaluate("1", {}) == 1                               # a new check starts afresh


SMALL = """\
maxdecl: 1
name: small
variants:
  tiny: {dim: 32, n_layers: N}
encodings: {default: f32}
inputs:
  x: {dtype: float32, shape: [4, dim]}
layers:
  - name: "blk.{i}"
    repeat: n_layers
    layers:
      - {op: add, in: [x, x], out: x}
outputs: [x]
"""


def test_small_spec_is_valid():
    assert md.spec.validate_text(SMALL.replace("N", "3")) == []


@pytest.mark.parametrize("n, limit", [(16777216, "MAX_REPEAT"), (4097, "MAX_REPEAT")])
def test_repeat_limit(n, limit):
    t0 = time.perf_counter()
    problems = md.spec.validate_text(SMALL.replace("N", str(n)), "s.yaml")
    assert any(limit in p.message and p.line == 10 for p in problems), problems
    assert time.perf_counter() - t0 < 2.0


def test_unrolled_limit():
    text = SMALL.replace("N", "4096").replace(
        "      - {op: add, in: [x, x], out: x}",
        "      - name: inner\n        repeat: 16\n        layers:\n"
        "          - {op: add, in: [x, x], out: x}")
    t0 = time.perf_counter()
    problems = md.spec.validate_text(text, "s.yaml")
    assert sum("MAX_UNROLLED" in p.message for p in problems) == 1, problems
    assert time.perf_counter() - t0 < 5.0


def test_a_spent_budget_is_reported_before_what_follows_from_it():
    """The limit stops the check, so values made after it look undefined, also at lines
    before it (a block's body): the limit comes first, in validate and in load errors."""
    from maxdecl.spec.semantic import problem_order

    class P:
        def __init__(self, line, message):
            self.line, self.col, self.message = line, 1, message

    found = sorted([P(30, "more than 65,536 layer instances (limit MAX_UNROLLED)"),
                    P(12, "undefined value 'y'")], key=problem_order)
    assert "MAX_UNROLLED" in found[0].message
    text = SMALL.replace("N", "4096").replace(
        "      - {op: add, in: [x, x], out: x}",
        "      - name: inner\n        repeat: 16\n        layers:\n"
        "          - {op: add, in: [x, x], out: x}")
    problems = md.spec.validate_text(text, "s.yaml")
    assert "MAX_UNROLLED" in problems[0].message


@pytest.mark.parametrize("data, line, col, fragment", [
    (b"maxdecl: 1\nname: a\xffb\n", 2, 8, "invalid UTF-8"),
    (b"maxdecl: 1\nn\xc3me: x\n", 2, 2, "invalid UTF-8"),
    (b"maxdecl: 1\nname: \xe2\x82\n", 2, 7, "invalid UTF-8"),
    (b"maxdecl: 1\nname: a\x00b\n", 2, 8, "NUL byte"),
    (b"maxdecl: 1\nname: a\x1bb\n", 2, 8, "control character U+001B"),
    (b"maxdecl: 1\nvariants:\n\ttiny: {}\n", 3, 1, "tab is used for indentation"),
    (b"maxdecl: 1\nvariants:\n  a: 1\n\tb: 2\n", 4, 1, "tab is used for indentation"),
    (b"a: " + b"[" * 100000, 1, None, "MAX_YAML_DEPTH"),
    (b"#" * (budgets.MAX_SPEC_BYTES + 1), 1, 1, "MAX_SPEC_BYTES"),
])
def test_decode_errors_are_positioned(tmp_path, data, line, col, fragment):
    path = tmp_path / "s.yaml"
    path.write_bytes(data)
    problems = md.validate_spec(path)
    assert len(problems) == 1, problems
    p = problems[0]
    assert fragment in p.message and p.line == line and (col is None or p.col == col), p
    assert str(p).startswith(f"{path}:{line}:") and "\n" not in str(p)
    with pytest.raises(md.SpecError, match=re.escape(fragment)) as e:
        md.load_spec(path)
    assert "\n" not in str(e.value)


def test_alias_bomb_is_bounded():
    text = "a: &a [x, x, x, x, x, x, x, x, x, x]\n" + "".join(
        f"{c}: &{c} [{', '.join(['*' + p] * 10)}]\n" for p, c in zip("abcdefgh", "bcdefghi"))
    t0 = time.perf_counter()
    problems = md.spec.validate_text(text)
    assert any("MAX_YAML_NODES" in p.message for p in problems)
    assert time.perf_counter() - t0 < 2.0


@pytest.mark.parametrize("where", ["name", "weight", "in"])
def test_long_names_are_refused_before_they_are_copied_per_instance(where):
    long = "a" * 300_000
    text = SMALL.replace("N", "4000")
    if where == "name":
        text = text.replace("      - {op: add, in: [x, x], out: x}",
                            f"      - {{name: {long}, op: add, in: [x, x], out: x}}")
    elif where == "weight":
        text = text.replace("      - {op: add, in: [x, x], out: x}",
                            f"      - {{name: w, weights: {{? {long} : [dim]}}, op: add, "
                            f"in: [x, .{long}], out: x}}")
    else:
        text = text.replace("in: [x, x]", f"in: [x, {long}]")
    t0 = time.perf_counter()
    problems = md.spec.validate_text(text, "s.yaml")
    assert any("MAX_PATH_CHARS" in p.message for p in problems), problems
    assert time.perf_counter() - t0 < 2.0


def test_block_chain_depth_is_bounded():
    """600 blocks each using the next: a problem naming MAX_LAYER_DEPTH, not a
    RecursionError."""
    n = 600
    blocks = "".join(f"  b{i}:\n    inputs: [x]\n    outputs: [x]\n    layers:\n"
                     f"      - {{name: l, block: b{i + 1}, in: x, out: x}}\n" for i in range(n))
    blocks += (f"  b{n}:\n    inputs: [x]\n    outputs: [x]\n    layers:\n"
               "      - {op: add, in: [x, x], out: x}\n")
    text = SMALL.replace("N", "1").replace(
        "layers:\n  - name:",
        "blocks:\n" + blocks + "layers:\n  - {name: top, block: b0, in: x, out: x}\n  - name:")
    problems = md.spec.validate_text(text, "s.yaml")
    assert any("MAX_LAYER_DEPTH" in p.message for p in problems), problems


@pytest.mark.parametrize("where", ["weight", "input"])
def test_a_shape_past_the_element_limit_is_a_located_problem(where):
    """A weight or input whose known dims multiply past MAX_STATIC_ELEMENTS (a huge
    param) is a problem at its shape, not an exception out of validate."""
    huge = "99999999999999999999999999999999999999"
    text = SMALL.replace("N", "1")
    if where == "input":
        text = text.replace("shape: [4, dim]", f"shape: [4, {huge}]")
    else:
        text = text.replace("tiny: {dim: 32,", f"tiny: {{dim: {huge},").replace(
            "      - {op: add, in: [x, x], out: x}",
            "      - {name: w, weights: {scale: [dim, dim]}}\n"
            "      - {op: add, in: [x, x], out: x}")
    problems = md.spec.validate_text(text, "s.yaml")
    assert any("MAX_STATIC_ELEMENTS" in p.message for p in problems), problems
