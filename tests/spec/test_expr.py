"""The expression language: what it computes and what it refuses."""

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

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
    ("[s * n_heads for s in sizes if s != 2]", [32, 96]),
    ("[a * b for a, b in [[1, 2], [3, 4]]]", [2, 12]),
    ("[i + j for i in range(3) for j in range(i)]", [1, 2, 3]),
    ("[k for k in cfg]", ["a"]),
    ("[i for i in sizes] + [i]", [1, 2, 3, 5]),            # the loop's i shadows only inside
    ("[[d for d in range(r)] for r in sizes][2]", [0, 1, 2]),
    ("[sum([sizes[j] for j in range(k)]) for k in range(4)]", [0, 1, 3, 6]),
    ("sum([0.5, 1.5], 1)", 3.0),
    ("[typeof(v) for v in [1, 1.5, 'a', True, None, sizes, cfg]]",
     ["int", "float", "str", "bool", "none", "list", "dict"]),
    ("float32(0.1)", 0.10000000149011612),                  # numpy.float32(0.1), widened
    ("float32(3)", 3.0),
    ("2 * pi", 2 * math.pi),
    ("[d % h == 0 for d, h in zip([64, 96], [8, 5])]", [True, False]),
    ("zip(sizes, 'ab', range(9))", [[1, "a", 0], [2, "b", 1]]),
    ("[make_divisible(c, 8) for c in [3, 16 * 0.25, 32 * 0.75, 100, 1000 * 1.4]]",
     [8, 8, 24, 104, 1400]),
    ("make_divisible(10, 8, 16)", 16),
    ("prod([2, 4, 5, 8])", 320),
    ("prod(sizes, 0.5)", 3.0),
    ("all([s > 0 for s in sizes])", True),
    ("any([s > 2 for s in sizes])", True),
    ("all([])", True),
    ("sorted([3, 1.5, 2])", [1.5, 2, 3]),
    ("sorted(['b', 'a'])", ['a', 'b']),
    ("sizes[1:2]", [2]),
    ("prod(sizes[1:])", 6),
    ("[sum(sizes[:i + 1]) for i in range(len(sizes))]", [1, 3, 6]),
    ("sizes[::-1]", [3, 2, 1]),
])
def test_evaluates(text, want):
    assert evaluate(text, ENV) == want


@pytest.mark.parametrize("text, fragment", [
    ("all(sizes)", "all takes a list of true/false values"),
    ("sorted([1, 'a'])", "sorted takes a list of numbers or of strings"),
    ("__import__('os').system('ls')", "unknown function"),
    ("dim.__class__", "Attribute is not allowed"),
    ("(lambda: 1)()", "unknown function"),
    ("{x for x in sizes}", "SetComp is not allowed"),
    ("{x: 1 for x in sizes}", "DictComp is not allowed"),
    ("(x for x in sizes)", "GeneratorExp is not allowed"),
    ("[x for x in dim]", "runs over a list, string or dict, not int"),
    ("[x for x.y in sizes]", "binds names only"),
    ("[x for sizes[0] in sizes]", "binds names only"),
    ("[a for a, b in sizes]", "cannot unpack 1 into 2 names"),
    ("[y for x in sizes]", "undefined name 'y'"),
    ("open('/etc/passwd')", "unknown function 'open'"),
    ("dimm + 1", "did you mean 'dim'?"),
    ("1 if True else nope", "undefined name 'nope'"),
    ("2 ** 100000", "exponent"),
    ("[0] * 10 ** 9", "too long"),
    ("dim +", "invalid expression"),
    ("sizes[::0]", "a slice step of 0"),
    ("dim[1:]", "a slice takes a list or string"),
    ("1 / 0", "division by zero"),
    ("{1: 2}", "Dict is not allowed"),
    ("f'{dim}'", "JoinedStr is not allowed"),
    ("range(10 ** 9)", "MAX_VALUE_SIZE"),
    ("range(1.5)", "range takes 1 to 3 integers"),
    ("sum([1, 'a'])", "sum takes a list of numbers"),
    ("1 if dim\n  else 2 if", "it spans lines"),
    ("float32(1e300)", "out of float32's range"),
    ("float32('a')", "float32 takes a number"),
    ("zip(dim)", "zip takes lists"),
    ("make_divisible(8, 0)", "positive divisor"),
    ("prod([1, 'a'])", "prod takes a list of numbers"),
    ("prod([2 ** 2000, 2 ** 2000, 2 ** 2000])", "bits"),
    ("[pi for pi in sizes]", "cannot bind the constant 'pi'"),
])
def test_refuses(text, fragment):
    with pytest.raises(ExprError) as e:
        evaluate(text, ENV)
    assert fragment in str(e.value)


