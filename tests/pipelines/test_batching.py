"""Continuous batching: several sequences through one compiled graph give exactly the
greedy ids (and logits) each gets alone; finished sequences free their slot."""

import numpy as np
import pytest

import maxdecl as md
from maxdecl.pipelines.batching import BatchRunner, Request
from maxdecl.weights.random import program_weights
from maxdecl.runtime import PerSequence
from pathlib import Path

SPECS = Path(__file__).resolve().parents[2] / "specs"


@pytest.fixture(scope="module", params=["llama3", "gemma3", "mixtral", "qwen3_moe", "mamba"])
def compiled(request):
    spec = md.load_spec(SPECS / f"{request.param}.yaml", "tiny")
    td = program_weights(spec.program("tiny"), seed=3)
    return md.compile(md.build(spec, weights=td), td)


def greedy(row):
    return int(np.argmax(row))


def solo(compiled, prompt, n):
    runner = BatchRunner(compiled, max_batch=1)
    (r,) = runner.run([Request(list(prompt), greedy, n)])
    return r.ids


def test_batched_greedy_equals_solo(compiled):
    rng = np.random.default_rng(0)
    prompts = [list(map(int, rng.integers(1, 250, n))) for n in (5, 1, 9, 3, 12, 2)]
    alone = [solo(compiled, p, 8) for p in prompts]
    runner = BatchRunner(compiled, max_batch=4)           # 6 requests, 4 slots: some wait
    together = runner.run([Request(p, greedy, 8) for p in prompts])
    assert [r.ids for r in together] == alone
    assert all(r.finish_reason == "length" and len(r.ids) == 8 for r in together)


def test_runner_reports_waiting_and_decoding(compiled):
    """One request joins per step while slots are free; finished ones leave."""
    runner = BatchRunner(compiled, max_batch=2)
    for n in (3, 2, 1):
        runner.add(Request([5, 7, 9][:n], greedy, 10))
    assert (runner.waiting, runner.decoding) == (3, 0)
    seen = []
    while runner.busy:
        runner.step()
        seen.append((runner.waiting, runner.decoding))
    assert seen[:2] == [(2, 1), (1, 2)] and seen[-1] == (0, 0)
    assert max(d for _, d in seen) == 2


def test_batched_logits_are_bit_identical_to_one_sequence(compiled):
    """One decode step of three sequences against each alone, through the graph."""
    runner = BatchRunner(compiled)
    names = compiled.input_names
    seqs = [[5, 9, 2], [7], [1, 2, 3, 4]]
    states, lasts = [], []
    for p in seqs:
        feed = {"tokens": np.array(p), "positions": np.arange(len(p)),
                "logit_rows": np.array([len(p) - 1]),
                **{k: PerSequence([v]) for k, v in runner.zero_state().items()}}
        outs = compiled(*(feed[n] for n in names), rows=[len(p)])
        states.append({k: outs[compiled.output_names.index(k)][0] for k in runner._states})
    alone = []
    for p, st in zip(seqs, states):
        feed = {"tokens": np.array([11]), "positions": np.array([len(p)]),
                "logit_rows": np.array([0]), **st}
        alone.append(compiled(*(feed[n] for n in names))[compiled.output_names.index("logits")])
    feed = {"tokens": np.array([11, 11, 11]), "positions": np.array([len(p) for p in seqs]),
            "logit_rows": np.arange(3),
            **{k: PerSequence(st[k] for st in states) for k in runner._states}}
    batch = compiled(*(feed[n] for n in names), rows=[1, 1, 1])
    logits = batch[compiled.output_names.index("logits")]
    for j in range(3):
        assert logits[j].tobytes() == alone[j][0].tobytes()


