"""causal_conv1d and selective_scan against torch, whole sequences and step by step."""

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import maxdecl as md
from ophelp import close, run_op


def torch_causal_conv(x, w, b):
    """x [B, L, C] -> conv1d with groups=C and k-1 zeros on the left (Mamba's conv1d)."""
    xt = torch.from_numpy(x).transpose(1, 2)
    k = w.shape[1]
    y = F.conv1d(F.pad(xt, (k - 1, 0)), torch.from_numpy(w)[:, None, :],
                 None if b is None else torch.from_numpy(b), groups=w.shape[0])
    return y.transpose(1, 2).numpy()


@pytest.mark.parametrize("k", [1, 2, 4])
def test_causal_conv1d_matches_torch(rng, k):
    x = rng.standard_normal((2, 9, 6)).astype(np.float32)
    w = rng.standard_normal((6, k)).astype(np.float32)
    b = rng.standard_normal(6).astype(np.float32)
    close(run_op(md.ops.causal_conv1d, x, w, b), torch_causal_conv(x, w, b), atol=1e-5)
    close(run_op(md.ops.causal_conv1d, x, w), torch_causal_conv(x, w, None), atol=1e-5)


def test_causal_conv1d_state_carries_across_steps(rng):
    """A prefill of 5 rows, then one row at a time through the state, equals one pass."""
    x = rng.standard_normal((1, 9, 6)).astype(np.float32)
    w = rng.standard_normal((6, 4)).astype(np.float32)
    b = rng.standard_normal(6).astype(np.float32)
    ref = torch_causal_conv(x, w, b)
    state = np.zeros((1, 3, 6), np.float32)
    ys = []
    for a, z in [(0, 5), (5, 6), (6, 7), (7, 8), (8, 9)]:
        y, state = run_op(md.ops.causal_conv1d, x[:, a:z], w, b, state)
        ys.append(y)
        np.testing.assert_array_equal(state, x[:, z - 3:z])
    close(np.concatenate(ys, axis=1), ref, atol=1e-5)
    y, s = run_op(md.ops.causal_conv1d, x[:, :2], w, b, np.zeros((1, 3, 6), np.float32))
    np.testing.assert_array_equal(s[:, 1:], x[:, :2])              # fewer rows than K - 1
    assert not s[:, 0].any()


def torch_selective_scan(x, dt, a, b, c, d, h0, softplus):
    """transformers' MambaMixer slow path, written per step in float32."""
    x, dt, a, b, c, d, h = (torch.from_numpy(v) for v in (x, dt, a, b, c, d, h0.copy()))
    if softplus:
        dt = F.softplus(dt)
    ys = []
    for t in range(x.shape[1]):
        da = torch.exp(a[None] * dt[:, t, :, None])                # [B, D, N]
        dbu = dt[:, t, :, None] * b[:, t, None, :] * x[:, t, :, None]
        h = da * h + dbu
        ys.append((h @ c[:, t, :, None])[..., 0] + d * x[:, t])
    return torch.stack(ys, 1).numpy(), h.numpy()


def scan_inputs(rng, bsz=2, seq=7, ch=5, n=4):
    x = rng.standard_normal((bsz, seq, ch)).astype(np.float32)
    dt = rng.standard_normal((bsz, seq, ch)).astype(np.float32)
    a = -np.exp(rng.standard_normal((ch, n))).astype(np.float32)
    b = rng.standard_normal((bsz, seq, n)).astype(np.float32)
    c = rng.standard_normal((bsz, seq, n)).astype(np.float32)
    d = rng.standard_normal(ch).astype(np.float32)
    h0 = rng.standard_normal((bsz, ch, n)).astype(np.float32)
    return x, dt, a, b, c, d, h0


@pytest.mark.parametrize("softplus", [False, True])
def test_selective_scan_matches_torch(rng, softplus):
    x, dt, a, b, c, d, h0 = scan_inputs(rng)
    if not softplus:
        dt = np.abs(dt)
    ref_y, ref_h = torch_selective_scan(x, dt, a, b, c, d, h0, softplus)
    y, h = run_op(lambda *v: md.ops.selective_scan(*v, dt_softplus=softplus),
                  x, dt, a, b, c, d, h0)
    close(y, ref_y, atol=1e-5)
    close(h, ref_h, atol=1e-5)
    ref0, _ = torch_selective_scan(x, dt, a, b, c, d, np.zeros_like(h0), softplus)
    y0 = run_op(lambda *v: md.ops.selective_scan(*v, dt_softplus=softplus), x, dt, a, b, c, d)
    close(y0, ref0, atol=1e-5)


