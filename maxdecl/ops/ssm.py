"""State-space ops (Mamba): ``causal_conv1d`` and ``selective_scan``.

Both work on token rows ``[..., seq, channels]`` (the layout of every other op) and
take their recurrent state as an explicit input and return the new one, as
``attention`` does with its KV cache: a prefill starts from zeros, and each decode
step feeds back the state the previous step returned. Runtime: ``maxdecl.kernels.ssm``.

* ``causal_conv1d(x, weight, bias?, state?)``: depthwise (one filter per channel),
  left-padded by ``K - 1`` (Mamba's ``conv1d`` with ``groups = channels``);
  ``state [..., K - 1, C]`` holds the last ``K - 1`` input rows.
* ``selective_scan(x, dt, A, B, C, D, state?)``: Mamba-1's recurrence per channel d
  and state index n: ``h = exp(dt * A) * h + dt * B_t * x_t``,
  ``y_t = C_t . h + D * x_t`` (``dt_softplus``: ``dt = softplus(dt)`` first).
* ``linear_scan(a, x, state?)``: the plain first-order linear recurrence
  ``h_t = a_t * h_{t-1} + x_t`` per channel, every ``h_t`` out (Griffin's RG-LRU,
  minGRU, any gated linear RNN); ``a_t = 0`` restarts it exactly.
* ``gated_delta_rule(q, k, v, g, beta, state?)``: Gated DeltaNet's matrix memory per
  value head (Qwen3-Next's linear attention): ``S = exp(g_t) S``, ``S += k_t (beta_t (v_t
  - S^T k_t))^T``, ``o_t = S^T q_t``.
"""

from __future__ import annotations

from ..dtypes import DType, TensorType, format_shape
from . import _checks
from ._registry import REQUIRED, apply, define

__all__ = ["causal_conv1d", "selective_scan", "linear_scan", "gated_delta_rule"]


def _float32(*pairs):
    for v, what in pairs:
        if v.is_quantized or v.dtype != DType.float32:
            raise TypeError(f"{what} must be float32, got {v.type}")


def _same_dims(a, b) -> bool:
    return len(a) == len(b) and all(_checks.dims_equal(p, q) for p, q in zip(a, b))


# -- causal_conv1d ------------------------------------------------------------------------
def _conv_rule(types, attrs):
    x, w, *rest = types
    bias, state = (rest + [None, None])[:2]
    _float32((x, "x"), (w, "weight"))
    for v, what in ((bias, "bias"), (state, "state")):
        if v is not None:
            _float32((v, what))
    if x.rank < 2:
        raise ValueError(f"x{format_shape(x.shape)} must be [..., seq, channels]")
    c = x.shape[-1]
    if w.rank != 2 or not _checks.dims_equal(w.shape[0], c) or not isinstance(w.shape[1], int):
        raise ValueError(f"weight{format_shape(w.shape)} must be [{c}, K] (one filter of static "
                         f"width K per channel of x{format_shape(x.shape)})")
    if bias is not None and bias.rank != 0 and not _same_dims(bias.shape, (c,)):
        raise ValueError(f"bias{format_shape(bias.shape)} must be [{c}] or a scalar")
    out = TensorType(DType.float32, x.shape)
    if state is None:
        return [out]
    want = (*x.shape[:-2], w.shape[1] - 1, c)
    if not _same_dims(state.shape, want):
        raise ValueError(f"state{format_shape(state.shape)} must be {format_shape(want)} "
                         "(the last K - 1 input rows)")
    return [out, TensorType(DType.float32, want)]


define("causal_conv1d", rule=_conv_rule, run="ssm", inputs=("x", "weight"),
       optional=("bias", "state"), kind="conv",
       outputs=lambda n, attrs: 2 if n >= 4 else 1,
       sequence_axis=-2, sequence_inputs=("x",), state={"state": 1},
       outputs_doc="y; with `state` also the new state",
       doc="depthwise causal convolution over seq: y[t, c] = bias[c] + sum_j weight[c, j] * "
           "x[t - K + 1 + j, c], earlier rows from state (zeros without it)",
       rule_doc="x float32 [..., seq, C], weight [C, K] (K static), bias [C] or scalar, "
                "state [..., K - 1, C] -> y [..., seq, C] (and the new state)")


