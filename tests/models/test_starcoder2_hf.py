"""specs/starcoder2.yaml against transformers' Starcoder2ForCausalLM.

A small seeded float32 StarCoder2: LayerNorm with bias, grouped-query attention (4
query heads, 2 kv heads) whose q/k/v/o projections all carry biases, RoPE rotating
halves (neox), a GELU-tanh MLP with biases, an untied output (as StarCoder2-7B/15B),
and a sliding window (5) shorter than the test sequence, as StarCoder2's 4096 is
shorter than its 16384-token context.
"""

import json
import shutil

import numpy as np
import pytest

import maxdecl as md
from maxdecl.pipelines.model_loading import params_from_metadata

from modelhelp import (N_PROMPT, TOL, _add_tokenizer, _write, assert_greedy_matches_hf,
                       assert_logits_match, assert_tiny_decoder_params, compare, gguf_writer,
                       hf_case, hf_params, hf_state, randomize, spec_path, tiny_model)

pytest.importorskip("torch")
pytest.importorskip("transformers")

PROMPTS = [[3, 17, 42, 99, 5, 7, 64, 1], [8, 9, 120], [5, 60, 33, 2, 90, 11, 7]]
N_NEW = 6
WINDOW = 5


def make_starcoder2(seed=0, **kw):
    """Starcoder2ForCausalLM: dim 64, 2 layers, GQA 4/2, biases everywhere, window 5."""
    import torch
    import transformers

    torch.manual_seed(seed)
    cfg = dict(vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
               num_attention_heads=4, num_key_value_heads=2, norm_epsilon=1e-5,
               max_position_embeddings=64, rope_theta=100000.0, sliding_window=WINDOW,
               hidden_act="gelu_pytorch_tanh", use_bias=True, bos_token_id=0,
               eos_token_id=0, tie_word_embeddings=False, attn_implementation="eager")
    cfg.update(kw)
    return randomize(transformers.Starcoder2ForCausalLM(transformers.Starcoder2Config(**cfg)),
                     seed)


@pytest.fixture(scope="module")
def starcoder2(tmp_path_factory):
    model = make_starcoder2()
    assert model.config.sliding_window < N_PROMPT
    return hf_case(model, tmp_path_factory.mktemp("starcoder2_hf"))


@pytest.fixture(scope="module")
def ours(starcoder2):
    return tiny_model("starcoder2", starcoder2[1])


def test_starcoder2_config_from_hf(starcoder2):
    model, path, _, _ = starcoder2
    spec, meta, got = hf_params("starcoder2", path)
    assert_tiny_decoder_params(got)
    assert got["window"] == WINDOW and got["rope_theta"] == 100000.0
    assert got["norm_eps"] == pytest.approx(1e-5) and got["rope_type"] == "default"
    # config.json as StarCoder2 ships it (transformers < 5): top-level rope_theta,
    # rope_scaling null; a null sliding_window means no window
    old = {k: v for k, v in meta.items() if k != "rope_parameters"}
    got = params_from_metadata(spec, {**old, "rope_theta": 999999.4420358813,
                                      "rope_scaling": None, "sliding_window": None})
    assert got["rope_theta"] == 999999.4420358813 and got["window"] == 0
    assert "rope_type" not in got                    # keeps the spec's default


def test_starcoder2_prefill_and_decode_match_hf(starcoder2, ours):
    model, path, ids, ref = starcoder2
    assert_logits_match("starcoder2", ours, ids, ref)


def test_starcoder2_greedy_generate_matches_hf(starcoder2, ours):
    assert_greedy_matches_hf(starcoder2[0], ours, PROMPTS, N_NEW)


def test_starcoder2_window_and_biases_matter(starcoder2):
    """Negative controls: the same weights without the sliding window, or with the
    projection biases zeroed, give other logits."""
    model, path, ids, ref = starcoder2
    for change in ("no window", "no biases"):
        td = md.load_weights(path)
        if change == "no window":
            td.metadata["sliding_window"] = None
        else:
            for name in list(td.keys()):
                if name.endswith("_proj.bias") or name.endswith("c_fc.bias"):
                    td[name] = np.zeros_like(np.asarray(td[name]))
        ours = md.load_model(spec_path("starcoder2"), td, variant="tiny")
        pre, dec = compare(ours, ref, ids)
        assert pre > 10 * TOL and dec > 10 * TOL, change


