"""Mutated specs (shipped specs and test cases): every one validates to clean, positioned
one-line problems or to none, quickly and in bounded memory; the CLI never shows a
traceback. ``MAXDECL_FUZZ_SPECS=5000`` runs more mutations."""

import json
import os
import subprocess
import sys
import time

import pytest

from _limited import ROOT, run_limited

N = int(os.environ.get("MAXDECL_FUZZ_SPECS", "2000"))


def test_spec_mutations():
    out = run_limited("spec_fuzz", N, seed=20261201, memory=2 << 30, timeout=600)
    count, slowest, bad = out["result"]
    print(f"{count} spec mutations in {out['seconds']:.1f} s, slowest {slowest:.2f} s")
    assert count == N
    assert not bad, "\n".join(f"{src} -> {path}: {why}" for src, path, why in bad[:20])


LLAMA = open(os.path.join(ROOT, "specs", "llama3.yaml"), "rb").read()
DOUBLE = ("params:\n  s0: \"{'a' * 1000000}\"\n" + "".join(
    f"  s{i + 1}: \"{{s{i} + s{i}}}\"\n" for i in range(12))).encode()
HOSTILE_SPECS = {
    "bad_utf8": (LLAMA.replace(b"name: llama3", b"name: ll\xffama3"), ":15:9: invalid UTF-8"),
    "nul": (LLAMA.replace(b"name: llama3", b"name: ll\x00ama3"), ":15:9: a NUL byte"),
    "ctrl": (LLAMA.replace(b"name: llama3", b"name: ll\x07ama3"), ":15:9: control character"),
    "tab": (LLAMA.replace(b"    dim: 4096", b"\tdim: 4096"), "tab is used for indentation"),
    "n_layers": (LLAMA.replace(b"n_layers: 32", b"n_layers: 16777216"), "MAX_REPEAT"),
    "double": (LLAMA.replace(b"params:\n", DOUBLE, 1), "MAX_VALUE_SIZE"),
    "pow": (LLAMA.replace(b"params:\n", b'params:\n  zz: "{(10**4096)**4096}"\n', 1),
            "MAX_INT_BITS"),
    "fmt": (LLAMA.replace(b"params:\n", b"params:\n  zz: \"{'%999999999d' % 1}\"\n", 1),
            "MAX_FORMAT_WIDTH"),
    "alibi": (LLAMA.replace(b"params:\n", b'params:\n  zz: "{alibi_slopes(10**9)}"\n', 1),
              "MAX_VALUE_SIZE"),
    "deep": (LLAMA + b"zz: " + b"[" * 100000 + b"\n", "MAX_YAML_DEPTH"),
    "laughs": (LLAMA + b"".join(
        b"l%d: &l%d [%s]\n" % (i, i, b", ".join([b"*l%d" % (i - 1) if i else b"x"] * 10))
        for i in range(9)), "MAX_YAML_NODES"),
    "big": (LLAMA + b"#" * (2 << 20), "MAX_SPEC_BYTES"),
}
# Amplifiers: a long list or name that every one of 4000 unrolled instances would copy.
SMALL = open(os.path.join(ROOT, "tests", "spec", "cases", "valid", "small.yaml"), "rb").read()
SMALL4K = SMALL.replace(b"n_layers: 2}", b"n_layers: 4000}")
LONG_LIST = b"[" + b", ".join([b"x"] * 40000) + b"]"
HOSTILE_SPECS.update({
    "many_inputs": (SMALL4K.replace(b"in: [x, h], out: x}", b"in: " + LONG_LIST + b", out: x}"),
                    "MAX_UNROLLED"),
    "many_outputs": (SMALL4K.replace(b"in: [x, h], out: x}", b"in: [x, h], out: " + LONG_LIST
                                     + b"}"), "MAX_UNROLLED"),
    "long_attr_list": (SMALL4K.replace(b"attrs: {epsilon: 1.0e-5}", b"attrs: {epsilon: "
                                       + LONG_LIST.replace(b"x", b"1") + b"}"),
                       "MAX_TOTAL_SIZE"),
    "long_shape": (SMALL4K.replace(b"weights: {weight: [dim]}", b"weights: {weight: "
                                   + LONG_LIST.replace(b"x", b"1") + b"}", 1), "MAX_RANK"),
    "long_name": (SMALL4K.replace(b"- name: norm", b"- name: " + b"n" * 300000),
                  "MAX_PATH_CHARS"),
})


@pytest.mark.parametrize("fmt", ["text", "json"])
@pytest.mark.parametrize("case", sorted(HOSTILE_SPECS))
def test_cli_hostile_spec(tmp_path, case, fmt):
    data, want = HOSTILE_SPECS[case]
    path = tmp_path / f"{case}.yaml"
    path.write_bytes(data)
    t0 = time.perf_counter()
    p = subprocess.run([sys.executable, "-c", "import resource, runpy, sys; "
                        "resource.setrlimit(resource.RLIMIT_AS, (1 << 30, 1 << 30)); "
                        "sys.argv = ['maxdecl'] + sys.argv[1:]; "
                        "runpy.run_module('maxdecl', run_name='__main__')",
                        "validate", "--format", fmt, str(path)],
                       cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert p.returncode == 1, p.stderr[-2000:]
    assert time.perf_counter() - t0 < 15, "validate took too long"
    assert "Traceback" not in p.stderr + p.stdout
    if fmt == "json":
        problems = json.loads(p.stdout)
        assert problems and all(pr["line"] >= 1 for pr in problems)
        text = "\n".join(f"{pr['file']}:{pr['line']}:{pr['col']}: {pr['message']}"
                         for pr in problems)
    else:
        text = p.stdout
        assert len(p.stderr.strip().splitlines()) == 1       # the summary line
    assert want in text, text[:2000]
    assert all(len(line) < 1000 for line in text.splitlines())
