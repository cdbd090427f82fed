"""fft, rfft and irfft against torch.fft: axes, the inverse, the three norms, complex
input, odd lengths, and an FFT convolution that equals a direct circular one."""

import numpy as np
import pytest
import torch

import maxdecl as md
from ophelp import close, run_op


@pytest.mark.parametrize("axes", [(-1,), (-2, -1), (0, 2)])
@pytest.mark.parametrize("norm", ["backward", "ortho", "forward"])
@pytest.mark.parametrize("inverse", [False, True])
def test_fft_matches_torch(axes, norm, inverse, rng):
    re = rng.standard_normal((3, 5, 8)).astype(np.float32)
    im = rng.standard_normal((3, 5, 8)).astype(np.float32)
    got_re, got_im = run_op(lambda a, b: md.ops.fft(a, b, axes=axes, inverse=inverse,
                                                    norm=norm), re, im)
    z = torch.complex(torch.from_numpy(re), torch.from_numpy(im))
    want = (torch.fft.ifftn if inverse else torch.fft.fftn)(z, dim=axes, norm=norm)
    close(got_re, want.real.numpy(), atol=2e-5, rtol=1e-5)
    close(got_im, want.imag.numpy(), atol=2e-5, rtol=1e-5)


def test_fft_of_real_input_is_fnets_mixing(rng):
    x = rng.standard_normal((2, 7, 12)).astype(np.float32)
    got, _ = run_op(lambda a: md.ops.fft(a, axes=(-2, -1)), x)
    close(got, torch.fft.fftn(torch.from_numpy(x), dim=(-2, -1)).real.numpy(), atol=2e-5)


@pytest.mark.parametrize("n", [8, 9])
@pytest.mark.parametrize("norm", ["backward", "ortho"])
def test_rfft_and_irfft_match_torch(n, norm, rng):
    x = rng.standard_normal((2, n, 3)).astype(np.float32)
    re, im = run_op(lambda a: md.ops.rfft(a, axis=1, norm=norm), x)
    want = torch.fft.rfft(torch.from_numpy(x), dim=1, norm=norm)
    assert re.shape == (2, n // 2 + 1, 3)
    close(re, want.real.numpy(), atol=2e-5)
    close(im, want.imag.numpy(), atol=2e-5)
    back = run_op(lambda a, b: md.ops.irfft(a, b, axis=1, n=n, norm=norm), re, im)
    close(back, x, atol=2e-5)
    close(back, torch.fft.irfft(want, n=n, dim=1, norm=norm).numpy(), atol=2e-5)


def test_fft_convolution_over_a_symbolic_length(rng):
    """irfft(rfft(x) * rfft(k)) is the circular convolution; a symbolic length gives an
    opaque frequency dim, and irfft then needs n."""
    g = md.Graph("t", [md.TensorType("float32", ("seq",)), md.TensorType("float32", ("seq",))])
    xr, xi = md.ops.rfft(g.inputs[0])
    kr, ki = md.ops.rfft(g.inputs[1])
    assert xr.shape[0].startswith("win(")
    re = md.ops.sub(md.ops.mul(xr, kr), md.ops.mul(xi, ki))
    im = md.ops.add(md.ops.mul(xr, ki), md.ops.mul(xi, kr))
    with pytest.raises(md.GraphError, match="n \\(the output length\\) must be given"):
        md.ops.irfft(re, im)
    g.output(md.ops.irfft(re, im, n=16))
    x, k = (rng.standard_normal(16).astype(np.float32) for _ in range(2))
    (y,) = g.execute(x, k)
    direct = np.array([sum(x[j] * k[(i - j) % 16] for j in range(16)) for i in range(16)])
    close(y, direct, atol=1e-4)


@pytest.mark.parametrize("make, fragment", [
    (lambda v: md.ops.fft(v, axes=(0, 0)), "repeat an axis"),
    (lambda v: md.ops.fft(v, norm="none"), "norm must be one of"),
    (lambda v: md.ops.fft(md.ops.cast(v, dtype="int64")), "re must be float32"),
])
def test_bad_transforms_are_refused(make, fragment):
    g = md.Graph("t", [md.TensorType("float32", (4, 6))])
    with pytest.raises(md.GraphError, match=fragment):
        make(g.inputs[0])


@pytest.mark.parametrize("n", [5, 12])
def test_rfft_n_pads_or_cuts_like_torch(n, rng):
    x = rng.standard_normal((2, 8)).astype(np.float32)
    re, im = run_op(lambda a: md.ops.rfft(a, n=n), x)
    want = torch.fft.rfft(torch.from_numpy(x), n=n)
    assert re.shape == (2, n // 2 + 1)
    close(re, want.real.numpy(), atol=2e-5)
    close(im, want.imag.numpy(), atol=2e-5)
