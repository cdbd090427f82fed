"""numba kernels: the hot loops. Import a kernel module only inside an op's or codec's
function body, never at package import, so ``maxdecl validate`` stays numba-free."""