def causal_conv1d(x, weight, bias=None, state=None):
    """Depthwise causal 1-D convolution along ``seq`` of ``x [..., seq, C]``.

    ``y[t, c] = bias[c] + sum_{j<K} weight[c, j] * xs[t + j, c]`` where ``xs`` is
    ``state [..., K-1, C]`` (zeros when None) followed by ``x``: torch's
    ``conv1d(x, weight[:, None], bias, groups=C, padding=K-1)[..., :seq]``. With a
    state, returns ``(y, new_state)``: the last ``K - 1`` rows of ``xs``.

    Example::

        y, conv_state = md.ops.causal_conv1d(x, w, b, conv_state)
    """
    if state is not None and bias is None:
        bias = 0.0
    ins = [x, weight] + ([] if bias is None else [bias]) + ([] if state is None else [state])
    outs = apply("causal_conv1d", ins)
    return outs[0] if state is None else (outs[0], outs[1])


# -- selective_scan -----------------------------------------------------------------------
def _scan_rule(types, attrs):
    x, dt, a, b, c, d, *rest = types
    _float32((x, "x"), (dt, "dt"), (a, "A"), (b, "B"), (c, "C"), (d, "D"),
             *[(s, "state") for s in rest])
    if x.rank < 2:
        raise ValueError(f"x{format_shape(x.shape)} must be [..., seq, D]")
    *lead, seq, ch = x.shape
    if not _same_dims(dt.shape, x.shape):
        raise ValueError(f"dt{format_shape(dt.shape)} must have x's shape {format_shape(x.shape)}")
    if a.rank not in (2, x.rank) or not _checks.dims_equal(a.shape[-2], ch) or (
            a.rank > 2 and not _same_dims(a.shape[:-2], tuple(lead))):
        per_batch = (f" or {format_shape((*lead, ch, 'N'))} (one per batch entry)"
                     if lead else "")
        raise ValueError(f"A{format_shape(a.shape)} must be [{ch}, N] (N state dims per "
                         f"channel){per_batch}")
    n = a.shape[-1]
    for v, what in ((b, "B"), (c, "C")):
        if not _same_dims(v.shape, (*lead, seq, n)):
            raise ValueError(f"{what}{format_shape(v.shape)} must be "
                             f"{format_shape((*lead, seq, n))}")
    if d.rank != 0 and not _same_dims(d.shape, (ch,)) and not (
            lead and _same_dims(d.shape, (*lead, ch))):
        per_batch = f", {format_shape((*lead, ch))} (one per batch entry)" if lead else ""
        raise ValueError(f"D{format_shape(d.shape)} must be [{ch}]{per_batch} or a scalar")
    out = TensorType(DType.float32, x.shape)
    if not rest:
        return [out]
    if not _same_dims(rest[0].shape, (*lead, ch, n)):
        raise ValueError(f"state{format_shape(rest[0].shape)} must be "
                         f"{format_shape((*lead, ch, n))}")
    return [out, TensorType(DType.float32, (*lead, ch, n))]


define("selective_scan", rule=_scan_rule, run="ssm", inputs=("x", "dt", "A", "B", "C", "D"),
       optional=("state",), attrs={"dt_softplus": False}, kind="ssm",
       outputs=lambda n, attrs: 2 if n >= 7 else 1,
       sequence_axis=-2, sequence_inputs=("x", "dt", "B", "C"), state={"state": 1},
       outputs_doc="y; with `state` also the new state",
       normalize=lambda attrs: {"dt_softplus": bool(attrs["dt_softplus"])},
       doc="Mamba-1 selective scan: h = exp(dt * A) * h + dt * B_t * x_t, y_t = C_t . h + "
           "D * x_t per channel, h from state (zeros without it)",
       rule_doc="x, dt float32 [..., seq, D], A [D, N] or [..., D, N], B, C [..., seq, N], "
                "D [D], [..., D] or scalar, "
                "state [..., D, N] -> y [..., seq, D] (and the new state)")


