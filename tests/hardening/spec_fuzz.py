"""Seeded mutations of the shipped specs and the spec test cases.

``run(n, seed, workdir)`` writes ``n`` mutated specs (byte flips, hostile tokens,
hostile values, line deletions/duplications), checks each with ``md.validate_spec``
and returns the cases that raised, printed an unclear problem or took too long. Run by
hand (``MAXDECL_FUZZ_SPECS`` sets the count in the test)::

    python tests/hardening/spec_fuzz.py 5000
"""

from __future__ import annotations

import glob
import json
import os
import random
import re
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

HOSTILE = [
    "99999999999999999999999999999999999999", "16777216", "-1", "0", "1e999", "nan",
    '"{10**4096}"', '"{(10**4096)**4096}"', '"{2**4095 * 2**4095}"', '"{9**9**9}"',
    "\"{'%999999999d' % 1}\"", "\"{'%.999999999f' % 1.0}\"", "\"{'a' * 999999 + 'a'}\"",
    '"{[0] * 1000000}"', '"{[[0] * 1000] * 1000}"', '"{alibi_slopes(10**9)}"',
    '"{llama3_rope_factors(10**9, 1e4, 8.0, 1.0, 4.0, 64)}"', '"{round(1, -10**7)}"',
    "\"{int('9' * 5000)}\"", '"{(-8) ** 0.5}"', '"{' + "-" * 1500 + '1}"',
    '"{' + "(" * 150 + "1" + ")" * 150 + '}"', '"{[x for x in [1]]}"', '"{dim.__class__}"',
    '"{__import__(\'os\')}"', '"{' + "a" * 3000 + '}"', '"{{}}"', '"{"', '"}"',
    "[" * 300 + "]" * 300, "{" * 300 + "}" * 300, "&a [1, 2]", "*a", "*nope",
    "&m {<<: *m}", "{<<: [*a, 1]}", "{<<: 3}", "&b {x: 1}", "{<<: *b, x: 2}",
    "!!python/object/apply:os.system ['true']", "!custom 1", "!!binary aGk=",
    "\t", "\x00", "\x01", "\x7f", "\u2028", "\ufeff", "'\x00'", "\"\\udcff\"", "~", "null",
    "'" + "x" * 100000 + "'", "[" + ", ".join(["1"] * 5000) + "]",
]
NUMBERS = ["16777216", "4097", "65537", "0", "-3", "2.5", "1e308", "3", "7", "2", "1",
           '"{n_layers * 4096}"', '"{dim * 1000}"', '"{i}"', "true", "[1, 2]", "x",
           "{}", "[]", "{a: 1}", "[[1, 2]]", "null", "[x, .weight]", "[{}]", "{x: [1]}"]
BYTES = [b"\xff", b"\xfe\xff", b"\xc3", b"\xe2\x82", b"\xed\xa0\x80", b"\x00", b"\t",
         b"\r", b"\x1b[31m"]
LAUGHS = ("l0: &l0 [x, x, x, x, x, x, x, x, x, x]\n" + "".join(
    f"l{i}: &l{i} [*l{i-1}, *l{i-1}, *l{i-1}, *l{i-1}, *l{i-1}, *l{i-1}, *l{i-1}, *l{i-1}, "
    f"*l{i-1}, *l{i-1}]\n" for i in range(1, 9)))
_VALUE = re.compile(rb"^(\s*-?\s*[\w.*\"'{}-]+:\s)(\S.*)$")

# edits inside a template expression: unbalanced brackets, operators, huge numbers
EXPR_EDITS = ["}", "{", ")", "(", "[", "]", "**", " if ", "'", '"', "//0", "-", "1e999",
              " not ", "lambda x: x", "__class__", ".", ",", ":", "%", "**99999", "{{", "}}",
              "[0]", "[1:]", " for i in x", "=", "==", "*-", "\\", "#"]


def sources() -> list[tuple[str, bytes]]:
    files = sorted(glob.glob(os.path.join(ROOT, "specs", "*.yaml")))
    files += sorted(glob.glob(os.path.join(ROOT, "tests", "spec", "cases", "*", "*.yaml")))
    return [(os.path.basename(f), open(f, "rb").read()) for f in files]


