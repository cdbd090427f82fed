"""Fusion in md.compile (maxdecl/fusion.py): sibling linears as one grouped call and
reshapes inline give exactly the unfused outputs; the graph is left as it was; errors
still name a layer; fuse=False and MAXDECL_FUSE=0 turn it off."""

from pathlib import Path

import numpy as np
import pytest

import maxdecl as md
from maxdecl.kernels import fused, gemv
from maxdecl.ops import _registry
from maxdecl.pipelines.batching import BatchRunner
from maxdecl.runtime import PerSequence
from maxdecl.weights.random import program_weights

SPECS = Path(__file__).resolve().parents[1] / "specs"
F32 = md.DType.float32


def _both(name):
    spec = md.load_spec(SPECS / f"{name}.yaml", "tiny")
    td = program_weights(spec.program("tiny"), seed=3)
    g = md.build(spec, weights=td)
    return g, md.compile(g, td, fuse=True), md.compile(g, td, fuse=False)


def _same(a, b):
    assert len(a) == len(b)
    for x, y in zip(a, b):
        if isinstance(x, PerSequence):
            _same(x, y)
        else:
            assert x.dtype == y.dtype and x.shape == y.shape and x.tobytes() == y.tobytes()


@pytest.mark.parametrize("name", ["gemma3", "llama3", "mixtral", "qwen3_moe", "tinystories"])
def test_fused_language_model_is_bit_identical(name):
    """A batched prefill of three sequences, then one batched decode step."""
    _, on, off = _both(name)
    assert any(s.kind == "linear_group" for s in on.steps)
    assert all(s.kind == "node" for s in off.steps)
    names, outs = on.input_names, on.output_names
    zero = BatchRunner(on).zero_state()
    seqs = [[5, 9, 2, 7], [7], [1, 2, 3]]
    feed = {"tokens": np.array(sum(seqs, [])), "logit_rows": np.arange(3),
            "positions": np.concatenate([np.arange(len(p)) for p in seqs]),
            **{k: PerSequence([v] * 3) for k, v in zero.items()}}
    rows = [len(p) for p in seqs]
    a = on(*(feed[n] for n in names), rows=rows)
    b = off(*(feed[n] for n in names), rows=rows)
    _same(a, b)
    step = {"tokens": np.array([11, 12, 13]), "positions": np.array(rows),
            "logit_rows": np.arange(3), **{k: a[outs.index(k)] for k in zero}}
    _same(on(*(step[n] for n in names), rows=[1, 1, 1]),
          off(*(step[n] for n in names), rows=[1, 1, 1]))


def test_fused_encoders_with_biases_are_bit_identical():
    _, on, off = _both("bert")
    assert any(s.kind == "linear_group" and len(s.inputs) == 7 for s in on.steps)  # q/k/v + biases
    ids = np.array([1, 5, 9, 2, 3])
    feed = [ids, np.arange(5), np.zeros(5, np.int64)]
    _same(on(*feed), off(*feed))
    _, on, off = _both("vit")
    pixels = np.random.default_rng(0).standard_normal(on.input_types[0].shape).astype(np.float32)
    _same(on(pixels), off(pixels))


def test_plan_groups_siblings_and_leaves_the_graph_alone():
    g, on, off = _both("gemma3")
    before = [(n.op, n.layer, list(n.inputs), list(n.outputs)) for n in g.nodes]
    md.compile(g, on.weights)
    assert [(n.op, n.layer, list(n.inputs), list(n.outputs)) for n in g.nodes] == before
    groups = [s for s in on.steps if s.kind == "linear_group"]
    nodes = on._nodes
    for s in groups:
        members = [nodes[i] for i in s.nodes]
        assert all(n.op == "linear" and n.inputs[0] is members[0].inputs[0] for n in members)
        encs = {on.weights[n.inputs[1].node.attrs["name"]].encoding for n in members}
        assert len(encs) == 1
    layers = {tuple(nodes[i].layer.split(".")[-1] for i in s.nodes) for s in groups}
    assert ("ffn_gate", "ffn_up") in layers
    assert {("attn_q", "attn_k", "attn_v")} <= layers
    covered = sorted(i for s in on.steps for i in s.nodes)
    assert covered == list(range(len(nodes)))                   # every node, once
    calls = sum(s.kind != "reshape" for s in on.steps)
    linears = sum(n.op == "linear" for n in nodes)
    reshapes = sum(n.op == "reshape" for n in nodes)
    assert calls == len(nodes) - reshapes - sum(len(s.nodes) - 1 for s in groups)
    assert len(groups) and linears > sum(len(s.nodes) for s in groups)  # attn_output etc. alone


def test_maxdecl_fuse_0_turns_it_off(monkeypatch):
    g, on, _ = _both("llama3")
    monkeypatch.setenv("MAXDECL_FUSE", "0")
    off = md.compile(g, on.weights)
    assert not off.fused and all(s.kind == "node" for s in off.steps)
    assert md.compile(g, on.weights, fuse=True).fused
    monkeypatch.delenv("MAXDECL_FUSE")
    assert md.compile(g, on.weights).fused


