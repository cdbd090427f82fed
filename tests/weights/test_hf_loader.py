"""Hugging Face directories and the spec-declared name mapping (remap)."""

import json

import numpy as np
import pytest

import maxdecl as md
from maxdecl.errors import WeightsError
from maxdecl.weights import load_hf, permute_qk, read_hf_config, remap

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

N_HEADS, N_KV, DIM, LAYERS = 4, 2, 64, 2
HEAD_DIM = DIM // N_HEADS

LLAMA_TENSORS = {
    "model.embed_tokens.weight": "token_embd.weight",
    "model.layers.{i}.input_layernorm.weight": "blk.{i}.attn_norm.weight",
    "model.layers.{i}.self_attn.q_proj.weight": "blk.{i}.attn_q.weight",
    "model.layers.{i}.self_attn.k_proj.weight": "blk.{i}.attn_k.weight",
    "model.layers.{i}.self_attn.v_proj.weight": "blk.{i}.attn_v.weight",
    "model.layers.{i}.self_attn.o_proj.weight": "blk.{i}.attn_output.weight",
    "model.layers.{i}.post_attention_layernorm.weight": "blk.{i}.ffn_norm.weight",
    "model.layers.{i}.mlp.gate_proj.weight": "blk.{i}.ffn_gate.weight",
    "model.layers.{i}.mlp.up_proj.weight": "blk.{i}.ffn_up.weight",
    "model.layers.{i}.mlp.down_proj.weight": "blk.{i}.ffn_down.weight",
    "model.norm.weight": "output_norm.weight",
    "lm_head.weight": "output.weight",
}
LLAMA_TRANSFORMS = {
    "blk.*.attn_q.weight": {"permute_qk": "n_heads"},
    "blk.*.attn_k.weight": {"permute_qk": "{n_kv_heads}"},
}
PARAMS = {"n_heads": N_HEADS, "n_kv_heads": N_KV}


def tiny_llama(dtype=None):
    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(
        vocab_size=96, hidden_size=DIM, intermediate_size=80, num_hidden_layers=LAYERS,
        num_attention_heads=N_HEADS, num_key_value_heads=N_KV, max_position_embeddings=64,
        tie_word_embeddings=False)
    m = transformers.LlamaForCausalLM(cfg).eval()
    with torch.no_grad():   # make the norms non-trivial
        for name, p in m.named_parameters():
            if "norm" in name:
                p.add_(torch.randn_like(p) * 0.1)
    return m.to(dtype) if dtype is not None else m


@pytest.fixture(scope="module")
def hf_dir(tmp_path_factory):
    d = tmp_path_factory.mktemp("llama")
    m = tiny_llama()
    m.save_pretrained(d, safe_serialization=True)
    return d, {k: v.detach().numpy() for k, v in m.state_dict().items()}