def mutate(data: bytes, rng: random.Random) -> bytes:
    lines = data.split(b"\n")
    for _ in range(rng.choice([1, 1, 1, 2, 3])):
        kind = rng.choices(range(9), weights=[1, 1, 5, 4, 2, 0.5, 0.5, 1, 3])[0]
        i = rng.randrange(len(lines))
        if kind == 0:                                   # flip bits of a few bytes
            b = bytearray(b"\n".join(lines))
            for _ in range(rng.randint(1, 3)):
                if b:
                    b[rng.randrange(len(b))] ^= 1 << rng.randrange(8)
            lines = bytes(b).split(b"\n")
        elif kind == 1:                                 # a hostile token somewhere in a line
            tok = rng.choice(HOSTILE).encode("utf-8", "surrogateescape")
            at = rng.randrange(len(lines[i]) + 1)
            lines[i] = lines[i][:at] + tok + lines[i][at:]
        elif kind in (2, 3):                            # a hostile value for a key
            cands = [j for j, ln in enumerate(lines) if _VALUE.match(ln)]
            if cands:
                j = rng.choice(cands)
                m = _VALUE.match(lines[j])
                tok = rng.choice(HOSTILE if kind == 2 else NUMBERS)
                lines[j] = m.group(1) + tok.encode("utf-8", "surrogateescape")
        elif kind == 4:                                 # delete or duplicate lines
            n = rng.randint(1, 3)
            if rng.random() < 0.5:
                del lines[i:i + n]
            else:
                lines[i:i] = lines[i:i + n] * rng.randint(1, 3)
        elif kind == 5:                                 # raw bytes
            tok = rng.choice(BYTES)
            at = rng.randrange(len(lines[i]) + 1)
            lines[i] = lines[i][:at] + tok + lines[i][at:]
        elif kind == 6:                                 # indent a line by a tab
            lines[i] = b"\t" + lines[i].lstrip(b" ")
        elif kind == 8:                                 # an edit inside an expression
            cands = [j for j, ln in enumerate(lines) if b"{" in ln]
            if cands:
                j = rng.choice(cands)
                ln = lines[j]
                at = rng.choice([k for k in range(len(ln)) if ln[k:k + 1] in b"{}()[]"]
                                or [rng.randrange(len(ln))])
                at = max(0, min(len(ln), at + rng.randint(-3, 3)))
                tok = rng.choice(EXPR_EDITS).encode()
                lines[j] = ln[:at] + tok + ln[at + rng.randint(0, 2):]
        else:                                           # an alias bomb / a deep value
            extra = rng.choice([LAUGHS.encode(), b"zz: " + b"[" * 5000 + b"]" * 5000,
                                b"zz: &z {a: *z}", b"zz: " + b"- " * 300 + b"x"])
            lines[i:i] = extra.split(b"\n")
        if not lines:
            lines = [b""]
    return b"\n".join(lines)


def check_one(path: str) -> str | None:
    """None when validating ``path`` returns clean problems; else what went wrong."""
    import maxdecl as md

    name = os.path.basename(path)
    try:
        problems = md.validate_spec(path)
    except Exception as e:      # noqa: BLE001 - anything but a list of problems is a bug
        return f"{type(e).__name__}: {str(e)[:300]}"
    for p in problems:
        text = str(p)
        if not isinstance(p, md.spec.SpecProblem) or "\n" in text or "\r" in text \
                or not re.match(rf"{re.escape(path)}:\d+:\d+: \S", text) or p.line < 1 \
                or len(text) > 1000:
            return f"unclear problem in {name}: {text[:300]!r}"
    return None


def run(n: int, seed: int, workdir: str, max_seconds: float = 5.0):
    """Validate ``n`` mutated specs: ``(count, slowest seconds, [(source, file, why)])``."""
    rng = random.Random(seed)
    srcs = sources()
    bad, slowest = [], 0.0
    for i in range(n):
        name, data = srcs[i % len(srcs)]
        path = os.path.join(workdir, f"m{i}.yaml")
        with open(path, "wb") as f:
            f.write(mutate(data, rng))
        t0 = time.perf_counter()
        why = check_one(path)
        dt = time.perf_counter() - t0
        slowest = max(slowest, dt)
        if why is None and dt > max_seconds:
            why = f"took {dt:.1f} s"
        if why is None:
            os.unlink(path)
        else:
            bad.append((name, path, why))
    return n, slowest, bad


if __name__ == "__main__":
    import tempfile

    n = int(sys.argv[1]) if len(sys.argv) > 1 else 1000
    seed = int(sys.argv[2]) if len(sys.argv) > 2 else 0
    work = tempfile.mkdtemp(prefix="sfuzz")
    t0 = time.perf_counter()
    count, slowest, bad = run(n, seed, work)
    print(json.dumps({"count": count, "seconds": round(time.perf_counter() - t0, 1),
                      "slowest_case_s": round(slowest, 2), "n_failures": len(bad),
                      "failures": bad[:40]}, indent=1))