def selective_scan(x, dt, A, B, C, D, state=None, dt_softplus=False):  # noqa: N803
    """Mamba-1's selective scan (``mamba_ssm.selective_scan_fn`` without z / dt_bias).

    For each channel ``d`` (of ``x [..., seq, D]``) and state index ``n`` (of
    ``A [D, N]``), over t in order, with ``dt`` softplus-ed when ``dt_softplus``::

        h[d, n] = exp(dt[t, d] * A[d, n]) * h[d, n] + dt[t, d] * B[t, n] * x[t, d]
        y[t, d] = sum_n C[t, n] * h[d, n] + D[d] * x[t, d]

    ``h`` starts as ``state [..., D, N]`` (zeros when None); with a state, returns
    ``(y, new_state)``. ``A`` may also be ``[..., D, N]``, one per batch entry of x:
    Mamba-2's heads as a batch axis (``[G, seq, head_dim]`` per group of heads sharing B
    and C) each keep their own decay; so may ``D``, as ``[..., D]`` (one skip per head,
    spread over its channels).

    Example::

        y, ssm_state = md.ops.selective_scan(x, dt, A, B, C, D, ssm_state, dt_softplus=True)
    """
    ins = [x, dt, A, B, C, D] + ([] if state is None else [state])
    outs = apply("selective_scan", ins, dt_softplus=dt_softplus)
    return outs[0] if state is None else (outs[0], outs[1])


# -- linear_scan ---------------------------------------------------------------------------
def _linear_scan_rule(types, attrs):
    a, x, *rest = types
    _float32((a, "a"), (x, "x"), *((v, "state") for v in rest))
    if x.rank < 2 or not _same_dims(a.shape, x.shape):
        raise ValueError(f"a{format_shape(a.shape)} and x{format_shape(x.shape)} must share "
                         f"one shape [..., seq, channels]")
    out = TensorType(DType.float32, x.shape)
    if not rest:
        return [out]
    want = (*x.shape[:-2], x.shape[-1])
    if not _same_dims(rest[0].shape, want):
        raise ValueError(f"state{format_shape(rest[0].shape)} must be {format_shape(want)} "
                         "(h after the last step, one per channel)")
    return [out, TensorType(DType.float32, want)]


define("linear_scan", rule=_linear_scan_rule, run="ssm", inputs=("a", "x"),
       optional=("state",), kind="ssm",
       outputs=lambda n, attrs: 2 if n >= 3 else 1,
       sequence_axis=-2, sequence_inputs=("a", "x"), state={"state": 1},
       outputs_doc="h at every step; with `state` also the new state",
       doc="first-order linear recurrence over seq: h_t = a_t * h_(t-1) + x_t per channel, "
           "h from state (zeros without it)",
       rule_doc="a, x float32 [..., seq, C] (one shape), state [..., C] -> h [..., seq, C] "
                "(and the new state, h at the last step)")


def linear_scan(a, x, state=None):
    """The linear recurrence ``h_t = a_t * h_{t-1} + x_t``, per channel, along ``seq``.

    a, x ``[..., seq, C]`` (one shape), float32; ``h`` starts as ``state [..., C]``
    (zeros when None) and every ``h_t`` comes out as ``[..., seq, C]``; with a state,
    returns ``(h, new_state)``, ``new_state`` the last ``h_t``. Each step is one
    multiply and one add in float32, in order, so ``a_t = 0`` restarts the recurrence
    exactly (Griffin's RG-LRU at a sequence start, where transformers resets it) and a
    prompt split into steps gives the bits of one call.

    Example::

        h, state = md.ops.linear_scan(decay, gated_input, state)
    """
    return apply("linear_scan", [a, x] + ([state] if state is not None else []))


