"""``gated_delta_rule`` against transformers' own Gated DeltaNet references
(``torch_recurrent_gated_delta_rule`` and the chunked ``torch_chunk_gated_delta_rule``
that Qwen3-Next runs on a prefill): shared key heads, L2-normalised q/k, a carried
state, step by step against a whole prefill, and the shape errors."""

import numpy as np
import pytest
import torch

import maxdecl as md
from ophelp import close, run_op

qn = pytest.importorskip("transformers.models.qwen3_next.modeling_qwen3_next")


def _inputs(rng, b=2, seq=11, hk=2, hv=4, dk=8, dv=6):
    q = rng.standard_normal((b, seq, hk * dk)).astype(np.float32)
    k = rng.standard_normal((b, seq, hk * dk)).astype(np.float32)
    v = rng.standard_normal((b, seq, hv * dv)).astype(np.float32)
    g = -np.abs(rng.standard_normal((b, seq, hv))).astype(np.float32) * 0.5
    beta = (1 / (1 + np.exp(-rng.standard_normal((b, seq, hv))))).astype(np.float32)
    return q, k, v, g, beta, (hk, hv, dk, dv)


def _theirs(q, k, v, g, beta, heads, state=None, chunk=False, l2=True):
    hk, hv, dk, dv = heads
    b, seq = q.shape[:2]
    t = lambda a, *s: torch.from_numpy(a).reshape(b, seq, *s)  # noqa: E731
    fn = qn.torch_chunk_gated_delta_rule if chunk else qn.torch_recurrent_gated_delta_rule
    kw = {"chunk_size": 4} if chunk else {}
    o, s = fn(t(q, hk, dk), t(k, hk, dk), t(v, hv, dv), t(g, hv), t(beta, hv),
              initial_state=None if state is None else torch.from_numpy(state),
              output_final_state=True, use_qk_l2norm_in_kernel=l2, **kw)
    return o.reshape(b, seq, hv * dv).numpy(), s.numpy()


@pytest.mark.parametrize("l2", [True, False])
def test_matches_the_recurrent_reference_with_shared_key_heads(rng, l2):
    q, k, v, g, beta, heads = _inputs(rng)
    if not l2:
        q, k = q * 0.3, k * 0.3
    state = rng.standard_normal((2, heads[1], heads[2], heads[3])).astype(np.float32) * 0.1
    o, s = run_op(lambda *a: md.ops.gated_delta_rule(*a, k_heads=heads[0], qk_l2norm=l2),
                  q, k, v, g, beta, state)
    want_o, want_s = _theirs(q, k, v, g, beta, heads, state=state, l2=l2)
    close(o, want_o, atol=2e-5, rtol=1e-4)
    close(s, want_s, atol=2e-5, rtol=1e-4)


def test_a_prefill_matches_the_chunked_form_qwen3_next_runs(rng):
    q, k, v, g, beta, heads = _inputs(rng, seq=13, hk=1, hv=2)
    o = run_op(lambda *a: md.ops.gated_delta_rule(*a, k_heads=1, qk_l2norm=True),
               q, k, v, g, beta)
    close(o, _theirs(q, k, v, g, beta, heads, chunk=True)[0], atol=3e-5, rtol=1e-4)


def test_step_by_step_gives_the_prefill_and_the_same_state(rng):
    q, k, v, g, beta, heads = _inputs(rng, b=1, seq=9)
    hk, hv, dk, dv = heads
    f = lambda *a: md.ops.gated_delta_rule(*a, k_heads=hk, qk_l2norm=True)  # noqa: E731
    zero = np.zeros((1, hv, dk, dv), np.float32)
    whole, s_whole = run_op(f, q, k, v, g, beta, zero)
    s, steps = zero, []
    for t in range(9):
        o, s = run_op(f, *(a[:, t:t + 1] for a in (q, k, v, g, beta)), s)
        steps.append(o)
    np.testing.assert_array_equal(np.concatenate(steps, axis=1), whole)
    np.testing.assert_array_equal(s, s_whole)


def test_scale_and_state_shape_rules():
    f32 = lambda *s: md.TensorType("float32", s)  # noqa: E731
    g = md.Graph("t", [f32("seq", 16), f32("seq", 16), f32("seq", 12), f32("seq", 4),
                       f32("seq", 4), f32(4, 8, 3), f32(4, 8, 4)])
    q, k, v, gg, beta, state, bad = g.inputs
    o, s = md.ops.gated_delta_rule(q, k, v, gg, beta, state, k_heads=2)
    assert o.shape == ("seq", 12) and s.shape == (4, 8, 3)
    with pytest.raises(md.GraphError, match="state\\[4, 8, 4\\] must be \\[4, 8, 3\\]"):
        md.ops.gated_delta_rule(q, k, v, gg, beta, bad, k_heads=2)
    with pytest.raises(md.GraphError, match="must split into k_heads 3"):
        md.ops.gated_delta_rule(q, k, v, gg, beta, k_heads=3)
    with pytest.raises(md.GraphError, match="k_heads must be a positive int"):
        md.ops.gated_delta_rule(q, k, v, gg, beta, k_heads=0)
    empty = md.Graph("e", [f32("seq", 16), f32("seq", 16), f32("seq", 12), f32("seq", 0),
                           f32("seq", 0)])
    with pytest.raises(md.GraphError, match="at least one value head"):
        md.ops.gated_delta_rule(*empty.inputs, k_heads=2)


def test_a_batched_step_gives_each_sequence_its_own_memory(rng):
    """rows=: sequences cut apart along seq, each from its own state (PerSequence), with
    the numbers of running each alone, as batched decoding needs."""
    from maxdecl.runtime import PerSequence

    f32 = lambda *s: md.TensorType("float32", s)  # noqa: E731
    g = md.Graph("t", [f32("seq", 16), f32("seq", 16), f32("seq", 12), f32("seq", 4),
                       f32("seq", 4), f32(4, 8, 3)])
    o, s = md.ops.gated_delta_rule(*g.inputs, k_heads=2, qk_l2norm=True)
    g.output(o, s)
    run = md.compile(g)
    seqs = [[rng.standard_normal((n, w)).astype(np.float32) for w in (16, 16, 12, 4)]
            for n in (3, 1, 2)]
    for parts in seqs:
        parts[3] = -np.abs(parts[3])
        parts.append(np.full_like(parts[3], 0.5))
    starts = [rng.standard_normal((4, 8, 3)).astype(np.float32) for _ in seqs]
    solo = [run(*parts, st) for parts, st in zip(seqs, starts)]
    joined = [np.concatenate([p[i] for p in seqs]) for i in range(5)]
    out, states = run(*joined, PerSequence(starts), rows=[3, 1, 2])
    assert out.tobytes() == np.concatenate([s[0] for s in solo]).tobytes()
    assert all(a.tobytes() == s[1].tobytes() for a, s in zip(states, solo))
