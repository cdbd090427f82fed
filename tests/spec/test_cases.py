"""Spec files under cases/valid must pass; each file under cases/invalid states the
problem it must produce in its first line: ``# expect: LINE:COL message fragment``."""

import re
from pathlib import Path

import pytest

import maxdecl as md

CASES = Path(__file__).parent / "cases"
EXPECT = re.compile(r"#\s*expect:\s*(\d+):(\d+)\s+(.+)")


def _cases(kind):
    return sorted((CASES / kind).glob("*.yaml"))


@pytest.mark.parametrize("path", _cases("valid"), ids=lambda p: p.stem)
def test_valid_case(path):
    assert md.validate_spec(path) == []
    spec = md.load_spec(path)
    assert spec.program().ops


@pytest.mark.parametrize("path", _cases("invalid"), ids=lambda p: p.stem)
def test_invalid_case(path):
    first = path.read_text().splitlines()[0]
    m = EXPECT.match(first)
    assert m, f"{path.name}: first line must be '# expect: LINE:COL fragment'"
    line, col, fragment = int(m[1]), int(m[2]), m[3].strip()
    problems = md.validate_spec(path)
    shown = "\n".join(f"  {p.line}:{p.col}: {p.message}" for p in problems) or "  (none)"
    assert any(p.line == line and p.col == col and fragment in p.message for p in problems), \
        f"{path.name}: expected {line}:{col} {fragment!r}; got\n{shown}"
    assert problems == sorted(problems, key=lambda p: (p.line, p.col))
    assert all(p.file == str(path) for p in problems)
    with pytest.raises(md.SpecError) as err:
        md.load_spec(path)
    msg = str(err.value)
    assert msg.startswith(f"{path}:{problems[0].line}:{problems[0].col}: ")
    if len(problems) > 1:
        assert f"(and {len(problems) - 1} more problem" in msg


def test_invalid_cases_cover_the_required_kinds():
    names = {p.stem for p in _cases("invalid")}
    required = {"wrong_type", "unknown_op", "misspelled_attribute", "duplicate_key",
                "undefined_name", "bad_indentation", "unknown_encoding", "python_tag",
                "negative_repeat", "bad_expression", "block_size", "duplicate_layer_name"}
    assert required <= names, f"missing cases: {sorted(required - names)}"


def test_a_layer_no_variant_runs_is_still_checked_for_names_and_ops():
    """A repeat that is 0 in every variant (a part switched off) still has its op names,
    attribute names and expressions checked: an undefined name, a disallowed construct,
    an unknown op or attribute; what depends on values it never gets (types) is not."""
    from maxdecl.spec import validate_text

    text = """maxdecl: 1
name: x
variants: {tiny: {dim: 8, clip: null}}
inputs: {x: {dtype: float32, shape: [2, dim]}}
layers:
  - repeat: "{1 if clip else 0}"
    layers:
      - {op: reshape, in: x, attrs: {shape: [7]}, out: x}
      - {op: maximum, in: [x, "{nosuchparam + 1}"], out: x}
      - {op: maximum, in: [x, "{(lambda: 1)()}"], out: x}
      - {op: minimumm, in: [x, "{clip}"], out: x}
      - {op: maximum, in: [x, "{-clip}"], attrs: {axiss: 1}, out: x}
outputs: [x]
"""
    got = [(p.line, p.message) for p in validate_text(text, "x.yaml")]
    assert [line for line, _ in got] == [9, 10, 11, 12]
    assert "undefined name 'nosuchparam'" in got[0][1]
    assert "unknown function" in got[1][1]
    assert "unknown op 'minimumm'; did you mean 'minimum'?" in got[2][1]
    assert "unknown attribute 'axiss'" in got[3][1]
    assert validate_text(text.replace("nosuchparam", "dim").replace("(lambda: 1)()", "dim")
                         .replace("minimumm", "minimum").replace("axiss: 1", ""), "x.yaml") == []
