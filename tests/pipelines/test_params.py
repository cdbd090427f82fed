"""Run-time argument checks (pipelines/params.py): every rule through the API and the CLI,
and a seeded fuzz asserting "a clean md.InputError, or success"."""

import math
import os
import random

import numpy as np
import pytest

import maxdecl as md
from maxdecl.cli import main
from maxdecl.pipelines import params as checks
from maxdecl.pipelines.tokenizer_bytes import ByteTokenizer

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SPEC = os.path.join(ROOT, "specs", "tinystories.yaml")


@pytest.fixture(scope="module")
def tiny():
    td = md.random_weights(SPEC, "tiny")
    return md.load_model(SPEC, td, variant="tiny", tokenizer=ByteTokenizer())


BAD = [  # (keyword, value, words the message must contain)
    ("temperature", -1, "temperature must be >= 0"),
    ("temperature", float("nan"), "temperature must be finite"),
    ("temperature", float("inf"), "temperature must be finite"),
    ("temperature", "0.5", "temperature must be a number"),
    ("temperature", True, "temperature must be a number"),
    ("top_k", -1, "top_k must be >= 0"),
    ("top_k", 2.5, "top_k must be an integer"),
    ("top_p", 0.0, "top_p must be in (0, 1]"),
    ("top_p", 2, "top_p must be in (0, 1]"),
    ("top_p", float("nan"), "top_p must be finite"),
    ("min_p", -0.1, "min_p must be in [0, 1]"),
    ("min_p", 1.5, "min_p must be in [0, 1]"),
    ("repeat_penalty", 0, "repeat_penalty must be > 0"),
    ("repeat_penalty", float("inf"), "repeat_penalty must be finite"),
    ("repeat_last_n", -2, "repeat_last_n must be >= -1"),
    ("seed", -2, "seed must be in [0, 18446744073709551615]"),
    ("seed", 2**64, "seed must be in"),
    ("seed", 1.5, "seed must be an integer"),
    ("max_new_tokens", -3, "max_new_tokens must be in [0,"),
    ("max_new_tokens", 1.5, "max_new_tokens must be an integer"),
    ("max_new_tokens", True, "max_new_tokens must be an integer"),
    ("max_new_tokens", 2**70, "max_new_tokens must be in [0,"),
    ("max_new_tokens", None, "max_new_tokens must be an integer"),
    ("stop", "", "stop strings must be non-empty"),
    ("stop", 5, "stop must be a string or a list"),
    ("stop", ["a"] * 17, "at most 16"),
    ("stop", ["\ud800"], "stop is not valid Unicode"),
    ("truncate", "yes", "truncate must be True or False"),
]


@pytest.mark.parametrize("key,value,words", BAD, ids=[f"{k}={v!r}"[:40] for k, v, _ in BAD])
def test_bad_generation_arguments(tiny, key, value, words):
    with pytest.raises(md.InputError) as e:
        tiny.generate("Hi", **{key: value})
    assert words in str(e.value) and "\n" not in str(e.value)


BAD_PROMPTS = [
    (None, "prompt must be a str or a list of token ids, got None"),
    (b"Hi", "got bytes"),
    (bytearray(b"Hi"), "got bytes"),
    ("\udc80abc", "prompt is not valid Unicode"),
    ([2**70], "prompt token 0 is 1180591620717411303424: token ids must be in [0, 256)"),
    ([1, 256], "prompt token 1 is 256"),
    ([1, -1], "prompt token 1 is -1"),
    ([1, 2.0], "prompt token 1 must be an int"),
    ([True], "prompt token 0 must be an int"),
    ([], "prompt is an empty list"),
    (42, "prompt must be a str or a list"),
    ([[1, 2], None], "a list of prompts holds strs or lists of token ids; item 1 is None"),
    ([1, "a"], "a list of prompts holds strs or lists of token ids; item 0 is 1"),
    ({"a": 1}, "prompt must be a str or a list"),
]


@pytest.mark.parametrize("prompt,words", BAD_PROMPTS, ids=[repr(p)[:30] for p, _ in BAD_PROMPTS])
def test_bad_prompts(tiny, prompt, words):
    with pytest.raises(md.InputError) as e:
        tiny.generate(prompt, max_new_tokens=1)
    assert words in str(e.value)


