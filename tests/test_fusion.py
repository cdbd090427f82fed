"""Fusion in md.compile (maxdecl/fusion.py): sibling linears as one grouped call and
reshapes inline give exactly the unfused outputs; the graph is left as it was; errors
still name a layer; fuse=False and MAXDECL_FUSE=0 turn it off."""

from pathlib import Path

import numpy as np
import pytest

import maxdecl as md
from maxdecl.kernels import fused, fused_rows, gemv
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
    fused = [s for s in on.steps if s.kind not in ("node", "reshape")]
    assert calls == len(nodes) - reshapes - sum(len(s.nodes) - 1 for s in fused)
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


def test_norms_fuse_into_the_residual_add_and_activations_into_the_gate(monkeypatch):
    """Gemma 3: post-norm -> residual add -> next pre-norm is one ``norm_chain`` call,
    ``gelu_tanh(gate) * up`` one ``act_mul``; Llama 3: add -> pre-norm, ``silu * up``."""
    _, on, _ = _both("gemma3")
    nodes = on._nodes
    chains = [s for s in on.steps if s.kind == "norm_chain"]
    full = [s for s in chains if s.attrs["pre"] and s.attrs["post"]]
    assert len(full) >= 2
    for s in full:
        add, pre, post = (nodes[i] for i in s.nodes)
        assert (add.op, pre.op, post.op) == ("add", "rms_norm", "rms_norm")
        assert pre.outputs[0] in add.inputs and post.inputs[0] is add.outputs[0]
        assert s.outputs == (add.outputs[0], post.outputs[0])
    acts = [s for s in on.steps if s.kind == "act_mul"]
    assert acts and all(nodes[s.nodes[1]].op == "gelu_tanh" for s in acts)
    calls = []                  # the gate and up columns of one grouped call take the kernel
    monkeypatch.setattr(fused_rows, "_UNFUSED", {k: lambda a, k=k: calls.append(k)
                                                 for k in fused_rows._UNFUSED})
    zero = BatchRunner(on).zero_state()
    feed = {"tokens": np.array([1, 2]), "positions": np.arange(2),
            "logit_rows": np.array([1]), **zero}
    on(*(feed[n] for n in on.input_names))
    assert not calls
    _, on, _ = _both("llama3")
    kinds = {(s.kind, s.attrs.get("pre"), s.attrs.get("post")) for s in on.steps}
    assert ("norm_chain", False, True) in kinds
    assert any(s.kind == "act_mul" and on._nodes[s.nodes[1]].op == "silu" for s in on.steps)


def _chain_graph(dtype, bias_shape=None, norm_out=False, late_weight=False):
    """x -> rms_norm -> add(r) -> rms_norm -> silu(.) * u, with variations the rules
    must respect (a broadcast add, the first norm an output, the second norm's weight
    computed after the add)."""
    t = md.DType.parse(dtype)
    g = md.Graph("chain", input_types=[md.TensorType(t, ("n", 6)),
                                       md.TensorType(t, bias_shape or ("n", 6)),
                                       md.TensorType(t, ("n", 6))])
    x, r, u = g.inputs
    with g.layer("a"):
        w1 = g.weight("w1", md.TensorType(t, (6,)))
        h = md.ops.rms_norm(x, w1, epsilon=1e-5)
    with g.layer("b"):
        s = md.ops.add(r, h)
    with g.layer("c"):
        w2 = g.weight("w2", md.TensorType(t, (6,)))
        if late_weight:
            w2 = md.ops.neg(w2)
        n = md.ops.rms_norm(s, w2)
    with g.layer("d"):
        y = md.ops.mul(u, md.ops.silu(n))
    g.output(y)
    g.output(s)
    if norm_out:
        g.output(h)
    rng = np.random.default_rng(4)
    td = {"w1": rng.standard_normal(6).astype(dtype), "w2": rng.standard_normal(6).astype(dtype)}
    return g, td


@pytest.mark.parametrize("case", [dict(dtype="float32"), dict(dtype="float16"),
                                  dict(dtype="float32", bias_shape=(6,)),
                                  dict(dtype="float32", norm_out=True),
                                  dict(dtype="float32", late_weight=True)])
def test_elementwise_fusion_is_bit_identical_or_left_alone(case):
    g, td = _chain_graph(**case)
    on, off = md.compile(g, td), md.compile(g, td, fuse=False)
    kinds = [s.kind for s in on.steps]
    chain = next(s for s in on.steps if s.kind == "norm_chain")
    assert chain.attrs["pre"] == (not case.get("norm_out"))       # an output stays a node
    assert chain.attrs["post"] == (not case.get("late_weight"))   # its weight comes later
    assert "act_mul" in kinds
    rng = np.random.default_rng(5)
    dt = np.dtype(case["dtype"])
    for n in (1, 3, 17):
        x = (rng.standard_normal((n, 6)) * 3).astype(dt)
        r = rng.standard_normal(case.get("bias_shape") or (n, 6)).astype(dt)
        u = rng.standard_normal((n, 6)).astype(dt)
        _same(on(x, r, u), off(x, r, u))


@pytest.mark.parametrize("twin", [0, 1])
def test_fused_row_kernels_match_the_ops_bit_for_bit(twin):
    """Random widths and row counts, both twins: the fused kernels give exactly what the
    rms_norm, add and activation ops give one by one."""
    from maxdecl.kernels import activations
    from maxdecl.kernels.norm import _rms_norm_run

    rng = np.random.default_rng(6)
    for _ in range(25):
        rows, d = int(rng.integers(1, 9)), int(rng.integers(1, 1100))
        x, r = (rng.standard_normal((2, rows, d)) * rng.uniform(0.01, 50)).astype(np.float32)
        w1, w2 = rng.standard_normal((2, d)).astype(np.float32)
        total, normed = np.empty_like(x), np.empty_like(x)
        for pre in (True, False):
            fused_rows._norm_add_norm[twin](x, w1, np.float32(1e-6), pre, r, w2,
                                            np.float32(1e-5), True, total, normed)
            h = _rms_norm_run([x, w1], {"epsilon": 1e-6})[0] if pre else x
            want = h + r
            assert total.tobytes() == want.tobytes()
            assert normed.tobytes() == _rms_norm_run([want, w2], {"epsilon": 1e-5})[0].tobytes()
        both = np.concatenate([x, r], axis=1)       # gate | up, as a grouped linear gives
        gate, up = both[:, :d], both[:, d:]
        for act, kind in fused_rows.ACTIVATIONS.items():
            want = (getattr(activations, act)(x) * r).tobytes()
            for a, b in ((x, r), (gate, up)):
                out = np.empty_like(x)
                (fa, sa), (fb, sb) = fused_rows.rows_flat(a), fused_rows.rows_flat(b)
                fused_rows._act_mul[twin](fa, sa, fb, sb, kind, out)
                assert out.tobytes() == want
