"""Op signatures: names, inputs, attributes and defaults, as plain data.

The spec layer (``maxdecl validate``) reads this table to check op names, arity and
attributes without importing NumPy or numba. The implementations in ``maxdecl.ops``
register under the same names; a test keeps the two in step.
"""

from __future__ import annotations

from dataclasses import dataclass, field

REQUIRED = object()  # marks an attribute without a default


@dataclass(frozen=True)
class OpSig:
    """What an op accepts.

    ``inputs``: names of required positional inputs; ``optional``: trailing inputs
    that may be omitted; ``variadic``: the op takes one list of values (``concat``);
    ``attrs``: attribute name -> default (``REQUIRED`` when there is none);
    ``outputs``: number of outputs, or None when it depends on attributes/inputs.
    """

    inputs: tuple = ("x",)
    optional: tuple = ()
    variadic: bool = False
    attrs: dict = field(default_factory=dict)
    outputs: int | None = 1
    doc: str = ""

    def arity(self) -> tuple[int, int | None]:
        """(min, max) number of inputs; max None for variadic ops."""
        if self.variadic:
            return (1, None)
        return (len(self.inputs), len(self.inputs) + len(self.optional))


_UNARY = ("neg abs exp log sqrt rsqrt tanh sigmoid relu silu gelu gelu_tanh").split()
_BINARY = "add sub mul div pow maximum minimum".split()

SIGNATURES: dict[str, OpSig] = {}
for _n in _UNARY:
    SIGNATURES[_n] = OpSig(("x",), doc=f"elementwise {_n}")
for _n in _BINARY:
    SIGNATURES[_n] = OpSig(("x", "y"), doc=f"elementwise {_n} with NumPy broadcasting")

_POOL = {"kernel_size": REQUIRED, "stride": 1, "dilation": 1, "padding": 0, "ceil_mode": False}
_CONV = {"stride": 1, "dilation": 1, "padding": 0, "groups": 1}

SIGNATURES.update({
    "cast": OpSig(("x",), attrs={"dtype": REQUIRED}, doc="convert element type"),
    # shape
    "reshape": OpSig(("x",), attrs={"shape": REQUIRED}, doc="new shape; one dim may be -1"),
    "transpose": OpSig(("x",), attrs={"perm": REQUIRED}, doc="permute axes"),
    "concat": OpSig(("values",), variadic=True, attrs={"axis": 0}, doc="join along axis"),
    "split": OpSig(("x",), attrs={"sizes": REQUIRED, "axis": 0}, outputs=None,
                   doc="split into pieces of the given sizes"),
    "slice": OpSig(("x",), attrs={"starts": REQUIRED, "ends": REQUIRED, "axes": None,
                                  "steps": None}, doc="x[starts:ends:steps] on axes"),
    "gather": OpSig(("x", "indices"), attrs={"axis": 0}, doc="np.take(x, indices, axis)"),
    "tile": OpSig(("x",), attrs={"repeats": REQUIRED}, doc="np.tile"),
    "select": OpSig(("cond", "x", "y"), doc="np.where(cond, x, y)"),
    # reductions
    "sum": OpSig(("x",), attrs={"axis": -1, "keepdims": False}),
    "mean": OpSig(("x",), attrs={"axis": -1, "keepdims": False}),
    "max": OpSig(("x",), attrs={"axis": -1, "keepdims": False}),
    "argmax": OpSig(("x",), attrs={"axis": -1, "keepdims": False}),
    "softmax": OpSig(("x",), attrs={"axis": -1}),
    # linear algebra
    "matmul": OpSig(("a", "b"), doc="NumPy matmul with batch broadcasting"),
    "qmatmul": OpSig(("x", "w"), doc="x @ dequantize(w).T; w quantized [N, K]"),
    # normalisation
    "layer_norm": OpSig(("x", "gamma"), optional=("beta",), attrs={"epsilon": 1e-5}),
    "rms_norm": OpSig(("x", "weight"), attrs={"epsilon": 1e-6}),
    # transformer
    "embedding": OpSig(("table", "ids"), doc="rows of table (float or quantized)"),
    "rope": OpSig(("x", "positions"), optional=("freq_factors",),
                  attrs={"theta": 10000.0, "style": "normal", "scale": 1.0, "dim": None},
                  doc="rotary position embedding on x[..., seq, heads, head_dim]; "
                      "freq_factors[dim // 2] divide the rotation frequencies"),
    "attention": OpSig(("q", "k", "v"), optional=("kv_cache",),
                       attrs={"causal": True, "scale": None, "sliding_window": None,
                              "alibi_slopes": None, "softcap": None},
                       outputs=None,
                       doc="grouped-query attention on [..., seq, heads, head_dim]; "
                           "with kv_cache also returns the new cache"),
    # vision
    "conv2d": OpSig(("x", "filter"), optional=("bias",),
                    attrs={**_CONV, "input_layout": "NHWC", "filter_layout": "RSCF"}),
    "conv3d": OpSig(("x", "filter"), optional=("bias",),
                    attrs={**_CONV, "input_layout": "NDHWC", "filter_layout": "QRSCF"}),
    "avg_pool": OpSig(("x",), attrs={**_POOL, "count_boundary": True}),
    "max_pool": OpSig(("x",), attrs=dict(_POOL)),
})

# Encodings every build knows, with (block_elements, block_bytes); "f32"/"f16" mean
# "stored unquantized". Registered user encodings are added at run time.
BUILTIN_ENCODINGS: dict[str, tuple[int, int]] = {
    "f32": (1, 4), "f16": (1, 2), "bf16": (1, 2),
    "q4_0": (32, 18), "q5_0": (32, 22), "q8_0": (32, 34),
    "q4_k": (256, 144), "q6_k": (256, 210),
}


def register_signature(name: str, sig: OpSig) -> None:
    """Add a signature (custom ops); registering a built-in name again is an error."""
    if name in SIGNATURES and SIGNATURES[name] is not sig:
        raise ValueError(f"op {name!r} already has a signature")
    SIGNATURES[name] = sig
