"""``maxdecl run``: llama.cpp-style options, prompt sources, the stderr lines, any spec on
.npy inputs, and the compile timer that keeps compilation out of the speeds."""

import io
import os
import subprocess
import sys

import numpy as np
import pytest

import maxdecl as md
from maxdecl.cli import main

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TINY = os.path.join(ROOT, "specs", "tinystories.yaml")
MLP = os.path.join(ROOT, "specs", "mlp.yaml")


@pytest.fixture
def empty_cwd(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)      # no models/ folder: the random-weights fallback
    return tmp_path


def test_version(capsys):
    with pytest.raises(SystemExit) as e:
        main(["--version"])
    assert e.value.code == 0 and capsys.readouterr().out.strip() == f"maxdecl {md.__version__}"


def test_help_describes_every_option_with_its_default(capsys):
    with pytest.raises(SystemExit):
        main(["run", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    for opt in ("-m PATH, --weights PATH", "-p TEXT, --prompt TEXT", "-f FILE, --file FILE",
                "-n N, --max-new-tokens N", "-t N, --threads N", "--temp T, --temperature T",
                "--top-k K", "--top-p P", "--min-p P", "--repeat-penalty R", "-s S, --seed S",
                "-c N, --ctx-size N", "--tokenizer PATH", "--input NAME=FILE.npy"):
        assert opt in text, opt
    for default in ("(default: 'Once upon a time')", "tokens to generate at most (default: 32)",
                    "0 is greedy (default: 0.0)", "0 is off (default: 0)", "(default: 1.0)",
                    "(default: 64)", "random one (default: 0)"):
        assert default in text, default


def test_short_options_and_weights_line(empty_cwd, capsys):
    td = md.random_weights(TINY, "tiny", seed=5)
    path = empty_cwd / "tiny.safetensors"
    md.checkpoint.save(td, str(path))
    assert main(["run", TINY, "--variant", "tiny", "-m", str(path), "-p", "Hi", "-n", "3", "-s", "1", "--temp", "0.7",
                 "--top-k", "20", "--top-p", "0.9", "--min-p", "0.05", "--repeat-penalty",
                 "1.1", "-t", "1", "-c", "32", "--tokenizer", _byte_tokenizer(empty_cwd)]) == 0
    out, err = capsys.readouterr()
    info = [ln for ln in err.splitlines() if ln.startswith("maxdecl: weights:")]
    assert len(info) == 1 and str(path) in info[0] and "variant tiny" in info[0]
    assert "tokenizer: HfTokenizer (vocab 256) from " + str(empty_cwd / "tokenizer.json") in info[0]
    assert out.startswith("Hi") and "3 generated tokens" in out.splitlines()[-1]


def _byte_tokenizer(folder) -> str:
    """A Hugging Face tokenizer.json of the 256 byte-level tokens (the tiny vocabulary)."""
    tokenizers = pytest.importorskip("tokenizers")
    from tokenizers import decoders, models, pre_tokenizers

    chars = pre_tokenizers.ByteLevel.alphabet()
    byte_to_char = _gpt2_bytes_to_unicode()
    assert set(byte_to_char.values()) == set(chars)
    vocab = {byte_to_char[b]: b for b in range(256)}
    tk = tokenizers.Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tk.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tk.decoder = decoders.ByteLevel()
    path = folder / "tokenizer.json"
    tk.save(str(path))
    return str(path)


def _gpt2_bytes_to_unicode() -> dict:
    bs = list(range(33, 127)) + list(range(161, 173)) + list(range(174, 256))
    cs, n = bs[:], 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, map(chr, cs)))


def test_prompt_from_stdin_and_from_a_file(empty_cwd, capsys, monkeypatch):
    monkeypatch.setattr(sys, "stdin", io.StringIO("Hello there"))
    assert main(["run", TINY, "-p", "-", "-n", "2"]) == 0
    from_stdin = capsys.readouterr().out.splitlines()
    (empty_cwd / "p.txt").write_text("Hello there", encoding="utf-8")
    assert main(["run", TINY, "-f", str(empty_cwd / "p.txt"), "-n", "2"]) == 0
    from_file = capsys.readouterr().out.splitlines()
    assert from_stdin[1].startswith("Hello there") and from_stdin[1] == from_file[1]
    (empty_cwd / "bad.txt").write_bytes(b"\xff\xfe bad")
    assert main(["run", TINY, "-f", str(empty_cwd / "bad.txt")]) == 2
    assert "not UTF-8 text" in capsys.readouterr().err


