"""Output arrays kept between runs (maxdecl/kernels/step_outputs.py, runtime._generate):
a decode step allocates no activations, gives the same bits as with new arrays, and
never writes into an array that a caller still holds."""

import threading
from pathlib import Path

import numpy as np
import pytest

import maxdecl as md
from maxdecl.kernels import step_outputs
from maxdecl.pipelines.generate import Session
from maxdecl.weights.random import program_weights

SPECS = Path(__file__).resolve().parents[1] / "specs"
F32 = md.DType.float32
# the runners that take their outputs from the plan (step_outputs.writes_into)
WRITERS = {"linear", "linear_group", "norm_chain", "act_mul", "rms_norm", "rope", "attention",
           "embedding", "gather", "add", "sub", "mul"}


def _model(name):
    spec = md.load_spec(SPECS / f"{name}.yaml", "tiny")
    td = program_weights(spec.program("tiny"), seed=5)
    g = md.build(spec, weights=td)
    return g, td


def _fresh(compiled):
    """``compiled`` with no kept arrays: every step allocates its outputs."""
    compiled._run.new_outputs = lambda: [None] * len(compiled.steps)
    return compiled


def _kinds(compiled):
    return [s.kind if s.kind != "node" else compiled._nodes[s.nodes[0]].op
            for s in compiled.steps]


def _greedy(session, prompt, steps):
    """The logits of a prefill and ``steps`` greedy decode steps, each a copy taken at
    once, and the last logits and state as returned (not copied)."""
    logits, state = session.prefill(np.asarray(prompt))
    seen, pos = [logits.copy()], len(prompt)
    for _ in range(steps):
        token = np.array([int(np.argmax(logits[-1]))])
        logits, state = session.step(token, pos, state)
        seen.append(logits.copy())
        pos += 1
    return seen, logits, state


@pytest.mark.parametrize("name", ["gemma3", "llama3", "qwen3_moe"])
def test_decode_steps_reuse_their_arrays_with_the_same_bits(name):
    g, td = _model(name)
    kept = md.compile(g, td)
    session = Session(g, kept)
    _greedy(session, [1, 2, 3, 4, 5], 2)                 # warm: the arrays are made
    held = kept._run.outputs.steps
    made = sum(o.made for o in held if o is not None)
    got, _, _ = _greedy(session, [1, 2, 3, 4, 5], 6)
    # a prefill's arrays, and those of the two decode steps after it (the shape changed,
    # then it repeated), are made each time: the steps after those allocate nothing, so
    # 6 and 12 decode steps make as many arrays
    per_call = sum(o.made for o in held if o is not None) - made
    got2, _, _ = _greedy(session, [1, 2, 3, 4, 5], 12)
    assert sum(o.made for o in held if o is not None) - made == 2 * per_call
    returned = {id(x) for x in g.outputs}
    for step, o, kind in zip(kept.steps, held, _kinds(kept)):
        if kind in WRITERS and not any(id(x) in returned for x in step.outputs):
            assert o is not None, kind
    want, _, _ = _greedy(Session(g, _fresh(md.compile(g, td))), [1, 2, 3, 4, 5], 12)
    for a, b in zip(got + got2, want[:7] + want):
        assert a.tobytes() == b.tobytes()


def test_returned_logits_and_state_are_never_written_again():
    g, td = _model("gemma3")
    session = Session(g, md.compile(g, td))
    _, logits, state = _greedy(session, [3, 1, 4], 3)
    copies = (logits.copy(), {k: np.array(v) for k, v in state.items()})
    held = (logits, dict(state))
    pos = 6
    for t in range(5):                           # more steps from the same state
        session.step(np.array([t + 1]), pos, state)
    assert held[0].tobytes() == copies[0].tobytes()
    for k, v in held[1].items():
        assert np.array_equal(v, copies[1][k])


