"""``md.load_model``: a spec and its weights, built once, run many times (API.md 6c).

A ``Model`` holds the built graph with its bound weights, the resolved
hyperparameters and the tokenizer. Any spec runs as ``model(*inputs)``; a language
model (graph inputs ``tokens`` and ``positions``, output ``logits``) also has
``logits(ids)`` and ``generate(prompt)``. Every argument is checked by
``pipelines.params`` (``md.InputError`` when bad).
"""

from __future__ import annotations

import dataclasses
import numbers
import os

import numpy as np

from .errors import InputError, WeightsError
from .pipelines import params as checks
from .pipelines.generate import (GenerateOutput, GenerateRequest, Session, generate_ids,
                                 is_language_model)
from .pipelines.sampling import Sampler
from .pipelines.seq2seq import (Seq2SeqSession, decoder_start, is_encoder_decoder,
                                source_input)
from .runtime import compile as compile_graph

__all__ = ["Model", "load_model", "generate", "GenerateOutput"]

PREFILL_CHUNK = 256       # tokens per prefill step when progress is reported
BATCH_MAX = 8             # sequences a list of prompts decodes together


class Model:
    """A built model: ``.spec``, ``.params``, ``.tokenizer``, ``.note``, ``.graph``,
    ``.weights``, ``.source`` / ``.tokenizer_source`` (where weights and tokenizer came
    from), ``.context`` (the most tokens a sequence may hold, or None).

    Example::

        model = md.load_model("specs/gemma3.yaml")
        out = model.generate("Once upon a time", max_new_tokens=16)
        print(out.text, out.finish_reason)
    """

    def __init__(self, spec, graph, weights, params, tokenizer=None, note="", source="",
                 context=None, tokenizer_source="", activations=None):
        self.spec, self.graph, self.weights = spec, graph, weights
        self.params = dict(params)
        self.tokenizer, self.note, self.source = tokenizer, note, source
        self.tokenizer_source = tokenizer_source
        self.context = context
        # The one place the graph runs: planned, checked and bound once.
        self.compiled = compile_graph(graph, weights, activations=activations)
        self._run = self.compiled
        names = [v.name for v in graph.inputs]
        lm = is_language_model(names, graph.output_names) and _one_sequence_of_tokens(graph)
        self.session = Session(graph, self._run) if lm else None     # encoders: model(*inputs)
        self.encoder_decoder = not lm and is_encoder_decoder(names, graph.output_names)
        vocab = self.params.get("vocab")
        self.vocab = int(vocab) if isinstance(vocab, numbers.Integral) else getattr(tokenizer, "vocab_size",
                                                                       None)

    @property
    def input_names(self) -> list[str]:
        """The graph's input names, in the order ``model(*inputs)`` takes them."""
        return [v.name for v in self.graph.inputs]

    @property
    def output_names(self) -> list[str]:
        return list(self.graph.output_names)

    def __call__(self, *inputs) -> list[np.ndarray]:
        """Run the graph once on ``inputs`` (one array per graph input, in order)."""
        return self._run(*inputs)

    # -- language models ------------------------------------------------------------------

    def _lm(self) -> Session:
        if self.session is None and self.encoder_decoder:
            raise InputError(f"{self.spec.file}: an encoder-decoder: generate() and run "
                             f"drive it (one source at a time); logits() and batched steps "
                             f"are for decoder-only language models")
        if self.session is None:
            raise InputError(f"{self.spec.file}: not a language model (it needs graph inputs "
                             f"'tokens' ([seq] or [batch, seq]) and 'positions' and an output "
                             f"'logits', or, for an "
                             f"encoder-decoder, a source 'enc_tokens' (or one other 'enc_*') "
                             f"and 'dec_tokens'; every other input a state; inputs are "
                             f"{self.input_names}, outputs {self.output_names}): run it with "
                             "model(*inputs)")
        return self.session

    def logits(self, ids, last_only: bool = False) -> np.ndarray:
        """Logits of ``ids`` in one prefill from an empty cache (no state kept).

        Returns:
            float32 ``[len(ids), vocab]``, or ``[1, vocab]`` (the last position) with
            ``last_only``.

        Example::

            row = model.logits(model.tokenizer.encode("Hello"), last_only=True)[0]
        """
        session = self._lm()
        ids = checks.check_prompt(ids, self.vocab)
        if isinstance(ids, str):
            raise InputError("logits takes token ids; encode text with model.tokenizer first")
        if self.context is not None and len(ids) > self.context:
            raise InputError(f"logits of {len(ids)} tokens: more than the context of "
                             f"{self.context} tokens")
        out, _ = session.step(ids, 0, session.initial_state(), all_logits=not last_only)
        return np.ascontiguousarray(out, dtype=np.float32)

    def encode(self, prompt) -> list[int]:
        """A checked prompt's token ids (text gets BOS as the tokenizer adds it)."""
        prompt = checks.check_prompt(prompt, self.vocab)
        if isinstance(prompt, str):
            if self.tokenizer is None:
                raise InputError("a text prompt needs a tokenizer: pass tokenizer= to "
                                 "load_model, or give token ids")
            prompt = self.tokenizer.encode(prompt, add_bos=True)
            if not prompt:
                raise InputError("the prompt is empty (no tokens to start from)")
        return prompt

    def generate(self, prompt, max_new_tokens: int = 16, temperature: float = 0.0, top_k=None,
                 top_p=None, min_p=None, repeat_penalty: float = 1.0, stop=None, seed=0,
                 on_text=None, *, repeat_last_n: int = 64, truncate: bool = False,
                 on_prefill=None, lookup: int = 0, presence_penalty: float = 0.0,
                 frequency_penalty: float = 0.0, decoder_prompt=None):
        """Generate from one prompt or a list of prompts.

        Args:
            prompt: a str (BOS added as the tokenizer does), a list of token ids, or a
                list of those (a batch; each gets exactly what it would get alone).
            max_new_tokens: at most this many new tokens.
            temperature, top_k, top_p, min_p, repeat_penalty, repeat_last_n, seed,
                presence_penalty, frequency_penalty: as
                llama.cpp (see ``pipelines/sampling.py``); top_k 0 is off, seed -1 random.
            stop: a string or list of strings; the text ends before the first one.
            on_text: ``on_text(text)`` as text completes (``on_text(index, text)`` for a
                batch).
            truncate: when prompt + max_new_tokens exceed the context, keep the prompt's
                last tokens instead of raising ``InputError``.
            on_prefill: ``on_prefill(done, total)``: the prefill runs in chunks of
                ``PREFILL_CHUNK`` tokens and reports after each (one prompt).
            lookup: prompt lookup decoding (greedy only): draft up to ``lookup`` tokens
                from the n-grams of the context, verify them in one step; the ids are
                exactly those of plain greedy decoding. ``out.drafted`` /
                ``out.accepted`` count the drafts.
            decoder_prompt: encoder-decoders only: token ids (or text, no BOS added) the
                decoder reads after its ``decoder_start`` token before it generates, as
                transformers' ``forced_bos_token_id`` (mBART-50's target language) or a
                ``decoder_input_ids`` prefix (Whisper's task tokens); not in ``out.ids``.

        Returns:
            a ``GenerateOutput`` (``ids text finish_reason prompt_tokens prefill_s
            decode_s``), or a list of them, in order, for a list of prompts.

        Raises:
            InputError: a bad argument or a prompt that does not fit the context.
        """
        if not self.encoder_decoder:
            self._lm()
        sampling = checks.check_sampling(temperature, top_k, top_p, min_p, repeat_penalty,
                                         repeat_last_n, seed, presence_penalty,
                                         frequency_penalty)
        max_new_tokens = checks.check_max_new_tokens(max_new_tokens)
        stop = checks.check_stop(stop)
        truncate = checks.check_bool("truncate", truncate)
        if stop and self.tokenizer is None:
            raise InputError("stop strings need a tokenizer")
        prefix = self._decoder_prompt(decoder_prompt, max_new_tokens)
        if self.encoder_decoder and self._array_source():
            prompts, batch = _source_arrays(prompt)        # Whisper: spectrograms, not text
            checks.fit_source([], max_new_tokens, self.context, False)   # the decoder's room
            requests = [GenerateRequest(p, max_new_tokens, sampling, stop) for p in prompts]
        else:
            prompts, batch = checks.split_batch(prompt)
            fit = checks.fit_source if self.encoder_decoder else checks.fit_context
            requests = [GenerateRequest(fit(self.encode(p), max_new_tokens, self.context,
                                            truncate),
                                        max_new_tokens, sampling, stop) for p in prompts]
        lookup = checks.check_lookup(lookup)
        if lookup and sampling["temperature"] != 0:
            raise InputError("lookup decoding is greedy only: use temperature=0")
        emit = on_text if batch or on_text is None else (lambda k, text: on_text(text))
        if lookup and (self.encoder_decoder or self.session.stateless):
            raise InputError("lookup decoding is for decoder-only language models with a "
                             "KV cache (state inputs)")
        if self.encoder_decoder:
            outs = self._generate_seq2seq(requests, emit, prefix)
        elif (len(requests) == 1 or self.session.stateless) and not lookup:
            outs = self._generate_each(requests, emit, on_prefill)     # no cache: one by one
        else:
            outs = self._generate_batch(requests, emit, lookup)
        return outs if batch else outs[0]

    def _generate_batch(self, requests, on_text=None, lookup: int = 0):
        """Several requests (or one with prompt lookup) through continuous batching."""
        return _batch_outputs(self, requests, on_text, lookup)

    def _array_source(self) -> bool:
        """Whether this encoder-decoder's source is an array (not ``enc_tokens``): then
        ``maxdecl run`` runs the graph on ``--input`` arrays, ``generate`` takes arrays."""
        return source_input(self.input_names) != "enc_tokens"

    def _decoder_prompt(self, decoder_prompt, max_new_tokens: int) -> list[int]:
        """The checked ids of ``generate``'s ``decoder_prompt`` ([] for None)."""
        if decoder_prompt is None:
            return []
        if not self.encoder_decoder:
            raise InputError("decoder_prompt is for encoder-decoder specs (inputs enc_* and "
                             "dec_tokens); a language model's prompt is the prompt")
        ids = checks.check_prompt(decoder_prompt, self.vocab, "decoder_prompt")
        if isinstance(ids, str):
            if self.tokenizer is None:
                raise InputError("a text decoder_prompt needs a tokenizer; give token ids")
            ids = self.tokenizer.encode(ids, add_bos=False)
        if self.context is not None and len(ids) + max_new_tokens > self.context:
            raise InputError(f"decoder_prompt ({len(ids)} tokens) and max_new_tokens "
                             f"{max_new_tokens} exceed the decoder's context of "
                             f"{self.context} tokens")
        return list(ids)

    def _generate_seq2seq(self, requests, on_text=None, prefix=()) -> list[GenerateOutput]:
        """Encoder-decoder generation: each source through the encoder, the decoder from
        the spec's ``decoder_start`` token and then ``prefix``, one sequence at a time."""
        start = [decoder_start(self.params, self.spec.name), *prefix]
        outs = []
        for k, r in enumerate(requests):
            emit = None if on_text is None else (lambda text, k=k: on_text(k, text))
            session = Seq2SeqSession(self.graph, self._run, r.ids)
            out = generate_ids(session, self.tokenizer, start, r.max_new_tokens,
                               Sampler(**r.sampling), on_text=emit, stop=r.stop)
            array = isinstance(r.ids, np.ndarray)
            outs.append(dataclasses.replace(out, prompt_tokens=len(r.ids),
                                            prompt_ids=[] if array else list(r.ids)))
        return outs

    def _generate_each(self, requests, on_text=None, on_prefill=None) -> list[GenerateOutput]:
        """One request through the plain loop (chunked prefill with progress)."""
        outs = []
        for k, r in enumerate(requests):
            emit = None if on_text is None else (lambda text, k=k: on_text(k, text))
            outs.append(generate_ids(self._lm(), self.tokenizer, r.ids, r.max_new_tokens,
                                     Sampler(**r.sampling), on_text=emit, stop=r.stop,
                                     prefill_chunk=PREFILL_CHUNK if on_prefill else None,
                                     on_prefill=on_prefill))
        return outs


