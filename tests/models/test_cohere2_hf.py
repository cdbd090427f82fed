"""specs/cohere2.yaml against transformers' Cohere2ForCausalLM (Command R7B, Command A).

A small seeded float32 Cohere2 model: one bias-free LayerNorm per block feeding attention
and the SwiGLU MLP in parallel, grouped-query attention (4 query heads, 2 kv heads),
interleaved RoPE (adjacent pairs, the rope op's ``normal`` style) on the sliding-window
layers only, full-attention layers with no positional embedding, the output tied to the
embedding and logits times ``logit_scale`` (0.5 here, so it matters). The default pattern
(4 layers: three sliding, then one full) with a 5-token window, shorter than the 12-token
prompt; a second model takes a non-periodic ``layer_types``, a third an old-style
config.json with ``sliding_window_pattern`` instead. The same weights written as llama.cpp's
converter writes a ``cohere2`` GGUF run in maxdecl (and in llama.cpp when llama-cpp-python is
installed).
"""

import json
import os
import subprocess
import sys

import pytest

import maxdecl as md
from maxdecl.pipelines.model_loading import params_from_metadata

from modelhelp import (N_PROMPT, TOL, _add_tokenizer, _write, assert_greedy_matches_hf,
                       assert_logits_match, compare, gguf_writer, hf_case, hf_logits, hf_params,
                       hf_state, llama_cpp_logits, randomize, rel_err, save_hf, spec_path,
                       tiny_model, token_ids, with_hf_config)

pytest.importorskip("torch")
pytest.importorskip("transformers")

WINDOW = 5
PROMPTS = [[3, 17, 42, 90, 5, 7, 64, 1], [8, 9, 80], [5, 60, 33, 2, 90, 11, 7]]
N_NEW = 6


def make_cohere2(seed=0, **kw):
    """Cohere2ForCausalLM: dim 128, 4 layers, GQA 4/2 (head_dim 32), ffn 256, vocab 96,
    window 5, logit_scale 0.5, rope_theta 10000, tied output, eager attention.

    The tied table is scaled to 0.1 * N(0, 1) so that greedy decoding does not only
    repeat the last token."""
    import torch
    import transformers

    torch.manual_seed(seed)
    cfg = dict(vocab_size=96, hidden_size=128, intermediate_size=256, num_hidden_layers=4,
               num_attention_heads=4, num_key_value_heads=2, layer_norm_eps=1e-5,
               max_position_embeddings=64,
               rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
               logit_scale=0.5, sliding_window=WINDOW, tie_word_embeddings=True,
               pad_token_id=0, bos_token_id=1, eos_token_id=2, attn_implementation="eager")
    cfg.update(kw)
    model = randomize(transformers.Cohere2ForCausalLM(transformers.Cohere2Config(**cfg)), seed)
    with torch.no_grad():
        model.model.embed_tokens.weight.mul_(0.1)
    return model


def rope_layers_of(model) -> list[int]:
    """The layers whose graph holds rope nodes."""
    return sorted({int(n.layer.split(".")[1]) for n in model.graph.nodes if n.op == "rope"})


@pytest.fixture(scope="module")
def cohere2(tmp_path_factory):
    model = make_cohere2()
    assert list(model.config.layer_types) == ["sliding_attention"] * 3 + ["full_attention"]
    assert model.config.sliding_window < N_PROMPT
    return hf_case(model, tmp_path_factory.mktemp("cohere2_hf"))


@pytest.fixture(scope="module")
def ours(cohere2):
    return tiny_model("cohere2", cohere2[1])


def test_cohere2_config_from_hf(cohere2, ours):
    _, path, _, _ = cohere2
    _, _, got = hf_params("cohere2", path)
    want = {"dim": 128, "n_layers": 4, "n_heads": 4, "n_kv_heads": 2, "ffn_dim": 256,
            "vocab": 96, "context": 64, "logit_scale": 0.5, "rope_type": "none",
            "window": WINDOW}
    assert {k: got.get(k) for k in want} == want
    assert got["rope_theta"] == 10000.0 and got["norm_eps"] == pytest.approx(1e-5)
    assert ours.params["sliding"] == [True, True, True, False]
    assert ours.params["head_dim"] == 32
    assert rope_layers_of(ours) == [0, 1, 2]            # the full layer is NoPE
    assert "output.weight" not in ours.weights          # tied: token_embd stands in


