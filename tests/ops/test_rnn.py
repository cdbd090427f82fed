"""lstm and gru against torch.nn.LSTM / torch.nn.GRU: whole sequences, a state carried
between pieces, no biases, leading batch dims, and the checks of their weights."""

import numpy as np
import pytest
import torch

import maxdecl as md
from ophelp import close, run_op


def _torch_rnn(kind, n_in, hidden, bias, seed):
    torch.manual_seed(seed)
    mod = (torch.nn.LSTM if kind == "lstm" else torch.nn.GRU)(n_in, hidden, bias=bias,
                                                              batch_first=True)
    with torch.no_grad():
        for p in mod.parameters():
            p.copy_(torch.randn(p.shape) * 0.5)
    return mod


def _weights(mod, bias):
    w = [mod.weight_ih_l0.detach().numpy(), mod.weight_hh_l0.detach().numpy()]
    if bias:
        return w + [mod.bias_ih_l0.detach().numpy(), mod.bias_hh_l0.detach().numpy()]
    return w + [np.float32(0), np.float32(0)]


def _op(kind):
    return md.ops.lstm if kind == "lstm" else md.ops.gru


@pytest.mark.parametrize("kind", ["lstm", "gru"])
@pytest.mark.parametrize("bias", [True, False])
def test_matches_torch_over_a_batch(kind, bias, rng):
    mod = _torch_rnn(kind, 5, 7, bias, seed=1)
    x = rng.standard_normal((3, 11, 5)).astype(np.float32)
    w = _weights(mod, bias)
    arrays = [x, *w[:2]] + ([*w[2:]] if bias else [])
    if bias:
        out = run_op(_op(kind), *arrays)
    else:
        g = md.Graph("t", [md.TensorType("float32", x.shape)])
        ws = [g.constant(a) for a in w]
        g.output(_op(kind)(g.inputs[0], *ws))
        (out,) = g.execute(x)
    ref, _ = mod(torch.from_numpy(x))
    close(out, ref.detach().numpy(), atol=2e-6, rtol=2e-5, label=f"{kind} bias={bias}")


@pytest.mark.parametrize("kind", ["lstm", "gru"])
def test_a_state_carries_a_sequence_split_in_pieces(kind, rng):
    """Two pieces through the state give the whole run's outputs and torch's final
    state; leading batch dims [2, 3] are rows."""
    mod = _torch_rnn(kind, 4, 6, True, seed=2)
    x = rng.standard_normal((2, 3, 9, 4)).astype(np.float32)
    w = _weights(mod, True)
    shape = (2, 3, 2, 6) if kind == "lstm" else (2, 3, 6)
    zero = np.zeros(shape, np.float32)
    y1, s1 = run_op(_op(kind), x[:, :, :4], *w, zero)
    y2, s2 = run_op(_op(kind), x[:, :, 4:], *w, s1)
    ref, last = mod(torch.from_numpy(x.reshape(6, 9, 4)))
    close(np.concatenate([y1, y2], axis=2).reshape(6, 9, 6), ref.detach().numpy(),
          atol=2e-6, rtol=2e-5)
    if kind == "lstm":
        h, c = (t.detach().numpy()[0] for t in last)
        close(s2.reshape(6, 2, 6)[:, 0], h, atol=2e-6)
        close(s2.reshape(6, 2, 6)[:, 1], c, atol=2e-6)
    else:
        close(s2.reshape(6, 6), last.detach().numpy()[0], atol=2e-6)


@pytest.mark.parametrize("w_hh, b, fragment", [
    ((24, 5), (24,), r"w_hh\[24, 5\] must be \[4 \* hidden, hidden\] = \[20, 5\]"),
    ((24, 6), (23,), r"b_ih\[23\] must be \[24\] or the number 0.0"),
])
def test_weights_are_checked(w_hh, b, fragment):
    g = md.Graph("t", [md.TensorType("float32", ("seq", 3))])
    x = g.inputs[0]
    w_ih = g.constant(np.zeros((w_hh[0], 3), np.float32))
    with pytest.raises(md.GraphError, match=fragment):
        md.ops.lstm(x, w_ih, g.constant(np.zeros(w_hh, np.float32)),
                    g.constant(np.zeros(b, np.float32)), g.constant(np.zeros(b, np.float32)))


@pytest.mark.parametrize("kind", ["lstm", "gru"])
def test_a_batched_step_gives_each_sequence_its_own_state(kind, rng):
    """rows=: the sequences of one call are cut apart and each starts from its own state
    (PerSequence), as a batched decode step runs them; the numbers are the solo ones."""
    from maxdecl.runtime import PerSequence

    mod = _torch_rnn(kind, 4, 5, True, seed=3)
    w = _weights(mod, True)
    shape = (2, 5) if kind == "lstm" else (5,)
    g = md.Graph("t", [md.TensorType("float32", ("seq", 4)), md.TensorType("float32", shape)])
    ws = [g.constant(a) for a in w]
    y, state = _op(kind)(g.inputs[0], *ws, g.inputs[1])
    g.output(y, state)
    run = md.compile(g)
    xs = [rng.standard_normal((n, 4)).astype(np.float32) for n in (3, 1, 2)]
    starts = [rng.standard_normal(shape).astype(np.float32) for _ in xs]
    solo = [run(x, s) for x, s in zip(xs, starts)]
    out, states = run(np.concatenate(xs), PerSequence(starts), rows=[3, 1, 2])
    assert out.tobytes() == np.concatenate([s[0] for s in solo]).tobytes()
    assert all(a.tobytes() == s[1].tobytes() for a, s in zip(states, solo))