def _batch_outputs(model, requests, on_text, lookup):
    """``requests`` decoded together (continuous batching, ``BATCH_MAX`` at a time):
    each gets exactly the ids it gets alone (greedy), text streamed per sequence."""
    from .pipelines.batching import BatchRunner, Request
    from .pipelines.compile_timer import CompileTimer
    from .pipelines.textstream import TextStream

    tok = model.tokenizer
    eos = frozenset(getattr(tok, "eos_ids", ()) or ())
    runner = BatchRunner(model.compiled, max_batch=min(len(requests), BATCH_MAX))
    if lookup and not runner.can_lookup:
        raise InputError(f"{model.spec.name}: lookup decoding needs KV-cache states "
                         "(every state growing along the sequence)")
    items = []
    for k, g in enumerate(requests):
        sampler = Sampler(**g.sampling)
        text = None if tok is None else TextStream(
            tok, g.stop, None if on_text is None else (lambda t, k=k: on_text(k, t)))
        req = Request(list(g.ids), None, g.max_new_tokens, eos,
                      None if text is None else text.push, lookup=lookup)
        req.sample = (lambda row, req=req, s=sampler: s(row, req.prompt + req.ids))
        items.append((req, text))
    with CompileTimer() as ct:
        runner.run([r for r, _ in items])
    outs = []
    for req, text in items:
        body = text.finish() if text is not None else ""
        reason = "stop" if text is not None and text.stopped else req.finish_reason
        out = GenerateOutput(list(req.ids), body, reason, len(req.prompt), req.prefill_s,
                             req.decode_s, ct.seconds, list(req.prompt))
        out.drafted, out.accepted = req.drafted, req.accepted
        outs.append(out)
    return outs


