"""specs/t5_encoder.yaml against transformers' T5EncoderModel (small random float32
configs, one with the ReLU feed-forward of the original T5, one gated-GELU as T5 v1.1 /
flan-t5): last_hidden_state on sequences of 40, 17 and 1 tokens, through the HF folder
(save_pretrained), a whole T5ForConditionalGeneration folder, an older config.json, the
GGUF llama.cpp's converter writes (float32, and Q8_0 feed-forward matrices) and the GGUF
``maxdecl export`` writes; llama.cpp itself (llama-cpp-python, when installed) runs both
GGUFs with the same hidden states.

With 40 tokens the relative distances 0..39 reach the exact buckets (|r| < n_buckets / 4),
the logarithmic ones and, for the ReLU case (max_distance 30), the last, saturated bucket;
the gated case uses T5's own 32 buckets / 128, whose logarithmic bucket edges fall on
the integer distances 16 and 32 (the float32 rounding there has to follow transformers').
"""

import json
import os
import shutil

import numpy as np
import pytest

import maxdecl as md
from archhelp import TOL as TOL_ENC          # 1e-5 of max|ref|, the encoders' bound
from modelhelp import TOL, _add_tokenizer, _write, hf_state, randomize, rel_err, save_hf
from modelhelp import spec_path, with_tokenizer

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

SPEC = spec_path("t5_encoder")
VOCAB = 300
LENGTHS = (40, 17, 1)
TOL_LLAMA_CPP = 5e-3        # of max|ref|: ggml's GELU reads an f16 table

CASES = {
    # ReLU FFN; inner width n_heads * d_kv = dim; buckets exact 0..5, log 6..29, >= 30 last
    "relu": dict(d_model=64, d_kv=16, num_heads=4, d_ff=128, feed_forward_proj="relu",
                 relative_attention_num_buckets=24, relative_attention_max_distance=30),
    # gated GELU; n_heads * d_kv = 128 != d_model 96; T5's 32 buckets, max_distance 128
    "gated-gelu": dict(d_model=96, d_kv=32, num_heads=4, d_ff=160,
                       feed_forward_proj="gated-gelu", relative_attention_num_buckets=32,
                       relative_attention_max_distance=128),
}


def make_t5(kind: str, cls=None):
    torch.manual_seed(0)
    cfg = transformers.T5Config(vocab_size=VOCAB, num_layers=2, layer_norm_epsilon=1e-6,
                                attn_implementation="eager", **CASES[kind])
    model = randomize((cls or transformers.T5EncoderModel)(cfg), 0)
    with torch.no_grad():     # T5 does not scale q.k: keep the softmax soft, as T5's init
        for block in model.encoder.block:
            block.layer[0].SelfAttention.q.weight.mul_(cfg.d_kv ** -0.5)
        bias = model.encoder.block[0].layer[0].SelfAttention.relative_attention_bias.weight
        bias.mul_(4.0)        # a position bias that matters next to q.k
    return model


def sequences():
    rng = np.random.default_rng(1)
    return [rng.integers(3, VOCAB, n).astype(np.int64) for n in LENGTHS]


def hf_hidden(model, ids) -> np.ndarray:
    with torch.no_grad():
        return model(input_ids=torch.tensor(ids[None])).last_hidden_state[0].numpy()


def ours(model, ids, start: int = 0) -> np.ndarray:
    (h,) = model(ids, np.arange(start, start + ids.size, dtype=np.int64))
    return np.asarray(h)


def max_err(model, seqs, refs) -> float:
    return max(rel_err(ours(model, ids), ref) for ids, ref in zip(seqs, refs))


@pytest.fixture(scope="module", params=list(CASES))
def case(request, tmp_path_factory):
    """(kind, HF model, its save_pretrained folder, token sequences, reference states)."""
    kind = request.param
    model = make_t5(kind)
    path = save_hf(model, tmp_path_factory.mktemp(f"t5_{kind}") / "hf")
    seqs = sequences()
    return kind, model, path, seqs, [hf_hidden(model, ids) for ids in seqs]


