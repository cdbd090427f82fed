"""numba kernels: the hot loops. Import a kernel module only inside an op's or codec's
function body, never at package import, so ``maxdecl validate`` stays numba-free.

Importing this package loads numba's NumPy support (``numba.np.arraymath``) without
its eager BLAS probe: that probe imports ``scipy.linalg`` wherever SciPy is installed
(0.3-0.4 s of start-up here) only to choose how ``np.correlate`` multiplies in
compiled code; no maxdecl kernel calls BLAS. ``np.dot`` and ``np.linalg`` in compiled
code still find SciPy's BLAS, which they look up when they compile.

It also makes numba load cached kernels without first installing its whole compiler
context (``cache_load``): 0.2-0.3 s of a ``maxdecl run`` here.
"""

import sys


def _load_numba_numpy_support() -> None:
    probe = "scipy.linalg.cython_blas"
    if "numba.np.arraymath" in sys.modules or probe in sys.modules:
        return
    sys.modules[probe] = None          # makes the probe's import fail at once
    try:
        import numba.np.arraymath  # noqa: F401
    finally:
        if sys.modules.get(probe, 0) is None:
            del sys.modules[probe]


_load_numba_numpy_support()


def _stamp_kernel_cache() -> None:
    from .cache_stamp import install

    install()


_stamp_kernel_cache()


def _load_cached_kernels_lightly() -> None:
    from .cache_load import install

    install()


_load_cached_kernels_lightly()
