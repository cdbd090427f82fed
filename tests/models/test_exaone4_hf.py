"""specs/exaone4.yaml against transformers' Exaone4ForCausalLM (and llama.cpp).

Small seeded float32 EXAONE 4.0 models: RMSNorm after each sublayer (no input norm),
per-head q/k RMSNorm, SwiGLU, head_dim 32 != dim / n_heads, GQA 4 / 2 heads.

* hybrid: 4 layers, sliding window 5 (shorter than the 12-token prompt) on layers
  0, 1 and 3 (config.json's ``layer_types``, not transformers' every-4th default),
  RoPE only on those; layer 2 is full attention without RoPE (NoPE). Untied output.
* full: ``sliding_window`` null, every layer full attention with RoPE (as the 1.2B),
  tied output, head_dim 16 = dim / n_heads (llama.cpp's exaone4 needs it).
* llama3: the hybrid with llama3 RoPE scaling (EXAONE 4.0's released configs use it):
  rope_freqs.weight computed from config.json.

Each is saved with ``save_pretrained`` and loaded by maxdecl from the folder, then
compared on a prompt plus decode steps through the KV cache. The same weights are
written as a GGUF the way llama.cpp's converter writes arch ``exaone4`` and run by
maxdecl; llama.cpp itself (llama-cpp-python, when installed) runs the full-attention
one (llama.cpp only switches sliding windows on for a 64-layer model, so it runs the
tiny hybrid with RoPE everywhere and no window: not the transformers model).
"""

import subprocess
import sys

import numpy as np
import pytest

import maxdecl as md
from maxdecl.pipelines.model_loading import params_from_metadata

from modelhelp import (N_PROMPT, TOL, _add_tokenizer, _write, assert_greedy_matches_hf,
                       assert_logits_match, compare, gguf_writer, hf_case, hf_state,
                       llama_cpp_logits, llama_cpp_rope_freqs, randomize, rel_err, spec_path,
                       token_ids, with_hf_config)

pytest.importorskip("torch")
pytest.importorskip("transformers")

VOCAB = 128
WINDOW = 5
HYBRID_TYPES = ["sliding_attention", "sliding_attention", "full_attention", "sliding_attention"]
TOL_LLAMA_CPP = 5e-3        # of max|ref|: llama.cpp keeps its KV cache in f16
LLAMA3_ROPE = {"rope_type": "llama3", "rope_theta": 10000.0, "factor": 8.0,
               "low_freq_factor": 1.0, "high_freq_factor": 4.0,
               "original_max_position_embeddings": 16}


def make_exaone4(seed=0, **kw):
    """Exaone4ForCausalLM, float32: dim 64, 4 layers, GQA 4 / 2 heads of 32, SwiGLU 128,
    vocab 128, rope_theta 10000, eager attention; hybrid (window 5) unless overridden."""
    import torch
    import transformers

    torch.manual_seed(seed)
    cfg = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=4,
               num_attention_heads=4, num_key_value_heads=2, head_dim=32, rms_norm_eps=1e-5,
               max_position_embeddings=64,
               rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
               sliding_window=WINDOW, layer_types=HYBRID_TYPES, tie_word_embeddings=False,
               attn_implementation="eager", pad_token_id=0, bos_token_id=1, eos_token_id=2)
    cfg.update(kw)
    config = transformers.Exaone4Config(**cfg)
    return randomize(transformers.Exaone4ForCausalLM(config), seed)


def make_full(seed=1):
    """No window (every layer full attention with RoPE), tied output, head_dim 16 =
    dim / n_heads (llama.cpp's exaone4 sizes attn_output as [dim, dim])."""
    return make_exaone4(seed, sliding_window=None, layer_types=["full_attention"] * 4,
                        head_dim=16, tie_word_embeddings=True)


def load(path, spec=None):
    return md.load_model(spec or spec_path("exaone4"), path, variant="tiny")


def rope_layers_of(model) -> list[str]:
    """The layers whose graph holds rope nodes."""
    return sorted({n.layer.split(".")[1] for n in model.graph.nodes if n.op == "rope"})


@pytest.fixture(scope="module")
def hybrid(tmp_path_factory):
    model = make_exaone4(seed=0)
    assert model.config.layer_types == HYBRID_TYPES and WINDOW < N_PROMPT
    return hf_case(model, tmp_path_factory.mktemp("exaone4_hybrid"))


@pytest.fixture(scope="module")
def full(tmp_path_factory):
    model = make_full()
    return hf_case(model, tmp_path_factory.mktemp("exaone4_full"))


