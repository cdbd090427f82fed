"""``maxdecl quantize`` refuses what would silently go wrong: weights of another model,
an encoding no tensor can take; ``--encoding spec`` and the presets pick per tensor."""

import os

import numpy as np
import pytest

import maxdecl as md
from maxdecl.cli import main
from maxdecl.pipelines.quant_presets import use_more_bits
from test_tinystories_flow import _write_llama2c_legacy

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
STORIES = os.path.join(ROOT, "specs", "tinystories.yaml")
GEMMA = os.path.join(ROOT, "specs", "gemma3.yaml")


@pytest.fixture(scope="module")
def stories_bin(tmp_path_factory):
    path = tmp_path_factory.mktemp("m") / "model.bin"
    _write_llama2c_legacy(path, np.random.default_rng(0))     # dims 64 / 96: under 256
    return str(path)


def test_weights_of_another_model_fail_in_one_line(stories_bin, tmp_path, capsys):
    out = tmp_path / "x.safetensors"
    assert main(["quantize", stories_bin, "-o", str(out), "--encoding", "q8_0",
                 "--spec", GEMMA]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "does not fit" in err
    assert "missing: blk.0.attn_q_norm.weight" in err and "misshapen" in err
    assert not out.exists()


def test_unexpected_tensors_are_named(stories_bin, tmp_path, capsys):
    td = md.load_weights(stories_bin)
    td["blk.9.extra.weight"] = np.ones((4, 64), np.float32)
    src = tmp_path / "extra.safetensors"
    md.checkpoint.save(td, str(src), params=dict(dim=64, ffn_dim=96, n_layers=3, n_heads=4,
                                                 n_kv_heads=2, vocab=300, context=32))
    assert main(["quantize", str(src), "-o", str(tmp_path / "o.safetensors"),
                 "--encoding", "q8_0", "--spec", STORIES]) == 1
    err = capsys.readouterr().err
    assert "1 unexpected: blk.9.extra.weight" in err and "missing" not in err


def test_k_quant_on_rows_under_256_is_an_error_naming_why(stories_bin, tmp_path, capsys):
    out = tmp_path / "x.safetensors"
    assert main(["quantize", stories_bin, "-o", str(out), "--encoding", "q4_k"]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "0 of 29 tensors quantized" in err
    assert "last dims 64, 96 not a multiple of q4_k's block of 256" in err
    assert not out.exists()


def test_a_rule_that_skips_some_tensors_warns(tmp_path, capsys):
    rng = np.random.default_rng(0)
    td = md.TensorDict({"a.weight": rng.standard_normal((4, 256)).astype(np.float32),
                        "b.weight": rng.standard_normal((4, 96)).astype(np.float32)})
    md.checkpoint.save(td, str(tmp_path / "s.safetensors"))
    assert main(["quantize", str(tmp_path / "s.safetensors"), "-o", str(tmp_path / "q.st"),
                 "--encoding", "Q4_K"]) == 0
    cap = capsys.readouterr()
    assert "warning: 1 tensor(s) kept as they were, last dim 96 not a multiple of q4_k's " \
           "block of 256: b.weight" in cap.err
    assert "1 tensors quantized, 1 kept" in cap.out
    assert md.checkpoint.load(str(tmp_path / "q.st"))["a.weight"].encoding == "q4_k"


def test_encoding_spec_uses_the_spec_rules(stories_bin, tmp_path, capsys):
    out = tmp_path / "s.safetensors"
    assert main(["quantize", stories_bin, "-o", str(out), "--encoding", "spec",
                 "--spec", STORIES]) == 0
    td = md.checkpoint.load(str(out))
    spec = md.load_spec(STORIES)
    for name, t in td.items():
        want = spec.encoding_for(name)                  # q8_0, norms f32
        got = t.encoding if isinstance(t, md.QuantizedTensor) else "f32"
        assert got == want, name
    assert {"q8_0", "f32"} == {spec.encoding_for(n) for n in td.keys()}
    capsys.readouterr()
    assert main(["quantize", stories_bin, "-o", str(out), "--encoding", "spec"]) == 1
    assert "give --spec" in capsys.readouterr().err


def test_q4_k_m_falls_back_on_short_rows_as_llama_cpp(stories_bin, tmp_path, capsys):
    out = tmp_path / "m.safetensors"
    assert main(["quantize", stories_bin, "-o", str(out), "--encoding", "Q4_K_M"]) == 0
    td = md.checkpoint.load(str(out))
    # 3 layers: use_more_bits picks layers 0 (i - 0) % 3 == 2 -> 2, and i >= 7*3//8 = 2
    assert [use_more_bits(i, 3) for i in range(3)] == [False, False, True]
    assert td["blk.2.ffn_down.weight"].encoding == "q8_0"        # q6_k, K = 96 -> q8_0
    assert td["blk.0.ffn_down.weight"].encoding == "q5_0"        # q4_k, K = 96 -> q5_0
    assert td["token_embd.weight"].encoding == "q8_0"            # tied output: q6_k -> q8_0
    assert isinstance(td["blk.0.attn_norm.weight"], np.ndarray)


def test_use_more_bits_matches_llama_cpp_for_gemma_depth():
    assert [i for i in range(18) if use_more_bits(i, 18)] == [0, 1, 4, 7, 10, 13, 15, 16, 17]


def test_quantize_without_a_tokenizer_warns_and_run_says_why(stories_bin, tmp_path, capsys):
    out = tmp_path / "q.safetensors"        # model.bin has no tokenizer.bin beside it
    assert main(["quantize", stories_bin, "-o", str(out), "--encoding", "q8_0",
                 "--spec", STORIES]) == 0
    assert "no tokenizer in the source or beside it" in capsys.readouterr().err
    assert main(["run", STORIES, "--weights", str(out), "--max-new-tokens", "1"]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "no tokenizer in the weights or beside them" in err
