"""The shipped specs: they validate, unroll to GGUF names, and carry the right numbers."""

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

import maxdecl as md
from maxdecl.builder import describe_tree
from maxdecl.spec import format_problems

ROOT = Path(__file__).resolve().parents[2]
SPECS = sorted((ROOT / "specs").glob("*.yaml"))
HEADER = "# yaml-language-server: $schema=../maxdecl/schema/spec.schema.json"


def test_all_five_specs_are_shipped():
    assert {p.stem for p in SPECS} >= {"mlp", "llama3", "replit", "tinystories", "gemma3"}


@pytest.mark.parametrize("path", SPECS, ids=lambda p: p.stem)
def test_spec_validates_in_every_variant(path):
    assert path.read_text().splitlines()[0] == HEADER
    assert md.validate_spec(path) == []
    spec = md.load_spec(path)
    for v in spec.variants:
        prog = spec.program(v)
        assert prog.ops and prog.weights
        # encoders: hidden states; pose estimation: heatmaps
        assert prog.outputs[0][0] in ("logits", "y", "last_hidden_state", "heatmaps")


def test_schema_is_draft_2020_12_and_public():
    from jsonschema import Draft202012Validator

    Draft202012Validator.check_schema(md.SCHEMA)
    assert md.SCHEMA["$schema"].endswith("2020-12/schema")
    on_disk = json.loads((ROOT / "maxdecl/schema/spec.schema.json").read_text())
    assert on_disk == md.SCHEMA
    assert md.SCHEMA["properties"]["layers"] and md.SCHEMA["description"]


def test_llama3_layer_paths_are_gguf_names():
    prog = md.load_spec(ROOT / "specs/llama3.yaml").program()
    names = [w.name for w in prog.weights]
    assert names[:4] == ["token_embd.weight", "rope_freqs.weight", "blk.0.attn_norm.weight",
                         "blk.0.attn_q.weight"]
    assert "blk.31.ffn_down.weight" in names and names[-2:] == ["output_norm.weight",
                                                              "output.weight"]
    shapes = {w.name: w.shape for w in prog.weights}
    assert shapes["blk.3.attn_k.weight"] == (1024, 4096)
    enc = {w.name: w.encoding for w in prog.weights}
    assert enc["blk.0.ffn_down.weight"] == "q6_k" and enc["blk.0.attn_norm.weight"] == "f32"
    assert enc["blk.0.attn_q.weight"] == "q4_k"
    assert shapes["rope_freqs.weight"] == (64,) and enc["rope_freqs.weight"] == "f32"
    # the 8B parameter count, from the spec alone (plus Llama 3.1's 64 RoPE divisors)
    assert describe_tree(ROOT / "specs/llama3.yaml")[0].params == 8_030_261_248 + 64


def test_generation_convention_inputs_and_outputs_pair_up():
    prog = md.load_spec(ROOT / "specs/llama3.yaml", "tiny").program()
    ins = [(p.name, p.dtype, p.shape) for p in prog.inputs]
    assert ins[:3] == [("tokens", "int64", ("seq",)), ("positions", "int64", ("seq",)),
                       ("logit_rows", "int64", ("rows",))]
    assert ins[3] == ("blk.0.kv_cache", "float32", (2, "past", 2, 64))
    assert [n for n, _ in prog.outputs] == ["logits", "blk.0.kv_cache", "blk.1.kv_cache"]
    assert prog.state == ("blk.0.kv_cache", "blk.1.kv_cache")


def test_gemma3_interleaves_local_and_global_layers():
    spec = md.load_spec(ROOT / "specs/gemma3.yaml")
    assert spec.variant == "270m"
    prog = spec.program()
    attn = {op.path: op.attrs for op in prog.ops if op.op == "attention"}
    ropes = {op.path: op.attrs["theta"] for op in prog.ops if op.op == "rope"}
    for i in range(18):
        is_global = (i + 1) % 6 == 0
        assert attn[f"blk.{i}.attn"]["sliding_window"] == (None if is_global else 512)
        assert attn[f"blk.{i}.attn"]["scale"] == pytest.approx(1 / 16)
        assert ropes[f"blk.{i}.rope"] == (1e6 if is_global else 1e4)
    names = {w.name for w in prog.weights}
    assert {"blk.0.attn_q_norm.weight", "blk.0.post_attention_norm.weight",
            "blk.0.post_ffw_norm.weight"} <= names
    assert "output.weight" not in names          # tied to token_embd.weight
    out = [op for op in prog.ops if op.path == "output"][0]
    assert out.inputs[1].target == "token_embd.weight"
    assert describe_tree(ROOT / "specs/gemma3.yaml")[0].params == 268_098_176


def test_replit_alibi_slopes_and_tied_output():
    prog = md.load_spec(ROOT / "specs/replit.yaml").program()
    slopes = [op.attrs["alibi_slopes"] for op in prog.ops if op.op == "attention"][0]
    assert len(slopes) == 24 and slopes[0] == pytest.approx(2 ** -0.5)
    assert slopes[16] == pytest.approx(2 ** -0.25)
    assert not any(w.name == "output.weight" for w in prog.weights)
    assert any(op.op == "layer_norm" and len(op.inputs) == 2 for op in prog.ops)


