"""Spec + weights -> a ready generation Session and tokenizer, for any spec.

Hyperparameters come from the weights' own metadata when the spec's ``formats``
section says where to find them (GGUF keys, HF config.json fields, the llama2.c
header), overriding the variant's values; foreign tensor names are mapped by the
spec's declared ``formats.<fmt>.tensors`` / ``transforms``.
"""

from __future__ import annotations

import os

import numpy as np

from ..errors import WeightsError
from ..tensors import QuantizedTensor, TensorDict
from ..weights.for_spec import params_from_metadata, prepare_weights  # noqa: F401 (moved)


class ByteTokenizer:
    """Ids 0-255 are UTF-8 bytes: the tokenizer of random-weight ``tiny`` runs."""

    vocab_size = 256
    bos_id = None
    eos_ids = frozenset()

    def encode(self, text: str, add_bos: bool = True) -> list[int]:
        return list(text.encode("utf-8")) or [0]

    def decode(self, ids) -> str:
        return bytes(int(i) % 256 for i in ids).decode("utf-8", errors="replace")


def random_weights(prog, seed: int = 0) -> TensorDict:
    """Seeded random weights for every weight a Program declares, in its encodings.

    Norm-like 1-D weights are near 1, matrices ~ N(0, 1/fan_in), so activations stay
    in range through many layers. A weight whose ``absent:`` stand-in is a fill value
    (such as RoPE frequency divisors) is left out: the builder fills it.
    """
    from .. import codecs

    rng = np.random.default_rng(seed)
    td = TensorDict()
    for w in prog.weights:
        shape = tuple(int(d) for d in w.shape)
        if w.absent is not None and w.absent.kind == "fill":
            continue
        if len(shape) == 1:
            x = (1.0 + 0.1 * rng.standard_normal(shape)).astype(np.float32)
        else:
            x = (rng.standard_normal(shape) / np.sqrt(shape[-1])).astype(np.float32)
        enc = (w.encoding or "f32").lower()
        if enc in ("f32", "f16", "none"):
            td[w.name] = x
        else:
            e = codecs.get(enc)
            td[w.name] = QuantizedTensor(e.quantize(x), shape, e.name)
    return td


def _tokenizer_for(path: str, meta: dict):
    from .tokenizer import load_gguf_tokenizer, load_tokenizer

    if meta.get("maxdecl.format") == "gguf":
        if "tokenizer.ggml.tokens" not in meta:
            return None          # a GGUF of weights only
        return load_gguf_tokenizer(path, meta)
    folder = path if os.path.isdir(path) else os.path.dirname(os.path.abspath(path))
    for name in ("tokenizer.json", "tokenizer.bin", "tokenizer.gguf"):
        cand = os.path.join(folder, name)
        if os.path.exists(cand):
            return load_tokenizer(folder if name == "tokenizer.json" else cand)
    return None


def load_model(spec, weights=None, variant=None):
    """Returns (Session, tokenizer or None, note). ``weights``: path, TensorDict or None.

    With no weights, looks where ``maxdecl run`` looks (see ``run.default_weights``);
    when nothing is found, the spec's ``tiny`` variant runs on seeded random weights
    with a byte tokenizer, and ``note`` says so.
    """
    from ..builder import build
    from ..spec import Spec, load_spec
    from ..weights import load_weights
    from .generate import Session
    from .run import default_weights

    if not isinstance(spec, Spec):
        spec = load_spec(spec)
    note, tok = "", None
    path = weights if isinstance(weights, (str, os.PathLike)) else None
    if weights is None:
        path = default_weights(spec.name, spec.file)
        if path is None:
            name = variant or ("tiny" if "tiny" in spec.variants else spec.variant)
            spec = spec.with_variant(name)
            td = random_weights(spec.program(name))
            note = (f"[no weights found for {spec.name} (looked in models/{spec.name}/ and known "
                    f"sources): running the '{name}' variant on seeded random weights; the "
                    f"text is noise]")
            graph = build(spec, td, name)
            return Session(graph, td), ByteTokenizer(), note
    if path is not None:
        path = os.fspath(path)
        td = load_weights(path)
    else:
        td = weights
    meta = dict(getattr(td, "metadata", {}) or {})
    if variant:
        spec = spec.with_variant(variant)
    params = params_from_metadata(spec, meta)
    td = prepare_weights(spec, td, params)
    if path is not None:
        tok = _tokenizer_for(path, meta)
    try:
        graph = build(spec, td, spec.variant, params)
    except WeightsError as e:
        raise WeightsError(f"{path or 'weights'} do not fit {spec.file}: {e}") from None
    return Session(graph, td), tok, note
