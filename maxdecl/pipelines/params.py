"""Run-time arguments checked in one place, for the CLI, the Python API and the server.

Every check raises ``md.InputError`` (a ``MaxdeclError``) with a one-line message that
names the argument, what it must be and what it got; the CLI prints it and exits 2.
This module imports neither NumPy nor numba, so the CLI checks before loading anything.

=================  ===========================================================================
argument           accepted
=================  ===========================================================================
temperature        a finite number >= 0; 0 is greedy
top_k              None or 0 (off, as llama.cpp), or an int >= 1
top_p              None, or a number in (0, 1]; 1 is off
min_p              None, or a number in [0, 1]; 0 is off
repeat_penalty     a finite number > 0; 1 is off
repeat_last_n      an int >= -1: how many recent tokens the penalty looks at (-1: all, 0: off)
seed               an int in [0, 2**64), or -1 / None for a fresh random seed (llama.cpp's -1)
max_new_tokens     an int in [0, MAX_NEW_TOKENS]
threads            an int in [1, the number of CPUs numba may use]
ctx_size           None or 0 (the model's context), or an int in [1, the model's context]
prompt             a str (valid Unicode: no lone surrogates) or a list of ints in [0, vocab);
                   a batch is a non-empty list of those; ``bytes`` and None are rejected
stop               None, a non-empty str, or a list of at most MAX_STOP non-empty strs
spec               a ``Spec`` or the path of an existing file; variant: None or a str
weights            None, a path (str / os.PathLike) or a ``md.TensorDict``
tokenizer          None, a path, or an object with ``encode`` and ``decode``
=================  ===========================================================================

A prompt plus ``max_new_tokens`` longer than the context is an error unless
``truncate=True``: then the prompt keeps its last ``context - max_new_tokens`` tokens.
"""

from __future__ import annotations

import math
import numbers
import os

from ..errors import InputError

MAX_NEW_TOKENS = 1 << 20        # far beyond any context this runs; stops 2**70 at once
MAX_STOP = 16                   # stop strings per request
MAX_SEED = 1 << 64


def _is_int(x) -> bool:
    return isinstance(x, numbers.Integral) and not isinstance(x, bool)


def _is_real(x) -> bool:
    return isinstance(x, numbers.Real) and not isinstance(x, bool)


def _got(x) -> str:
    text = repr(x)
    return text if len(text) <= 40 else text[:37] + "..."


def check_int(name: str, x, lo: int, hi: int | None = None) -> int:
    """``x`` as an int in ``[lo, hi]`` (``hi`` None: no upper bound)."""
    if not _is_int(x):
        raise InputError(f"{name} must be an integer, got {_got(x)}")
    x = int(x)
    if x < lo or (hi is not None and x > hi):
        bound = f">= {lo}" if hi is None else f"in [{lo}, {hi}]"
        raise InputError(f"{name} must be {bound}, got {x}")
    return x


def check_real(name: str, x, lo: float, hi: float | None = None, *, lo_open=False) -> float:
    """``x`` as a finite float with ``lo <= x`` (``lo < x`` if ``lo_open``) and ``x <= hi``."""
    if not _is_real(x):
        raise InputError(f"{name} must be a number, got {_got(x)}")
    x = float(x)
    if not math.isfinite(x):
        raise InputError(f"{name} must be finite, got {x}")
    if (x <= lo if lo_open else x < lo) or (hi is not None and x > hi):
        left = "(" if lo_open else "["
        bound = (f"{'>' if lo_open else '>='} {lo:g}" if hi is None
                 else f"in {left}{lo:g}, {hi:g}]")
        raise InputError(f"{name} must be {bound}, got {x:g}")
    return x


