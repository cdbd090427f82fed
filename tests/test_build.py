"""md.build: Spec (+ weights) -> Graph with layer scopes, origins, names and checks."""

from pathlib import Path

import numpy as np
import pytest

import maxdecl as md
from maxdecl.builder import describe_tree

ROOT = Path(__file__).resolve().parents[1]
SPECS = ROOT / "specs"


def random_weights(spec, variant=None, seed=0, scale=0.05):
    """Seeded float32 weights for every weight the spec declares."""
    rng = np.random.default_rng(seed)
    prog = md.load_spec(spec, variant).program() if not isinstance(spec, md.spec.Spec) \
        else spec.program(variant)
    return md.TensorDict({w.name: (rng.standard_normal(w.shape) * scale).astype(np.float32)
                          for w in prog.weights})


def graph_inputs(g, seq=5, start=0, caches=None, rng=None):
    """Inputs by name: tokens/positions for one step, empty caches unless given."""
    caches = caches or {}
    out = []
    for v in g.inputs:
        if v.name == "tokens":
            out.append((rng or np.random.default_rng(1)).integers(0, 200, seq).astype(np.int64))
        elif v.name == "positions":
            out.append(np.arange(start, start + seq, dtype=np.int64))
        elif v.name == "logit_rows":
            out.append(np.arange(seq, dtype=np.int64))
        elif v.name in caches:
            out.append(caches[v.name])
        else:
            out.append(np.zeros([0 if d == "past" else d for d in v.shape], np.float32))
    return out


def test_mlp_runs_end_to_end_against_numpy():
    td = random_weights(SPECS / "mlp.yaml", scale=1.0)
    g = md.build(SPECS / "mlp.yaml", weights=td)
    x = np.random.default_rng(2).standard_normal((3, 16)).astype(np.float32)
    (y,) = g.execute(x, weights=td)
    h = np.maximum(x @ td["fc1.weight"].T + td["fc1.bias"], 0)
    want = h @ td["fc2.weight"].T + td["fc2.bias"]
    np.testing.assert_allclose(y, want, rtol=1e-5, atol=1e-5)
    assert g.output_names == ["y"] and [v.name for v in g.inputs] == ["x"]
    assert md.compile(g, td)(x)[0].tobytes() == y.tobytes()


def test_node_layers_and_origins_follow_the_yaml():
    g = md.build(SPECS / "mlp.yaml")
    text = (SPECS / "mlp.yaml").read_text().splitlines()
    layers = {n.layer for n in g.nodes}
    assert layers == {"fc1", "fc2"}
    relu = next(n for n in g.nodes if n.op == "relu")
    file, line, col = relu.origin.rsplit(":", 2)
    assert file == str(SPECS / "mlp.yaml")
    assert text[int(line) - 1][int(col) - 1:].startswith("relu")
    w = g.weights["fc2.weight"].node
    assert w.layer == "fc2" and text[int(w.origin.rsplit(":", 2)[1]) - 1].strip() \
        .startswith("weight: [d_out, hidden]")


def test_llama3_tiny_layer_paths_equal_gguf_prefixes():
    spec = md.load_spec(SPECS / "llama3.yaml", "tiny")
    try:
        g = md.build(spec, weights=random_weights(spec))
    except md.GraphError as e:
        pytest.skip(f"an op of llama3 is not available yet: {e}")
    weights = {n.attrs["name"]: n.layer for n in g.nodes if n.op == "weight"}
    assert weights["blk.1.attn_q.weight"] == "blk.1.attn_q"
    assert weights["token_embd.weight"] == "token_embd"
    by_op = {}
    for n in g.nodes:
        by_op.setdefault(n.op, set()).add(n.layer)
    assert by_op["rope"] == {"blk.0.attn_q", "blk.0.attn_k", "blk.1.attn_q", "blk.1.attn_k"}
    assert by_op["attention"] == {"blk.0.attn", "blk.1.attn"}
    assert "blk.0" in by_op["add"]                      # anonymous residual adds
    assert "output" in by_op["linear"]                 # linear is one op (qmatmul or matmul inside)


