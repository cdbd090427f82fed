"""Safe YAML loading: positions, duplicate keys, tags, syntax errors, alias bombs."""

from maxdecl.spec.marks import load_yaml, nearest_mark


def test_marks_are_one_based_and_keys_have_their_own():
    data, marks, problems = load_yaml("a: 1\nb:\n  - x\n  - {c: 2}\n")
    assert problems == []
    assert data == {"a": 1, "b": ["x", {"c": 2}]}
    assert marks["/a"] == (1, 4)
    assert marks["/b/1/c"] == (4, 9)
    assert marks["/b/1/c#key"] == (4, 6)
    assert nearest_mark(marks, "/b/1/missing/deeper") == (4, 5)
    assert nearest_mark(marks, "/b/1/c", key=True) == (4, 6)


def test_keys_like_numbers_stay_text_and_dates_stay_strings():
    data, _, problems = load_yaml("8b: {x: 2024-01-01}\n1: yes\n")
    assert problems == []
    assert data == {"8b": {"x": "2024-01-01"}, "1": True}


def test_duplicate_keys_are_reported_at_the_second():
    _, _, problems = load_yaml("a: 1\nb: 2\na: 3\n")
    assert [(p.line, p.col, p.path) for p in problems] == [(3, 1, "/a")]
    assert "duplicate key 'a'" in problems[0].message and "line 1" in problems[0].message


def test_tags_are_rejected_without_running_anything(tmp_path):
    marker = tmp_path / "ran"
    text = (f"a: !!python/object/apply:os.system ['touch {marker}']\n"
            "b: !!python/name:os.system\n"
            "c: !custom 1\n"
            "d: !!binary aGVsbG8=\n"
            "e: !!set {x}\n")
    data, _, problems = load_yaml(text)
    assert not marker.exists()
    assert [p.line for p in problems] == [1, 2, 3, 4, 5]
    assert all("is not allowed" in p.message for p in problems)
    assert data == {"a": None, "b": None, "c": None, "d": None, "e": None}


def test_syntax_error_has_its_position():
    data, _, problems = load_yaml("a:\n  b: 1\n c: 2\n")
    assert data is None
    assert len(problems) == 1 and problems[0].message.startswith("YAML syntax error")
    assert (problems[0].line, problems[0].col) == (3, 2)


def test_alias_bomb_is_stopped():
    lines = ["a0: &a0 [x, x, x, x, x, x, x, x, x, x]"]
    for k in range(1, 9):
        prev = f"*a{k - 1}"
        lines.append(f"a{k}: &a{k} [{', '.join([prev] * 10)}]")
    _, _, problems = load_yaml("\n".join(lines) + "\n")
    assert any("too large" in p.message for p in problems)


def test_recursive_alias_is_stopped():
    _, _, problems = load_yaml("a: &x [*x]\n")
    assert problems and ("too large" in problems[0].message or "YAML" in problems[0].message)


def test_merge_keys_fill_what_the_mapping_does_not_say():
    """YAML's ``<<: *base`` (and a list of bases, the first to give a key winning); keys
    written in the mapping win wherever they stand; anything but mappings is a problem."""
    text = ("base: &b {dim: 8, hidden: 16, act: silu}\n"
            "more: &m {act: gelu, eps: 1.0e-6}\n"
            "big: {dim: 32, <<: *b}\n"
            "both: {<<: [*m, *b], dim: 4}\n")
    data, marks, problems = load_yaml(text)
    assert problems == []
    assert data["big"] == {"dim": 32, "hidden": 16, "act": "silu"}
    assert data["both"] == {"dim": 4, "act": "gelu", "eps": 1.0e-6, "hidden": 16}
    assert marks["/big/dim"] == (3, 12)
    _, _, problems = load_yaml("a: {<<: [1, {x: 2}], y: 3}\n")
    assert len(problems) == 1 and "merge key '<<' takes a mapping" in problems[0].message


def test_a_merge_bomb_is_stopped():
    lines = ["a0: &a0 {x0: 1, x1: 1, x2: 1, x3: 1, x4: 1, x5: 1, x6: 1, x7: 1, x8: 1, x9: 1}"]
    for k in range(1, 9):
        lines.append(f"a{k}: &a{k} {{{', '.join(f'y{j}: *a{k - 1}' for j in range(10))}}}")
    lines.append("b: {<<: [*a8, *a7, *a6]}")
    _, _, problems = load_yaml("\n".join(lines) + "\n")
    assert any("too large" in p.message for p in problems)


def test_a_mapping_that_merges_itself_is_stopped():
    _, _, problems = load_yaml("a: &x {b: 1, <<: *x}\n")
    assert len(problems) == 1 and "too large or too deeply nested" in problems[0].message
