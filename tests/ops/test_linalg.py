import numpy as np
import pytest
import torch

import maxdecl as md
from ophelp import close, run_op


@pytest.mark.parametrize("sa,sb", [((5,), (5,)), ((2, 3, 5), (5, 4)), ((5,), (3, 5, 2)),
                                   ((4, 1, 2, 5), (3, 5, 6))])
def test_matmul_broadcasts_like_torch(rng, sa, sb):
    a = rng.standard_normal(sa).astype(np.float32)
    b = rng.standard_normal(sb).astype(np.float32)
    close(run_op(md.ops.matmul, a, b), torch.matmul(torch.from_numpy(a), torch.from_numpy(b)),
          atol=1e-5)


def test_matmul_k_mismatch():
    g = md.Graph("t", [md.TensorType("float32", ("seq", 8)), md.TensorType("float32", (7, 3))])
    with pytest.raises(md.GraphError, match=r"K must match \(8 vs 7\)"):
        md.ops.matmul(*g.inputs)
