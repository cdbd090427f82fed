"""The ``maxdecl`` command (API.md section 7): exit codes, one-line errors, subcommands."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest

import maxdecl as md
from maxdecl.cli import main

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SPECS = sorted(os.path.join(ROOT, "specs", f) for f in os.listdir(os.path.join(ROOT, "specs"))
               if f.endswith(".yaml"))


def test_validate_all_specs_exit_0(capsys):
    assert main(["validate", *SPECS]) == 0
    assert f"{len(SPECS)} spec(s) valid" in capsys.readouterr().err


def test_validate_invalid_exit_1_with_file_line_col(tmp_path, capsys):
    bad = tmp_path / "bad.yaml"
    text = open(os.path.join(ROOT, "specs", "mlp.yaml")).read().replace("op: relu", "op: rellu")
    bad.write_text(text)
    assert main(["validate", str(bad)]) == 1
    out = capsys.readouterr().out
    line = next(i for i, ln in enumerate(text.splitlines(), 1) if "rellu" in ln)
    assert f"{bad}:{line}:" in out and "did you mean 'relu'" in out


def test_validate_missing_file_exit_2(capsys):
    assert main(["validate", "no/such/spec.yaml"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "no/such/spec.yaml" in err


@pytest.mark.parametrize("fmt", ["json", "github"])
def test_validate_machine_formats(tmp_path, capsys, fmt):
    bad = tmp_path / "bad.yaml"
    bad.write_text("maxdecl: 1\nname: x\nname: y\n")
    assert main(["validate", "--format", fmt, str(bad)]) == 1
    out = capsys.readouterr().out
    if fmt == "json":
        problems = json.loads(out)
        assert any(p["line"] == 3 for p in problems)
    else:
        assert f"::error file={bad},line=3" in out


def test_schema_prints_the_json_schema(capsys):
    assert main(["schema"]) == 0
    assert json.loads(capsys.readouterr().out) == md.SCHEMA


def test_graph_prints_layer_tree(capsys):
    assert main(["graph", os.path.join(ROOT, "specs", "mlp.yaml")]) == 0
    out = capsys.readouterr().out
    assert "<model>" in out and "fc1" in out and "params" in out


def test_inspect_lists_encodings(tmp_path, capsys):
    td = md.TensorDict({"w": md.QuantizedTensor(np.zeros((2, 18), np.uint8), (2, 32), "q4_0"),
                        "b": np.ones(3, np.float32)})
    path = tmp_path / "m.safetensors"
    md.checkpoint.save(td, str(path))
    assert main(["inspect", str(path)]) == 0
    out = capsys.readouterr().out
    assert "q4_0" in out and "float32" in out and "2 tensors" in out


def test_errors_are_one_line_without_traceback_unless_debug(tmp_path):
    junk = tmp_path / "junk.safetensors"
    junk.write_bytes(b"\x00" * 5)
    cmd = [sys.executable, "-m", "maxdecl", "inspect", str(junk)]
    res = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT)
    assert res.returncode == 1 and "Traceback" not in res.stderr
    assert res.stderr.strip().count("\n") == 0 and str(junk) in res.stderr
    res = subprocess.run(cmd[:3] + ["--debug"] + cmd[3:], capture_output=True, text=True, cwd=ROOT)
    assert "Traceback" in res.stderr


def test_quantize_then_inspect_round_trip(tmp_path, capsys):
    rng = np.random.default_rng(0)
    src = md.TensorDict({"a.weight": rng.standard_normal((4, 64)).astype(np.float32),
                         "a_norm.weight": np.ones(64, np.float32)})
    md.checkpoint.save(src, str(tmp_path / "src.safetensors"))
    out = tmp_path / "q.safetensors"
    assert main(["quantize", str(tmp_path / "src.safetensors"), "-o", str(out),
                 "--encoding", "q8_0"]) == 0
    text = capsys.readouterr().out
    assert "1 tensors quantized, 1 kept" in text
    td = md.checkpoint.load(str(out))
    assert td["a.weight"].encoding == "q8_0" and isinstance(td["a_norm.weight"], np.ndarray)
    want = md.codecs.get("q8_0").quantize(src["a.weight"])
    np.testing.assert_array_equal(td["a.weight"].data, want)


def test_quantize_unknown_encoding_is_one_line_error(tmp_path, capsys):
    md.checkpoint.save(md.TensorDict({"a": np.ones((2, 32), np.float32)}),
                       str(tmp_path / "s.safetensors"))
    assert main(["quantize", str(tmp_path / "s.safetensors"), "-o", str(tmp_path / "o"),
                 "--encoding", "q4_1x"]) == 1
    assert "unknown encoding 'q4_1x'" in capsys.readouterr().err


def test_run_without_weights_falls_back_to_tiny_random(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert main(["run", os.path.join(ROOT, "specs", "tinystories.yaml"),
                 "--max-new-tokens", "3", "--prompt", "Hi"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert "seeded random weights" in lines[0]
    assert "tokens/s" in lines[-1] and "3 generated tokens" in lines[-1]


def test_run_rejects_a_prompt_outside_the_vocab_before_printing_it(tmp_path, capsys,
                                                                   monkeypatch):
    """A prompt whose ids the model cannot take is a one-line error (exit 2), and the
    prompt is not echoed first."""
    text = open(os.path.join(ROOT, "specs", "tinystories.yaml")).read()
    assert "    vocab: 256\n" in text
    (tmp_path / "small.yaml").write_text(text.replace("    vocab: 256\n", "    vocab: 128\n"))
    monkeypatch.chdir(tmp_path)
    assert main(["run", "small.yaml", "--max-new-tokens", "2", "--prompt", "h\u00e9llo"]) == 2
    out, err = capsys.readouterr()
    assert "token ids must be in [0, 128)" in err and "llo" not in out


def test_graph_dot_clusters_by_layer(capsys):
    assert main(["graph", os.path.join(ROOT, "specs", "mlp.yaml"), "--dot"]) == 0
    out = capsys.readouterr().out
    assert out.startswith('digraph "mlp"') and 'label="fc1"' in out
    assert 'label="relu\\nfloat32[batch, 32]"' in out and out.rstrip().endswith("}")


def test_quantize_from_gguf_requantizes_and_keeps_norms(tmp_path, capsys):
    gguf = pytest.importorskip("gguf")
    rng = np.random.default_rng(1)
    w = rng.standard_normal((8, 64)).astype(np.float32)
    src = tmp_path / "m.gguf"
    wr = gguf.GGUFWriter(str(src), "llama")
    wr.add_tensor("blk.0.attn_q.weight", w)
    wr.add_tensor("blk.0.attn_norm.weight", np.ones(64, np.float32))
    q4 = gguf.quants.quantize(w, gguf.GGMLQuantizationType.Q4_0)
    wr.add_tensor("blk.0.ffn_up.weight", q4, raw_dtype=gguf.GGMLQuantizationType.Q4_0)
    wr.write_header_to_file()
    wr.write_kv_data_to_file()
    wr.write_tensors_to_file()
    wr.close()
    out = tmp_path / "q.safetensors"
    assert main(["quantize", str(src), "-o", str(out), "--encoding", "q8_0"]) == 0
    assert "2 tensors quantized, 1 kept" in capsys.readouterr().out
    td = md.checkpoint.load(str(out))
    np.testing.assert_array_equal(td["blk.0.attn_q.weight"].data,
                                  md.codecs.get("q8_0").quantize(w))
    # a Q4_0 source is decoded and re-encoded; the 1-D norm stays float32
    deq = gguf.quants.dequantize(q4, gguf.GGMLQuantizationType.Q4_0)
    np.testing.assert_array_equal(td["blk.0.ffn_up.weight"].data,
                                  md.codecs.get("q8_0").quantize(deq))
    assert td["blk.0.attn_norm.weight"].dtype == np.float32
    assert td.metadata["maxdecl.source_format"] == "gguf"


def test_console_command_flushes_everything_before_its_fast_exit():
    """``python -m maxdecl run`` ends with os._exit once numba is loaded: the streamed
    text and the last line must still arrive, with exit code 0."""
    cmd = [sys.executable, "-m", "maxdecl", "run", "specs/llama3.yaml", "--prompt", "hi",
           "--max-new-tokens", "3", "--seed", "1"]
    res = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, timeout=600)
    assert res.returncode == 0, res.stderr[-2000:]
    lines = res.stdout.strip().splitlines()
    assert lines[0].startswith("[no weights found for llama3")
    assert lines[-1].startswith("[") and "3 generated tokens" in lines[-1]
