"""One mistake, one problem: a block parameter or a repeat count that fails to evaluate
leaves its layers unexpanded, and nothing that would only follow from it is reported
(the block's shapes computed from the missing value, its weights that "no mapping
entry names", encoding overrides that "match no weight")."""

from pathlib import Path

from maxdecl.spec import validate_text

SPECS = Path(__file__).resolve().parents[2] / "specs"


def _problems(text: str) -> list:
    return validate_text(text, "lfm2.yaml")


def test_a_bad_block_parameter_is_the_only_problem():
    src = (SPECS / "lfm2.yaml").read_text()
    bad = src.replace('kv: "{kv_heads_per_layer[i] if kv_heads_per_layer else n_kv_heads}"',
                      'kv: "{kv_heads_per_layer[i] if kv_heads_per_layer}"')
    assert bad != src
    problems = _problems(bad)
    assert len(problems) == 1, "\n".join(map(str, problems))
    assert "parameter 'kv'" in problems[0].message
    assert "expected 'else'" in problems[0].message


def test_a_bad_repeat_count_is_the_only_problem():
    src = (SPECS / "lfm2.yaml").read_text()
    bad = src.replace("    repeat: n_layers\n    block: lfm2_layer",
                      "    repeat: n_layerz\n    block: lfm2_layer")
    assert bad != src
    problems = _problems(bad)
    assert len(problems) == 1, "\n".join(map(str, problems))
    assert "undefined name 'n_layerz'" in problems[0].message


def test_a_repeat_of_none_is_refused():
    src = (SPECS / "lfm2.yaml").read_text()
    bad = src.replace("    repeat: n_layers\n    block: lfm2_layer",
                      '    repeat: "{None}"\n    block: lfm2_layer')
    problems = _problems(bad)
    assert [p.message for p in problems] == ["repeat must be an integer >= 0, got None"]
