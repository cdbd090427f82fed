"""``maxdecl batch`` (local and on a local Ray, equal results; resumable; failing rows
reported) and ``maxdecl chat`` (stdin turns, the same greedy text as generate)."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

import maxdecl as md
from maxdecl.pipelines.chat_template import ChatTemplate

ROOT = Path(__file__).resolve().parents[2]
SPEC = ROOT / "specs" / "llama3.yaml"
ROWS = [{"id": 1, "prompt": "Once upon a time", "max_tokens": 6},
        {"id": "two", "prompt": "The cat", "max_tokens": 4, "temperature": 0},
        {"id": 3, "prompt": [5, 6, 7], "max_tokens": 3},
        {"id": 4, "prompt": "x", "max_tokens": -1},
        {"id": 5, "prompt": {"bad": 1}}]


def run_batch(tmp_path, out, *extra):
    src = tmp_path / "in.jsonl"
    src.write_text("".join(json.dumps(r) + "\n" for r in ROWS) + "not json\n")
    return subprocess.run([sys.executable, "-m", "maxdecl", "batch", str(SPEC), "--input",
                           str(src), "--output", str(out), *extra],
                          capture_output=True, text=True, timeout=600, cwd=ROOT)


def read(path):
    return {json.dumps(r["id"]): r for r in map(json.loads, path.read_text().splitlines())}


def test_local_batch_results_errors_and_resume(tmp_path):
    out = tmp_path / "out.jsonl"
    done = run_batch(tmp_path, out)
    assert done.returncode == 0, done.stderr
    got = read(out)
    assert set(got) == {"1", '"two"', "3", "4", "5", '"line 6"'}
    assert got["1"]["text"] == md.generate(SPEC, None, "Once upon a time",
                                           max_new_tokens=6).text
    assert got["3"]["ids"] == md.generate(SPEC, None, [5, 6, 7], max_new_tokens=3).ids
    assert "max_tokens" in got["4"]["error"] and "prompt" in got["5"]["error"]
    assert "not JSON" in got['"line 6"']["error"]
    # a killed job resumes: drop two results, rerun, only those two run again
    lines = out.read_text().splitlines()
    out.write_text("\n".join(lines[:4]) + "\n")
    again = run_batch(tmp_path, out)
    assert "4 already in" in again.stderr and "2 to run" in again.stderr
    assert read(out) == got


def test_ray_batch_equals_local(tmp_path):
    pytest.importorskip("ray.data")
    local, remote = tmp_path / "local.jsonl", tmp_path / "ray.jsonl"
    assert run_batch(tmp_path, local).returncode == 0
    done = run_batch(tmp_path, remote, "--ray")
    assert done.returncode == 0, done.stderr[-2000:]
    assert read(remote) == read(local)
    ids = [json.loads(line)["id"] for line in remote.read_text().splitlines()]
    assert ids == [r["id"] for r in ROWS] + ["line 6"]         # input order kept


def test_chat_turns_from_stdin_match_generate():
    spec = md.load_spec(SPEC)
    done = subprocess.run([sys.executable, "-m", "maxdecl", "chat", str(SPEC), "-n", "5"],
                          input="Hello\n/reset\nHello\n/exit\n", capture_output=True,
                          text=True, timeout=300, cwd=ROOT)
    assert done.returncode == 0, done.stderr
    prompt = ChatTemplate(spec.chat_template).render([{"role": "user", "content": "Hello"}])
    want = md.generate(SPEC, None, prompt, max_new_tokens=5).text
    replies = done.stdout.split("\n")
    assert replies[0] == want and replies[1] == want      # /reset: the same first turn
    assert "[new conversation]" in done.stderr