@pytest.mark.parametrize("name", ["llama3", "replit", "tinystories", "gemma3"])
def test_tiny_variants_build_and_run_on_random_weights(name):
    td = random_weights(SPECS / f"{name}.yaml", "tiny")
    try:
        g = md.build(SPECS / f"{name}.yaml", weights=td, variant="tiny")
    except md.GraphError as e:
        if "unknown op" in str(e):
            pytest.skip(f"{name}: op not registered yet: {e}")
        raise
    outs = g.execute(*graph_inputs(g), weights=td)
    vocab = md.load_spec(SPECS / f"{name}.yaml", "tiny").params["vocab"]
    assert outs[0].shape == (5, vocab) and np.isfinite(outs[0]).all()
    for out_name, arr in zip(g.output_names[1:], outs[1:]):
        assert out_name.endswith(".kv_cache") and arr.shape[1] == 5


@pytest.mark.parametrize("name", ["llama3", "gemma3"])
def test_kv_cache_outputs_feed_back_as_inputs(name):
    """One 7-token step equals 4 tokens then 3 tokens with caches fed back by name."""
    td = random_weights(SPECS / f"{name}.yaml", "tiny")
    try:
        g = md.build(SPECS / f"{name}.yaml", weights=td, variant="tiny")
    except md.GraphError as e:
        pytest.skip(f"op not available yet: {e}")
    tokens = np.random.default_rng(3).integers(0, 200, 7).astype(np.int64)
    names = [v.name for v in g.inputs]

    def step(toks, start, caches):
        args = graph_inputs(g, len(toks), start, caches)
        args[names.index("tokens")] = toks
        outs = g.execute(*args, weights=td)
        state = {n: o for n, o in zip(g.output_names, outs) if n in names}
        return outs[0], state

    full, _ = step(tokens, 0, {})
    _, caches = step(tokens[:4], 0, {})
    assert set(caches) == {n for n in names if n.endswith(".kv_cache")}
    last, caches = step(tokens[4:], 4, caches)
    np.testing.assert_allclose(last, full[4:], rtol=1e-4, atol=1e-5)
    assert next(iter(caches.values())).shape[1] == 7


def test_absent_weights_take_their_stand_ins():
    """llama3: without rope_freqs.weight the divisors are ones, without output.weight
    the output projection is token_embd.weight; other weights stay required."""
    spec = md.load_spec(SPECS / "llama3.yaml", "tiny")
    td = random_weights(spec, scale=0.2)
    del td["rope_freqs.weight"], td["output.weight"]
    g = md.build(spec, weights=td)
    assert "output.weight" not in g.weights and "rope_freqs.weight" not in g.weights
    full = md.TensorDict({n: td[n] for n in td.keys()})
    full["rope_freqs.weight"] = np.ones(32, np.float32)
    full["output.weight"] = td["token_embd.weight"]
    g2 = md.build(spec, weights=full)
    np.testing.assert_array_equal(g.execute(*graph_inputs(g), weights=td)[0],
                                  g2.execute(*graph_inputs(g2), weights=full)[0])
    del td["blk.0.ffn_up.weight"]
    with pytest.raises(md.WeightsError, match="1 missing: blk.0.ffn_up.weight$"):
        md.build(spec, weights=td)


