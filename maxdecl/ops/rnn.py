"""Recurrent layers with torch's weight layouts: ``lstm`` and ``gru``, one layer, one
direction (stack layers with ``repeat``; run a reversed copy of the sequence for the
backward direction).

Both take token rows ``x [..., seq, input]`` and return every step's hidden state
``[..., seq, hidden]``; with a ``state`` input they start from it and also return the
state after the last step, as ``linear_scan`` does, so a sequence can run in pieces
and a batched step gives each sequence its own state. Runtime: ``maxdecl.kernels.rnn``.

* ``lstm(x, w_ih [4H, I], w_hh [4H, H], b_ih, b_hh, state? [..., 2, H])``: gates i, f,
  g, o in that order (``torch.nn.LSTM``'s ``weight_ih_l0`` ...); ``state`` stacks h
  and c.
* ``gru(x, w_ih [3H, I], w_hh [3H, H], b_ih, b_hh, state? [..., H])``: gates r, z, n
  (``torch.nn.GRU``): ``n = tanh(W_in x + b_in + r * (W_hn h + b_hn))``,
  ``h = (1 - z) * n + z * h``.

A bias is its ``[gates * H]`` vector or the number ``0.0`` (``bias=False``).
"""

from __future__ import annotations

from ..dtypes import DType, TensorType, format_shape
from . import _checks
from ._registry import define, public

__all__ = ["lstm", "gru"]

_GATES = {"lstm": 4, "gru": 3}


def _rule(kind):
    gates = _GATES[kind]

    def rule(types, attrs):
        x, w_ih, w_hh, b_ih, b_hh, *rest = types
        for v, what in ((x, "x"), (w_ih, "w_ih"), (w_hh, "w_hh"), (b_ih, "b_ih"),
                        (b_hh, "b_hh"), *((s, "state") for s in rest)):
            if v.is_quantized or v.dtype != DType.float32:
                raise TypeError(f"{what} must be float32 (not quantized), got {v.type}")
        if x.rank < 2:
            raise ValueError(f"x{format_shape(x.shape)} must be [..., seq, input]")
        if w_hh.rank != 2 or not isinstance(w_hh.shape[1], int):
            raise ValueError(f"w_hh{format_shape(w_hh.shape)} must be [{gates} * hidden, hidden]")
        hidden = w_hh.shape[1]
        if not _checks.dims_equal(w_hh.shape[0], gates * hidden):
            raise ValueError(f"w_hh{format_shape(w_hh.shape)} must be [{gates} * hidden, "
                             f"hidden] = [{gates * hidden}, {hidden}]")
        if w_ih.rank != 2 or not (_checks.dims_equal(w_ih.shape[0], gates * hidden)
                                  and _checks.dims_equal(w_ih.shape[1], x.shape[-1])):
            raise ValueError(f"w_ih{format_shape(w_ih.shape)} must be [{gates * hidden}, "
                             f"{x.shape[-1]}] ({gates} gates x hidden {hidden}, x's input)")
        for b, what in ((b_ih, "b_ih"), (b_hh, "b_hh")):
            if b.rank and not (b.rank == 1 and _checks.dims_equal(b.shape[0], gates * hidden)):
                raise ValueError(f"{what}{format_shape(b.shape)} must be [{gates * hidden}] "
                                 f"or the number 0.0")
        out = TensorType(DType.float32, (*x.shape[:-1], hidden))
        if not rest:
            return [out]
        want = (*x.shape[:-2], 2, hidden) if kind == "lstm" else (*x.shape[:-2], hidden)
        if len(rest[0].shape) != len(want) or not all(
                _checks.dims_equal(a, b) for a, b in zip(rest[0].shape, want)):
            raise ValueError(f"state{format_shape(rest[0].shape)} must be "
                             f"{format_shape(want)} ({'h and c' if kind == 'lstm' else 'h'} "
                             f"after the last step)")
        return [out, TensorType(DType.float32, want)]
    return rule


_DOCS = {
    "lstm": ("one LSTM layer over seq with torch.nn.LSTM's weights (gates i, f, g, o): "
             "c = f * c + i * g, h = o * tanh(c); h and c from state (zeros without it)",
             "state [..., 2, H]", " (h and c stacked)"),
    "gru": ("one GRU layer over seq with torch.nn.GRU's weights (gates r, z, n): "
            "n = tanh(W_in x + b_in + r * (W_hn h + b_hn)), h = (1 - z) * n + z * h; h "
            "from state (zeros without it)", "state [..., H]", ""),
}
for _kind, (_doc, _state, _stacked) in _DOCS.items():
    _g = _GATES[_kind]
    define(_kind, rule=_rule(_kind), run="rnn", inputs=("x", "w_ih", "w_hh", "b_ih", "b_hh"),
           optional=("state",), kind="rnn", outputs=lambda n, attrs: 2 if n >= 6 else 1,
           sequence_axis=-2, sequence_inputs=("x",), state={"state": 1},
           outputs_doc=f"h at every step; with `state` also the new state{_stacked}",
           doc=_doc,
           rule_doc=f"x float32 [..., seq, I]; w_ih [{_g}H, I], w_hh [{_g}H, H]; b_ih, b_hh "
                    f"[{_g}H] or 0.0; {_state} -> h [..., seq, H] (and the new state)")


@public
def lstm():  # noqa: A001 - the signature comes from the definition
    """One LSTM layer over ``seq`` with ``torch.nn.LSTM``'s weights (``weight_ih_l0``,
    ``weight_hh_l0``, ``bias_ih_l0``, ``bias_hh_l0``; gates i, f, g, o). ``x`` is
    ``[..., seq, input]``; returns every step's h ``[..., seq, hidden]``, and with a
    ``state [..., 2, hidden]`` (h, c) input also the state after the last step.

    Example::

        y, state = md.ops.lstm(x, w_ih, w_hh, b_ih, b_hh, state)
    """


@public
def gru():  # noqa: A001 - the signature comes from the definition
    """One GRU layer over ``seq`` with ``torch.nn.GRU``'s weights (gates r, z, n).
    ``x`` is ``[..., seq, input]``; returns every step's h ``[..., seq, hidden]``, and
    with a ``state [..., hidden]`` input also the state after the last step.

    Example::

        y = md.ops.gru(x, w_ih, w_hh, b_ih, b_hh)
    """
