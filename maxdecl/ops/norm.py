"""Normalisation over the last axis: ``layer_norm`` and ``rms_norm`` (float32 math).

Both compute in float32 whatever the float input dtype and return the input dtype.
Weights have x's trailing shape: 1-D of the last dim's size (shared by every row), or
more dims (a gain per head: ``[heads, head_dim]`` on ``[seq, heads, head_dim]``). Gemma-style checkpoints whose norm weight
is stored as ``w`` but applied as ``1 + w`` are the loader's business: GGUF files
already hold ``1 + w``.
"""

from __future__ import annotations

from ..dtypes import format_shape
from . import _checks
from ._registry import REQUIRED, define, public

__all__ = ["layer_norm", "rms_norm", "group_norm", "batch_norm", "normalize"]


def _check_weight(x, w, what):
    _checks.float_input(w, what)
    if not 1 <= w.rank <= x.rank or not all(
            _checks.dims_equal(a, b) for a, b in zip(w.shape, x.shape[x.rank - w.rank:])):
        raise ValueError(f"{what}{format_shape(w.shape)} must be x's trailing dims "
                         f"(1-D of size {x.shape[-1]}, or [heads, {x.shape[-1]}] and the "
                         f"like, of x{format_shape(x.shape)})")


def _norm_rule(inputs, attrs):
    x, *weights = inputs
    _checks.float_input(x)
    _checks.no_bfloat16(x, *weights)
    _checks.has_axes(x, "normalisation")
    for w, what in zip(weights, ("gamma", "beta")):
        _check_weight(x, w, what)
    if float(attrs["epsilon"]) < 0:
        raise ValueError(f"epsilon must be >= 0, got {attrs['epsilon']}")
    return [x]


def _rms_rule(inputs, attrs):
    x, *w = inputs
    _checks.float_input(x)
    _checks.no_bfloat16(x, *w)
    _checks.has_axes(x, "rms_norm")
    if w:
        _check_weight(x, w[0], "weight")
    return [x]


def _eps(a):
    return {**a, "epsilon": float(a["epsilon"])}


def _normalize_rule(inputs, attrs):
    (x,) = inputs
    _checks.float_input(x)
    _checks.no_bfloat16(x)
    _checks.has_axes(x, "normalize")
    _checks.valid_axis(attrs["axis"], x.rank)
    if not float(attrs["p"]) > 0:
        raise ValueError(f"p must be > 0, got {attrs['p']}")
    if float(attrs["epsilon"]) < 0:
        raise ValueError(f"epsilon must be >= 0, got {attrs['epsilon']}")
    return [x]


def _normalize_attrs(a):
    return {**a, "axis": int(a["axis"]), "p": float(a["p"]), "epsilon": float(a["epsilon"])}


define("normalize", rule=_normalize_rule, run="norm", attrs={"axis": -1, "p": 2.0,
                                                              "epsilon": 1e-12},
       normalize=_normalize_attrs, kind="norm",
       doc="x / max(||x||_p, epsilon) along axis (torch.nn.functional.normalize: unit "
           "embeddings, cosine attention's q and k); float32 math. Not the epsilon-inside "
           "form x / sqrt(sum x^2 + eps) of FLA-style l2norm (gated_delta_rule's "
           "qk_l2norm has that one): write it as rsqrt of sum plus eps where needed",
       rule_doc="x float, rank >= 1; axis one of x's; p > 0, epsilon >= 0; out: the type of x")
define("layer_norm", rule=_norm_rule, run="norm", inputs=("x", "gamma"), optional=("beta",),
       attrs={"epsilon": 1e-5}, normalize=_eps, kind="norm",
       doc="(x - mean) / sqrt(var + epsilon) * gamma + beta over the last axis",
       rule_doc="x float; gamma, beta: x's trailing dims (1-D of the last dim, or more); "
                "out: the type of x")
define("rms_norm", rule=_rms_rule, run="norm", inputs=("x",), optional=("weight",),
       attrs={"epsilon": 1e-6}, normalize=_eps, kind="norm",
       doc="x * rsqrt(mean(x**2) + epsilon) * weight over the last axis (no weight: a "
           "gain of ones)",
       rule_doc="x float; weight: x's trailing dims (1-D of the last dim, or more); "
                "out: the type of x")


def _channels(op: str, inputs, attrs):
    """The channel count of a per-channel norm's x (last axis, or axis 1), after the
    checks its inputs share: float, no bfloat16, rank >= 2."""
    x = inputs[0]
    _checks.float_input(x)
    _checks.no_bfloat16(*inputs)
    if x.rank < 2:
        raise ValueError(f"{op} needs x of rank >= 2 ([N, ..., C] or [N, C, ...]), "
                         f"got x{format_shape(x.shape)}")
    return x.shape[-1] if attrs["channels_last"] else x.shape[1]


def _group_rule(inputs, attrs):
    x, *weights = inputs
    c = _channels("group_norm", inputs, attrs)
    g = attrs["groups"]
    if not isinstance(c, int) or c % g:
        raise ValueError(f"{c} channels of x{format_shape(x.shape)} do not split "
                         f"into {g} groups (channels must be a static multiple of groups)")
    for w, what in zip(weights, ("gamma", "beta")):
        _checks.float_input(w, what)
        if w.rank != 1 or not _checks.dims_equal(w.shape[0], c):
            raise ValueError(f"{what}{format_shape(w.shape)} must be [{c}] (one per channel)")
    return [x]


def _normalize_group(a):
    g = a["groups"]
    if isinstance(g, bool) or not isinstance(g, int) or g < 1:
        raise ValueError(f"groups must be a positive int, got {g!r}")
    if float(a["epsilon"]) < 0:
        raise ValueError(f"epsilon must be >= 0, got {a['epsilon']}")
    return {**a, "epsilon": float(a["epsilon"]), "channels_last": bool(a["channels_last"])}


