"""A repeat inside another: a 0/1 repeat (an optional part) without `index:` keeps the
enclosing repeat's index, a real inner loop must name its own."""

from maxdecl.spec import parse_text, validate_text

SPEC = """\
maxdecl: 1
name: nested
variants:
  tiny: {dim: 4, n_layers: 3, widths: [2, 3, 5]}
inputs:
  x: {dtype: float32, shape: [dim]}
outputs: [x]
layers:
  - name: "blk.{i}"
    repeat: n_layers
    layers:
      - name: part
        repeat: "%s"
        %s
        weights: {weight: ["{widths[i]}", dim]}
        layers:
          - {op: matmul, in: [.weight, x], out: y}
          - {op: sum, in: y, attrs: {axis: 0}, out: s}
          - {op: add, in: [x, s], out: x}
"""


def test_an_optional_part_keeps_the_enclosing_index():
    text = SPEC % ("{1 if i != 1 else 0}", "")
    spec, problems = parse_text(text, "nested.yaml")
    assert problems == []
    shapes = {w.name: tuple(w.shape) for w in spec.program().weights}
    assert shapes == {"blk.0.part.weight": (2, 4), "blk.2.part.weight": (5, 4)}


def test_an_inner_loop_without_its_own_index_is_refused():
    problems = validate_text(SPEC % ("2", ""), "nested.yaml")
    assert [p.message for p in problems] == [
        "a repeat inside another needs its own index: `i` is the enclosing repeat's "
        "(write `index: j` and use `{j}`)"]


def test_an_inner_loop_with_its_own_index():
    text = (SPEC % ("2", "index: j")).replace("name: part", 'name: "part{j}"')
    assert validate_text(text, "nested.yaml") == []


def test_an_inner_loop_that_reads_no_index_needs_none():
    body = SPEC.split("      - name: part")[0] + (
        "      - repeat: 3\n"
        "        layers:\n"
        "          - {op: add, in: [x, x], out: x}\n")
    assert validate_text(body, "nested.yaml") == []