def test_graph_error_names_spec_position_and_layer(tmp_path):
    bad = tmp_path / "bad.yaml"
    # fc2 declared with the wrong K: [d_out, d_in] instead of [d_out, hidden]
    text = (SPECS / "mlp.yaml").read_text().replace("weight: [d_out, hidden]",
                                                    "weight: [d_out, d_in]")
    bad.write_text(text)
    (problem,) = md.validate_spec(bad)          # validate runs the op's type rule ...
    with pytest.raises(md.SpecError) as err:    # md.build checks the spec first
        md.build(bad)
    msg = str(err.value)
    line = next(k for k, s in enumerate(text.splitlines(), 1) if s.strip() == "- name: fc2")
    assert f"{bad}:{line + 4}:9: fc2: linear: x float32[batch, 32] @ weight[8, 16].T: " \
           "32 != 16" in msg
    assert msg == f"{bad}:{problem.line}:{problem.col}: {problem.message}"  # the same text
    g = md.Graph("mlp", [md.TensorType("float32", ("batch", 32))])   # the graph's own check
    with g.layer("fc2"), pytest.raises(md.GraphError) as err:
        md.ops.linear(g.inputs[0], g.weight("fc2.weight", ("float32", (8, 16))),
                      g.weight("fc2.bias", ("float32", (8,))))
    assert str(err.value) == problem.message


def test_weights_are_checked_up_front_with_one_error():
    td = random_weights(SPECS / "mlp.yaml")
    del td["fc1.bias"]
    td["fc2.weight"] = np.zeros((8, 31), np.float32)
    td["extra.weight"] = np.zeros(3, np.float32)
    with pytest.raises(md.WeightsError) as err:
        md.build(SPECS / "mlp.yaml", weights=td)
    msg = str(err.value)
    assert "1 missing: fc1.bias" in msg
    assert "1 unexpected: extra.weight" in msg
    assert "1 mis-shaped: fc2.weight [8, 31] (expected [8, 32])" in msg


def test_encodings_come_from_bound_weights_or_spec_rules():
    spec = md.load_spec(SPECS / "tinystories.yaml", "tiny")
    g = md.build(spec)                          # no weights: the spec's rules decide
    enc = {n.attrs["name"]: n.attrs["encoding"] for n in g.nodes if n.op == "weight"}
    assert enc["blk.0.attn_q.weight"] == "q8_0" and enc["blk.0.attn_norm.weight"] is None
    td = random_weights(spec)
    td["blk.0.attn_q.weight"] = md.codecs.get("q8_0").quantize(td["blk.0.attn_q.weight"])
    td["blk.0.attn_q.weight"] = md.QuantizedTensor(td["blk.0.attn_q.weight"], (64, 64), "q8_0")
    try:
        g = md.build(spec, weights=td)
    except md.GraphError as e:
        pytest.skip(f"qmatmul not available yet: {e}")
    enc = {n.attrs["name"]: n.attrs["encoding"] for n in g.nodes if n.op == "weight"}
    assert enc["blk.0.attn_q.weight"] == "q8_0" and enc["blk.1.attn_q.weight"] is None
    linear = next(n for n in g.nodes if n.op == "linear" and n.layer == "blk.0.attn_q")
    assert linear.inputs[1].encoding == "q8_0"