def check_sampling(temperature=0.0, top_k=None, top_p=None, min_p=None, repeat_penalty=1.0,
                   repeat_last_n=64, seed=0, presence_penalty=0.0,
                   frequency_penalty=0.0) -> dict:
    """The sampling arguments, checked and normalised (top_k 0 -> None, seed -1 -> None).

    Returns a dict of the same keys; ``seed`` None means "draw a fresh random seed".
    """
    out = {"temperature": check_real("temperature", temperature, 0.0)}
    out["top_k"] = None if top_k is None else check_int("top_k", top_k, 0) or None
    out["top_p"] = None if top_p is None else check_real("top_p", top_p, 0.0, 1.0, lo_open=True)
    out["min_p"] = None if min_p is None else check_real("min_p", min_p, 0.0, 1.0)
    out["repeat_penalty"] = check_real("repeat_penalty", repeat_penalty, 0.0, lo_open=True)
    out["repeat_last_n"] = check_int("repeat_last_n", repeat_last_n, -1)
    out["presence_penalty"] = check_real("presence_penalty", presence_penalty, -2.0, 2.0)
    out["frequency_penalty"] = check_real("frequency_penalty", frequency_penalty, -2.0, 2.0)
    if seed is None:
        out["seed"] = None
    elif _is_int(seed) and int(seed) == -1:
        out["seed"] = None
    else:
        out["seed"] = check_int("seed", seed, 0, MAX_SEED - 1)
    return out


def check_bool(name: str, x) -> bool:
    """``x`` as a bool (True/False only: ``"yes"`` or 1 are not flags)."""
    if isinstance(x, bool) or type(x).__name__ == "bool_":
        return bool(x)
    raise InputError(f"{name} must be True or False, got {_got(x)}")


def check_max_new_tokens(n) -> int:
    """``max_new_tokens``: an int in [0, MAX_NEW_TOKENS] (``bool``, 1.5, 2**70 rejected)."""
    return check_int("max_new_tokens", n, 0, MAX_NEW_TOKENS)


MAX_LOOKUP = 15          # draft tokens per step (a verify step stays within 16 rows)


def check_lookup(n) -> int:
    """``lookup``: draft tokens per step for prompt lookup decoding, 0 (off) to 15."""
    return 0 if n is None else check_int("lookup", n, 0, MAX_LOOKUP)


def max_threads() -> int:
    """The most threads numba's pool has here (``NUMBA_NUM_THREADS``, else the CPU count)."""
    env = os.environ.get("NUMBA_NUM_THREADS", "")
    if env.isdigit() and int(env) > 0:
        return int(env)
    return os.cpu_count() or 1


def check_threads(n) -> int | None:
    """``threads``: None (numba's default) or an int in [1, ``max_threads()``]."""
    return None if n is None else check_int("threads", n, 1, max_threads())


def check_activations(value) -> None:
    """``activations``: None, "f32" or "q8" (``md.compile``)."""
    if value is not None and value not in ("f32", "q8"):
        raise InputError(f"activations must be 'f32' or 'q8', got {_got(value)}")


def check_ctx_size(n, model_context: int | None) -> int | None:
    """The context to enforce: ``n`` (None/0: the model's), at most the model's own."""
    if n is None or (_is_int(n) and int(n) == 0):
        return model_context
    n = check_int("ctx_size", n, 1, model_context)
    return n


def check_stop(stop) -> tuple[str, ...]:
    """``stop``: None, a str or a list of strs -> a tuple of non-empty strings."""
    if stop is None:
        return ()
    items = [stop] if isinstance(stop, str) else stop
    if not isinstance(items, (list, tuple)) or len(items) > MAX_STOP:
        raise InputError(f"stop must be a string or a list of at most {MAX_STOP} strings, "
                         f"got {_got(stop)}")
    for s in items:
        if not isinstance(s, str) or not s:
            raise InputError(f"stop strings must be non-empty strings, got {_got(s)}")
        _check_unicode("stop", s)
    return tuple(items)


def _check_unicode(name: str, text: str) -> None:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as e:
        raise InputError(f"{name} is not valid Unicode: {e.reason} at character "
                         f"{e.start}") from None


def check_prompt(prompt, vocab: int | None, name: str = "prompt"):
    """One prompt (``name`` in errors): a str (valid Unicode) or a list of token ids in
    [0, vocab).

    Returns the str, or the ids as a list of Python ints.
    """
    if isinstance(prompt, str):
        _check_unicode(name, prompt)
        return prompt
    if isinstance(prompt, (bytes, bytearray, memoryview)):
        raise InputError(f"{name} must be a str or a list of token ids, got bytes "
                         "(decode it to str first)")
    if not _is_sequence(prompt):
        raise InputError(f"{name} must be a str or a list of token ids, got {_got(prompt)}")
    ids = []
    for k, t in enumerate(prompt):
        if not _is_int(t):
            raise InputError(f"{name} token {k} must be an int token id, got {_got(t)}")
        t = int(t)
        if t < 0 or (vocab is not None and t >= vocab):
            raise InputError(f"{name} token {k} is {t}: token ids must be in [0, {vocab})")
        ids.append(t)
    if not ids:
        raise InputError(f"{name} is an empty list of token ids")
    return ids