def _one_sequence_of_tokens(graph) -> bool:
    """Whether the ``tokens`` input holds one sequence a step: ``[seq]``, or
    ``[batch, seq]`` with a plain batch dim (``[codebooks*batch, seq]`` is not)."""
    shape = next(v.type.shape for v in graph.inputs if v.name == "tokens")
    return len(shape) == 1 or (len(shape) == 2 and (
        shape[0] == 1 or (isinstance(shape[0], str) and shape[0].isidentifier())))


def load_model(spec, weights=None, variant=None, tokenizer=None, ctx_size=None,
               activations=None) -> Model:
    """Load ``spec`` with its weights and build it once.

    Args:
        spec: a spec path or a ``Spec``.
        weights: a path (GGUF, safetensors, HF dir, llama2.c .bin, maxdecl checkpoint),
            a TensorDict, or None: ``models/<spec name>/`` and the known sources
            (``weights.sources``); when nothing is found the spec's ``tiny`` variant
            (else its default) runs on seeded random weights and ``model.note`` says so.
        variant: the variant to select (weights' metadata still overrides its values).
        tokenizer: a tokenizer path or object (``encode``/``decode``) replacing the one
            that comes with the weights.
        ctx_size: the context to enforce (None or 0: the model's ``context``).
        activations: "f32" (exact) or "q8" (decode matmuls on int8-rounded x, as
            llama.cpp; faster, not bit-identical); None: ``MAXDECL_ACTIVATIONS``, else
            "f32" (see ``md.compile``).

    Returns:
        a ``Model``.

    Raises:
        InputError: bad arguments. SpecError / WeightsError / GraphError: the spec, the
        weights, or the two together are wrong.

    Example::

        model = md.load_model("specs/gemma3.yaml", weights="gemma-3-270m.gguf")
        model.params["n_layers"]      # 18
    """
    from .builder import build
    from .pipelines.model_loading import open_weights
    from .spec import Spec, load_spec
    from .spec.semantic import variant_env
    from .weights.sources import default_weights

    checks.check_spec_arg(spec)
    checks.check_variant(variant)
    checks.check_weights_arg(weights)
    checks.check_tokenizer_arg(tokenizer)
    checks.check_activations(activations)
    if not isinstance(spec, Spec):
        spec = load_spec(spec)
    note, tok, params = "", None, {}
    if weights is None:
        weights = default_weights(spec.name, spec.file)
    if weights is None:
        from .pipelines.tokenizer_bytes import ByteTokenizer
        from .weights.random import program_weights

        name = variant or ("tiny" if "tiny" in spec.variants else spec.variant)
        spec = spec.with_variant(name)
        prog = spec.program(name)
        td = program_weights(prog)
        ins = [p.name for p in prog.inputs]
        outs = [o if isinstance(o, str) else o[0] for o in prog.outputs]
        is_lm = is_language_model(ins, outs) or is_encoder_decoder(ins, outs)
        tok = ByteTokenizer() if is_lm else None
        tok_source = "random weights (bytes)" if is_lm else ""
        note = (f"[no weights found for {spec.name} (looked in models/{spec.name}/ and known "
                f"sources): running the '{name}' variant on seeded random weights; the "
                f"{'text is' if is_lm else 'outputs are'} noise]")
        source = "seeded random weights"
    else:
        spec, td, params, tok = open_weights(spec, weights, variant)
        tok_source = "the weights" if tok is not None else ""
        source = os.fspath(weights) if isinstance(weights, (str, os.PathLike)) else "TensorDict"
    try:
        graph = build(spec, td, spec.variant, params)
    except WeightsError as e:
        why = str(e).removeprefix(f"{spec.file}: ")       # the file is named once
        raise WeightsError(f"the weights from {source} do not fit {spec.file}: {why}") from None
    full, _ = variant_env(spec, spec.variant, params)     # what build unrolled with
    if tokenizer is not None:
        if isinstance(tokenizer, (str, os.PathLike)):
            from .pipelines.tokenizer_embed import load_tokenizer

            tok, tok_source = load_tokenizer(tokenizer), os.fspath(tokenizer)
        else:
            tok, tok_source = tokenizer, "the tokenizer= argument"
    model_ctx = full.get("context")
    context = checks.check_ctx_size(ctx_size, model_ctx if isinstance(model_ctx, int) else None)
    from .kernels import compiler_pages
    compiler_pages.release()          # what importing and loading touched in the compiler
    return Model(spec, graph, td, full, tok, note, source, context, tok_source, activations)


def generate(spec, weights, prompt, max_new_tokens: int = 16, temperature: float = 0.0,
             top_k=None, top_p=None, seed=0, variant=None, tokenizer=None, on_text=None,
             **kwargs):
    """``md.load_model(spec, weights, variant, tokenizer).generate(prompt, ...)``.

    Example::

        out = md.generate("specs/gemma3.yaml", path, "The capital of France is",
                          max_new_tokens=8)
        print(out.text)
    """
    model = load_model(spec, weights, variant, tokenizer)
    return model.generate(prompt, max_new_tokens, temperature, top_k, top_p, seed=seed,
                          on_text=on_text, **kwargs)


def _source_arrays(prompt) -> tuple[list, bool]:
    """(sources, batch) of an encoder-decoder whose source is an array: one ndarray, or
    a list of them (a batch, decoded one after another)."""
    if isinstance(prompt, np.ndarray):
        return [prompt], False
    if isinstance(prompt, (list, tuple)) and prompt and all(
            isinstance(p, np.ndarray) for p in prompt):
        return list(prompt), True
    raise InputError(f"this encoder-decoder's source is an array (its encoder input is not "
                     f"token ids): give a numpy array or a list of them, got "
                     f"{type(prompt).__name__}")