define("group_norm", rule=_group_rule, run="norm", inputs=("x", "gamma"), optional=("beta",),
       attrs={"groups": REQUIRED, "epsilon": 1e-5, "channels_last": True},
       normalize=_normalize_group, kind="norm",
       call_order=("groups", "beta", "epsilon", "channels_last"),
       doc="(x - mean) / sqrt(var + epsilon) * gamma + beta, statistics per sample over "
           "each group of channels and every other axis (torch.nn.GroupNorm)",
       rule_doc="x float, rank >= 2, channels (last, or axis 1) a static multiple of "
                "groups; gamma, beta [channels]; out: the type of x")


def _batch_rule(inputs, attrs):
    x, *params = inputs
    c = _channels("batch_norm", inputs, attrs)
    for p, what in zip(params, ("mean", "var", "gamma", "beta")):
        _checks.float_input(p, what)
        if p.rank != 1 or not _checks.dims_equal(p.shape[0], c):
            raise ValueError(f"{what}{format_shape(p.shape)} must be [{c}] (one per channel "
                             f"of x{format_shape(x.shape)})")
    return [x]


def _normalize_batch(a):
    if float(a["epsilon"]) < 0:
        raise ValueError(f"epsilon must be >= 0, got {a['epsilon']}")
    return {**a, "epsilon": float(a["epsilon"]), "channels_last": bool(a["channels_last"])}


define("batch_norm", rule=_batch_rule, run="norm", inputs=("x", "mean", "var"),
       optional=("gamma", "beta"), attrs={"epsilon": 1e-5, "channels_last": True},
       normalize=_normalize_batch, kind="norm",
       doc="inference batch norm: (x - mean) / sqrt(var + epsilon) * gamma + beta with the "
           "running statistics, per channel (torch.nn.BatchNorm2d in eval mode)",
       rule_doc="x float, rank >= 2; mean, var, gamma, beta [channels] (last axis, or "
                "axis 1); out: the type of x")


@public
def batch_norm():  # noqa: A001 - the signature comes from the definition
    """Inference batch norm, as ``torch.nn.functional.batch_norm(..., training=False)``.

    ``(x - mean) / sqrt(var + epsilon) * gamma + beta`` per channel, with the running
    statistics ``mean`` and ``var`` (``[C]``; float32 math). ``gamma`` and ``beta`` are
    optional (torch's ``affine=False``). ``channels_last`` (default): x ``[N, ..., C]``
    as NHWC convolutions give it; false: torch's ``[N, C, ...]``. The statistics are
    weights (``running_mean``, ``running_var``), so a checkpoint's BatchNorm maps to four
    weights and one op.
    """


@public
def group_norm():  # noqa: A001 - the signature comes from the definition
    """Group norm, as ``torch.nn.functional.group_norm``.

    The channels split into ``groups`` consecutive groups; each sample's mean and
    biased variance are taken over one group's channels and every axis but the first
    (float32 math), then ``gamma`` and ``beta`` (``[C]``) scale and shift each channel.
    ``channels_last`` (default): x ``[N, ..., C]``, as NHWC convolutions give it; false:
    torch's ``[N, C, ...]``. ``groups == C`` normalises each channel on its own
    (wav2vec2's first conv layer: ``GroupNorm(512, 512)`` over time); ``groups == 1``
    is a LayerNorm over all of a sample.
    """


@public
def layer_norm():  # noqa: A001 - the signature comes from the definition
    """Layer norm over the last axis.

    ``y = (x - mean) / sqrt(var + epsilon) * gamma + beta`` (biased variance,
    float32 math), as ``torch.nn.functional.layer_norm(x, x.shape[-1:], ...)``.
    ``gamma`` and ``beta`` have x's trailing shape. 1-D, the size of the last axis: on
    ``[seq, heads, head_dim]`` a per-head LayerNorm whose gain and bias all heads share
    (Phi's ``qk_layernorm``); ``[heads, head_dim]``: a gain and bias of each head's own
    (StableLM 2 12B's and Command-R+'s per-head q/k norms), the statistics still over
    the last axis only. A LayerNorm without parameters (OLMo's) takes a constant of ones
    as ``gamma`` (in a spec: ``constants: {ones: {value: "{[1.0] * dim}"}}``).
    Inference BatchNorm is ``batch_norm`` (specs/resnet.yaml writes it out with
    elementwise ops, which computes the same).

    Example::

        y = md.ops.layer_norm(x, g.weight("ln.weight", (md.DType.float32, (512,))))
    """


@public
def rms_norm():  # noqa: A001 - the signature comes from the definition
    """RMS norm over the last axis: ``y = x * rsqrt(mean(x**2) + epsilon) * weight``.

    Computed in float32 (as llama.cpp and HF Llama). Gemma GGUF weights already
    hold ``1 + w``. On ``[seq, heads, head_dim]`` with a ``[head_dim]`` weight it is a
    per-head norm whose gain all heads share (Qwen3's and Gemma 3's q/k norms); a
    ``[heads, head_dim]`` weight gives each head its own gain (statistics still over the
    last axis only). Without a weight the gain is 1 (Falcon Mamba's RMS norms of dt, B
    and C, which have no parameters).
    """


@public
def normalize():  # noqa: A001 - the signature comes from the definition
    """``x / max(||x||_p, epsilon)`` along ``axis``, as ``torch.nn.functional.normalize``
    (``p`` 2 and ``epsilon`` 1e-12 by default): unit-length embeddings (CLIP, sentence
    encoders), the cosine attention of Swin V2. Computed in float32, returned in x's dtype.

    Example::

        e = md.ops.normalize(pooled, axis=-1)
    """
