"""Grouped kernels for fused calls (``maxdecl.fusion``): several weights, one input.

``qmatmul_group`` is the kernel API a fused group of ``linear`` nodes runs: one call
for all the weights that read the same activations (q/k/v, gate/up). Today it runs
``qmatmul_blocks`` once per weight; a single parallel kernel over all the weights'
rows may replace the body, as long as every output stays bit-identical to
``qmatmul_blocks(x2, w, encoding)`` of that weight alone.
"""

from __future__ import annotations

import numpy as np

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
    return [qmatmul_blocks(x2, w, encoding) for w in weights]