def test_stop_option(empty_cwd, capsys):
    assert main(["run", TINY, "-p", "Hi", "-n", "8"]) == 0
    text = capsys.readouterr().out.splitlines()[1][2:]
    assert main(["run", TINY, "-p", "Hi", "-n", "8", "--stop", text[2:4]]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[1] == "Hi" + text[:text.find(text[2:4])] and "finish: stop" in lines[-1]


def test_any_spec_runs_on_npy_inputs(empty_cwd, capsys):
    x = np.random.default_rng(0).standard_normal((3, 16)).astype(np.float32)
    np.save(empty_cwd / "x.npy", x)
    out_path = empty_cwd / "out.npz"
    assert main(["run", MLP, "--input", f"x={empty_cwd / 'x.npy'}", "--output",
                 str(out_path)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert "seeded random weights" in lines[0] and "outputs are noise" in lines[0]
    assert lines[1].startswith("y: float32 [3, 8] [")
    want = md.load_model(MLP)(x)[0]
    np.testing.assert_allclose(np.load(out_path)["y"], want, rtol=1e-6)
    assert f"{want.reshape(-1)[0]:.6g}" in lines[1]


def test_graph_run_errors_name_the_inputs(empty_cwd, capsys):
    assert main(["run", MLP]) == 2
    err = capsys.readouterr().err
    assert "missing --input for x" in err and "x: float32[batch, 16]" in err
    np.save(empty_cwd / "x.npy", np.ones((2, 16), np.float32))
    assert main(["run", MLP, "--input", f"z={empty_cwd / 'x.npy'}"]) == 2
    assert "unknown input(s) z" in capsys.readouterr().err
    np.save(empty_cwd / "x64.npy", np.ones((2, 16)))
    assert main(["run", MLP, "--input", f"x={empty_cwd / 'x64.npy'}"]) == 2
    assert "expected float32[batch, 16], got float64[2, 16]" in capsys.readouterr().err
    np.save(empty_cwd / "x15.npy", np.ones((2, 15), np.float32))
    assert main(["run", MLP, "--input", f"x={empty_cwd / 'x15.npy'}"]) == 2
    assert "got float32[2, 15]" in capsys.readouterr().err
    assert main(["run", MLP, "--input", f"x={empty_cwd / 'nope.npy'}"]) == 2
    assert "cannot read a .npy array" in capsys.readouterr().err
    assert main(["run", TINY, "--input", f"x={empty_cwd / 'x.npy'}"]) == 2
    assert "is a language model" in capsys.readouterr().err


def test_compile_timer_sees_real_compiles_only():
    numba = pytest.importorskip("numba")
    from maxdecl.pipelines.compile_timer import CompileTimer

    @numba.njit            # no cache: it compiles on its first call
    def twice(x):
        return 2 * x

    notices = []
    with CompileTimer(on_first=lambda: notices.append(1)) as ct:
        assert twice(3) == 6
    assert ct.count == 1 and ct.seconds > 0 and notices == [1]
    with CompileTimer() as again:
        assert twice(4) == 8                        # machine code found: no lock, no time
    assert again.count == 0 and again.seconds == 0.0
    with CompileTimer() as other:
        assert twice(1.5) == 3.0                    # new argument types: a compile
    assert other.count == 1 and other.seconds > 0


def test_cold_cache_notice_and_speeds_without_compile(tmp_path):
    """A fresh NUMBA_CACHE_DIR: the notice comes, and the figures say compile time was left
    out; a second run with that cache compiles nothing."""
    env = dict(os.environ, NUMBA_CACHE_DIR=str(tmp_path / "cache"), PYTHONPATH=ROOT)
    cmd = [sys.executable, "-m", "maxdecl", "run", TINY, "-p", "Hi", "-n", "2"]
    cold = subprocess.run(cmd, capture_output=True, text=True, cwd=tmp_path, env=env,
                          timeout=900)
    assert cold.returncode == 0, cold.stderr[-2000:]
    assert "compiling kernels (first run only" in cold.stderr
    assert "kernels compiled in" in cold.stdout.splitlines()[-1]
    warm = subprocess.run(cmd, capture_output=True, text=True, cwd=tmp_path, env=env,
                          timeout=900)
    assert warm.returncode == 0 and "compiling" not in warm.stderr
    assert "kernels compiled" not in warm.stdout
    assert "kernels loaded in" in warm.stdout.splitlines()[-1]     # from the cache


def test_graph_run_starts_a_state_input_left_out_empty(empty_cwd, capsys):
    """An input with an output of its name is state: without --input it starts as a
    generation loop's first step does, its symbolic dims 0 (an empty cache)."""
    spec = empty_cwd / "acc.yaml"
    spec.write_text("""\
maxdecl: 1
name: acc
variants:
  tiny: {dim: 4}
dims: {seq: new rows, past: rows so far}
inputs:
  x: {dtype: float32, shape: [seq, "{dim}"]}
  memory: {dtype: float32, shape: [past, "{dim}"]}
layers:
  - {op: concat, in: [memory, x], attrs: {axis: 0}, out: memory}
  - {op: sum, in: memory, attrs: {axis: 0}, out: total}
outputs: [total, memory]
""")
    np.save(empty_cwd / "x.npy", np.ones((3, 4), np.float32))
    assert main(["run", str(spec), "--input", f"x={empty_cwd / 'x.npy'}"]) == 0
    out = capsys.readouterr().out
    assert "total: float32 [4] [3, 3, 3, 3]" in out and "memory: float32 [3, 4]" in out
    np.save(empty_cwd / "m.npy", np.ones((2, 4), np.float32))
    assert main(["run", str(spec), "--input", f"x={empty_cwd / 'x.npy'}",
                 "--input", f"memory={empty_cwd / 'm.npy'}"]) == 0
    assert "total: float32 [4] [5, 5, 5, 5]" in capsys.readouterr().out


def test_activations_option_reaches_the_compiled_graph(empty_cwd, monkeypatch, capsys):
    import maxdecl.model as model_module

    seen = []
    real = model_module.compile_graph

    def spy(graph, weights, **kw):
        compiled = real(graph, weights, **kw)
        seen.append(compiled.activations)
        return compiled

    monkeypatch.setattr(model_module, "compile_graph", spy)
    assert main(["run", TINY, "-p", "Hi", "-n", "2", "--activations", "q8"]) == 0
    assert main(["run", TINY, "-p", "Hi", "-n", "2"]) == 0
    assert seen == ["q8", "f32"]
    capsys.readouterr()
    with pytest.raises(SystemExit) as e:
        main(["run", TINY, "--activations", "int4"])
    assert e.value.code == 2 and "invalid choice: 'int4'" in capsys.readouterr().err
