"""A weight of shape [] (a learned scalar): validated, drawn at random, read from a
0-d safetensors tensor, kept through a maxdecl checkpoint and a GGUF (stored [1]),
and refused in a block encoding."""

import subprocess
import sys

import numpy as np
import pytest
from safetensors.numpy import save_file

import maxdecl as md
from maxdecl import checkpoint

SPEC = """\
maxdecl: 1
name: temp
doc: a learned temperature
variants:
  tiny: {dim: 32}
dims: {seq: tokens}
encodings:
  default: f32
  overrides:
    "*.w": ENC
inputs:
  x: {dtype: float32, shape: [seq, dim]}
layers:
  - name: temperature
    weights: {weight: [], w: [dim, dim]}
    layers:
      - {op: linear, in: [x, .w], out: y}
      - {op: mul, in: [y, .weight], out: y}
outputs: [y]
formats:
  gguf: {arch: llama}
"""


def _spec(tmp_path, enc="f32", weight_enc=None):
    text = SPEC.replace("ENC", enc)
    if weight_enc:
        text = text.replace('    "*.w"', f'    "*.weight": {weight_enc}\n    "*.w"')
    path = tmp_path / "temp.yaml"
    path.write_text(text)
    return path


def test_a_scalar_weight_runs_from_every_format(tmp_path):
    spec = _spec(tmp_path)
    assert md.validate_spec(spec) == []
    x = np.random.default_rng(0).standard_normal((3, 32)).astype(np.float32)
    w = np.random.default_rng(1).standard_normal((32, 32)).astype(np.float32)
    save_file({"temperature.weight": np.array(2.5, np.float32), "temperature.w": w},
              str(tmp_path / "model.safetensors"))
    model = md.load_model(spec, str(tmp_path / "model.safetensors"))
    assert model.weights["temperature.weight"].shape == ()
    want = (x @ w.T) * 2.5
    np.testing.assert_allclose(model(x)[0], want, rtol=1e-5, atol=1e-5)
    checkpoint.save(model.weights, str(tmp_path / "saved.maxdecl"))
    again = md.load_model(spec, str(tmp_path / "saved.maxdecl"))
    assert again(x)[0].tobytes() == model(x)[0].tobytes()
    gguf = tmp_path / "temp.gguf"
    subprocess.run([sys.executable, "-m", "maxdecl", "export", "--spec", str(spec), "-o",
                    str(gguf), str(tmp_path / "model.safetensors")], check=True,
                   capture_output=True)
    np.testing.assert_allclose(md.load_model(spec, str(gguf))(x)[0], want, rtol=1e-5,
                               atol=1e-5)
    assert md.load_model(spec).weights["temperature.weight"].shape == ()   # random weights


def test_a_scalar_weight_cannot_be_blocks(tmp_path):
    problems = md.validate_spec(_spec(tmp_path, weight_enc="q8_0"))
    assert any("is a scalar ([]): it cannot be q8_0 blocks" in p.message for p in problems)


def test_a_shape_that_is_no_list_is_still_refused(tmp_path):
    path = tmp_path / "bad.yaml"
    path.write_text(SPEC.replace("ENC", "f32").replace("weight: []", "weight: 7"))
    problems = md.validate_spec(path)
    assert problems and any("temperature" in p.message or "weights" in p.path
                            for p in problems)
