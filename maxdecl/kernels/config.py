"""The one place that decides numba compile flags for every kernel.

Matmul-like kernels may reorder float sums (``FASTMATH``); codec kernels that must
match GGML's C reference byte for byte use ``EXACT`` (no contraction, no reassociation).
"""

FASTMATH = {"contract", "reassoc", "nsz", "arcp"}  # float reassociation for vectorised dots
EXACT = False                                        # bit-exact codecs: plain IEEE arithmetic
CACHE = True                                         # on-disk cache of compiled kernels