def test_cohere2_prefill_and_decode_match_hf(cohere2, ours):
    _, _, ids, ref = cohere2
    assert_logits_match("cohere2", ours, ids, ref)


def test_cohere2_greedy_generate_matches_hf(cohere2, ours):
    assert_greedy_matches_hf(cohere2[0], ours, PROMPTS, N_NEW)


def test_cohere2_window_matters(cohere2):
    """Negative control: a window wider than the sequence gives other logits."""
    _, path, ids, ref = cohere2
    td = md.load_weights(path)
    td.metadata["sliding_window"] = 64
    pre, dec = compare(md.load_model(spec_path("cohere2"), td, variant="tiny"), ref, ids)
    assert pre > 10 * TOL and dec > 10 * TOL


@pytest.mark.parametrize("edit", ["rope on every layer", "neox style"])
def test_cohere2_rope_placement_and_style_matter(cohere2, edit, tmp_path):
    """Negative controls: RoPE on the full-attention layer too (no NoPE), or rotating
    halves (``neox``) instead of adjacent pairs, gives other logits."""
    _, path, ids, ref = cohere2
    text = open(spec_path("cohere2")).read()
    old, new = {"rope on every layer": ('repeat: "{1 if swa else 0}"', "repeat: 1"),
                "neox style": ("style: normal", "style: neox")}[edit]
    assert old in text
    changed = tmp_path / "cohere2_changed.yaml"
    changed.write_text(text.replace(old, new))
    pre, dec = compare(md.load_model(str(changed), path, variant="tiny"), ref, ids)
    assert pre > 10 * TOL and dec > 10 * TOL


def test_cohere2_logit_scale_matters(cohere2):
    _, path, ids, ref = cohere2
    spec = with_hf_config(md.load_spec(spec_path("cohere2")), logit_scale=1.0)
    pre, dec = compare(md.load_model(spec, path, variant="tiny"), ref, ids)
    assert pre > 10 * TOL and dec > 10 * TOL


def test_cohere2_layer_types_from_config(tmp_path):
    """A non-periodic layer_types: each layer's kind (window + RoPE, or full + NoPE)
    follows the list; the default period would not."""
    kinds = ["full_attention", "sliding_attention", "full_attention", "sliding_attention"]
    model = make_cohere2(seed=1, layer_types=kinds)
    assert list(model.config.layer_types) == kinds
    _, path, ids, ref = hf_case(model, tmp_path / "hf")
    ours = tiny_model("cohere2", path)
    assert ours.params["sliding"] == [False, True, False, True]
    assert rope_layers_of(ours) == [1, 3]
    assert_logits_match("cohere2 layer_types", ours, ids, ref)
    td = md.load_weights(path)
    del td.metadata["layer_types"]                      # negative control: the period 4
    pre, dec = compare(md.load_model(spec_path("cohere2"), td, variant="tiny"), ref, ids)
    assert pre > 10 * TOL and dec > 10 * TOL


def test_cohere2_sliding_window_pattern_config(tmp_path):
    """An older config.json (as on the Hub for Command R7B) states sliding_window_pattern
    and no layer_types: every pattern-th layer is full."""
    model = make_cohere2(seed=2, sliding_window_pattern=2)
    assert list(model.config.layer_types) == ["sliding_attention", "full_attention"] * 2
    path = save_hf(model, tmp_path / "hf")
    cfg_path = os.path.join(path, "config.json")
    cfg = json.load(open(cfg_path))
    del cfg["layer_types"]
    cfg["sliding_window_pattern"] = 2
    json.dump(cfg, open(cfg_path, "w"))
    ids = token_ids(model.config.vocab_size)
    ref = hf_logits(model, ids)
    ours = tiny_model("cohere2", path)
    assert ours.params["sliding"] == [True, False, True, False]
    assert_logits_match("cohere2 sliding_window_pattern 2", ours, ids, ref)


