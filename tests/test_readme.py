"""The README's "In Python" examples run as written (from a folder holding specs/)."""

import os
import re

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _python_blocks() -> list[str]:
    """The Python blocks of the README's "In Python" section (the others need a server)."""
    with open(os.path.join(ROOT, "README.md"), encoding="utf-8") as f:
        text = f.read()
    section = text.split("\n## In Python\n", 1)[1].split("\n## ", 1)[0]
    return re.findall(r"```python\n(.*?)```", section, flags=re.S)


def test_readme_python_example_runs(tmp_path, monkeypatch):
    blocks = _python_blocks()
    assert blocks, "the README has no python block"
    os.symlink(os.path.join(ROOT, "specs"), tmp_path / "specs")
    monkeypatch.chdir(tmp_path)
    scope: dict = {}
    for code in blocks:
        exec(compile(code, "README.md", "exec"), scope)
    assert (tmp_path / "mlp.safetensors").exists()
    assert scope["y"].shape == (2, 8)
    assert scope["out"].finish_reason in ("stop", "length") and len(scope["outs"]) == 2
