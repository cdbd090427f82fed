"""specs/lfm2.yaml against transformers' Lfm2ForCausalLM (small random configs).

A seeded float32 LFM2 (dim 64, 4 layers, GQA 4 / 2 heads, vocab 256) whose layer
pattern comes from config.json's `layer_types`: conv, attention, conv, attention. It is
saved with save_pretrained and loaded by maxdecl from the directory; a prefill, then one
token at a time through the KV caches and the conv states, matches transformers' logits,
and greedy generation gives transformers' ids. A second config (another pattern with
two attention layers in a row, kernel 4, conv biases, untied output, no MLP auto-adjust)
checks that the pattern and the optional parts follow config.json and the checkpoint.
A GGUF written as llama.cpp's converter writes LFM2 (per-layer head_count_kv, squeezed
conv filters, `token_embd_norm`) loads and matches too.
"""

import numpy as np
import pytest

import maxdecl as md
from archhelp import TOL, decoder_errors, error_with_state_reset, load
from modelhelp import (assert_greedy_matches_hf, compare, hf_case, hf_state, randomize,
                       rel_err, spec_path)

pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
if not hasattr(transformers, "Lfm2ForCausalLM"):
    pytest.skip("transformers has no Lfm2ForCausalLM", allow_module_level=True)


def make_lfm2(seed=0, **kw):
    """Lfm2ForCausalLM, float32: dim 64, 4 layers (conv, attn, conv, attn), 4 / 2 heads,
    MLP width int(2 * 192 / 3) = 128 (auto-adjusted, multiple of 32), kernel 3, tied."""
    import torch

    torch.manual_seed(seed)
    cfg = dict(vocab_size=256, hidden_size=64, intermediate_size=192, num_hidden_layers=4,
               num_attention_heads=4, num_key_value_heads=2, norm_eps=1e-5,
               max_position_embeddings=64, conv_L_cache=3, conv_bias=False,
               block_auto_adjust_ff_dim=True, block_ffn_dim_multiplier=1.0,
               block_multiple_of=32,
               layer_types=["conv", "full_attention", "conv", "full_attention"],
               rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
               tie_word_embeddings=True, attn_implementation="eager",
               pad_token_id=0, bos_token_id=1, eos_token_id=2)
    cfg.update(kw)
    return randomize(transformers.Lfm2ForCausalLM(transformers.Lfm2Config(**cfg)), seed)


def kinds(graph) -> dict:
    """{layer index: mixer} from the ops each block's graph holds."""
    ops = {}
    for n in graph.nodes:
        parts = n.layer.split(".")
        if parts[0] == "blk":
            ops.setdefault(int(parts[1]), set()).add(n.op)
    return {i: "attention" if "attention" in o else "conv" if "causal_conv1d" in o else "?"
            for i, o in sorted(ops.items())}


def hf_kinds(cfg) -> dict:
    return {i: "conv" if t == "conv" else "attention" for i, t in enumerate(cfg.layer_types)}


@pytest.fixture(scope="module")
def lfm2(tmp_path_factory):
    return hf_case(make_lfm2(), tmp_path_factory.mktemp("lfm2_hf"))


@pytest.fixture(scope="module")
def lfm2_model(lfm2):
    _, path, _, _ = lfm2
    return md.load_model(spec_path("lfm2"), path, variant="tiny")


def test_lfm2_weights_and_pattern_from_config(lfm2):
    model, path, _, _ = lfm2
    td = md.load_weights(path, spec=spec_path("lfm2"), variant="tiny")
    p = td.params
    assert p["ffn_dim"] == 128 and p["d_conv"] == 3 and p["rope_theta"] == 10000.0
    assert p["layer_types"] == ["conv", "full_attention", "conv", "full_attention"]
    assert td["blk.0.shortconv.conv.weight"].shape == (64, 3)           # squeezed
    assert td["blk.0.shortconv.in_proj.weight"].shape == (192, 64)
    assert "blk.0.attn_q.weight" not in td and "blk.1.shortconv.in_proj.weight" not in td
    assert td["blk.1.attn_q_norm.weight"].shape == (16,)
    assert "output.weight" not in td                                     # tied
    np.testing.assert_array_equal(td["token_embd_norm.weight"],
                                  model.model.embedding_norm.weight.detach().numpy())
    g = md.build(spec_path("lfm2"), weights=td)
    assert kinds(g) == hf_kinds(model.config) == {
        0: "conv", 1: "attention", 2: "conv", 3: "attention"}
    state = [v.name for v in g.inputs if v.name in g.output_names]
    assert state == ["blk.0.shortconv.conv.conv_state", "blk.1.attn.kv_cache",
                     "blk.2.shortconv.conv.conv_state", "blk.3.attn.kv_cache"]