def test_exaone4_config_from_hf(hybrid, full):
    _, path, _, _ = hybrid
    ours = load(path)
    p = ours.params
    assert (p["dim"], p["head_dim"], p["n_heads"], p["n_kv_heads"], p["vocab"]) == (64, 32, 4, 2, VOCAB)
    assert p["window"] == WINDOW and p["swa_window"] == WINDOW
    assert p["sliding"] == [True, True, False, True]
    assert p["rope_layers"] == [1, 1, 0, 1]
    assert rope_layers_of(ours) == ["0", "1", "3"]          # the full layer is NoPE
    windows = {n.layer: n.attrs.get("sliding_window") for n in ours.graph.nodes
               if n.op == "attention"}
    assert windows == {"blk.0.attn": WINDOW, "blk.1.attn": WINDOW, "blk.2.attn": None,
                       "blk.3.attn": WINDOW}
    shapes = {w: tuple(v.shape) for w, v in ours.weights.items()}
    assert shapes["blk.0.attn_q.weight"] == (128, 64) and shapes["blk.0.attn_q_norm.weight"] == (32,)
    assert "output.weight" in shapes
    ours = load(full[1])
    assert ours.params["window"] == 0 and ours.params["rope_layers"] == [1, 1, 1, 1]
    assert "output.weight" not in {w for w in ours.weights}      # tied


def test_exaone4_hybrid_prefill_and_decode_match_hf(hybrid):
    model, path, ids, ref = hybrid
    assert_logits_match("exaone4 hybrid (window 5)", load(path), ids, ref)


def test_exaone4_full_attention_prefill_and_decode_match_hf(full):
    model, path, ids, ref = full
    assert_logits_match("exaone4 full attention", load(path), ids, ref)


def test_exaone4_greedy_matches_hf(hybrid):
    model, path, _, _ = hybrid
    prompts = [token_ids(VOCAB, n=7, seed=21), token_ids(VOCAB, n=10, seed=22)]
    assert_greedy_matches_hf(model, load(path), prompts, n_new=6)


@pytest.mark.parametrize("override", [
    {"window": "{0}"},                                            # no window, RoPE everywhere
    {"swa_layers": "{[True] * 4}"},                               # RoPE + window everywhere
    {"swa_layers": "{[False] * 4}"},                              # NoPE full attention everywhere
    {"swa_layers": "{[(i + 1) % 4 != 0 for i in range(4)]}"},     # transformers' default pattern
])
def test_exaone4_hybrid_pattern_matters(hybrid, override):
    """Negative controls: the same weights read with another window or layer pattern."""
    model, path, ids, ref = hybrid
    ours = load(path, with_hf_config(md.load_spec(spec_path("exaone4")), **override))
    pre, dec = compare(ours, ref, ids)
    assert pre > 30 * TOL and dec > 30 * TOL


def test_exaone4_pattern_fallbacks(hybrid):
    """Without layer_types, config.json's sliding_window_pattern: an int (every n-th layer
    full) or a string ("LLGL", repeated); a list of the wrong length is refused."""
    _, path, _, _ = hybrid
    spec = md.load_spec(spec_path("exaone4"))
    meta = {k: v for k, v in md.load_weights(path).metadata.items() if k != "layer_types"}
    got = params_from_metadata(spec, {**meta, "sliding_window_pattern": 2})
    assert got["swa_layers"] == [True, False, True, False]
    got = params_from_metadata(spec, {**meta, "sliding_window_pattern": "LLGL"})
    assert got["swa_layers"] == [True, True, False, True]
    with pytest.raises(md.WeightsError, match="3 entries for 4 layers"):
        params_from_metadata(spec, {**meta, "layer_types": HYBRID_TYPES[:3]})


def test_exaone4_rope_scaling_is_refused_unless_llama3(hybrid):
    _, path, _, _ = hybrid
    spec = md.load_spec(spec_path("exaone4"))
    meta = dict(md.load_weights(path).metadata)
    yarn = {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 2.0,
            "original_max_position_embeddings": 16}
    with pytest.raises(md.WeightsError, match="RoPE scaling yarn is not modelled"):
        params_from_metadata(spec, {**meta, "rope_parameters": yarn})


@pytest.fixture(scope="module")
def llama3(tmp_path_factory):
    model = make_exaone4(seed=4, rope_parameters=dict(LLAMA3_ROPE))
    return hf_case(model, tmp_path_factory.mktemp("exaone4_llama3"))


def test_exaone4_llama3_rope_scaling_matches_hf(llama3):
    """rope_freqs.weight computed from config.json (formats.hf.computed), as the
    converter computes it; without it the logits differ."""
    model, path, ids, ref = llama3
    ours = load(path)
    assert ours.params["rope_type"] == "llama3"
    want = llama_cpp_rope_freqs(model.config)
    assert want is not None and not np.allclose(want, 1.0)
    assert_logits_match("exaone4 hybrid, llama3 RoPE", ours, ids, ref)
    pre, dec = compare(load(path, with_hf_config(md.load_spec(spec_path("exaone4")),
                                                 rope_type="{'default'}")), ref, ids)
    assert pre > 30 * TOL and dec > 30 * TOL