def test_buckets_cover_exact_log_and_far():
    """The 40-token sequence reaches every kind of bucket (transformers' own function)."""
    from transformers.models.t5.modeling_t5 import T5Attention

    n = LENGTHS[0]
    rel = torch.arange(n)[None, :] - torch.arange(n)[:, None]
    for kind, expect_far in (("relu", True), ("gated-gelu", False)):
        nb, far = (CASES[kind][k] for k in ("relative_attention_num_buckets",
                                            "relative_attention_max_distance"))
        b = T5Attention._relative_position_bucket(rel, True, nb, far).numpy() % (nb // 2)
        exact = nb // 4
        assert (b < exact).any() and ((b >= exact) & (b < nb // 2 - 1)).any()
        assert (b == nb // 2 - 1).any() == expect_far


def test_hidden_states_match_hf(case):
    kind, model, path, seqs, refs = case
    m = md.load_model(SPEC, path)
    p = m.params
    assert (p["dim"], p["head_dim"], p["n_buckets"], p["max_distance"]) == (
        CASES[kind]["d_model"], CASES[kind]["d_kv"],
        CASES[kind]["relative_attention_num_buckets"],
        CASES[kind]["relative_attention_max_distance"])
    assert p["gated"] == (kind != "relu")
    assert p["ffn_act"] == ("relu" if kind == "relu" else "gelu_new")
    assert "enc.blk.1.ffn_gate.weight" in m.weights or kind == "relu"
    errs = [rel_err(ours(m, ids), ref) for ids, ref in zip(seqs, refs)]
    each = ", ".join(f"{e:.1e}" for e in errs)
    print(f"t5 {kind} vs HF: last_hidden_state {max(errs):.2e} ({each})")
    assert max(errs) <= TOL_ENC <= TOL
    # only position differences matter
    shifted = ours(m, seqs[0], start=7)
    assert rel_err(shifted, refs[0]) <= TOL_ENC
    # negative control: a wrong max_distance moves the logarithmic buckets
    attn = model.encoder.block[0].layer[0].SelfAttention
    far = attn.relative_attention_max_distance
    folder = os.path.join(os.path.dirname(path), "other_distance")
    shutil.copytree(path, folder, dirs_exist_ok=True)
    cfg = json.load(open(os.path.join(folder, "config.json")))
    cfg["relative_attention_max_distance"] = far // 2
    json.dump(cfg, open(os.path.join(folder, "config.json"), "w"))
    other = ours(md.load_model(SPEC, folder), seqs[0])
    assert rel_err(other, refs[0]) > 100 * TOL_ENC
    attn.relative_attention_max_distance = far // 2          # and transformers agrees
    try:
        assert rel_err(other, hf_hidden(model, seqs[0])) <= TOL_ENC
    finally:
        attn.relative_attention_max_distance = far


def test_older_config_and_whole_t5_folder(case, tmp_path):
    """A config.json without is_gated_act / dense_act_fn (and, for ReLU, without
    feed_forward_proj: T5Config's default), and a T5ForConditionalGeneration folder
    (decoder, lm_head, the tied embedding saved under several names) read the same."""
    kind, model, path, seqs, refs = case
    old = str(tmp_path / "old")
    shutil.copytree(path, old)
    cfg = json.load(open(os.path.join(old, "config.json")))
    dropped = ("is_gated_act", "dense_act_fn") + (("feed_forward_proj",) if kind == "relu" else ())
    for key in dropped:
        cfg.pop(key)
    json.dump(cfg, open(os.path.join(old, "config.json"), "w"))
    m = md.load_model(SPEC, old)
    assert m.params["gated"] == (kind != "relu")
    assert max_err(m, seqs, refs) <= TOL_ENC
    full = make_t5(kind, transformers.T5ForConditionalGeneration)
    full.shared.load_state_dict(model.shared.state_dict())
    full.encoder.load_state_dict(model.encoder.state_dict())
    folder = save_hf(full, tmp_path / "full")
    assert max_err(md.load_model(SPEC, folder), seqs, refs) <= TOL_ENC


# -- GGUF: llama.cpp's t5encoder ------------------------------------------------------------

def t5_to_gguf(model, path, quantize=None) -> str:
    """A T5EncoderModel as llama.cpp's convert_hf_to_gguf.py writes it (arch t5encoder,
    names from gguf-py's tensor map; no max_distance key: llama.cpp uses 128), with the
    test tokenizer."""
    import gguf

    cfg, sd = model.config, hf_state(model)
    w = gguf.GGUFWriter(str(path), "t5encoder")
    w.add_context_length(512)
    w.add_embedding_length(cfg.d_model)
    w.add_feed_forward_length(cfg.d_ff)
    w.add_block_count(cfg.num_layers)
    w.add_head_count(cfg.num_heads)
    w.add_key_length(cfg.d_kv)
    w.add_value_length(cfg.d_kv)
    w.add_layer_norm_eps(cfg.layer_norm_epsilon)
    w.add_relative_attn_buckets_count(cfg.relative_attention_num_buckets)
    w.add_layer_norm_rms_eps(cfg.layer_norm_epsilon)
    w.add_file_type(gguf.LlamaFileType.ALL_F32)
    _add_tokenizer(w, cfg.vocab_size)
    names = gguf.get_tensor_name_map(gguf.MODEL_ARCH.T5ENCODER, cfg.num_layers)
    tensors = {names.get_name(k, try_suffixes=(".weight",)): v for k, v in sd.items()
               if k != "encoder.embed_tokens.weight"}
    _write(w, tensors, quantize)
    return str(path)


def ffn_q8_0(name, arr):
    """Q8_0 for the feed-forward matrices (a quantized ffn_gate too), float elsewhere."""
    import gguf

    if ".ffn_" not in name or arr.ndim != 2:
        return None
    qt = gguf.GGMLQuantizationType.Q8_0
    return gguf.quants.quantize(arr, qt), qt


def ffn_dequantized(model):
    """A copy of ``model`` whose feed-forward matrices went through Q8_0 and back."""
    import copy

    import gguf

    deq = copy.deepcopy(model)
    qt = gguf.GGMLQuantizationType.Q8_0
    with torch.no_grad():
        for name, p in deq.named_parameters():
            if "DenseReluDense" in name:
                back = gguf.quants.dequantize(gguf.quants.quantize(p.numpy(), qt), qt)
                p.copy_(torch.from_numpy(np.ascontiguousarray(back, np.float32)))
    return deq


def llama_cpp_hidden(llama_cpp, path, ids) -> np.ndarray:
    """llama.cpp's encoder output (per token, no pooling) for ``ids``."""
    llm = llama_cpp.Llama(model_path=str(path), embedding=True, n_ctx=64, n_batch=64,
                          n_ubatch=64, pooling_type=llama_cpp.LLAMA_POOLING_TYPE_NONE,
                          n_threads=1, verbose=False)
    llm._batch.set_batch([int(t) for t in ids], 0, True)
    assert llama_cpp.llama_encode(llm._ctx.ctx, llm._batch.batch) == 0
    n = llm.n_embd()
    ptr = llama_cpp.llama_get_embeddings(llm._ctx.ctx)
    return np.ctypeslib.as_array(ptr, shape=(ids.size * n,)).reshape(ids.size, n).copy()


def test_converter_gguf_matches_hf(case, tmp_path):
    """llama.cpp's GGUF states neither gating nor max_distance: the ffn_gate tensors
    decide (also when Q8_0), and T5's 128 holds for the gated case. The ReLU case's
    max_distance 30 is not in the file, so its GGUF runs with 128 (as llama.cpp does):
    the same buckets up to distance 5 only, which the 1-token sequence shows."""
    kind, model, path, seqs, refs = case
    gg = t5_to_gguf(model, tmp_path / "f32.gguf")
    m = md.load_model(SPEC, gg)
    assert m.params["gated"] is None and m.params["max_distance"] == 128
    if kind == "relu":
        assert "enc.blk.0.ffn_gate.weight" not in m.weights
        assert rel_err(ours(m, seqs[2]), refs[2]) <= TOL_ENC
        assert rel_err(ours(m, seqs[0]), refs[0]) > 100 * TOL_ENC
        return
    assert max_err(m, seqs, refs) <= TOL_ENC
    q8 = md.load_model(SPEC, t5_to_gguf(model, tmp_path / "q8.gguf", quantize=ffn_q8_0))
    assert q8.weights["enc.blk.0.ffn_gate.weight"].encoding == "q8_0"
    deq = ffn_dequantized(model)
    assert max_err(q8, seqs, [hf_hidden(deq, ids) for ids in seqs]) <= TOL_ENC


def _export(src, out) -> str:
    from maxdecl.cli import main

    assert main(["export", str(src), "--spec", SPEC, "-o", str(out)]) == 0
    return str(out)



def test_export_round_trip(case, tmp_path):
    """``maxdecl export`` of the HF folder writes the converter's tensors and the keys
    llama.cpp reads, plus max_distance, gating and the activation under t5encoder.*
    keys of its own; maxdecl reads it back with HF's states."""
    from gguf import GGUFReader

    kind, model, path, seqs, refs = case
    out = _export(path, tmp_path / "exported.gguf")
    conv = md.load_weights(t5_to_gguf(model, tmp_path / "conv.gguf"))
    exported = md.load_weights(out)
    assert sorted(exported.keys()) == sorted(conv.keys())
    for name in conv.keys():
        np.testing.assert_array_equal(np.asarray(exported[name]), np.asarray(conv[name]))
    c, fields = CASES[kind], GGUFReader(out).fields
    for key, value in (("attention.relative_buckets_count", c["relative_attention_num_buckets"]),
                       ("attention.key_length", c["d_kv"]),
                       ("attention.value_length", c["d_kv"]),
                       ("attention.relative_max_distance", c["relative_attention_max_distance"]),
                       ("feed_forward_gated", kind != "relu"),
                       ("hidden_act", "relu" if kind == "relu" else "gelu_new")):
        assert fields[f"t5encoder.{key}"].contents() == value
    assert abs(fields["t5encoder.attention.layer_norm_rms_epsilon"].contents() - 1e-6) < 1e-12
    assert max_err(md.load_model(SPEC, out), seqs, refs) <= TOL_ENC


def test_llama_cpp_runs_the_ggufs_with_hf_states(case, tmp_path):
    """llama.cpp itself runs the converter's file and the exported one (with the test
    tokenizer added) with transformers' states; llama.cpp fixes max_distance at 128, so
    the ReLU case's reference is transformers with 128."""
    llama_cpp = pytest.importorskip("llama_cpp")
    kind, model, path, seqs, refs = case
    if kind == "relu":
        attn = model.encoder.block[0].layer[0].SelfAttention
        far, attn.relative_attention_max_distance = attn.relative_attention_max_distance, 128
        try:
            refs = [hf_hidden(model, ids) for ids in seqs]
        finally:
            attn.relative_attention_max_distance = far
    exported = with_tokenizer(_export(path, tmp_path / "exported.gguf"),
                               tmp_path / "exported_tok.gguf", VOCAB)
    for gg in (t5_to_gguf(model, tmp_path / "conv.gguf"), exported):
        errs = [rel_err(llama_cpp_hidden(llama_cpp, gg, ids), ref) for ids, ref in zip(seqs, refs)]
        print(f"t5 {kind}: llama.cpp on {os.path.basename(gg)} vs HF {max(errs):.2e}")
        assert max(errs) <= TOL_LLAMA_CPP