def test_lfm2_prefill_and_decode_match_hf(lfm2):
    """md.build + md.compile, stepped by hand through every state."""
    _, path, ids, ref = lfm2
    g, td = load("lfm2", path)
    pre, dec = decoder_errors(g, td, ref, ids)
    print(f"lfm2 vs HF: prefill {pre:.2e}, decode {dec:.2e} (of max|ref|)")
    assert pre <= TOL and dec <= TOL


def test_lfm2_model_session_matches_hf(lfm2, lfm2_model):
    """The same through md.load_model's session (what generate uses)."""
    _, _, ids, ref = lfm2
    pre, dec = compare(lfm2_model, ref, ids)
    print(f"lfm2 (session) vs HF: prefill {pre:.2e}, decode {dec:.2e} (of max|ref|)")
    assert pre <= TOL and dec <= TOL


@pytest.mark.parametrize("reset", ["kv_cache", "conv_state"])
def test_lfm2_every_state_matters(lfm2, reset):
    """Negative controls: a decode step with one kind of state reset to zeros diverges."""
    _, path, ids, ref = lfm2
    g, td = load("lfm2", path)
    assert error_with_state_reset(g, td, ref, ids, reset) > 100 * TOL


def test_lfm2_greedy_matches_hf(lfm2, lfm2_model):
    model, _, ids, _ = lfm2
    prompts = [ids[:10], ids[3:8], ids[5:14]]
    assert_greedy_matches_hf(model, lfm2_model, prompts, n_new=6)


def test_lfm2_other_pattern_biases_untied(tmp_path):
    """attention, attention, conv, conv, attention; kernel 4; conv_bias (in_proj, conv and
    out_proj biases); untied output; MLP width taken as is (no auto-adjust)."""
    model = make_lfm2(seed=3, num_hidden_layers=5, intermediate_size=96,
                      block_auto_adjust_ff_dim=False, conv_L_cache=4, conv_bias=True,
                      tie_word_embeddings=False, num_key_value_heads=1,
                      layer_types=["full_attention", "full_attention", "conv", "conv",
                                   "full_attention"])
    _, path, ids, ref = hf_case(model, tmp_path / "hf")
    g, td = load("lfm2", path)
    assert td.params["ffn_dim"] == 96 and td.params["d_conv"] == 4
    assert "output.weight" in td and "blk.2.shortconv.conv.bias" in td
    assert "blk.3.shortconv.in_proj.bias" in td and "blk.3.shortconv.out_proj.bias" in td
    assert kinds(g) == hf_kinds(model.config) == {
        0: "attention", 1: "attention", 2: "conv", 3: "conv", 4: "attention"}
    pre, dec = decoder_errors(g, td, ref, ids)
    print(f"lfm2 (pattern 2, biases, untied) vs HF: prefill {pre:.2e}, decode {dec:.2e}")
    assert pre <= TOL and dec <= TOL


def test_lfm2_config_defaults():
    """Keys a config.json leaves out take Lfm2Config's defaults, not the tiny variant's:
    no layer_types and no full_attn_idxs means every layer is attention; the MLP width
    follows block_ff_dim with the auto-adjust (LFM2-1.2B: 12288 -> 8192)."""
    from maxdecl.pipelines.model_loading import params_from_metadata

    spec = md.load_spec(spec_path("lfm2"), variant="tiny")
    got = params_from_metadata(spec, {
        "maxdecl.format": "hf", "num_hidden_layers": 3, "block_ff_dim": 12288,
        "block_auto_adjust_ff_dim": True, "block_ffn_dim_multiplier": 1.0,
        "block_multiple_of": 256})
    assert got["ffn_dim"] == 8192
    assert got["layer_types"] == [] and list(got["full_attn_idxs"]) == [0, 1, 2]
    got = params_from_metadata(spec, {"maxdecl.format": "hf", "num_hidden_layers": 4,
                                      "full_attn_idxs": [2]})
    assert list(got["full_attn_idxs"]) == [2]


