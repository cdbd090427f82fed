"""``maxdecl validate DIR`` / I/O errors in machine formats, ``maxdecl inspect --metadata``."""

import json
import os
import shutil

import numpy as np
import pytest

import maxdecl as md
from maxdecl.cli import main

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SPECS = os.path.join(ROOT, "specs")


def test_validate_a_directory_checks_every_yaml_below_it(tmp_path, capsys):
    shutil.copy(os.path.join(SPECS, "mlp.yaml"), tmp_path / "a.yaml")
    (tmp_path / "sub").mkdir()
    shutil.copy(os.path.join(SPECS, "tinystories.yaml"), tmp_path / "sub" / "b.yml")
    (tmp_path / "notes.txt").write_text("not a spec")
    assert main(["validate", str(tmp_path)]) == 0
    assert "2 spec(s) valid" in capsys.readouterr().err
    (tmp_path / "sub" / "c.yaml").write_text("maxdecl: 1\nname: x\nname: y\n")
    assert main(["validate", "--format", "json", str(tmp_path)]) == 1
    problems = json.loads(capsys.readouterr().out)
    assert problems and all(p["file"].endswith("c.yaml") for p in problems)


def test_validate_the_shipped_specs_folder(capsys):
    assert main(["validate", SPECS]) == 0
    n = len([f for f in os.listdir(SPECS) if f.endswith((".yaml", ".yml"))])
    assert f"{n} spec(s) valid" in capsys.readouterr().err


@pytest.mark.parametrize("fmt", ["json", "github"])
def test_io_errors_in_machine_formats_exit_2(tmp_path, capsys, fmt):
    (tmp_path / "empty").mkdir()
    good = os.path.join(SPECS, "mlp.yaml")
    missing = str(tmp_path / "missing.yaml")
    assert main(["validate", "--format", fmt, good, missing, str(tmp_path / "empty")]) == 2
    out = capsys.readouterr().out
    if fmt == "json":
        items = json.loads(out)
        assert [(i["file"], i["kind"]) for i in items] == [(missing, "io"),
                                                           (str(tmp_path / "empty"), "io")]
        assert items[0]["message"] == "no such file" and items[0]["line"] is None
        assert "no *.yaml or *.yml spec" in items[1]["message"]
    else:
        assert f"::error file={missing}::no such file" in out


def test_io_errors_in_text_stay_one_line_exit_2(tmp_path, capsys):
    (tmp_path / "empty").mkdir()
    assert main(["validate", str(tmp_path / "empty")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "holds no *.yaml" in err


def test_validate_imports_no_numpy():
    import subprocess
    import sys

    code = ("import sys; from maxdecl.cli import main; main(['validate', 'specs']); "
            "print('numpy' in sys.modules, 'numba' in sys.modules)")
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)
    assert res.stdout.split() == ["False", "False"], res.stderr


def test_inspect_metadata_summarizes_gguf_arrays(tmp_path, capsys):
    gguf = pytest.importorskip("gguf")
    path = tmp_path / "m.gguf"
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_block_count(2)
    w.add_token_list([f"t{i}" for i in range(1000)])
    w.add_tensor("a.weight", np.ones((2, 32), np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    assert main(["inspect", "--metadata", str(path)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert any(ln.startswith("general.architecture") and ln.endswith("'llama'") for ln in lines)
    assert any(ln.startswith("llama.block_count") and ln.endswith(": 2") for ln in lines)
    tokens = next(ln for ln in lines if ln.startswith("tokenizer.ggml.tokens"))
    assert tokens.endswith(": [1000 x str] ['t0', 't1', 't2', ...]")
    assert lines[-1] == "3 metadata entries (gguf)"


def test_inspect_metadata_of_a_checkpoint(tmp_path, capsys):
    path = tmp_path / "c.safetensors"
    td = md.TensorDict({"w": md.QuantizedTensor(np.zeros((2, 34), np.uint8), (2, 32), "q8_0")},
                       metadata={"general.name": "x", "scores": list(range(50))})
    md.checkpoint.save(td, path, params={"dim": 32})
    assert main(["inspect", "--metadata", str(path)]) == 0
    out = capsys.readouterr().out
    lines = [[part.strip() for part in ln.split(":", 1)] for ln in out.splitlines()]
    assert ["maxdecl.version", "'1'"] in lines and ["general.name", "'x'"] in lines
    assert ["scores", "[50 x int] [0, 1, 2, ...]"] in lines
    assert ["params", '{"dim": 32}'] in lines
    assert ["maxdecl.encodings", '{"w": {"encoding": "q8_0", "shape": [2, 32]}}'] in lines
    assert lines[-1] == ["5 metadata entries (safetensors)"]