def _norm_then_view():
    """x -> rms_norm a -> reshape -> output; x -> rms_norm b -> rms_norm c -> output."""
    g = md.Graph("views", input_types=[md.TensorType(F32, (1, 8))])
    norms = {}
    for name, src in (("a", 0), ("b", 0), ("c", "b")):
        with g.layer(name):
            x = g.inputs[0] if src == 0 else norms[src]
            norms[name] = md.ops.rms_norm(x, g.weight(f"{name}.w", md.TensorType(F32, (8,))),
                                          1e-6)
    g.output(md.ops.reshape(norms["a"], (2, 4)), norms["c"])
    rng = np.random.default_rng(0)
    return g, {f"{n}.w": rng.standard_normal(8).astype(np.float32) for n in "abc"}


@pytest.mark.parametrize("fuse", [True, False])
def test_an_output_viewing_a_step_array_is_not_reused(fuse):
    g, td = _norm_then_view()
    c = md.compile(g, td, fuse=fuse)
    xs = [np.random.default_rng(s).standard_normal((1, 8)).astype(np.float32)
          for s in range(4)]
    first = c(xs[0])
    copy = [a.copy() for a in first]
    for x in xs[1:]:
        later = c(x)
        assert not any(np.shares_memory(a, b) for a in first for b in later)
    assert all(a.tobytes() == b.tobytes() for a, b in zip(first, copy))
    # a's array is viewed by an output, c's is one: made anew each run; b's is kept
    held = c._run.outputs.steps
    a, b, cc = [i for i, k in enumerate(_kinds(c)) if k == "rms_norm"]
    assert held[a] is None and held[cc] is None and held[b] is not None


def test_threads_take_their_own_arrays():
    g, td = _model("llama3")
    c = md.compile(g, td)
    prompts = [[1, 2, 3], [7, 8, 9, 10], [4], [11, 5]]
    want = {i: _greedy(Session(g, _fresh(md.compile(g, td))), p, 8)[0]
            for i, p in enumerate(prompts)}
    got, errors = {}, []

    def work(i):
        try:
            for _ in range(3):
                got[i] = _greedy(Session(g, c), prompts[i], 8)[0]
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(len(prompts))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    for i, logits in want.items():
        assert all(a.tobytes() == b.tobytes() for a, b in zip(got[i], logits))


def test_step_outputs_keeps_repeated_small_arrays_within_the_budget():
    budget = [step_outputs.BUDGET_BYTES]
    held = step_outputs.StepOutputs([0], 2, budget)
    first = held.empty(0, (2, 3), np.float32)
    a = held.empty(0, (2, 3), np.float32)             # the shape again: kept from now
    assert a is not first and held.empty(0, (2, 3), np.float32) is a
    assert budget[0] == step_outputs.BUDGET_BYTES - a.nbytes
    assert held.empty(0, (3, 2), np.float32) is not a          # another shape: remade
    assert budget[0] == step_outputs.BUDGET_BYTES               # and a's bytes back
    for _ in range(2):                                 # output 1 may outlive the run
        assert held.empty(1, (2, 3), np.float32) is not held.empty(1, (2, 3), np.float32)
        assert held.empty(step_outputs.ALL, (4,), np.float32) is not \
            held.empty(step_outputs.ALL, (4,), np.float32)       # not every output kept
    big = (step_outputs.MAX_BYTES // 4 + 1,)
    assert held.empty(0, big, np.float32) is not held.empty(0, big, np.float32)
    small = step_outputs.StepOutputs([0], 1, [100])
    assert small.empty(0, (40,), np.float32) is not small.empty(0, (40,), np.float32)
    assert step_outputs.empty(None, 0, (2,), np.int64).dtype == np.int64


def test_the_writers_are_marked():
    from maxdecl import fusion
    from maxdecl.ops import _registry

    for kind in sorted(WRITERS):
        fn = fusion.runner(kind) if kind in ("linear_group", "norm_chain", "act_mul") \
            else _registry.get(kind).runner()
        assert getattr(fn, "writes_into", False), kind
    assert _registry.get("attention").batch_runner().writes_into
    assert not getattr(_registry.get("reshape").runner(), "writes_into", False)