def test_stop_ids_and_on_token_finish_a_sequence(compiled):
    first = solo(compiled, [3, 4, 5], 6)
    # stop at the first new id after the start (or at the very first one when a random
    # model repeats a single id)
    k = next((k for k in range(1, 6) if first[k] not in first[:k]), 0)
    runner = BatchRunner(compiled)
    stopped, long = runner.run([Request([3, 4, 5], greedy, 6, stop_ids=frozenset({first[k]})),
                                Request([3, 4, 5], greedy, 6, on_token=lambda i: True)])
    assert stopped.ids == first[:k] and stopped.finish_reason == "stop"
    assert long.ids == first[:1] and long.finish_reason == "stop"


def test_bad_batches_are_clean_errors(compiled):
    with pytest.raises(md.MaxdeclError, match="max_batch"):
        BatchRunner(compiled, max_batch=0)
    with pytest.raises(md.MaxdeclError, match="empty"):
        BatchRunner(compiled).run([Request([], greedy, 3)])
    names = compiled.input_names
    feed = {"tokens": np.array([1, 2]), "positions": np.arange(2), "logit_rows": np.array([1]),
            **{k: PerSequence([v]) for k, v in BatchRunner(compiled).zero_state().items()}}
    with pytest.raises(md.GraphError, match="rows"):
        compiled(*(feed[n] for n in names), rows=[3])
    with pytest.raises(md.GraphError, match="arrays for 2 sequences"):
        compiled(*(feed[n] for n in names), rows=[1, 1])


def test_propose_draft_follows_the_latest_matching_ngram():
    from maxdecl.pipelines.batching import propose_draft

    assert propose_draft([1, 2, 3, 9, 1, 2, 3, 4, 1, 2], 3) == [3, 4, 1]
    assert propose_draft([5, 6, 7], 3) == []
    assert propose_draft([1, 2, 1], 2) == [2, 1]
    assert propose_draft([1, 2, 1], 0) == []


@pytest.mark.parametrize("lookup", [1, 3, 8])
def test_prompt_lookup_gives_exactly_the_plain_greedy_ids(compiled, lookup):
    if not BatchRunner(compiled).can_lookup:        # a recurrent state cannot be cut back
        with pytest.raises(md.MaxdeclError, match="grow along the sequence"):
            BatchRunner(compiled).run([Request([1, 2, 1, 2], greedy, 4, lookup=lookup)])
        return
    rng = np.random.default_rng(1)
    base = list(map(int, rng.integers(1, 250, 6)))
    prompts = [base * 3, base[:4] * 4 + [9], [7, 8, 9]]       # repetitive: drafts get used
    alone = [solo(compiled, p, 12) for p in prompts]
    runner = BatchRunner(compiled, max_batch=3)
    got = runner.run([Request(p, greedy, 12, lookup=lookup) for p in prompts])
    assert [r.ids for r in got] == alone
    assert sum(r.drafted for r in got) > 0
    assert all(0 <= r.accepted <= r.drafted for r in got)


def test_a_state_read_by_another_op_is_refused_by_name_in_a_batched_run():
    """In a batched run a state is one array per sequence: a graph that also reads its
    KV cache with a plain op (a reshape, for the shape) gets a GraphError naming the node
    and the state, not an AttributeError from inside the op."""
    g = md.Graph("s", [md.TensorType("float32", ("seq", 2, 4)),
                       md.TensorType("float32", (2, "past", 2, 4))],
                 input_names=["x", "kv_cache"])
    with g.layer("attn"):
        y, cache = md.ops.attention(*(g.inputs[0],) * 3, g.inputs[1])
        peek = md.ops.reshape(g.inputs[1], shape=[-1])
    g.output(y, cache, peek)
    c = md.compile(g)
    x = np.ones((2, 2, 4), np.float32)
    caches = PerSequence([np.zeros((2, 0, 2, 4), np.float32)] * 2)
    with pytest.raises(md.GraphError, match=r"attn: reshape: reads the state 'kv_cache'"):
        c(x, caches, rows=[1, 1])
    assert len(c(x, np.zeros((2, 0, 2, 4), np.float32))) == 3      # one sequence: fine