def test_selective_scan_step_by_step_equals_one_pass(rng):
    x, dt, a, b, c, d, _ = scan_inputs(rng, bsz=1)
    h = np.zeros((1, 5, 4), np.float32)
    whole = run_op(lambda *v: md.ops.selective_scan(*v, dt_softplus=True), x, dt, a, b, c, d)
    ys = []
    for t in range(x.shape[1]):
        y, h = run_op(lambda *v: md.ops.selective_scan(*v, dt_softplus=True),
                      *(v[:, t:t + 1] for v in (x, dt)), a, *(v[:, t:t + 1] for v in (b, c)),
                      d, h)
        ys.append(y)
    close(np.concatenate(ys, 1), whole, atol=1e-6)


def test_ssm_rules_name_the_shapes():
    f32 = md.DType.float32
    g = md.Graph("t", input_types=[md.TensorType(f32, (9, 6)), md.TensorType(f32, (6, 4)),
                                   md.TensorType(f32, (6,)), md.TensorType(f32, (2, 6))])
    x, w, b, s = g.inputs
    with pytest.raises(md.GraphError, match=r"state\[2, 6\] must be \[3, 6\]"):
        md.ops.causal_conv1d(x, w, b, s)
    with pytest.raises(md.GraphError, match=r"A\[6, 4\] must be \[6, N\]|B\[6\] must be"):
        md.ops.selective_scan(x, x, w, b, b, b)


def test_scalar_bias_and_d(rng):
    """A scalar bias (a state without a bias) and a scalar D broadcast over channels."""
    x = rng.standard_normal((1, 6, 4)).astype(np.float32)
    w = rng.standard_normal((4, 3)).astype(np.float32)
    state = np.zeros((1, 2, 4), np.float32)
    y, _ = run_op(lambda a, b, s: md.ops.causal_conv1d(a, b, state=s), x, w, state)
    close(y, torch_causal_conv(x, w, None), atol=1e-5)
    xs, dt, a, b, c, d, h0 = scan_inputs(rng)
    ref, _ = torch_selective_scan(xs, np.abs(dt), a, b, c, np.full_like(d, 0.5), h0, False)
    out = run_op(lambda x_, t_, a_, b_, c_, h_: md.ops.selective_scan(x_, t_, a_, b_, c_, 0.5, h_)[0],
                 xs, np.abs(dt), a, b, c, h0)
    close(out, ref, atol=1e-5)


def test_selective_scan_takes_an_a_per_batch_entry(rng):
    """A [B, D, N] (Mamba-2's heads as a batch axis, each its own decay): each entry as
    torch's recurrence with that entry's A, and bit for bit what a scan of that entry
    alone gives; an A whose batch dims are not x's is refused."""
    x, dt, _, b, c, d, h0 = scan_inputs(rng, bsz=3)
    dt = np.abs(dt)
    a = -np.exp(rng.standard_normal((3, 5, 4))).astype(np.float32)
    y, h = run_op(md.ops.selective_scan, x, dt, a, b, c, d, h0)
    for i in range(3):
        ref_y, ref_h = torch_selective_scan(x[i:i + 1], dt[i:i + 1], a[i], b[i:i + 1],
                                            c[i:i + 1], d, h0[i:i + 1], False)
        close(y[i:i + 1], ref_y, atol=1e-5)
        close(h[i:i + 1], ref_h, atol=1e-5)
        yi, hi = run_op(md.ops.selective_scan, x[i:i + 1], dt[i:i + 1], a[i:i + 1],
                        b[i:i + 1], c[i:i + 1], d, h0[i:i + 1])
        assert yi.tobytes() == y[i:i + 1].tobytes() and hi.tobytes() == h[i:i + 1].tobytes()
    g = md.Graph("t", [md.TensorType("float32", s) for s in
                       ((3, 7, 5), (3, 7, 5), (2, 5, 4), (3, 7, 4), (3, 7, 4), (5,))])
    with pytest.raises(md.GraphError, match=r"A\[2, 5, 4\] must be \[5, N\]"):
        md.ops.selective_scan(*g.inputs)