def test_cohere2_refuses_what_it_does_not_model(cohere2):
    _, path, _, _ = cohere2
    spec = md.load_spec(spec_path("cohere2"))
    meta = dict(md.load_weights(path).metadata)
    assert params_from_metadata(spec, meta)
    with pytest.raises(md.WeightsError, match="RoPE scaling linear is not modelled"):
        params_from_metadata(spec, {**meta, "rope_parameters": {"rope_type": "linear",
                                                                 "rope_theta": 1e4,
                                                                 "factor": 2.0}})
    with pytest.raises(md.WeightsError, match="attention biases"):
        params_from_metadata(spec, {**meta, "attention_bias": True})
    with pytest.raises(md.WeightsError, match="layer_types has 2 entries for 4 layers"):
        params_from_metadata(spec, {**meta, "layer_types": ["sliding_attention"] * 2})
    # transformers < 5: rope_theta at the top level, rope_scaling null
    old = {k: v for k, v in meta.items() if k != "rope_parameters"}
    got = params_from_metadata(spec, {**old, "rope_theta": 50000.0, "rope_scaling": None})
    assert got["rope_theta"] == 50000.0 and got["rope_type"] == "none"


def test_cohere2_export_round_trip(tmp_path):
    """`maxdecl export` of an HF folder with a non-periodic layer_types writes the list
    under cohere2.layer_types (a key llama.cpp ignores), which maxdecl reads back."""
    import gguf

    kinds = ["full_attention", "sliding_attention", "full_attention", "sliding_attention"]
    _, path, ids, ref = hf_case(make_cohere2(seed=3, layer_types=kinds), tmp_path / "hf")
    out = tmp_path / "x.gguf"
    subprocess.run([sys.executable, "-m", "maxdecl", "export", path, "--spec",
                    spec_path("cohere2"), "-o", str(out)], check=True, capture_output=True)
    fields = gguf.GGUFReader(str(out)).fields
    assert fields["general.architecture"].contents() == "cohere2"
    assert fields["cohere2.layer_types"].contents() == kinds
    assert fields["cohere2.attention.sliding_window"].contents() == WINDOW
    assert fields["cohere2.logit_scale"].contents() == 0.5
    assert "output.weight" not in {t.name for t in gguf.GGUFReader(str(out)).tensors}
    ours = tiny_model("cohere2", str(out))
    assert ours.params["sliding"] == [False, True, False, True]
    pre, dec = compare(ours, ref, ids)
    assert pre <= TOL and dec <= TOL


# -- GGUF, as llama.cpp's convert_hf_to_gguf.py (Cohere2Model) writes it ------------------

COHERE2_LAYERS = {"input_layernorm": "attn_norm", "self_attn.q_proj": "attn_q",
                  "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v",
                  "self_attn.o_proj": "attn_output", "mlp.gate_proj": "ffn_gate",
                  "mlp.up_proj": "ffn_up", "mlp.down_proj": "ffn_down"}