def test_a_state_read_by_plain_ops_decodes_each_sequence_alone_with_the_same_ids():
    """A recurrent state updated by plain ops (``add``) cannot be one array per sequence
    in one call: the runner runs each sequence of a step through the graph in turn, and
    greedy ids equal a plain loop's."""
    v = 16
    table = np.random.default_rng(5).standard_normal((v, v)).astype(np.float32)
    g = md.Graph("acc", [md.TensorType("int64", ("seq",)), md.TensorType("int64", ("seq",)),
                         md.TensorType("int64", ("rows",)), md.TensorType("float32", (1, v))],
                 input_names=["tokens", "positions", "logit_rows", "acc"])
    tokens, _, rows, acc = g.inputs
    e = md.ops.embedding(g.constant(table), tokens)
    acc_new = md.ops.add(acc, md.ops.mul(md.ops.sum(e, axis=0, keepdims=True), 0.5))
    logits = md.ops.gather(md.ops.add(e, md.ops.neg(acc_new)), rows, axis=0)
    g.output([logits, acc_new], names=["logits", "acc"])
    compiled = md.compile(g)

    def loop(prompt, n):
        ids, state, pos = list(prompt), np.zeros((1, v), np.float32), 0
        feed = list(prompt)
        while len(ids) < len(prompt) + n:
            out, state = compiled(np.array(feed), np.arange(pos, pos + len(feed)),
                                  np.array([len(feed) - 1]), state)
            pos += len(feed)
            feed = [int(np.argmax(out[0]))]
            ids.append(feed[0])
        return ids[len(prompt):]

    prompts = [[1, 2, 3], [4], [5, 6, 7, 8, 9]]
    runner = BatchRunner(compiled, max_batch=3)
    assert runner.per_sequence
    got = runner.run([Request(p, greedy, 6) for p in prompts])
    assert [r.ids for r in got] == [loop(p, 6) for p in prompts]


def test_a_graph_that_fails_batched_falls_back_to_each_sequence_alone():
    """A masked_attention whose mask follows the step's rows cannot be cut per sequence:
    the first batched call fails, and the runner runs each sequence alone from then on,
    with the ids of a plain loop."""
    v, d = 12, 8
    rng = np.random.default_rng(9)
    table = rng.standard_normal((v, d)).astype(np.float32)
    head = rng.standard_normal((v, d)).astype(np.float32)
    g = md.Graph("masked", [md.TensorType("int64", ("seq",)), md.TensorType("int64", ("seq",)),
                            md.TensorType("float32", (2, "past", 1, d))],
                 input_names=["tokens", "positions", "kv_cache"])
    tokens, positions, cache = g.inputs
    x = md.ops.reshape(md.ops.embedding(g.constant(table), tokens), [-1, 1, d])
    bias = md.ops.mul(md.ops.cast(md.ops.reshape(positions, [1, -1, 1]), "float32"), 0.01)
    a, cache_new = md.ops.masked_attention(x, x, x, bias, cache)
    logits = md.ops.linear(md.ops.reshape(a, [-1, d]), g.constant(head))
    g.output([logits, cache_new], names=["logits", "kv_cache"])
    compiled = md.compile(g)

    def loop(prompt, n):
        ids, state, feed, pos = [], np.zeros((2, 0, 1, d), np.float32), list(prompt), 0
        while len(ids) < n:
            out, state = compiled(np.array(feed), np.arange(pos, pos + len(feed)), state)
            pos += len(feed)
            feed = [int(np.argmax(out[-1]))]
            ids.append(feed[0])
        return ids

    prompts = [[1, 2, 3], [4, 5], [6, 7, 8, 9]]
    runner = BatchRunner(compiled, max_batch=3)
    assert not runner.per_sequence
    got = runner.run([Request(p, greedy, 5) for p in prompts])
    assert runner.per_sequence
    assert [r.ids for r in got] == [loop(p, 5) for p in prompts]