# -- GGUF, as llama.cpp's convert_hf_to_gguf.py writes arch exaone4 -----------------------

NAMES = {"self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k",
         "self_attn.v_proj": "attn_v", "self_attn.o_proj": "attn_output",
         "self_attn.q_norm": "attn_q_norm", "self_attn.k_norm": "attn_k_norm",
         "post_attention_layernorm": "post_attention_norm",
         "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up", "mlp.down_proj": "ffn_down",
         "post_feedforward_layernorm": "post_ffw_norm"}


def exaone4_to_gguf(model, path) -> str:
    """Exaone4Model of convert_hf_to_gguf.py: TextModel's keys (key/value length from
    head_dim), vocab_size, sliding_window and the per-layer bool pattern only when
    config.json has a window, HF's q/k row order (neox), rope_freqs.weight for llama3
    scaling, no output.weight when tied."""
    import gguf

    cfg, sd = model.config, hf_state(model)
    w = gguf_writer(path, "exaone4", cfg)
    w.add_name("tiny-exaone4")
    w.add_rope_freq_base(float(cfg.rope_parameters["rope_theta"]))
    w.add_layer_norm_rms_eps(cfg.rms_norm_eps)
    w.add_key_length(cfg.head_dim)
    w.add_value_length(cfg.head_dim)
    w.add_vocab_size(cfg.vocab_size)
    if cfg.sliding_window is not None:
        w.add_sliding_window(cfg.sliding_window)
        w.add_sliding_window_pattern([t == "sliding_attention" for t in cfg.layer_types])
    w.add_file_type(gguf.LlamaFileType.ALL_F32)
    _add_tokenizer(w, cfg.vocab_size)
    t = {"token_embd.weight": sd["model.embed_tokens.weight"]}
    freqs = llama_cpp_rope_freqs(cfg)
    if freqs is not None:
        t["rope_freqs.weight"] = freqs
    for i in range(cfg.num_hidden_layers):
        for src, dst in NAMES.items():
            t[f"blk.{i}.{dst}.weight"] = sd[f"model.layers.{i}.{src}.weight"]
    t["output_norm.weight"] = sd["model.norm.weight"]
    if not cfg.tie_word_embeddings:
        t["output.weight"] = sd["lm_head.weight"]
    _write(w, t)
    return str(path)


@pytest.mark.parametrize("case", ["hybrid", "full", "llama3"])
def test_exaone4_converter_gguf_matches_hf(case, request, tmp_path):
    model, _, ids, ref = request.getfixturevalue(case)
    path = exaone4_to_gguf(model, tmp_path / f"{case}.gguf")
    ours = load(path)
    want_sliding = [t == "sliding_attention" for t in model.config.layer_types]
    if model.config.sliding_window is None:
        want_sliding = [False] * 4
    assert ours.params["sliding"] == want_sliding
    assert_logits_match(f"exaone4 {case} GGUF", ours, ids, ref)


def test_exaone4_export_round_trip(hybrid, tmp_path):
    """`maxdecl export` of the hybrid HF folder writes the window and the bool pattern
    under llama.cpp's keys and reads back to the transformers logits."""
    import gguf

    model, path, ids, ref = hybrid
    out = tmp_path / "x.gguf"
    subprocess.run([sys.executable, "-m", "maxdecl", "export", path, "--spec",
                    spec_path("exaone4"), "-o", str(out)], check=True, capture_output=True)
    fields = gguf.GGUFReader(str(out)).fields
    assert fields["general.architecture"].contents() == "exaone4"
    assert fields["exaone4.attention.sliding_window"].contents() == WINDOW
    assert fields["exaone4.attention.sliding_window_pattern"].contents() == [True, True, False, True]
    assert fields["exaone4.attention.key_length"].contents() == 32
    pre, dec = compare(load(str(out)), ref, ids)
    assert pre <= TOL and dec <= TOL


def test_exaone4_llama_cpp_runs_the_full_attention_gguf(full, tmp_path):
    llama_cpp = pytest.importorskip("llama_cpp")

    model, _, ids, ref = full
    path = exaone4_to_gguf(model, tmp_path / "full.gguf")
    try:
        theirs = llama_cpp_logits(llama_cpp, path, ids)
    except Exception as e:          # a llama.cpp build without arch exaone4
        pytest.skip(f"llama.cpp cannot load exaone4: {e}")
    err = rel_err(theirs, ref)
    ours = np.asarray(load(path).logits(ids))
    print(f"llama.cpp vs HF: {err:.2e}; maxdecl vs llama.cpp: {rel_err(ours, theirs):.2e}")
    assert err <= TOL_LLAMA_CPP
    assert rel_err(ours, theirs) <= TOL_LLAMA_CPP
