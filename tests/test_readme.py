"""The README's Python example runs as written (from a folder holding specs/)."""

import os
import re

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _python_blocks() -> list[str]:
    with open(os.path.join(ROOT, "README.md"), encoding="utf-8") as f:
        return re.findall(r"```python\n(.*?)```", f.read(), flags=re.S)


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
