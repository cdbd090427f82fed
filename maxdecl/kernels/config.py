"""The one place that decides numba compile flags for every kernel.

Matmul-like kernels may reorder float sums (``FASTMATH``); codec kernels that must
match GGML's C reference byte for byte use ``EXACT`` (no contraction, no reassociation).
"""

import contextvars
import os

FASTMATH = {"contract", "reassoc", "nsz", "arcp"}  # float reassociation for vectorised dots
EXACT = False                                        # bit-exact codecs: plain IEEE arithmetic
CACHE = True                                         # on-disk cache of compiled kernels
# Up to this many rows of x, quantized matmuls run the GEMV kernels (each weight row read
# and decoded once for up to 8 rows of x, every row by the same instructions: bit-identical
# to one row alone, so sequences decoded in a batch get exactly their solo logits); more
# rows run the GEMM.
GEMV_MAX_ROWS = 16

# How the GEMV treats x (``md.compile(..., activations=)``): "f32" (default) multiplies
# float32 weights by float32 x, exact products; "q8" rounds x to int8 codes with a
# float32 scale per 32 values and sums integer products (``gemv_q8.py``: faster,
# llama.cpp's CPU scheme, not bit-identical to "f32"). Set per run of a compiled graph.
ACTIVATIONS = ("f32", "q8")
ACTIVATION_MODE = contextvars.ContextVar("maxdecl_activations", default="f32")


def activations(value: str | None) -> str:
    """``value`` checked (one of ACTIVATIONS), or None: the ``MAXDECL_ACTIVATIONS``
    environment variable, default "f32". ValueError names the choices."""
    if value is None:
        value = os.environ.get("MAXDECL_ACTIVATIONS", "").strip().lower() or "f32"
        source = "MAXDECL_ACTIVATIONS"
    else:
        source = "activations"
    if value not in ACTIVATIONS:
        raise ValueError(f"{source} must be one of {', '.join(map(repr, ACTIVATIONS))}, "
                         f"got {value!r}")
    return value
