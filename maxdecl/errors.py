"""One exception hierarchy for the whole library.

Every message names where the problem is: a spec ``file:line:col``, a layer
path such as ``blk.3.attn_q``, a tensor name, or an encoding and its shapes.
The CLI prints ``str(error)`` as one line, without a traceback.
"""


class MaxdeclError(Exception):
    """Base class of every error maxdecl raises on purpose."""


class SpecError(MaxdeclError):
    """A model spec is malformed or inconsistent (carries file:line:col)."""


class GraphError(MaxdeclError):
    """A node could not be built or executed (carries layer path, op, shapes)."""


class QuantizationError(MaxdeclError):
    """Bad input to an encoding: wrong dtype, shape, NaN/Inf, truncated bytes."""


class WeightsError(MaxdeclError):
    """A weights file is missing, truncated, corrupted, foreign or mismatched."""


class InputError(MaxdeclError):
    """A bad run-time argument: a sampling or length parameter, a prompt, a weights or
    tokenizer argument, a prompt longer than the model's context (the CLI exits 2)."""