def test_good_prompt_forms(tiny):
    a = tiny.generate([72, 105], max_new_tokens=2)
    assert tiny.generate(np.array([72, 105]), max_new_tokens=2).ids == a.ids
    assert tiny.generate((np.int64(72), 105), max_new_tokens=2).ids == a.ids
    assert tiny.generate("Hi", max_new_tokens=2).ids == a.ids        # bytes 72, 105


def test_bad_load_arguments(tiny):
    with pytest.raises(md.InputError, match="weights must be a path, a md.TensorDict or None, "
                                             "got int"):
        md.load_model(SPEC, weights=42)
    with pytest.raises(md.InputError, match="tokenizer must be a path or an object with "
                                             r"encode\(\) and decode\(\), got object"):
        md.load_model(SPEC, tiny.weights, variant="tiny", tokenizer=object())
    with pytest.raises(md.InputError, match="weights must be"):
        md.generate(SPEC, 42, "Hi")
    with pytest.raises(md.InputError, match="spec /no/such.yaml: no such file"):
        md.load_model("/no/such.yaml")
    with pytest.raises(md.InputError, match="spec must be a path or a md.load_spec"):
        md.load_model(42)
    with pytest.raises(md.InputError, match="variant must be a variant name"):
        md.load_model(SPEC, variant=5)
    with pytest.raises(md.InputError, match="ctx_size must be an integer"):
        md.load_model(SPEC, tiny.weights, variant="tiny", ctx_size="big")


def test_threads_and_ctx_size_rules():
    assert checks.check_threads(None) is None and checks.check_threads(1) == 1
    with pytest.raises(md.InputError, match=r"threads must be in \[1, "):
        checks.check_threads(100000)
    with pytest.raises(md.InputError, match=r"threads must be in \[1, "):
        checks.check_threads(0)
    assert checks.check_ctx_size(0, 64) == 64 and checks.check_ctx_size(None, 64) == 64
    assert checks.check_ctx_size(10, 64) == 10
    with pytest.raises(md.InputError, match=r"ctx_size must be in \[1, 64\]"):
        checks.check_ctx_size(65, 64)


def test_sampling_normalises_off_values():
    p = checks.check_sampling(top_k=0, seed=-1)
    assert p["top_k"] is None and p["seed"] is None


# -- the CLI: exit 2, one line, before the prompt is echoed --------------------------------

CLI_BAD = [
    (["--temperature", "-1"], "temperature must be >= 0"),
    (["--temp", "nan"], "temperature must be finite"),
    (["--top-p", "2"], "top_p must be in (0, 1]"),
    (["--top-p", "nan"], "top_p must be finite"),
    (["--top-k", "-5"], "top_k must be >= 0"),
    (["--min-p", "3"], "min_p must be in [0, 1]"),
    (["--seed", "-2"], "seed must be in"),
    (["-n", "-3"], "max_new_tokens must be in"),
    (["-n", str(2**70)], "max_new_tokens must be in"),
    (["-n", "1.5"], "invalid int value"),
    (["--threads", "100000"], "threads must be in"),
    (["-c", "-1"], "ctx_size must be >= 0"),
    (["-c", "1000"], "ctx_size must be in [1, 64]"),
    (["-p", "a", "-f", "x.txt"], "not both"),
    (["-p", "x" * 200], "exceeds the context of 64 tokens"),
    (["--input", "x"], "expected NAME=FILE.npy"),
    (["-m", "no/such.gguf"], "--weights no/such.gguf: no such file or directory"),
    (["--tokenizer", "no/tok.json"], "--tokenizer no/tok.json: no such file or directory"),
    (["-f", "no/prompt.txt"], "no/prompt.txt: No such file or directory"),
]


def _code(argv) -> int:
    try:
        return main(argv)
    except SystemExit as e:              # argparse: a value of the wrong type
        return e.code


@pytest.mark.parametrize("args,words", CLI_BAD, ids=[" ".join(a)[:30] for a, _ in CLI_BAD])
def test_cli_usage_errors_exit_2_with_one_line(tmp_path, monkeypatch, capsys, args, words):
    monkeypatch.chdir(tmp_path)
    code = _code(["run", SPEC, *args])
    out, err = capsys.readouterr()
    lines = [ln for ln in err.splitlines() if ln.startswith("maxdecl") and "error" in ln]
    assert code == 2 and "Traceback" not in err and len(lines) == 1, err
    assert words in lines[0]
    assert "Once upon" not in out and "x" * 200 not in out     # the prompt was not echoed


