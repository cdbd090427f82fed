"""Saves leave nothing behind: temporaries go on every failure path, and a save removes
the temporaries of earlier killed saves of the same target (only those)."""

import os
import random
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

import maxdecl as md
from maxdecl import checkpoint
from maxdecl.weights import safetensors_io as st

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

WRITER = r"""
import sys, numpy as np
from maxdecl import checkpoint
path, fill = sys.argv[1], float(sys.argv[2])
td = {"w": np.full((4, 1 << 20), fill, np.float32), "b": np.full(7, fill, np.float32)}
print("ready", flush=True)
while True:
    checkpoint.save(td, path)
"""


def temporaries(path):
    d, base = os.path.split(path)
    return sorted(n for n in os.listdir(d) if n.startswith(f".{base}.") and n.endswith(".tmp"))


def test_kill_9_during_save_loop(tmp_path):
    """kill -9 at random moments: the target is always the old or the new complete file,
    and the next successful save removes every temporary the killed ones left."""
    target = str(tmp_path / "m.safetensors")
    checkpoint.save({"w": np.zeros((4, 1 << 20), np.float32), "b": np.zeros(7, np.float32)},
                    target)
    rng = random.Random(1234)
    env = {**os.environ, "PYTHONPATH": ROOT + os.pathsep + os.environ.get("PYTHONPATH", "")}
    left = 0
    for it in range(12):
        fill = float(it + 1)
        p = subprocess.Popen([sys.executable, "-c", WRITER, target, str(fill)], cwd=ROOT,
                             env=env, stdout=subprocess.PIPE)
        assert p.stdout.readline().strip() == b"ready"
        time.sleep(rng.uniform(0.0, 0.25))
        p.send_signal(signal.SIGKILL)
        p.wait()
        td = checkpoint.load(target)          # always a complete file: old or new
        w = np.asarray(td["w"])
        assert w.shape == (4, 1 << 20) and np.asarray(td["b"]).shape == (7,)
        assert w[0, 0] in (0.0, *[float(k + 1) for k in range(it + 1)])
        assert np.all(w == w[0, 0]) and np.all(np.asarray(td["b"]) == w[0, 0])
        left += len(temporaries(target))
        del td, w
    assert left > 0, "no kill landed inside a save; the loop tested nothing"
    other = tmp_path / ".other.safetensors.123.0123456789ab.tmp"     # not this target's
    other.write_bytes(b"x")
    checkpoint.save({"w": np.ones(3, np.float32)}, target)
    assert temporaries(target) == []
    assert other.exists()


def test_live_writers_temporary_is_kept(tmp_path):
    target = tmp_path / "m.safetensors"
    mine = tmp_path / st.temporary_name(target)          # this (live) process's pid
    mine.write_bytes(b"partial")
    dead = tmp_path / f".m.safetensors.{2**22 + 12345}.00aa00aa00aa.tmp"   # no such pid
    dead.write_bytes(b"partial")
    old = tmp_path / ".m.safetensors.00aa00aa00bb.tmp"   # pid-less name of older versions
    old.write_bytes(b"partial")
    young = tmp_path / ".m.safetensors.00aa00aa00cc.tmp"
    young.write_bytes(b"partial")
    past = time.time() - 2 * st.STALE_AFTER
    os.utime(old, (past, past))
    lookalike = tmp_path / ".m.safetensors.bak.00aa00aa00aa.tmp"
    lookalike.write_bytes(b"x")
    removed = st.remove_stale_temporaries(target)
    assert sorted(removed) == sorted([dead.name, old.name])
    assert mine.exists() and young.exists() and lookalike.exists()


@pytest.mark.parametrize("exc", [KeyboardInterrupt, OSError, RuntimeError])
def test_failed_save_removes_its_temporary(tmp_path, monkeypatch, exc):
    target = tmp_path / "m.safetensors"
    checkpoint.save({"a": np.zeros(3, np.float32)}, target)

    def boom(*a, **k):
        raise exc("injected")
    monkeypatch.setattr(os, "fsync", boom)
    with pytest.raises(md.WeightsError if exc is OSError else exc):
        checkpoint.save({"a": np.ones(3, np.float32)}, target)
    assert temporaries(str(target)) == []
    monkeypatch.undo()
    assert np.asarray(checkpoint.load(target)["a"]).tolist() == [0.0, 0.0, 0.0]
