"""Random expressions with hostile constants: each evaluates to a bounded value or fails
with an ExprError, quickly (seeded; ``MAXDECL_FUZZ_EXPRS`` sets the count)."""

import os
import random
import time

from maxdecl.spec import budgets
from maxdecl.spec.expr import FUNCTIONS, ExprError, evaluate, render

N = int(os.environ.get("MAXDECL_FUZZ_EXPRS", "3000"))
ATOMS = ["0", "1", "-1", "2", "3", "4096", "4097", "10**9", "2**63", "10**300", "1e308",
         "0.5", "-0.0", "'a'", "''", "'%d'", "'%999999d'", "'%.5000f'", "'%s%s'", "'%c'",
         "'x' * 999999", "[0] * 999999", "[]", "[1, 2]", "[[1], [2]]", "None", "True",
         "x", "s", "big", "lst", "nested", "float('nan')", "float('inf')"]
BINOPS = ["+", "-", "*", "/", "//", "%", "**"]
CMPS = ["==", "!=", "<", "<=", ">", ">=", "in", "not in"]
ENV = {"x": 7, "s": "s" * 1000, "big": 2**4000, "lst": list(range(1000)),
       "nested": [[1, 2]] * 100}


def expr(rng: random.Random, depth: int = 0) -> str:
    if depth > 4 or rng.random() < 0.3:
        return rng.choice(ATOMS)
    k = rng.randrange(7)
    a, b = expr(rng, depth + 1), expr(rng, depth + 1)
    if k <= 1:
        return f"({a} {rng.choice(BINOPS)} {b})"
    if k == 2:
        return f"({a} {rng.choice(CMPS)} {b})"
    if k == 3:
        fn = rng.choice(sorted(FUNCTIONS))
        args = ", ".join(expr(rng, depth + 1) for _ in range(rng.randint(0, 3)))
        return f"{fn}({args})"
    if k == 4:
        return f"({a} if {b} else {expr(rng, depth + 1)})"
    if k == 5:
        return f"{a}[{b}]"
    return f"{rng.choice(['-', 'not ', '+'])}{a}"


def test_random_expressions():
    rng = random.Random(20261201)
    slowest, kinds = 0.0, {"value": 0, "error": 0}
    for _ in range(N):
        text = expr(rng)
        t0 = time.perf_counter()
        try:
            with budgets.metered():
                v = evaluate(text, ENV) if rng.random() < 0.7 else render(
                    "a{" + text + "}b", ENV)
            budgets.size_of(v)
            kinds["value"] += 1
        except ExprError as e:
            assert "\n" not in str(e), text
            kinds["error"] += 1
        except Exception as e:   # noqa: BLE001 - anything but ExprError is a bug
            raise AssertionError(f"{text!r}: {type(e).__name__}: {e}") from None
        slowest = max(slowest, time.perf_counter() - t0)
        assert time.perf_counter() - t0 < 2.0, text
    print(f"{N} expressions: {kinds}, slowest {slowest:.3f} s")
    assert kinds["value"] > N // 10 and kinds["error"] > N // 10
