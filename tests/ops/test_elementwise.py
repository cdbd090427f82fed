import numpy as np
import pytest
import torch
import torch.nn.functional as F

import maxdecl as md
from ophelp import close, run_op

UNARY = {
    "neg": torch.neg, "abs": torch.abs, "exp": torch.exp, "log": torch.log, "sqrt": torch.sqrt,
    "rsqrt": torch.rsqrt, "tanh": torch.tanh, "sigmoid": torch.sigmoid, "relu": F.relu,
    "silu": F.silu, "gelu": F.gelu, "gelu_tanh": lambda t: F.gelu(t, approximate="tanh"),
}
BINARY = {"add": torch.add, "sub": torch.sub, "mul": torch.mul, "div": torch.div,
          "pow": torch.pow, "maximum": torch.maximum, "minimum": torch.minimum}


@pytest.mark.parametrize("name", sorted(UNARY))
def test_unary_matches_torch(name, rng):
    x = rng.standard_normal((3, 17)).astype(np.float32) * 3
    if name in ("log", "sqrt", "rsqrt"):
        x = np.abs(x) + 0.1
    out = run_op(getattr(md.ops, name), x)
    close(out, UNARY[name](torch.from_numpy(x)).numpy(), atol=2e-6, rtol=2e-6, label=name)
    assert out.dtype == np.float32


@pytest.mark.parametrize("name", sorted(BINARY))
def test_binary_broadcasts_like_torch(name, rng):
    x = rng.standard_normal((2, 1, 5)).astype(np.float32)
    y = rng.standard_normal((4, 1)).astype(np.float32)
    if name == "pow":
        x = np.abs(x) + 0.5
    out = run_op(getattr(md.ops, name), x, y)
    close(out, BINARY[name](torch.from_numpy(x), torch.from_numpy(y)).numpy(), label=name)


def test_binary_shape_mismatch_is_graph_error():
    g = md.Graph("t", [md.TensorType("float32", (2, 3)), md.TensorType("float32", (4,))])
    with pytest.raises(md.GraphError, match=r"add.*\[2, 3\].*\[4\]"):
        md.ops.add(*g.inputs)