def split_batch(prompt) -> tuple[list, bool]:
    """``(prompts, is_batch)``: a list of strs / of id lists is a batch, anything else one
    prompt (each checked later by ``check_prompt``)."""
    if not _is_sequence(prompt):
        return [prompt], False
    if len(prompt) == 0:
        raise InputError("prompt is an empty list")
    nested = [isinstance(p, str) or _is_sequence(p) for p in prompt]
    if not any(nested):
        return [prompt], False
    if not all(nested):
        k = nested.index(False)
        raise InputError(f"a list of prompts holds strs or lists of token ids; item {k} is "
                         f"{_got(prompt[k])}")
    return list(prompt), True


def _is_sequence(x) -> bool:
    if isinstance(x, (list, tuple)):
        return True
    shape = getattr(x, "shape", None)          # a 1-D NumPy array of ids
    return isinstance(shape, tuple) and len(shape) == 1 and hasattr(x, "tolist")


def fit_context(ids: list, max_new_tokens: int, context: int | None, truncate: bool) -> list:
    """``ids`` checked against the context: prompt + max_new_tokens must fit, or with
    ``truncate`` the prompt keeps its last ``context - max_new_tokens`` tokens."""
    if context is None or len(ids) + max_new_tokens <= context:
        return ids
    if truncate and max_new_tokens < context:
        return ids[len(ids) + max_new_tokens - context:]
    if max_new_tokens >= context:
        raise InputError(f"max_new_tokens {max_new_tokens} leaves no room for the prompt in "
                         f"the context of {context} tokens")
    raise InputError(f"the prompt ({len(ids)} tokens) plus max_new_tokens ({max_new_tokens}) "
                     f"exceeds the context of {context} tokens; shorten it or pass "
                     "truncate=True (--truncate) to keep its last tokens")


def fit_source(ids: list, max_new_tokens: int, context: int | None, truncate: bool) -> list:
    """An encoder-decoder's source ``ids`` checked against the context: the encoder's
    positions and the decoder's are counted apart, so the source fits on its own (with
    ``truncate``: keeps its last ``context`` tokens) and so do the new tokens."""
    if context is None:
        return ids
    if max_new_tokens > context:
        raise InputError(f"max_new_tokens {max_new_tokens} exceeds the decoder's context of "
                         f"{context} tokens")
    if len(ids) <= context:
        return ids
    if truncate:
        return ids[len(ids) - context:]
    raise InputError(f"the source ({len(ids)} tokens) exceeds the encoder's context of "
                     f"{context} tokens; shorten it or pass truncate=True (--truncate) to "
                     "keep its last tokens")


def check_spec_arg(spec):
    """``spec``: a ``Spec`` or the path of an existing file (returned as given)."""
    from ..spec import Spec

    if isinstance(spec, Spec):
        return spec
    if not isinstance(spec, (str, os.PathLike)):
        raise InputError(f"spec must be a path or a md.load_spec() Spec, got "
                         f"{type(spec).__name__}")
    if not os.path.isfile(spec):
        raise InputError(f"spec {os.fspath(spec)}: no such file")
    return spec


def check_variant(variant):
    """``variant``: None or a str (whether the spec has it is the spec's check)."""
    if variant is None or isinstance(variant, str):
        return variant
    raise InputError(f"variant must be a variant name (str), got {_got(variant)}")


def check_weights_arg(weights):
    """``weights``: None, a path or a TensorDict (returned as given)."""
    from ..tensors import TensorDict

    if weights is None or isinstance(weights, (str, os.PathLike, TensorDict)):
        return weights
    raise InputError(f"weights must be a path, a md.TensorDict or None, got "
                     f"{type(weights).__name__}")


def check_tokenizer_arg(tokenizer):
    """``tokenizer``: None, a path, or an object with ``encode`` and ``decode``."""
    if tokenizer is None or isinstance(tokenizer, (str, os.PathLike)):
        return tokenizer
    if callable(getattr(tokenizer, "encode", None)) and callable(getattr(tokenizer, "decode",
                                                                         None)):
        return tokenizer
    raise InputError(f"tokenizer must be a path or an object with encode() and decode(), got "
                     f"{type(tokenizer).__name__}")