def unpermute(w, n_heads):
    """GGUF/Meta interleaved rows -> HF rotate-half rows (the inverse, written directly)."""
    out = np.empty_like(w)
    hd = w.shape[0] // n_heads
    for h in range(n_heads):
        for j in range(hd // 2):
            for r in range(2):
                out[h * hd + r * hd // 2 + j] = w[h * hd + 2 * j + r]
    return out


def test_load_hf_dir(hf_dir, in_mapping):
    d, sd = hf_dir
    td = md.load_weights(d)
    assert set(td.keys()) == set(sd)
    for k, v in sd.items():
        np.testing.assert_array_equal(td[k], v, err_msg=k)
    assert td.metadata["maxdecl.format"] == "hf"
    assert td.metadata["num_attention_heads"] == N_HEADS
    assert read_hf_config(d)["hidden_size"] == DIM
    assert read_hf_config(d / "config.json")["hidden_size"] == DIM
    shard = d / "model.safetensors"
    assert in_mapping(td.view("model.embed_tokens.weight").unsafe_ptr(), shard)


def test_remap_llama_permutes_q_and_k(hf_dir):
    d, sd = hf_dir
    expected = set(LLAMA_TENSORS.values()) - {v for v in LLAMA_TENSORS.values() if "{i}" in v}
    expected |= {v.format(i=i) for v in LLAMA_TENSORS.values() if "{i}" in v
                 for i in range(LAYERS)}
    td = remap(load_hf(d), LLAMA_TENSORS, LLAMA_TRANSFORMS, PARAMS, expected=expected)
    assert set(td.keys()) == expected
    assert td.metadata["num_attention_heads"] == N_HEADS
    for i in range(LAYERS):
        hf = f"model.layers.{i}.self_attn."
        q, k = td[f"blk.{i}.attn_q.weight"], td[f"blk.{i}.attn_k.weight"]
        assert not np.array_equal(q, sd[hf + "q_proj.weight"])
        np.testing.assert_array_equal(unpermute(q, N_HEADS), sd[hf + "q_proj.weight"])
        np.testing.assert_array_equal(unpermute(k, N_KV), sd[hf + "k_proj.weight"])
        np.testing.assert_array_equal(td[f"blk.{i}.attn_v.weight"], sd[hf + "v_proj.weight"])
    np.testing.assert_array_equal(td["output.weight"], sd["lm_head.weight"])


def test_permuted_q_with_interleaved_rope_equals_hf_rope(hf_dir):
    """Why the permutation exists: HF rotate-half rope on HF rows == GGUF pairwise rope
    on permuted rows, up to the same row permutation of the result."""
    _, sd = hf_dir
    wq = sd["model.layers.0.self_attn.q_proj.weight"]
    wq_g = permute_qk(wq, N_HEADS)
    rng = np.random.default_rng(0)
    x = rng.standard_normal((5, DIM)).astype(np.float64)
    pos = np.arange(5)[:, None]
    inv = 10000.0 ** (-np.arange(0, HEAD_DIM, 2) / HEAD_DIM)          # [hd/2]
    ang = pos * inv                                                     # [T, hd/2]
    cos, sin = np.cos(ang)[:, None], np.sin(ang)[:, None]               # [T, 1, hd/2]
    qh = (x @ wq.T).reshape(5, N_HEADS, HEAD_DIM)
    a, b = qh[..., :HEAD_DIM // 2], qh[..., HEAD_DIM // 2:]
    hf_rope = np.concatenate([a * cos - b * sin, b * cos + a * sin], -1)
    qg = (x @ wq_g.T).reshape(5, N_HEADS, HEAD_DIM)
    e, o = qg[..., 0::2], qg[..., 1::2]
    gg = np.empty_like(qg)
    gg[..., 0::2], gg[..., 1::2] = e * cos - o * sin, o * cos + e * sin
    back = unpermute(gg.reshape(5, DIM).T, N_HEADS).T.reshape(5, N_HEADS, HEAD_DIM)
    np.testing.assert_allclose(back, hf_rope, rtol=1e-10, atol=1e-12)


def test_bf16_model_stays_packed(tmp_path):
    m = tiny_llama(torch.bfloat16)
    m.save_pretrained(tmp_path, safe_serialization=True)
    sd = {k: v.float().numpy() for k, v in m.state_dict().items()}
    td = md.load_weights(tmp_path)
    q = td["model.layers.0.self_attn.q_proj.weight"]
    assert isinstance(q, md.QuantizedTensor) and q.encoding == "bf16"
    assert q.shape == (DIM, DIM)
    np.testing.assert_array_equal(q.dequantize(), sd["model.layers.0.self_attn.q_proj.weight"])
    out = remap(td, LLAMA_TENSORS, {**LLAMA_TRANSFORMS,
                                    "blk.*.attn_norm.weight": {"add": 1.0},
                                    "blk.0.ffn_up.weight": {"transpose": True}}, PARAMS)
    gq = out["blk.0.attn_q.weight"]
    assert gq.encoding == "bf16"
    np.testing.assert_array_equal(unpermute(gq.dequantize(), N_HEADS),
                                  sd["model.layers.0.self_attn.q_proj.weight"])
    norm = out["blk.1.attn_norm.weight"]
    assert norm.dtype == np.float32
    np.testing.assert_array_equal(norm, sd["model.layers.1.input_layernorm.weight"] + 1.0)
    up = out["blk.0.ffn_up.weight"]
    assert up.encoding == "bf16" and up.shape == (DIM, 80)
    np.testing.assert_array_equal(up.dequantize(), sd["model.layers.0.mlp.up_proj.weight"].T)


def test_sharded_with_index(tmp_path):
    m = tiny_llama()
    m.save_pretrained(tmp_path, safe_serialization=True, max_shard_size="40KB")
    index = json.loads((tmp_path / "model.safetensors.index.json").read_text())
    assert len(set(index["weight_map"].values())) > 1
    td = md.load_weights(tmp_path)
    sd = m.state_dict()
    assert set(td.keys()) == set(sd)
    for k, v in sd.items():
        np.testing.assert_array_equal(td[k], v.detach().numpy(), err_msg=k)


def test_bad_index(tmp_path):
    m = tiny_llama()
    m.save_pretrained(tmp_path, safe_serialization=True, max_shard_size="40KB")
    idx = tmp_path / "model.safetensors.index.json"
    index = json.loads(idx.read_text())
    good = json.loads(json.dumps(index))
    index["weight_map"]["model.norm.weight"] = "../../etc/passwd"
    idx.write_text(json.dumps(index))
    with pytest.raises(WeightsError, match="file name in the model directory"):
        md.load_weights(tmp_path)
    index = json.loads(json.dumps(good))
    index["weight_map"]["ghost.weight"] = next(iter(index["weight_map"].values()))
    idx.write_text(json.dumps(index))
    with pytest.raises(WeightsError, match="ghost.weight"):
        md.load_weights(tmp_path)
    idx.write_text("{oops")
    with pytest.raises(WeightsError, match="not valid JSON"):
        md.load_weights(tmp_path)


def test_dir_errors(tmp_path):
    (tmp_path / "config.json").write_text("{}")
    with pytest.raises(WeightsError, match="no \\*.safetensors"):
        md.load_weights(tmp_path)
    (tmp_path / "pytorch_model.bin").write_bytes(b"x")
    with pytest.raises(WeightsError, match="pytorch_model.bin"):
        md.load_weights(tmp_path)
    (tmp_path / "config.json").write_text("[1]")
    with pytest.raises(WeightsError, match="JSON object"):
        read_hf_config(tmp_path)


# ---------------------------------------------------------------- remap on its own

def test_remap_reports_missing_and_unexpected_together():
    src = md.TensorDict({f"layers.{i}.w": np.ones(2) for i in range(3)})
    for i in range(9):
        src[f"extra.{i}"] = np.ones(1)
    with pytest.raises(WeightsError) as e:
        remap(src, {"layers.{i}.w": "blk.{i}.w"}, {}, {},
              expected=[f"blk.{i}.w" for i in range(4)] + ["output.weight"])
    msg = str(e.value)
    assert "missing 2 (blk.3.w, output.weight)" in msg
    assert "unexpected 9 (extra.0, extra.1, extra.2, extra.3, extra.4, ...)" in msg
    assert "\n" not in msg


def test_remap_patterns():
    src = md.TensorDict({"a.0.b.12.w": np.ones(1), "a.1.b.3.w": np.ones(1), "inv_freq": np.ones(1),
                         "exact": np.zeros(2), "a.01.b.1.w": np.ones(1)})
    with pytest.raises(WeightsError, match="unexpected 1 \\(a.01.b.1.w\\)"):
        remap(src, {"a.{i}.b.{j}.w": "x.{j}.{i}", "inv_freq": None, "exact": "e"})
    del src["a.01.b.1.w"]
    out = remap(src, {"a.{i}.b.{j}.w": "x.{j}.{i}", "inv_freq": None, "exact": "e"})
    assert list(out.keys()) == ["x.12.0", "x.3.1", "e"]
    assert out["e"] is src["exact"]                          # untransformed: shared
    # two names of one saved-twice tensor (T5's shared and embed_tokens): the first wins
    out = remap(src, {"a.{i}.b.{j}.w": "same", "inv_freq": None, "exact": "e"})
    assert list(out.keys()) == ["same", "e"] and out["same"] is src["a.0.b.12.w"]
    src["a.1.b.3.w"] = np.full(1, 2.0)
    with pytest.raises(WeightsError, match="both map to 'same' and differ"):
        remap(src, {"a.{i}.b.{j}.w": "same", "inv_freq": None, "exact": "e"})
    with pytest.raises(WeightsError, match="does not capture"):
        remap(src, {"a.{i}.b.{j}.w": "x.{k}"})


def test_transform_errors():
    src = md.TensorDict({"q": np.ones((6, 4), np.float32)})
    with pytest.raises(WeightsError, match="unknown transform"):
        remap(src, {"q": "q"}, {"q": {"rotate": 1}})
    with pytest.raises(WeightsError, match="unknown parameter 'n_heads'"):
        remap(src, {"q": "q"}, {"q": {"permute_qk": "n_heads"}}, {})
    with pytest.raises(WeightsError, match="q \\(from q\\).*6 rows.*4 heads"):
        remap(src, {"q": "q"}, {"q": {"permute_qk": 4}})
    enc = md.codecs.get("q4_0")
    qt = md.QuantizedTensor(np.zeros((2, enc.block_bytes), np.uint8), (2, 32), "q4_0")
    with pytest.raises(WeightsError, match="cannot be transposed"):
        remap(md.TensorDict({"w": qt}), {"w": "w"}, {"w": {"transpose": True}})
    out = remap(md.TensorDict({"w": qt}), {"w": "w"}, {"w": {"permute_qk": 1}})
    assert out["w"].encoding == "q4_0"


def test_permute_qk_on_quantized_rows_moves_whole_rows():
    enc = md.codecs.get("q8_0")
    rng = np.random.default_rng(0)
    data = rng.integers(0, 256, (8, enc.block_bytes), dtype=np.uint8)
    qt = md.QuantizedTensor(data, (8, 32), "q8_0")
    p = permute_qk(qt, 2)
    np.testing.assert_array_equal(unpermute(p.data, 2), data)


def test_compute_tensors():
    from maxdecl.weights import compute_tensors

    shapes = {"f.weight": (4,), "m.weight": (2, 2)}
    out = compute_tensors({"f.weight": "{[1.0, 2.0] * (n // 2)}", "m.weight": 0.5},
                          {"n": 4}, shapes)
    np.testing.assert_array_equal(out["f.weight"], [1, 2, 1, 2])
    assert out["m.weight"].dtype == np.float32 and out["m.weight"].tolist() == [[0.5] * 2] * 2
    assert compute_tensors({"f.weight": "{None if n else 1.0}"}, {"n": 4}, shapes) == {}
    with pytest.raises(WeightsError, match=r"computed 'f.weight': expected .* 4 numbers"):
        compute_tensors({"f.weight": "{[1.0] * n * 2}"}, {"n": 4}, shapes)
    with pytest.raises(WeightsError, match="undefined name 'k'"):
        compute_tensors({"f.weight": "{k}"}, {"n": 4}, shapes)
    # a weight this configuration does not declare (only others have it) is skipped
    assert compute_tensors({"x.weight": 1.0}, {}, shapes) == {}


def test_remap_fallback_is_taken_only_when_nothing_else_maps():
    """ALBERT: ``predictions.decoder.bias`` is the head's bias; ``predictions.bias`` (a
    different tensor when the decoder is untied, the only one when tied) stands in."""
    untied = md.TensorDict({"predictions.bias": np.zeros(3), "predictions.decoder.bias": np.ones(3),
                            "blk.0.b": np.full(2, 5.0), "blk.1.b": np.full(2, 6.0)})
    rules = {"predictions.decoder.bias": "output.bias",
             "predictions.bias": {"fallback": "output.bias"},
             "blk.{i}.b": {"fallback": "layer.{i}.b"}}
    out = remap(untied, rules, expected=["output.bias", "layer.0.b", "layer.1.b"])
    assert out["output.bias"] is untied["predictions.decoder.bias"]
    assert out["layer.1.b"] is untied["blk.1.b"]             # placeholders carry over
    tied = md.TensorDict({"predictions.bias": np.zeros(3)})
    out = remap(tied, {"predictions.decoder.bias": "output.bias",
                       "predictions.bias": {"fallback": "output.bias"}}, expected=["output.bias"])
    assert out["output.bias"] is tied["predictions.bias"]
    with pytest.raises(WeightsError, match="a fallback target is one spec name"):
        remap(tied, {"predictions.bias": {"fallback": ""}})