def test_error_in_a_fused_call_names_the_first_layer(monkeypatch):
    _, on, _ = _both("llama3")

    def boom(*args):
        raise RuntimeError("kernel failed")

    monkeypatch.setattr(fused, "qmatmul_group", boom)          # prefill-sized x
    for enc in list(gemv.GEMV_GROUP):                          # decode-sized x (2 rows)
        monkeypatch.setitem(gemv.GEMV_GROUP, enc, boom)
    zero = BatchRunner(on).zero_state()
    feed = {"tokens": np.array([1, 2]), "positions": np.arange(2),
            "logit_rows": np.array([1]), **zero}
    with pytest.raises(md.GraphError) as err:
        on(*(feed[n] for n in on.input_names))
    msg = str(err.value)
    assert "blk.0.attn_q" in msg and "kernel failed" in msg and "fused" in msg
    assert "blk.0.attn_k" in msg


def _float_pair(with_bias):
    g = md.Graph("pair", input_types=[md.TensorType(F32, ("seq", 8))])
    x = g.inputs[0]
    outs = []
    for name in ("a", "b", "c"):
        with g.layer(name):
            w = g.weight(f"{name}.weight", md.TensorType(F32, (4 if name != "b" else 6, 8)))
            b = g.weight(f"{name}.bias", md.TensorType(F32, (4 if name != "b" else 6,))) \
                if with_bias else None
            outs.append(md.ops.linear(x, w, b) if with_bias else md.ops.linear(x, w))
    with g.layer("d"):                                   # weight is computed: not fused
        outs.append(md.ops.linear(x, md.ops.neg(g.weight("d.weight", md.TensorType(F32, (4, 8))))))
    for o in outs:
        g.output(o)
    rng = np.random.default_rng(1)
    td = {f"{n}.weight": rng.standard_normal((4 if n != "b" else 6, 8)).astype(np.float32)
          for n in "abcd"}
    td.update({f"{n}.bias": rng.standard_normal(4 if n != "b" else 6).astype(np.float32)
               for n in "abc"})
    return g, td


@pytest.mark.parametrize("with_bias", [False, True])
def test_float_siblings_fused_exactly(with_bias):
    g, td = _float_pair(with_bias)
    on, off = md.compile(g, td), md.compile(g, td, fuse=False)
    (group,) = [s for s in on.steps if s.kind == "linear_group"]
    assert [on._nodes[i].layer for i in group.nodes] == ["a", "b", "c"]
    x = np.random.default_rng(2).standard_normal((5, 8)).astype(np.float32)
    _same(on(x), off(x))
    _same(on(x, rows=[2, 3]), off(x, rows=[2, 3]))


def test_inline_reshape_runs_and_errors_after_it_name_their_layer(monkeypatch):
    def boom(args, attrs):
        raise RuntimeError("neg failed")

    monkeypatch.setitem(_registry._RUNNERS, "neg", boom)
    g = md.Graph("r", input_types=[md.TensorType(F32, ("n", 4))])
    with g.layer("blk.1.split_heads"):
        y = md.ops.reshape(g.inputs[0], ["n", 2, 2])
    with g.layer("blk.1.flip"):
        z = md.ops.neg(y)
    g.output(z)
    run = md.compile(g)
    assert [s.kind for s in run.steps] == ["reshape", "node"]
    with pytest.raises(md.GraphError, match=r"blk\.1\.flip: neg: RuntimeError: neg failed "
                                            r"\(inputs: float32\[3, 2, 2\]\)"):
        run(np.ones((3, 4), np.float32))
    monkeypatch.delitem(_registry._RUNNERS, "neg")
    (a,) = md.compile(g, fuse=True)(np.arange(12, dtype=np.float32).reshape(3, 4))
    assert a.shape == (3, 2, 2) and a[2, 1, 1] == -11


def test_float16_weights_are_cast_once_at_compile():
    """A float16 weight's cast to float32 (the builder's) runs once in md.compile, not on
    every call; the outputs are those of the same weights given as float32."""
    rng = np.random.default_rng(0)
    w16 = rng.standard_normal((6, 8)).astype(np.float16)
    x = rng.standard_normal((3, 8)).astype(np.float32)
    outs = []
    for w in (w16, w16.astype(np.float32)):
        td = md.TensorDict({"w": w})
        g = md.Graph("f16", [md.TensorType(F32, (3, 8))])
        with g:
            wv = g.weight("w", md.TensorType(md.DType.parse(w.dtype.name), (6, 8)))
            if w.dtype == np.float16:
                wv = md.ops.cast(wv, F32)
            g.output(md.ops.linear(g.inputs[0], wv))
        run = md.compile(g, td)
        assert [run._nodes[s.nodes[0]].op for s in run.steps] == ["linear"]   # no cast a call
        outs.append(run(x)[0])
    np.testing.assert_array_equal(outs[0], outs[1])