def cohere2_to_gguf(model, path, pattern_array=False) -> str:
    """A Cohere2ForCausalLM as llama.cpp's converter writes it (arch ``cohere2``): the base
    keys (context, width, layers, FFN, heads, rope.freq_base, layer_norm_epsilon, key and
    value length from config.json's head_dim), logit_scale, sliding_window, vocab_size,
    rope.dimension_count (rotary_pct 1.0 * head_dim) and rope.scaling.type none; HF's row
    order (no q/k permutation); no output.weight (tied), no layer-pattern key (llama.cpp:
    every 4th layer full). ``pattern_array``: also the per-layer bool array under
    cohere2.attention.sliding_window_pattern, as llama.cpp's converter writes it for
    Cohere2Moe (the key maxdecl must read as a list, not as its length)."""
    import gguf

    cfg, sd = model.config, hf_state(model)
    head_dim = cfg.hidden_size // cfg.num_attention_heads
    w = gguf_writer(path, "cohere2", cfg)
    w.add_name("tiny-cohere2")
    w.add_rope_freq_base(float(cfg.rope_parameters["rope_theta"]))
    w.add_layer_norm_eps(cfg.layer_norm_eps)
    w.add_key_length(head_dim)
    w.add_value_length(head_dim)
    w.add_logit_scale(cfg.logit_scale)
    w.add_sliding_window(cfg.sliding_window)
    w.add_vocab_size(cfg.vocab_size)
    w.add_rope_dimension_count(head_dim)
    w.add_rope_scaling_type(gguf.RopeScalingType.NONE)
    if pattern_array:
        w.add_sliding_window_pattern([t == "sliding_attention" for t in cfg.layer_types])
    w.add_file_type(gguf.LlamaFileType.ALL_F32)
    _add_tokenizer(w, cfg.vocab_size)
    t = {"token_embd.weight": sd["model.embed_tokens.weight"]}
    for i in range(cfg.num_hidden_layers):
        for src, dst in COHERE2_LAYERS.items():
            t[f"blk.{i}.{dst}.weight"] = sd[f"model.layers.{i}.{src}.weight"]
    t["output_norm.weight"] = sd["model.norm.weight"]
    assert "lm_head.weight" not in sd or cfg.tie_word_embeddings
    _write(w, t)
    return str(path)


@pytest.fixture(scope="module")
def cohere2_gguf(cohere2, tmp_path_factory):
    return cohere2_to_gguf(cohere2[0], tmp_path_factory.mktemp("cohere2_gguf") / "tiny.gguf")


def test_cohere2_gguf_matches_hf(cohere2, cohere2_gguf):
    """The converter's GGUF: params from the cohere2.* keys, the period-4 pattern
    (no key), the tied output from token_embd.weight."""
    _, _, ids, ref = cohere2
    got = hf_params("cohere2", cohere2_gguf)[2]
    assert got["logit_scale"] == 0.5 and got["window"] == WINDOW and got["vocab"] == 96
    assert got["rope_theta"] == 10000.0 and got["norm_eps"] == pytest.approx(1e-5)
    assert got["rope_dim"] == 32 and got["swa_pattern"] == 4 and got["layer_types"] == []
    ours = md.load_model(spec_path("cohere2"), cohere2_gguf, variant="tiny")
    assert ours.params["sliding"] == [True, True, True, False]
    assert_logits_match("cohere2 GGUF", ours, ids, ref)


def test_cohere2_gguf_pattern_array_matches_hf(tmp_path):
    """A GGUF whose sliding_window_pattern is a per-layer bool array (non-periodic)."""
    kinds = ["full_attention", "sliding_attention", "full_attention", "sliding_attention"]
    model = make_cohere2(seed=1, layer_types=kinds)
    path = cohere2_to_gguf(model, tmp_path / "x.gguf", pattern_array=True)
    ids = token_ids(model.config.vocab_size)
    ours = md.load_model(spec_path("cohere2"), path, variant="tiny")
    assert ours.params["sliding"] == [False, True, False, True]
    assert_logits_match("cohere2 GGUF (pattern array)", ours, ids, hf_logits(model, ids))


def test_llama_cpp_runs_the_gguf_as_hf(cohere2, cohere2_gguf):
    """llama.cpp itself on the converter-style GGUF gives HF's logits (so the layout
    above is llama.cpp's, not just ours)."""
    llama_cpp = pytest.importorskip("llama_cpp")
    _, _, ids, ref = cohere2
    got = llama_cpp_logits(llama_cpp, cohere2_gguf, ids)
    print(f"llama.cpp vs HF: {rel_err(got, ref):.2e} (of max|ref|)")
    assert rel_err(got, ref) <= TOL