def starcoder2_to_gguf(model, path) -> str:
    """Write a Starcoder2ForCausalLM as llama.cpp's converter does (arch ``starcoder2``,
    TextModel's generic keys): HF's q/k row order kept (neox rope), biases as ``.bias``,
    c_fc / c_proj as ffn_up / ffn_down, the LayerNorm epsilon as
    attention.layer_norm_epsilon. The converter writes no sliding window; a config with
    one gets ``starcoder2.attention.sliding_window`` here (llama.cpp's key name, which
    llama.cpp does not read for starcoder2), so that maxdecl applies it."""
    import gguf

    cfg, sd = model.config, hf_state(model)
    w = gguf_writer(path, "starcoder2", cfg)
    w.add_rope_freq_base(float(cfg.rope_parameters["rope_theta"]))
    w.add_layer_norm_eps(cfg.norm_epsilon)
    if cfg.sliding_window:
        w.add_sliding_window(cfg.sliding_window)
    w.add_file_type(gguf.LlamaFileType.ALL_F32)
    _add_tokenizer(w, cfg.vocab_size)
    names = {"input_layernorm": "attn_norm", "self_attn.q_proj": "attn_q",
             "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v",
             "self_attn.o_proj": "attn_output", "post_attention_layernorm": "ffn_norm",
             "mlp.c_fc": "ffn_up", "mlp.c_proj": "ffn_down"}
    t = {"token_embd.weight": sd["model.embed_tokens.weight"]}
    for i in range(cfg.num_hidden_layers):
        for src, dst in names.items():
            for kind in ("weight", "bias"):
                t[f"blk.{i}.{dst}.{kind}"] = sd[f"model.layers.{i}.{src}.{kind}"]
    t["output_norm.weight"] = sd["model.norm.weight"]
    t["output_norm.bias"] = sd["model.norm.bias"]
    if not cfg.tie_word_embeddings:
        t["output.weight"] = sd["lm_head.weight"]
    _write(w, t)
    return str(path)


def test_starcoder2_gguf_matches_hf(starcoder2, tmp_path):
    """The same weights as a llama.cpp-style GGUF (starcoder2.* keys, biases, LayerNorm
    epsilon), the window from starcoder2.attention.sliding_window."""
    model, _, ids, ref = starcoder2
    path = starcoder2_to_gguf(model, tmp_path / "tiny-starcoder2.gguf")
    spec = md.load_spec(spec_path("starcoder2"))
    got = params_from_metadata(spec, md.load_weights(path).metadata)
    assert (got["window"], got["n_kv_heads"], got["vocab"]) == (WINDOW, 2, 128)
    assert got["norm_eps"] == pytest.approx(1e-5) and got["rope_theta"] == 100000.0
    ours = md.load_model(spec_path("starcoder2"), path, variant="tiny")
    pre, dec = compare(ours, ref, ids)
    assert pre <= TOL and dec <= TOL


@pytest.mark.parametrize("layout", ["rope_parameters", "rope_scaling"])
def test_starcoder2_rope_scaling_is_refused(starcoder2, tmp_path, layout):
    """A config.json with RoPE scaling, which the spec does not model, is refused when
    loading (formats.hf.refuse), in both config layouts."""
    _, path, _, _ = starcoder2
    scaled = tmp_path / "scaled"
    shutil.copytree(path, scaled)
    cfg = json.loads((scaled / "config.json").read_text())
    cfg.pop("rope_parameters", None)
    cfg.pop("rope_scaling", None)
    if layout == "rope_parameters":          # transformers >= 5
        cfg["rope_parameters"] = {"rope_type": "linear", "rope_theta": 100000.0, "factor": 2.0}
    else:                                    # older config.json
        cfg["rope_theta"] = 100000.0
        cfg["rope_scaling"] = {"type": "linear", "factor": 2.0}
    (scaled / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(md.WeightsError, match="RoPE scaling linear is not modelled"):
        md.load_model(spec_path("starcoder2"), str(scaled), variant="tiny")
