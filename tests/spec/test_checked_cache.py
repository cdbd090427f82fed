"""Specs found valid are not checked again by load_spec (maxdecl.spec.checked)."""

import os

import pytest

import maxdecl as md
from maxdecl.spec import checked, semantic

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
MLP = os.path.join(ROOT, "specs", "mlp.yaml")


def _copy(tmp_path, text=None):
    path = tmp_path / "m.yaml"
    path.write_text(text if text is not None else open(MLP).read())
    return path


def _refuse_checks(monkeypatch):
    def no(*a, **k):
        raise AssertionError("checked again")
    monkeypatch.setattr(semantic, "check", no)


def test_a_valid_spec_is_checked_once(tmp_path, monkeypatch):
    monkeypatch.setenv("MAXDECL_CACHE_DIR", str(tmp_path / "cache"))
    path = _copy(tmp_path)
    first = md.load_spec(path)
    assert len(os.listdir(tmp_path / "cache" / "checked-specs")) == 1
    _refuse_checks(monkeypatch)
    again = md.load_spec(path)                        # the marker: parsed, not checked
    assert again.params == first.params and again.program().weights == first.program().weights
    path.write_text(open(MLP).read() + "\n# another text\n")
    with pytest.raises(AssertionError, match="checked again"):
        md.load_spec(path)


def test_invalid_specs_get_no_marker_and_validate_writes_none(tmp_path, monkeypatch):
    monkeypatch.setenv("MAXDECL_CACHE_DIR", str(tmp_path / "cache"))
    bad = _copy(tmp_path, open(MLP).read().replace("op: relu", "op: reluu", 1))
    assert "op: reluu" in bad.read_text()
    for _ in range(2):
        with pytest.raises(md.SpecError, match="reluu"):
            md.load_spec(bad)
    good = _copy(tmp_path)
    assert md.validate_spec(good) == []
    assert not (tmp_path / "cache").exists()


def test_off_or_unwritable_cache_checks_every_time(tmp_path, monkeypatch):
    path = _copy(tmp_path)
    monkeypatch.setenv("MAXDECL_CACHE_DIR", "")
    md.load_spec(path)
    assert not checked.was_valid(path.read_text())
    blocker = tmp_path / "file"
    blocker.write_text("")
    monkeypatch.setenv("MAXDECL_CACHE_DIR", str(blocker))     # not a directory
    md.load_spec(path)
    assert not checked.was_valid(path.read_text())


def test_a_new_op_in_the_registry_is_another_key(tmp_path, monkeypatch):
    from maxdecl.ops import _registry

    monkeypatch.setenv("MAXDECL_CACHE_DIR", str(tmp_path / "cache"))
    path = _copy(tmp_path)
    md.load_spec(path)
    assert checked.was_valid(path.read_text())
    monkeypatch.setitem(_registry.REGISTRY, "my_test_op", _registry.REGISTRY["relu"])
    assert not checked.was_valid(path.read_text())