# -- gated_delta_rule ----------------------------------------------------------------------
def _delta_rule_rule(types, attrs):
    q, k, v, g, beta, *rest = types
    _float32((q, "q"), (k, "k"), (v, "v"), (g, "g"), (beta, "beta"),
             *((s, "state") for s in rest))
    hk = attrs["k_heads"]
    if isinstance(hk, bool) or not isinstance(hk, int) or hk < 1:
        raise ValueError(f"k_heads must be a positive int, got {hk!r}")
    if q.rank < 2 or not _same_dims(q.shape, k.shape):
        raise ValueError(f"q{format_shape(q.shape)} and k{format_shape(k.shape)} must share "
                         "one shape [..., seq, k_heads * dk]")
    lead = q.shape[:-1]
    for val, what in ((v, "v"), (g, "g"), (beta, "beta")):
        if not _same_dims(val.shape[:-1], lead) or val.rank != q.rank:
            raise ValueError(f"{what}{format_shape(val.shape)} must be [..., seq, ...] like "
                             f"q{format_shape(q.shape)}")
    if not _same_dims(g.shape, beta.shape):
        raise ValueError(f"g{format_shape(g.shape)} and beta{format_shape(beta.shape)} must "
                         "share one shape [..., seq, v_heads]")
    ck, cv, hv = q.shape[-1], v.shape[-1], g.shape[-1]
    if not all(isinstance(d, int) for d in (ck, cv, hv)):
        raise ValueError(f"the widths of q{format_shape(q.shape)}, v{format_shape(v.shape)} "
                         f"and g{format_shape(g.shape)} must be static")
    if hv < 1 or ck < hk or cv < hv:
        raise ValueError(f"g{format_shape(g.shape)} needs at least one value head, and q "
                         f"and v at least one channel a head")
    if ck % hk or hv % hk or cv % hv:
        raise ValueError(f"q's width {ck} must split into k_heads {hk}, g's v_heads {hv} "
                         f"must be a multiple of k_heads, and v's width {cv} must split into "
                         f"{hv} heads")
    dk, dv = ck // hk, cv // hv
    out = TensorType(DType.float32, v.shape)
    if not rest:
        return [out]
    want = (*q.shape[:-2], hv, dk, dv)
    if not _same_dims(rest[0].shape, want):
        raise ValueError(f"state{format_shape(rest[0].shape)} must be {format_shape(want)} "
                         "(one [dk, dv] memory per value head)")
    return [out, TensorType(DType.float32, want)]


def _normalize_delta_rule(attrs):
    scale = attrs["scale"]
    if scale is not None and (isinstance(scale, bool) or not isinstance(scale, (int, float))):
        raise ValueError(f"scale must be a number or None, got {scale!r}")
    return {**attrs, "scale": None if scale is None else float(scale),
            "qk_l2norm": bool(attrs["qk_l2norm"])}


define("gated_delta_rule", rule=_delta_rule_rule, run="ssm",
       inputs=("q", "k", "v", "g", "beta"), optional=("state",),
       attrs={"k_heads": REQUIRED, "scale": None, "qk_l2norm": False}, kind="ssm",
       normalize=_normalize_delta_rule,
       outputs=lambda n, attrs: 2 if n >= 6 else 1,
       sequence_axis=-2, sequence_inputs=("q", "k", "v", "g", "beta"), state={"state": 1},
       outputs_doc="o; with `state` also the new state",
       doc="Gated DeltaNet's recurrence per value head: S = exp(g_t) * S, S += k_t (beta_t * "
           "(v_t - S^T k_t))^T, o_t = S^T q_t (transformers' torch_recurrent_gated_delta_rule"
           "; q and k optionally L2-normalised, q scaled by `scale`, default dk^-0.5)",
       rule_doc="q, k float32 [..., seq, k_heads * dk], v [..., seq, v_heads * dv], g, beta "
                "[..., seq, v_heads] (v_heads a multiple of k_heads), state [..., v_heads, "
                "dk, dv] -> o [..., seq, v_heads * dv] (and the new state)")


def gated_delta_rule(q, k, v, g, beta, state=None, *, k_heads, scale=None, qk_l2norm=False):
    """Gated DeltaNet's matrix-memory recurrence (Qwen3-Next's linear attention layers).

    ``q, k [..., seq, k_heads * dk]``, ``v [..., seq, v_heads * dv]``, ``g`` (the log
    decay, <= 0) and ``beta`` (the write strength) ``[..., seq, v_heads]``, all float32.
    Key head ``j`` serves value heads ``j * r .. j * r + r - 1`` (``r = v_heads /
    k_heads``, transformers' ``repeat_interleave``). Per value head, the memory ``S [dk,
    dv]`` starts as ``state [..., v_heads, dk, dv]`` (zeros when None) and for each t:
    ``S = exp(g_t) S``; ``S += k_t (beta_t (v_t - S^T k_t))^T``; ``o_t = S^T q_t``, with
    q and k first L2-normalised when ``qk_l2norm`` (``x / sqrt(sum x^2 + 1e-6)``) and q
    scaled by ``scale`` (default ``dk ** -0.5``). With a state, returns ``(o,
    new_state)``. A prefill and step-by-step decoding give the same outputs (one
    recurrence in float32, in order).
    """
    ins = [q, k, v, g, beta] + ([] if state is None else [state])
    outs = apply("gated_delta_rule", ins, k_heads=k_heads, scale=scale, qk_l2norm=qk_l2norm)
    return outs[0] if state is None else (outs[0], outs[1])