def test_params_override_and_describe_tree():
    g = md.build(SPECS / "llama3.yaml", variant="tiny", params={"n_layers": 1})
    assert [v.name for v in g.inputs] == ["tokens", "positions", "logit_rows", "blk.0.kv_cache"]
    rows = describe_tree(SPECS / "mlp.yaml")
    assert [(r.path, r.depth) for r in rows] == [("", 0), ("fc1", 1), ("fc2", 1)]
    assert rows[0].params == 32 * 16 + 32 + 8 * 32 + 8
    assert rows[0].bytes == {"f32": rows[0].params * 4}
    assert rows[1].ops == {"linear": 1, "relu": 1}
    q = describe_tree(SPECS / "llama3.yaml", "8b")
    blk = next(r for r in q if r.path == "blk.0.ffn_down")
    assert blk.bytes == {"q6_k": 4096 * 14336 // 256 * 210}


def test_describe_tree_prints_as_a_table():
    text = str(describe_tree(SPECS / "gemma3.yaml", "tiny"))
    lines = text.splitlines()
    assert lines[0].split() == ["layer", "params", "bytes", "ops"]
    assert lines[1].startswith("<model>") and "q8_0" in lines[1]
    assert any(line.startswith("    blk.5.attn_q_norm") for line in lines)


def test_a_repeat_of_zero_runs_its_layer_no_times(tmp_path):
    """``repeat: 0`` (an empty ``nn.ModuleList``): the layer adds no nodes and no weights,
    and values flow past it unchanged; a value bound only inside it is unknown after."""
    text = (SPECS.parent / "tests/spec/cases/invalid/negative_repeat_expr.yaml").read_text()
    text = text.replace("repeat: n_layers - 3", "repeat: n_layers - first_dense")
    text = text.replace("n_layers: 2}", "n_layers: 2, first_dense: 2}")
    text = text.replace("outputs: [x]", "  - {op: mul, in: [x, x], out: y}\noutputs: [y]")
    path = tmp_path / "zero.yaml"
    path.write_text(text)
    assert md.validate_spec(path) == []
    g = md.build(path, weights=md.TensorDict({}))
    x = np.random.default_rng(0).standard_normal((3, 32)).astype(np.float32)
    assert g.execute(x)[0].tobytes() == (x * x).tobytes()
    assert not g.weights and len(g.nodes) == 1
    path.write_text(text.replace("in: [x, x], out: y", "in: [h, x], out: y"))
    with pytest.raises(md.SpecError, match=r"zero.yaml:32:\d+: undefined value 'h'"):
        md.build(path)


def test_an_anonymous_group_adds_no_path_segment(tmp_path):
    """A group of `layers:` without a name (here a 0/1 repeat: a part some layers have)
    names its weights after the enclosing layer (`blk.1.extra.weight`, as llama.cpp
    names a tensor only some blocks hold); two such weights with one name collide."""
    text = (SPECS.parent / "tests/spec/cases/invalid/negative_repeat_expr.yaml").read_text()
    text = text.replace("repeat: n_layers - 3", "repeat: n_layers")
    text = text.replace("      - {op: add, in: [x, h], out: x}", """\
      - repeat: "{1 if i == 1 else 0}"
        index: j
        layers:
          - {name: extra, weights: {weight: [dim, dim]}, op: linear, in: [h, .weight], out: h}
      - {op: add, in: [x, h], out: x}""")
    path = tmp_path / "anon.yaml"
    path.write_text(text)
    assert md.validate_spec(path) == []
    prog = md.load_spec(path).program()
    assert "blk.1.extra.weight" in [w.name for w in prog.weights]
    assert "blk.0.extra.weight" not in [w.name for w in prog.weights]
    td = random_weights(path, scale=0.2)
    g = md.build(path, weights=td)
    x = np.random.default_rng(0).standard_normal((3, 32)).astype(np.float32)
    assert np.isfinite(g.execute(x, weights=td)[0]).all()
    twice = text.replace("""          - {name: extra, weights: {weight: [dim, dim]}, op: linear, in: [h, .weight], out: h}""", """\
          - {name: extra, weights: {weight: [dim, dim]}, op: linear, in: [h, .weight], out: h}
      - repeat: 1
        layers:
          - {name: extra, weights: {weight: [dim, dim]}, op: linear, in: [h, .weight], out: h}""")
    path.write_text(twice)
    problems = md.validate_spec(path)
    assert problems and "duplicate" in problems[0].message


def test_a_weight_squeezed_or_not_binds_to_its_declared_shape():
    """A tensor that differs from its declaration only by axes of size 1 (llama.cpp's
    older converters squeeze [1, dim] gates to [dim]) binds as declared, the same data;
    a real mismatch is still one error."""
    td = random_weights(SPECS / "mlp.yaml", scale=1.0)
    want = np.asarray(td["fc1.bias"]).copy()
    td["fc1.bias"] = want.reshape(1, -1)
    g = md.build(SPECS / "mlp.yaml", weights=td)
    assert td["fc1.bias"].shape == want.shape and np.array_equal(td["fc1.bias"], want)
    x = np.ones((2, 16), np.float32)
    assert np.isfinite(g.execute(x, weights=td)[0]).all()
    td["fc1.bias"] = np.ones((2, want.size // 2), np.float32)
    with pytest.raises(md.WeightsError, match="mis-shaped: fc1.bias"):
        md.build(SPECS / "mlp.yaml", weights=td)


def test_required_makes_an_optional_weight_mandatory_when_its_condition_holds(tmp_path):
    """``required: "{expr}"`` beside ``absent:``: a checkpoint whose config says it has
    the weight (PoolFormer's use_layer_scale) but lacks it is refused, not filled."""
    text = (SPECS / "mlp.yaml").read_text()
    text = text.replace("      bias: [d_out]\n",
                        "      bias: {shape: [d_out], absent: 0.0, required: \"{has_bias}\"}\n")
    text = text.replace("    d_out: 8          # output features\n",
                        "    d_out: 8          # output features\n    has_bias: true\n")
    text = text.replace("    d_out: 10\n", "    d_out: 10\n    has_bias: false\n")
    path = tmp_path / "mlp_required.yaml"
    path.write_text(text)
    assert md.validate_spec(path) == []
    spec = md.load_spec(path, "small")
    td = md.random_weights(spec)
    assert "fc2.bias" in td.keys()          # random weights give a required one
    del td["fc2.bias"]
    with pytest.raises(md.WeightsError, match="1 missing: fc2.bias$"):
        md.build(spec, weights=td)
    wide = md.load_spec(path, "wide")
    tw = md.random_weights(wide)
    assert "fc2.bias" not in tw.keys()
    g = md.build(wide, weights=tw)           # not required: the fill stands in
    assert "fc2.bias" not in g.weights
    bad = tmp_path / "bad.yaml"
    bad.write_text(text.replace("absent: 0.0, required: \"{has_bias}\"",
                                "required: \"{has_bias}\""))
    (problem,) = md.validate_spec(bad)
    assert "required: only a weight with `absent:` can be optional" in str(problem)
    bad.write_text(text.replace("required: \"{has_bias}\"", "required: \"{d_out}\""))
    (problem,) = md.validate_spec(bad)
    assert "required: expected true, false or a condition giving one, got 8" in str(problem)


def test_an_int_in_an_index_input_is_int64(tmp_path):
    """``gather(x, "{i}")``: a bare int where the op takes indices is an int64 index,
    not a number of x's float dtype (which gather refuses)."""
    path = tmp_path / "pick.yaml"
    path.write_text("""maxdecl: 1
name: pick
variants:
  tiny: {n: 3}
dims: {rows: rows}
encodings: {default: f32}
inputs:
  x: {dtype: float32, shape: [rows, 4]}
layers:
  - name: "p{i}"
    repeat: n
    layers:
      - {op: gather, in: [x, "{i}"], attrs: {axis: 1}, out: "c"}
      - {op: add, in: [c, 1], out: c}
outputs: [c]
""")
    assert md.validate_spec(path) == []
    g = md.build(md.load_spec(path), weights=md.TensorDict())
    x = np.arange(8, dtype=np.float32).reshape(2, 4)
    np.testing.assert_array_equal(g.execute(x)[0], x[:, 2] + 1)


def test_an_integer_weight_is_bound_as_stored(tmp_path):
    """``dtype: int64`` on a weight (a saved index table, packed bits): no encoding, the
    array bound as it is and read by ops that take integers."""
    path = tmp_path / "index.yaml"
    path.write_text("""maxdecl: 1
name: index
variants:
  tiny: {n: 4}
dims: {rows: rows}
encodings: {default: q8_0}
inputs:
  x: {dtype: float32, shape: [rows, 6]}
layers:
  - name: pick
    weights:
      order: {shape: [n], dtype: int64}
      mask: {shape: [n], dtype: bool, absent: 1}
    layers:
      - {op: gather, in: [x, .order], attrs: {axis: 1}, out: y}
      - {op: select, in: [.mask, y, 0.0], out: y}
outputs: [y]
""")
    assert md.validate_spec(path) == []
    spec = md.load_spec(path)
    td = md.TensorDict({"pick.order": np.array([5, 0, 2, 2])})
    g = md.build(spec, weights=td)
    x = np.arange(12, dtype=np.float32).reshape(2, 6)
    np.testing.assert_array_equal(g.execute(x, weights=td)[0], x[:, [5, 0, 2, 2]])
    rw = md.random_weights(spec)
    assert rw["pick.order"].dtype == np.int64 and "pick.mask" not in rw.keys()   # a fill
    with pytest.raises(md.WeightsError, match="pick.order: float32; the spec declares it int64"):
        md.build(spec, weights=md.TensorDict({"pick.order": np.zeros(4, np.float32)}))
    bad = tmp_path / "bad.yaml"
    bad.write_text(path.read_text().replace("dtype: int64", "dtype: float64"))
    problems = [p.message for p in md.validate_spec(bad)]
    assert any("int8, uint8, int32, int64, bool" in m for m in problems), problems


def test_a_weight_stand_in_of_another_shape_under_checkpoint_sizes(tmp_path):
    """``absent: <weight>`` is checked for every variant; with sizes read from a checkpoint
    that make the two shapes differ (Marian's separate vocabularies), the weight is just
    required: the checkpoint holding it builds, one lacking it fails as missing it."""
    text = (SPECS / "mlp.yaml").read_text().replace(
        "      weight: [d_out, hidden]\n",
        "      weight: {shape: [d_out, hidden], absent: tied.weight}\n").replace(
        "layers:\n  - name: fc1\n",
        "layers:\n  - name: tied\n    weights: {weight: [d_tied, hidden]}\n  - name: fc1\n",
        1).replace("    d_out: 8          # output features\n",
                   "    d_out: 8          # output features\n    d_tied: 8\n").replace(
        "    d_out: 10\n", "    d_out: 10\n    d_tied: 10\n")
    path = tmp_path / "mlp_tied.yaml"
    path.write_text(text)
    assert md.validate_spec(path) == []
    spec = md.load_spec(path, "small")
    rng = np.random.default_rng(0)
    td = md.random_weights(spec)
    sized = md.TensorDict({n: rng.standard_normal(
        (5, *td[n].shape[1:]) if n.startswith("fc2.") else td[n].shape).astype(np.float32)
        for n in td.keys()})
    g = md.build(spec, weights=sized, params={"d_out": 5})
    assert g.execute(np.ones((2, 16), np.float32), weights=sized)[0].shape == (2, 5)
    del sized["fc2.weight"]
    with pytest.raises(md.WeightsError, match="1 missing: fc2.weight$"):
        md.build(spec, weights=sized, params={"d_out": 5})
    bad = tmp_path / "bad.yaml"                 # a variant where the shapes differ
    bad.write_text(text.replace("    d_tied: 10\n", "    d_tied: 9\n"))
    problems = [str(p) for p in md.validate_spec(bad)]
    assert any("absent: weight 'tied.weight' has shape [9, 256]" in p for p in problems)


def test_anonymous_block_use_adds_no_path_segment():
    """A block used without a name builds its layers under the enclosing layer's path."""
    path = Path(__file__).parent / "spec" / "cases" / "valid" / "anonymous_block_use.yaml"
    g = md.build(md.load_spec(path))
    assert [(n.op, n.layer) for n in g.nodes if n.op != "weight"] == [
        ("linear", "mixer.fc1"), ("gelu", "mixer"), ("linear", "mixer.fc2"), ("add", "mixer")]
    assert {n.attrs["name"] for n in g.nodes if n.op == "weight"} == {
        "mixer.fc1.weight", "mixer.fc2.weight"}