def test_cli_truncate_keeps_the_last_tokens(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert main(["run", SPEC, "-p", "ab" * 100, "-n", "4", "--truncate"]) == 0
    out, err = capsys.readouterr()
    assert "keeps its last 60 of 200 tokens" in err
    assert "[60 prompt tokens" in out.splitlines()[-1]


# -- seeded fuzz -------------------------------------------------------------------------

HOSTILE = [None, True, False, 0, 1, -1, 2, 7, 63, 64, 65, 2**31, 2**63, 2**64, -2**64, 2**70,
           0.0, 0.5, 1.0, 1.5, -0.5, 1e-300, 1e300, float("nan"), float("inf"), -float("inf"),
           "", "1", "abc", "\ud800", b"x", [], [1], [1, 2], [-1], [2**70], [[1]], {}, (),
           object(), np.int64(3), np.float32(0.5), np.array([1, 2]), 1j]
KEYS = ["temperature", "top_k", "top_p", "min_p", "repeat_penalty", "repeat_last_n", "seed",
        "max_new_tokens", "stop", "truncate"]


def test_fuzz_generate_arguments_clean_error_or_success(tiny):
    rng = random.Random(1234)
    ok = bad = 0
    for _ in range(400):
        kw = {k: rng.choice(HOSTILE) for k in rng.sample(KEYS, rng.randint(1, 4))}
        kw.setdefault("max_new_tokens", rng.choice([0, 1, 2]))
        prompt = rng.choice(["Hi", [1, 2, 3], ["a", "b"], rng.choice(HOSTILE)])
        try:
            out = tiny.generate(prompt, **kw)
        except md.InputError as e:
            assert str(e) and "\n" not in str(e)
            bad += 1
            continue
        outs = out if isinstance(out, list) else [out]
        for o in outs:
            assert o.finish_reason in ("stop", "length") and len(o.ids) <= kw["max_new_tokens"]
            assert all(0 <= i < 256 for i in o.ids) and math.isfinite(o.decode_s)
        ok += 1
    assert ok > 20 and bad > 200, (ok, bad)


def test_fuzz_cli_arguments_clean_exit(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    rng = random.Random(99)
    opts = ["--temp", "--top-k", "--top-p", "--min-p", "--repeat-penalty", "--seed", "-n", "-t",
            "-c", "--repeat-last-n"]
    values = ["-1", "0", "1", "0.5", "nan", "inf", "-inf", "2", "1e309", str(2**70), "x", "",
              "65", "-0"]
    codes = set()
    for _ in range(60):
        args = []
        for opt in rng.sample(opts, rng.randint(1, 3)):
            args += [opt, rng.choice(values)]
        if "-n" not in args:
            args += ["-n", "1"]
        code = _code(["run", SPEC, "-p", "Hi", *args])
        out, err = capsys.readouterr()
        assert code in (0, 2) and "Traceback" not in err, (args, err)
        if code == 2:
            assert not out, (args, out)  # nothing echoed before the error
        codes.add(code)
    assert codes == {0, 2}


def test_fuzz_load_model_arguments_clean_error_or_success(tiny, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)              # weights=None: the random-weights fallback
    rng = random.Random(7)
    spec = md.load_spec(SPEC)
    good = {"spec": [SPEC, spec], "weights": [None, tiny.weights], "variant": ["tiny", None],
            "tokenizer": [None, ByteTokenizer()], "ctx_size": [None, 0, 16]}
    bad = {"spec": [None, 42, b"specs/x.yaml", "/no/such.yaml", str(tmp_path)],
           "weights": [42, "/no/such.gguf", [1], b"x", str(tmp_path)],
           "variant": ["nope", 5, ""],
           "tokenizer": [object(), 3, "/no/tok.json"],
           "ctx_size": [-1, 10**9, 1.5, "8"]}
    ok = 0
    for _ in range(60):
        kw = {k: rng.choice(bad[k] if rng.random() < 0.25 else good[k]) for k in good}
        try:
            model = md.load_model(**kw)
        except md.MaxdeclError as e:
            assert str(e) and "\n" not in str(e), kw
            continue
        ok += 1
        assert model.generate([1, 2], max_new_tokens=1).finish_reason in ("stop", "length")
    assert ok >= 3, ok