def test_selective_scan_takes_a_d_per_batch_entry(rng):
    """D [B, D] (Mamba-2's one skip per head, spread over its channels): each entry as
    torch's recurrence with that entry's D; a D whose batch dims are not x's is refused."""
    x, dt, a, b, c, _, h0 = scan_inputs(rng, bsz=3)
    dt = np.abs(dt)
    d = rng.standard_normal((3, 5)).astype(np.float32)
    y, h = run_op(md.ops.selective_scan, x, dt, a, b, c, d, h0)
    for i in range(3):
        ref_y, ref_h = torch_selective_scan(x[i:i + 1], dt[i:i + 1], a, b[i:i + 1],
                                            c[i:i + 1], d[i], h0[i:i + 1], False)
        close(y[i:i + 1], ref_y, atol=1e-5)
        close(h[i:i + 1], ref_h, atol=1e-5)
    g = md.Graph("t", [md.TensorType("float32", s) for s in
                       ((3, 7, 5), (3, 7, 5), (5, 4), (3, 7, 4), (3, 7, 4), (2, 5))])
    with pytest.raises(md.GraphError, match=r"D\[2, 5\] must be \[5\], \[3, 5\]"):
        md.ops.selective_scan(*g.inputs)


def _linear_scan_torch(a, x, h0):
    """h_t = a_t * h_{t-1} + x_t by a torch loop (float64)."""
    a, x = torch.from_numpy(a).double(), torch.from_numpy(x).double()
    h = torch.from_numpy(h0).double()
    out = []
    for t in range(x.shape[-2]):
        h = a[..., t, :] * h + x[..., t, :]
        out.append(h)
    return torch.stack(out, -2).numpy(), h.numpy()


@pytest.mark.parametrize("shape", [(9, 6), (2, 3, 7, 5)])
def test_linear_scan_matches_torch(rng, shape):
    a = rng.uniform(-1, 1, shape).astype(np.float32)
    x = rng.standard_normal(shape).astype(np.float32)
    h0 = rng.standard_normal(shape[:-2] + shape[-1:]).astype(np.float32)
    h, state = run_op(md.ops.linear_scan, a, x, h0)
    ref, ref_state = _linear_scan_torch(a, x, h0)
    close(h, ref, atol=1e-5)
    close(state, ref_state, atol=1e-5)
    close(run_op(md.ops.linear_scan, a, x), _linear_scan_torch(a, x, 0 * h0)[0], atol=1e-5)


def test_linear_scan_steps_give_the_bits_of_one_call_and_zero_decay_restarts(rng):
    a = rng.uniform(0, 1, (8, 4)).astype(np.float32)
    a[5] = 0.0                                             # a restart at step 5
    x = rng.standard_normal((8, 4)).astype(np.float32)
    h0 = rng.standard_normal(4).astype(np.float32)
    whole, last = run_op(md.ops.linear_scan, a, x, h0)
    first, mid = run_op(md.ops.linear_scan, a[:3], x[:3], h0)
    second, end = run_op(md.ops.linear_scan, a[3:], x[3:], mid)
    assert np.concatenate([first, second]).tobytes() == whole.tobytes()
    assert end.tobytes() == last.tobytes()
    fresh = run_op(md.ops.linear_scan, a[5:], x[5:], np.full(4, 1e30, np.float32))[0]
    assert fresh.tobytes() == whole[5:].tobytes()          # nothing of the past survives


def test_linear_scan_shapes_are_checked():
    g = md.Graph("t", [md.TensorType("float32", ("seq", 4)), md.TensorType("float32", ("seq", 5)),
                       md.TensorType("float32", (3,))])
    with pytest.raises(md.GraphError, match="must share one shape"):
        md.ops.linear_scan(g.inputs[0], g.inputs[1])
    with pytest.raises(md.GraphError, match=r"state\[3\] must be \[4\]"):
        md.ops.linear_scan(g.inputs[0], g.inputs[0], g.inputs[2])
