"""CompiledGraph.fixed: the steps that read only some inputs (an encoder's source) run once
per value of those inputs; every output is the plain run's, bit for bit."""

from pathlib import Path

import numpy as np
import pytest

import maxdecl as md
from maxdecl.errors import GraphError
from maxdecl.weights.random import program_weights

SPECS = Path(__file__).resolve().parents[1] / "specs"


@pytest.fixture(scope="module")
def t5():
    spec = md.load_spec(SPECS / "t5.yaml", "tiny")
    td = program_weights(spec.program("tiny"), seed=5)
    return md.compile(md.build(spec, weights=td), td)


def _feed(run, src, dec, state=None, start=0):
    """Inputs: the source, decoder ids at ``start``.., the states (empty by default)."""
    feed = {"enc_tokens": np.array(src), "enc_positions": np.arange(len(src)),
            "dec_tokens": np.array(dec), "dec_positions": np.arange(start, start + len(dec))}
    for v, t in zip(run._inputs, run.input_types):
        if v.name not in feed:
            feed[v.name] = (state[v.name] if state else
                            np.zeros([0 if isinstance(d, str) else d for d in t.shape],
                                     t.dtype.numpy))
    return [feed[n] for n in run.input_names]


def _state(run, outs):
    return {n: o for n, o in zip(run.output_names, outs) if n in run.input_names}


def _bits(a, b):
    assert len(a) == len(b)
    for x, y in zip(a, b):
        assert x.dtype == y.dtype and x.shape == y.shape and x.tobytes() == y.tobytes()


def test_encoder_runs_once_per_source(t5):
    run = t5.fixed(["enc_tokens", "enc_positions"])
    src = [4, 9, 2, 7, 7, 1]
    first = run(*_feed(t5, src, [0]))
    kept = run.values
    assert kept is not None and len(kept) > 0          # the encoder's results are kept
    _bits(first, t5(*_feed(t5, src, [0])))
    state = _state(t5, first)
    for pos, tok in enumerate([5, 3, 8], start=1):    # decoder steps: same source
        got = run(*_feed(t5, src, [tok], state, pos))
        _bits(got, t5(*_feed(t5, src, [tok], state, pos)))
        assert run.values is kept                      # not recomputed
        state = _state(t5, got)
    other = [4, 9, 2, 7, 7, 2]                         # a new source: computed again
    _bits(run(*_feed(t5, other, [0, 5])), t5(*_feed(t5, other, [0, 5])))
    assert run.values is not kept


def test_fixed_input_changed_in_place_is_seen(t5):
    run = t5.fixed("enc_tokens")
    src = np.array([3, 1, 4, 1, 5])
    run(*_feed(t5, src, [0]))
    src[0] = 9                                         # the caller's array, mutated
    _bits(run(*_feed(t5, src, [0])), t5(*_feed(t5, src, [0])))


def test_unknown_fixed_input_is_refused(t5):
    with pytest.raises(GraphError, match="no input named 'enc_ids'"):
        t5.fixed(["enc_ids"])


def test_failed_run_keeps_nothing(t5):
    run = t5.fixed(["enc_tokens", "enc_positions"])
    with pytest.raises(GraphError):
        run(*_feed(t5, [4, 9, 10 ** 6], [0]))        # a token id past the vocabulary
    assert run.values is None
    _bits(run(*_feed(t5, [4, 9], [0])), t5(*_feed(t5, [4, 9], [0])))
