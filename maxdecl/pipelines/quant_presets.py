"""What ``maxdecl quantize --encoding X`` means, per tensor.

    X                     rule
    -------------------   ------------------------------------------------------------------
    q4_0 q5_0 q8_0        every float tensor of rank >= 2 in X; 1-D norms and biases kept;
    q4_k q6_k bf16        with --spec, the spec's ``encodings.overrides`` globs come first
    (any registered
    encoding, any case)
    spec                  the spec's own ``encodings`` (default + overrides); needs --spec
    Q4_K_M                llama.cpp's Q4_K_M mix (llama_tensor_get_type): q6_k for
                          ``output.weight`` (``token_embd.weight`` when the output is tied),
                          q6_k for ``attn_v``/``attn_qkv``/``ffn_down`` of the layers
                          llama.cpp's use_more_bits picks (the first and last eighth, and
                          every third between), q4_k for the other matrices; a row length
                          that is not a multiple of 256 falls back as in llama.cpp (q4_k ->
                          q5_0, q6_k -> q8_0); 1-D tensors kept. Applied to Gemma 3 270M it
                          gives the published Q4_K_M file's encoding of every tensor.
"""

from __future__ import annotations

import fnmatch
import re

from ..errors import MaxdeclError

__all__ = ["PRESETS", "rules_for", "use_more_bits"]

PRESETS = {"spec": "the spec's own encodings rules",
           "q4_k_m": "llama.cpp's Q4_K_M mix (q4_k, q6_k for output/attn_v/ffn_down halves)"}
QK_K = 256                                        # K-quant super-block length
_K_FALLBACK = {"q4_k": "q5_0", "q6_k": "q8_0"}    # llama.cpp, rows not a multiple of QK_K
_LAYER = re.compile(r"(?:^|\.)blk\.(\d+)\.")


def use_more_bits(i_layer: int, n_layers: int) -> bool:
    """llama.cpp's choice of the layers that get more bits (integer division as in C)."""
    return (i_layer < n_layers // 8 or i_layer >= 7 * n_layers // 8
            or (i_layer - n_layers // 8) % 3 == 2)


def rules_for(encoding: str, td, spec=None):
    """(``rules(name) -> encoding or None``, or None for one plain encoding; a label).

    Raises:
        MaxdeclError: ``spec`` without --spec.
    """
    key = encoding.lower()
    if key == "spec":
        if spec is None:
            raise MaxdeclError("--encoding spec uses the spec's encodings: give --spec SPEC")
        return (lambda name: spec.encoding_for(name)), f"the rules of {spec.file}"
    if key == "q4_k_m":
        return _q4_k_m(td), "Q4_K_M (llama.cpp's mix)"
    if spec is not None:
        return _spec_overrides(spec, key), f"{key} (with {spec.file}'s overrides)"
    return None, key


def _spec_overrides(spec, encoding: str):
    """The spec's glob overrides first, else ``encoding``."""
    def rule(name):
        for glob, _, _ in spec.encoding_overrides:
            if fnmatch.fnmatchcase(name, glob):
                return spec.encoding_for(name)
        return encoding
    return rule


def _q4_k_m(td):
    layers = {int(m.group(1)) for n in td.keys() if (m := _LAYER.search(n))}
    n_layers = max(layers) + 1 if layers else 0
    has_output = "output.weight" in td

    def rule(name):
        shape = td[name].shape
        if len(shape) < 2:
            return None
        m = _LAYER.search(name)
        if name == "output.weight" or (not has_output and name == "token_embd.weight"):
            enc = "q6_k"
        elif m and re.search(r"\.(attn_v|attn_qkv|ffn_down)\.weight$", name) \
                and use_more_bits(int(m.group(1)), n_layers):
            enc = "q6_k"
        else:
            enc = "q4_k"
        if shape[-1] % QK_K:
            enc = _K_FALLBACK[enc]
        return enc
    return rule
