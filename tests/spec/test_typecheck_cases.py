"""The type-check corpus: each spec under ``cases/typecheck`` is valid YAML and schema
but ill-typed; its first line states ``# expect: LINE:COL fragment``. Each must fail
``maxdecl validate`` (exit 1) at that line, ``md.build`` with the same message, and,
where the graph itself sees the mistake (weights bound, spec checks bypassed), the
graph's GraphError must carry the same text: one rule, one message."""

import re
import subprocess
import sys
from pathlib import Path

import pytest

import maxdecl as md
from maxdecl.ops import _registry
from maxdecl.weights.random import program_weights
from maxdecl.spec import parse_text
from maxdecl.spec.semantic import expand_or_raise, select_variant

CASES = sorted((Path(__file__).parent / "cases" / "typecheck").glob("*.yaml"))
EXPECT = re.compile(r"#\s*expect:\s*(\d+):(\d+)\s+(.+)")


def _expect(path):
    m = EXPECT.match(path.read_text().splitlines()[0])
    assert m, f"{path.name}: first line must be '# expect: LINE:COL fragment'"
    return int(m[1]), int(m[2]), m[3].strip()


@pytest.mark.parametrize("path", CASES, ids=lambda p: p.stem)
def test_case_fails_validate_and_build_with_one_message(path):
    line, col, fragment = _expect(path)
    problems = md.validate_spec(path)
    hit = [p for p in problems if p.line == line and p.col == col and fragment in p.message]
    assert hit, f"{path.name}: expected {line}:{col} {fragment!r}, got {problems}"
    with pytest.raises(md.SpecError) as err:
        md.build(path)
    assert str(err.value).startswith(str(problems[0]))

    # the graph's own rule, with the spec-level type check out of the way
    spec, _ = parse_text(path.read_text(), str(path))
    spec = select_variant(spec, spec.default_variant)
    prog = expand_or_raise(spec, spec.variant, check_encodings=False)
    spec_level = "is not a declared dim" in hit[0].message or "state output" in hit[0].message
    try:
        md.build(spec, weights=program_weights(prog))
    except md.GraphError as e:
        # an undeclared dim name may still break a graph rule, in the graph's own words
        assert spec_level or str(e) == str(hit[0]), "the graph and validate word the problem alike"
    else:
        assert spec_level, "only spec-level facts (dim names, state outputs) are beyond the graph's rules"


def test_validate_cli_exits_1_and_names_every_broken_line():
    out = subprocess.run([sys.executable, "-m", "maxdecl", "validate", *map(str, CASES)],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 1, out.stderr
    for path in CASES:
        line, col, _ = _expect(path)
        assert f"{path}:{line}:{col}: " in out.stdout, path.name


def test_corpus_covers_every_type_rule():
    """Every distinct rule function of the spec ops fails in at least one case."""
    failing = set()
    for path in CASES:
        fragment = _expect(path)[2]
        m = re.match(r"(?:[\w.<>]+: )?(\w+): ", fragment)
        if m and m[1] in _registry.REGISTRY:
            failing.add(_registry.get(m[1]).rule)
    builtin = [n for n in _registry.spec_ops() if _registry.get(n).kind != "custom"]
    missing = sorted({n for n in builtin if _registry.get(n).rule not in failing})
    assert len(CASES) >= 30
    assert not missing, f"no case breaks the type rule of: {missing}"