def test_names_of_a_comprehension_are_its_free_names():
    from maxdecl.spec.expr import names

    assert names("[n if t != 'conv' else 0 for t in layer_types]") == {"n", "layer_types"}
    assert names("[i * j for i in range(k) for j in range(i)]") == {"k"}
    assert names("2 * pi * k") == {"k"}                 # a constant, not a free name


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


def test_make_divisible_is_transformers_rule():
    hf = pytest.importorskip("transformers.models.mobilevit.modeling_mobilevit")
    for v in [1, 3, 7.5, 12, 16 * 0.25, 32 * 0.75, 57.6, 100, 250.5, 1000 * 1.4]:
        for d, low in [(8, None), (4, None), (8, 16)]:
            assert evaluate(f"make_divisible({v}, {d}, {low})", {}) == \
                hf.make_divisible(v, d, low), (v, d, low)


def test_normal_icdf_and_erf_match_torch():
    """Gemma 3n's sparsity cutoff: torch's Normal(0, 1).icdf(p) (float64, within 1e-11)."""
    torch = pytest.importorskip("torch")
    for p in (1e-6, 0.05, 0.5, 0.8, 0.95, 0.999999):
        got = evaluate(f"normal_icdf({p})", {})
        ref = torch.distributions.Normal(0.0, 1.0).icdf(torch.tensor(p, dtype=torch.float64))
        assert abs(got - ref.item()) < 1e-11 * max(1.0, abs(got)), p
        assert abs(evaluate(f"erf({got})", {}) - torch.erf(ref).item()) < 1e-12
    for bad in ("normal_icdf(0)", "normal_icdf(1.5)", "normal_icdf('a')"):
        with pytest.raises(ExprError, match="strictly between 0 and 1"):
            evaluate(bad, {})


@settings(max_examples=200, deadline=None)
@given(st.text(alphabet=" |,aAbB-_\t", max_size=40), st.sampled_from([None, "|", ",", "ab"]))
def test_string_functions_are_pythons(s, sep):
    """lower / upper / strip / split of a config string (DeBERTa's "p2c|c2p") are
    Python's own string methods."""
    env = {"s": s, "sep": sep}
    assert evaluate("lower(s)", env) == s.lower()
    assert evaluate("upper(s)", env) == s.upper()
    assert evaluate("strip(s)", env) == s.strip()
    assert evaluate("split(s, sep)", env) == s.split(sep)
    assert evaluate("[strip(x) for x in split(lower(s), '|')]", env) == \
        [x.strip() for x in s.lower().split("|")]


def test_string_functions_refuse_and_stay_bounded():
    for bad, why in (("lower(3)", "lower takes a string"), ("split('a', '')", "non-empty"),
                     ("split(1)", "split takes a string"), ("strip(['a'])", "strip takes")):
        with pytest.raises(ExprError, match=why):
            evaluate(bad, {})
    # the longest string a value may be splits into at most a million and one parts
    assert evaluate("len(split(s, 'a'))", {"s": "a" * 999_999}) == 1_000_000