def lfm2_to_gguf(model, path) -> str:
    """Write an Lfm2ForCausalLM as llama.cpp's convert_hf_to_gguf.py (LFM2Model) does:
    arch lfm2, head_count_kv per layer (0 on conv layers), shortconv.l_cache, the MLP
    width after the auto-adjust, conv filters squeezed to [dim, L], embedding_norm as
    token_embd_norm, no output.weight when tied."""
    import gguf

    cfg, sd = model.config, hf_state(model)
    w = gguf.GGUFWriter(str(path), "lfm2")
    w.add_context_length(cfg.max_position_embeddings)
    w.add_embedding_length(cfg.hidden_size)
    w.add_block_count(cfg.num_hidden_layers)
    w.add_feed_forward_length(sd["model.layers.0.feed_forward.w1.weight"].shape[0])
    w.add_head_count(cfg.num_attention_heads)
    w.add_head_count_kv([cfg.num_key_value_heads if t == "full_attention" else 0
                         for t in cfg.layer_types])
    w.add_rope_freq_base(float(cfg.rope_parameters["rope_theta"]))
    w.add_layer_norm_rms_eps(cfg.norm_eps)
    w.add_vocab_size(cfg.vocab_size)
    w.add_shortconv_l_cache(cfg.conv_L_cache)
    names = {"operator_norm": "attn_norm", "self_attn.q_proj": "attn_q",
             "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v",
             "self_attn.q_layernorm": "attn_q_norm", "self_attn.k_layernorm": "attn_k_norm",
             "self_attn.out_proj": "attn_output", "conv.in_proj": "shortconv.in_proj",
             "conv.conv": "shortconv.conv", "conv.out_proj": "shortconv.out_proj",
             "ffn_norm": "ffn_norm", "feed_forward.w1": "ffn_gate",
             "feed_forward.w3": "ffn_up", "feed_forward.w2": "ffn_down"}
    t = {"token_embd.weight": sd["model.embed_tokens.weight"],
         "token_embd_norm.weight": sd["model.embedding_norm.weight"]}
    for i in range(cfg.num_hidden_layers):
        for src, dst in names.items():
            key = f"model.layers.{i}.{src}.weight"
            if key in sd:
                x = sd[key]
                t[f"blk.{i}.{dst}.weight"] = x.squeeze(1) if src == "conv.conv" else x
    if not cfg.tie_word_embeddings:
        t["output.weight"] = sd["lm_head.weight"]
    for name, arr in t.items():
        w.add_tensor(name, np.ascontiguousarray(arr, np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return str(path)


def test_lfm2_llama_cpp_layout_gguf(lfm2, tmp_path):
    """A GGUF in llama.cpp's LFM2 layout: the pattern comes from head_count_kv."""
    pytest.importorskip("gguf")
    model, _, ids, ref = lfm2
    path = lfm2_to_gguf(model, tmp_path / "lfm2.gguf")
    td = md.load_weights(path, spec=spec_path("lfm2"), variant="tiny")
    assert list(td.params["kv_heads_per_layer"]) == [0, 2, 0, 2]
    g = md.build(spec_path("lfm2"), weights=td)
    assert kinds(g) == {0: "conv", 1: "attention", 2: "conv", 3: "attention"}
    pre, dec = decoder_errors(g, td, ref, ids)
    print(f"lfm2 (llama.cpp GGUF) vs HF: prefill {pre:.2e}, decode {dec:.2e}")
    assert pre <= TOL and dec <= TOL


def test_lfm2_gguf_runs_in_llama_cpp(lfm2, tmp_path):
    """The same converter-layout GGUF (names, per-layer head_count_kv, l_cache) is one that
    llama.cpp itself loads and runs with transformers' logits (its KV cache is f16)."""
    llama_cpp = pytest.importorskip("llama_cpp")
    pytest.importorskip("gguf")
    from modelhelp import llama_cpp_logits, with_tokenizer

    model, _, ids, ref = lfm2
    src = lfm2_to_gguf(model, tmp_path / "lfm2.gguf")
    path = with_tokenizer(src, tmp_path / "lfm2_tok.gguf", model.config.vocab_size)
    theirs = llama_cpp_logits(llama_cpp, path, ids)
    assert rel_err(theirs, ref) <= 5e-3


def test_lfm2_export_writes_the_per_layer_kv_heads(lfm2, tmp_path):
    """`maxdecl export` of the HF folder writes llama.cpp's per-layer head_count_kv (0 on
    conv layers, worked out from layer_types by a list comprehension in hf.config), so
    maxdecl and llama.cpp (when installed) run the export with transformers' logits."""
    import subprocess
    import sys

    import gguf

    model, path, ids, ref = lfm2
    out = tmp_path / "export.gguf"
    subprocess.run([sys.executable, "-m", "maxdecl", "export", path, "--spec",
                    spec_path("lfm2"), "--variant", "tiny", "-o", str(out)],
                   check=True, capture_output=True)
    fields = gguf.GGUFReader(str(out)).fields
    want = [0 if t == "conv" else model.config.num_key_value_heads
            for t in model.config.layer_types]
    assert list(fields["lfm2.attention.head_count_kv"].contents()) == want
    g_model = md.load_model(spec_path("lfm2"), str(out), variant="tiny")
    pre, dec = compare(g_model, ref, ids)
    assert pre <= TOL and dec <= TOL
    try:
        import llama_cpp
    except ImportError:
        return
    from modelhelp import llama_cpp_logits, with_tokenizer

    tok = with_tokenizer(str(out), tmp_path / "export_tok.gguf", model.config.vocab_size)
    assert rel_err(llama_cpp_logits(llama_cpp, tok, ids), ref) <= 5e-3
