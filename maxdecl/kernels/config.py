"""The one place that decides numba compile flags for every kernel.

Matmul-like kernels may reorder float sums (``FASTMATH``); codec kernels that must
match GGML's C reference byte for byte use ``EXACT`` (no contraction, no reassociation).
"""

FASTMATH = {"contract", "reassoc", "nsz", "arcp"}  # float reassociation for vectorised dots
EXACT = False                                        # bit-exact codecs: plain IEEE arithmetic
CACHE = True                                         # on-disk cache of compiled kernels
# Up to this many rows of x, quantized matmuls run the GEMV kernels (each weight row read
# and decoded once for up to 8 rows of x, every row by the same instructions: bit-identical
# to one row alone, so sequences decoded in a batch get exactly their solo logits); more
# rows run the GEMM.
GEMV_MAX_ROWS = 16
