"""Grouped kernels for fused calls (``maxdecl.fusion``): several weights, one input.

``qmatmul_group`` is the kernel API a fused group of ``linear`` nodes runs: one call
for all the weights that read the same activations (q/k/v, gate/up). Up to
``GEMV_MAX_ROWS`` rows of x it is one parallel GEMV over all the weights' rows
(``gemv.gemv_group``: each column from the same row intrinsic as the weight alone, so
bit-identical); more rows (prefill) run ``qmatmul_blocks`` per weight.
"""

from __future__ import annotations

import numpy as np

from .config import GEMV_MAX_ROWS
from .gemv import GEMV_GROUP, offsets
from .gemv_q8 import gemv_group
from .qmatmul import qmatmul_blocks


def qmatmul_group(x2: np.ndarray, weights: list, encoding: str) -> list:
    """``[x2 @ dequantize(w).T for w in weights]`` in one call.

    Args:
        x2: (M, K) float32, C-contiguous activations (M >= 1), shared by every weight.
        weights: packed (N_i, K // block_elements * block_bytes) uint8 C-contiguous
            arrays, all of ``encoding`` (one with kernels: ``qmatmul.LAYOUTS``) and K.
        encoding: the weights' encoding name (``"q4_k"``, ``"q8_0"``, ...).
    Returns:
        one (M, N_i) float32 array per weight, in order, each bit-identical to
        ``qmatmul_blocks(x2, weights[i], encoding)``; the caller may write into them
        (they may be views of one buffer, but must not overlap).
    """
    if x2.shape[0] <= GEMV_MAX_ROWS and encoding in GEMV_GROUP and len(weights) > 1:
        out = gemv_group(x2, weights, encoding)
        cols = offsets(tuple(w.shape[0] for w in weights)).tolist()
        return [out[:, a:b] for a, b in zip(cols[:-1], cols[1:])]
    return [qmatmul_blocks(x2, w, encoding) for w in weights]
