"""Sampler semantics as llama.cpp: repeat penalty, min-p, top-p before the temperature."""

import numpy as np
import pytest

from maxdecl.pipelines.sampling import Sampler


def test_repeat_penalty_divides_positive_and_multiplies_negative_logits():
    s = Sampler(repeat_penalty=2.0)
    logits = np.array([4.0, -3.0, 1.0, 0.0, -1.0])
    out = s.penalize(logits.copy(), context=[0, 1, 1, 3])
    np.testing.assert_array_equal(out, [2.0, -6.0, 1.0, 0.0, -1.0])   # each id once
    np.testing.assert_array_equal(logits, [4.0, -3.0, 1.0, 0.0, -1.0])  # input untouched


def test_repeat_penalty_looks_at_the_last_n_tokens_only():
    s = Sampler(repeat_penalty=2.0, repeat_last_n=2)
    out = s.penalize(np.array([4.0, 4.0, 4.0]), context=[0, 1, 2, 2])
    np.testing.assert_array_equal(out, [4.0, 4.0, 2.0])
    everything = Sampler(repeat_penalty=2.0, repeat_last_n=-1)
    np.testing.assert_array_equal(everything.penalize(np.array([4.0, 4.0, 4.0]), [0, 1, 2, 2]),
                                  [2.0, 2.0, 2.0])
    off = Sampler(repeat_penalty=2.0, repeat_last_n=0)
    np.testing.assert_array_equal(off.penalize(np.array([4.0, 4.0]), [0, 1]), [4.0, 4.0])


def test_repeat_penalty_changes_the_greedy_choice():
    logits = np.array([3.0, 2.0, 0.5])
    assert Sampler()(logits, context=[0]) == 0
    assert Sampler(repeat_penalty=1.6)(logits, context=[0]) == 1     # 3 / 1.6 < 2
    assert Sampler(repeat_penalty=1.4)(logits, context=[0]) == 0     # 3 / 1.4 > 2


def test_min_p_drops_tokens_below_min_p_times_the_top_probability():
    p = np.array([0.5, 0.3, 0.12, 0.08])
    logits = np.log(p)
    s = Sampler(temperature=1.0, min_p=0.2, seed=3)                   # keeps p >= 0.1
    assert set(s(logits) for _ in range(3000)) == {0, 1, 2}
    s = Sampler(temperature=1.0, min_p=0.7, seed=3)                   # keeps p >= 0.35
    assert set(s(logits) for _ in range(500)) == {0}
    s = Sampler(temperature=1.0, min_p=0.0, seed=3)                   # off
    assert set(s(logits) for _ in range(3000)) == {0, 1, 2, 3}


def test_min_p_uses_probabilities_before_the_temperature():
    logits = np.log(np.array([0.5, 0.3, 0.2]))
    # at temperature 5 every token is likely, but min-p judges the untempered p
    s = Sampler(temperature=5.0, min_p=0.5, seed=0)                   # keeps p >= 0.25
    assert set(s(logits) for _ in range(2000)) == {0, 1}


def test_top_p_uses_probabilities_before_the_temperature():
    logits = np.log(np.array([0.6, 0.25, 0.1, 0.05]))
    s = Sampler(temperature=10.0, top_p=0.8, seed=0)
    draws = [s(logits) for _ in range(4000)]
    assert set(draws) == {0, 1}
    freq = np.bincount(draws, minlength=2)[:2] / len(draws)
    want = np.array([0.6, 0.25]) ** 0.1
    np.testing.assert_allclose(freq, want / want.sum(), atol=0.03)    # then the temperature


def test_seed_minus_one_draws_a_fresh_seed():
    a, b = Sampler(temperature=1.0, seed=-1), Sampler(temperature=1.0, seed=None)
    assert 0 <= a.seed < 2**64 and a.seed != b.seed
    assert Sampler(seed=2**64 - 1).seed == 2**64 - 1


@pytest.mark.parametrize("top_k,kept", [(1, {1}), (2, {1, 3}), (0, {0, 1, 2, 3})])
def test_top_k_keeps_the_k_largest_and_0_is_off(top_k, kept):
    logits = np.array([0.1, 2.0, -1.0, 1.9])
    s = Sampler(temperature=1.0, top_k=top_k, seed=0)
    assert set(s(logits) for _ in range(1000)) == kept
