"""Output arrays kept between runs (maxdecl/kernels/step_outputs.py, runtime._generate):
a decode step allocates no activations, gives the same bits as with new arrays, and
never writes into an array that a caller still holds."""

import threading
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import maxdecl as md
from maxdecl import runtime
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


def test_steps_of_one_slot_share_its_array_within_the_budget():
    a_step, b_step, fresh = step_outputs.outputs_of([{0: 0}, {0: 0, 1: 1}, None])
    assert fresh is None
    a = a_step.empty(0, (2, 3), np.float32)
    assert b_step.empty(0, (2, 3), np.dtype(np.float32)) is a       # slot 0, shared
    assert a_step.empty(0, (2, 3), np.float32) is a
    assert b_step.empty(1, (2, 3), np.float32) is not a              # slot 1
    budget = a_step._budget
    assert budget[0] == step_outputs.BUDGET_BYTES - 2 * a.nbytes
    c = a_step.empty(0, (3, 2), np.float32)                           # another shape: remade
    assert c is not a and b_step.empty(0, (3, 2), np.float32) is c
    assert budget[0] == step_outputs.BUDGET_BYTES - 2 * a.nbytes
    assert a_step.empty(5, (2,), np.float32) is not a_step.empty(5, (2,), np.float32)
    big = (step_outputs.MAX_BYTES // 4 + 1,)
    assert a_step.empty(0, big, np.float32) is not a_step.empty(0, big, np.float32)
    (small,) = step_outputs.outputs_of([{0: 0}])
    small._budget[0] = 100
    assert small.empty(0, (40,), np.float32) is not small.empty(0, (40,), np.float32)
    assert step_outputs.empty(None, 0, (2,), np.int64).dtype == np.int64


class _V:
    def __init__(self, kind):
        self.type = kind


class _Step:
    def __init__(self, inputs, outputs):
        self.inputs, self.outputs = inputs, outputs


@settings(max_examples=300, deadline=None, derandomize=True)
@given(st.lists(st.tuples(st.lists(st.integers(0, 40), max_size=3), st.integers(1, 2),
                          st.integers(0, 2), st.booleans()), min_size=1, max_size=30))
def test_slot_plan_never_gives_a_slot_to_two_arrays_in_use(spec):
    """Random plans: outputs of steps that write into slots (``reuse``) or may view
    their inputs; no two buffers in use at one step share a slot number."""
    values, steps, reuse = [_V("in")], [], []
    for reads, n_out, kind, writes in spec:
        ins = [values[r % len(values)] for r in reads]
        outs = [_V(f"t{kind}") for _ in range(n_out)]
        values += outs
        steps.append(_Step(ins, outs))
        reuse.append(list(range(n_out)) if writes else None)
    order = list(range(len(steps)))
    plan = runtime._slot_plan(steps, order, lambda x: id(x), reuse)
    # each buffer's life, by a plain fixpoint: the values that may view it, and the
    # last step reading any of them
    views = {}
    for s, step in enumerate(steps):
        if plan[s] is not None:
            for j in plan[s]:
                views[(s, j)] = {id(x) for x in step.outputs}
    changed = True
    while changed:
        changed = False
        for s, step in enumerate(steps):
            if plan[s] is None:
                for seen in views.values():
                    if any(id(x) in seen for x in step.inputs):
                        new = {id(x) for x in step.outputs} - seen
                        if new:
                            seen |= new
                            changed = True
    life = {b: (b[0], max([b[0]] + [s for s, step in enumerate(steps)
                                     if any(id(x) in seen for x in step.inputs)]))
            for b, seen in views.items()}
    for b1, (a1, z1) in life.items():
        for b2, (a2, z2) in life.items():
            if b1 < b2 and plan[b1[0]][b1[1]] == plan[b2[0]][b2[1]]:
                assert z1 < a2 or z2 < a1, (b1, b2)


def test_the_writers_are_marked():
    from maxdecl import fusion
    from maxdecl.ops import _registry

    for kind in sorted(WRITERS):
        fn = fusion.runner(kind) if kind in ("linear_group", "norm_chain", "act_mul") \
            else _registry.get(kind).runner()
        assert getattr(fn, "writes_into", False), kind
    assert _registry.get("attention").batch_runner().writes_into
    assert not getattr(_registry.get("reshape").runner(), "writes_into", False)