def test_tinystories_variants_match_llama2c_sizes():
    spec = md.load_spec(ROOT / "specs/tinystories.yaml", "stories15m")
    p = spec.params
    assert (p["dim"], p["n_layers"], p["n_heads"], p["ffn_dim"], p["vocab"]) == \
        (288, 6, 6, 768, 32000)
    assert spec.with_variant("stories110m").params["dim"] == 768
    assert spec.formats["llama2c"]["header"][0] == "dim"
    n = describe_tree(spec, "stories15m")[0].params
    assert math.isclose(n, 15.2e6, rel_tol=0.01)


def test_formats_are_plain_dicts_on_the_spec():
    spec = md.load_spec(ROOT / "specs/llama3.yaml")
    hf = spec.formats["hf"]
    assert hf["config"]["dim"] == "hidden_size"
    assert hf["tensors"]["model.layers.{i}.self_attn.q_proj.weight"] == "blk.{i}.attn_q.weight"
    assert hf["transforms"]["blk.*.attn_q.weight"] == {"permute_qk": "{n_heads}"}
    assert spec.formats["gguf"]["metadata"]["dim"] == "{arch}.embedding_length"


def test_unknown_variant_is_a_spec_error():
    with pytest.raises(md.SpecError, match="unknown variant 'tiny2'.*did you mean 'tiny'"):
        md.load_spec(ROOT / "specs/llama3.yaml", "tiny2")


def test_format_problems_text_json_github(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text((ROOT / "specs/mlp.yaml").read_text().replace("op: relu", "op: rleu"))
    problems = md.validate_spec(bad)
    assert len(problems) == 1
    p = problems[0]
    text = format_problems(problems, "text")
    assert text == f"{bad}:{p.line}:{p.col}: {p.path}: {p.message}"
    data = json.loads(format_problems(problems, "json"))
    assert data == [{"file": str(bad), "line": p.line, "col": p.col, "path": p.path,
                     "message": p.message}]
    gh = format_problems(problems, "github")
    assert gh.startswith(f"::error file={bad},line={p.line},col={p.col}::")
    assert "did you mean 'relu'" in gh


def test_validate_never_imports_numba_or_numpy():
    code = ("import sys, glob, maxdecl as md\n"
            "bad = [p for f in sorted(glob.glob('specs/*.yaml')) for p in md.validate_spec(f)]\n"
            "md.load_spec('specs/llama3.yaml').program()\n"
            "from maxdecl.builder import describe_tree\n"
            "describe_tree('specs/gemma3.yaml')\n"
            "print(len(bad), 'numba' in sys.modules, 'numpy' in sys.modules)\n")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True,
                         text=True, check=True).stdout.split()
    assert out == ["0", "False", "False"]


def test_docs_example_validates_and_unrolls(tmp_path):
    doc = (ROOT / "docs/spec.md").read_text()
    example = doc.split("```yaml\n", 1)[1].split("```", 1)[0]
    path = tmp_path / "toy.yaml"
    path.write_text(example)
    assert md.validate_spec(path) == []
    prog = md.load_spec(path).program()
    assert [p.name for p in prog.inputs] == ["tokens", "positions", "blk.0.kv_cache",
                                             "blk.1.kv_cache"]
    assert [n for n, _ in prog.outputs] == ["logits", "blk.0.kv_cache", "blk.1.kv_cache"]
    assert [w.name for w in prog.weights][:5] == ["token_embd.weight", "rope_freqs.weight",
                                                  "blk.0.attn_norm.weight",
                                                  "blk.0.attn_q.weight", "blk.0.attn_kv.weight"]
    absent = {w.name: w.absent for w in prog.weights if w.absent is not None}
    assert {n: (r.kind, r.target) for n, r in absent.items()} == {
        "rope_freqs.weight": ("fill", 1.0), "output.weight": ("weight", "token_embd.weight")}


def test_registered_encodings_are_known(tmp_path):
    import numpy as np

    class MyEnc:
        name, block_elements, block_bytes = "test_q16", 2, 3

        def quantize(self, x):
            return np.zeros((*x.shape[:-1], x.shape[-1] // 2 * 3), np.uint8)

        def dequantize(self, data, shape):
            return np.zeros(shape, np.float32)

    text = (ROOT / "specs/mlp.yaml").read_text().replace("default: f32", "default: test_q16\n  overrides: {'*.bias': f32}")
    path = tmp_path / "custom.yaml"
    path.write_text(text)
    assert "unknown encoding 'test_q16'" in md.validate_spec(path)[0].message
    md.codecs.register(MyEnc())
    try:
        assert md.validate_spec(path) == []
    finally:
        md.codecs.unregister("test_q16")



@pytest.mark.parametrize("path", SPECS, ids=lambda p: p.stem)
def test_language_model_spec_generates_text_on_random_weights(path):
    """What `maxdecl run SPEC` does without a weights file: the tiny (else default)
    variant on seeded random weights, a text prompt as bytes (so its vocab holds 256)."""
    model = md.load_model(path)
    if model.session is None or "random weights" not in model.note:
        pytest.skip("not a language model, or real weights were found")
    assert len(model.generate("Hi!", max_new_tokens=2).ids) == 2
    assert len(model.generate("héllo ✓", max_new_tokens=1).ids) == 1   # every byte is an id
