"""specs/smollm3.yaml against transformers' SmolLM3ForCausalLM (and llama.cpp).

A small seeded float32 SmolLM3 (4 layers, 4 query heads over 2 kv heads, vocab 300,
tied output) whose per-layer NoPE pattern is config.json's ``no_rope_layers`` =
[1, 0, 0, 1] (1 = RoPE; not transformers' every-4th default) is saved with
``save_pretrained`` and loaded by maxdecl from the directory. The pattern is read from
config.json: negative controls show that an all-RoPE (plain Llama) or the default
pattern gives clearly different logits. A sliding-window config, the interval
fallback, refusals and a ``maxdecl export`` round trip are covered too. A GGUF written
as llama.cpp's converter writes it (no NoPE key: llama.cpp hard-codes every 4th layer)
runs in maxdecl and, when llama-cpp-python is installed, in llama.cpp itself.
"""

import subprocess
import sys

import numpy as np
import pytest

import maxdecl as md
from maxdecl.pipelines.model_loading import params_from_metadata

from modelhelp import (TOL, _add_tokenizer, _write, assert_greedy_matches_hf, assert_logits_match,
                       compare, gguf_writer, hf_case, hf_logits, hf_state, layer_tensors,
                       llama_cpp_logits, llama_cpp_permute, randomize, rel_err, spec_path,
                       token_ids, with_hf_config)

pytest.importorskip("torch")
pytest.importorskip("transformers")

VOCAB = 300
TOL_LLAMA_CPP = 5e-3        # of max|ref|: llama.cpp keeps its KV cache in f16


def make_smollm3(seed=0, **kw):
    """SmolLM3ForCausalLM, float32: dim 256, 4 layers, GQA 4 / 2 heads, SwiGLU 512,
    vocab 300, rope_theta 10000, tied output, eager attention."""
    import torch
    import transformers

    torch.manual_seed(seed)
    cfg = dict(vocab_size=VOCAB, hidden_size=256, intermediate_size=512, num_hidden_layers=4,
               num_attention_heads=4, num_key_value_heads=2, rms_norm_eps=1e-6,
               max_position_embeddings=64,
               rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
               tie_word_embeddings=True, attn_implementation="eager",
               pad_token_id=0, bos_token_id=1, eos_token_id=2)
    cfg.update(kw)
    config = transformers.SmolLM3Config(**cfg)
    return randomize(transformers.SmolLM3ForCausalLM(config), seed)


def load(path, spec=None):
    return md.load_model(spec or spec_path("smollm3"), path, variant="tiny")


def rope_layers_of(model) -> list[str]:
    """The layers whose graph holds rope nodes."""
    return sorted({n.layer.split(".")[1] for n in model.graph.nodes if n.op == "rope"})


@pytest.fixture(scope="module")
def smollm3(tmp_path_factory):
    model = make_smollm3(seed=0, no_rope_layers=[1, 0, 0, 1])
    assert model.config.no_rope_layers == [1, 0, 0, 1]
    return hf_case(model, tmp_path_factory.mktemp("smollm3_hf"))


def test_smollm3_config_from_hf(smollm3):
    model, path, _, _ = smollm3
    ours = load(path)
    assert ours.params["rope_layers"] == [1, 0, 0, 1]       # from config.json, not the variant
    assert rope_layers_of(ours) == ["0", "3"]                # NoPE layers have no rope node
    assert ours.params["vocab"] == VOCAB and ours.params["rope_theta"] == 10000.0
    assert ours.params["window"] == 0
    shapes = {w: tuple(v.shape) for w, v in ours.weights.items()}
    assert shapes["blk.0.attn_k.weight"] == (128, 256)      # 2 kv heads * head_dim 64
    assert "output.weight" not in shapes                     # tied: token_embd stands in


def test_smollm3_prefill_and_decode_match_hf(smollm3):
    model, path, ids, ref = smollm3
    assert_logits_match("smollm3", load(path), ids, ref)


def test_smollm3_greedy_matches_hf(smollm3):
    model, path, _, _ = smollm3
    prompts = [token_ids(VOCAB, n=6, seed=21), token_ids(VOCAB, n=9, seed=22)]
    assert_greedy_matches_hf(model, load(path), prompts, n_new=8)


@pytest.mark.parametrize("pattern", ["{[1, 1, 1, 1]}", "{[0, 0, 0, 0]}", "{[]}"])
def test_smollm3_nope_pattern_matters(smollm3, pattern):
    """Negative controls: the same weights with RoPE on every layer (plain Llama), on no
    layer, or the default every-4th pattern instead of config.json's list."""
    model, path, ids, ref = smollm3
    spec = with_hf_config(md.load_spec(spec_path("smollm3")), no_rope_layers=pattern)
    ours = load(path, spec)
    assert ours.params["rope_layers"] != [1, 0, 0, 1]
    pre, dec = compare(ours, ref, ids)
    assert pre > 30 * TOL and dec > 30 * TOL


def test_smollm3_interval_when_config_lists_no_layers(smollm3):
    """Without no_rope_layers, every no_rope_layer_interval-th layer is NoPE
    (transformers' default); a list shorter than the layers is refused."""
    _, path, _, _ = smollm3
    td = md.load_weights(path)
    del td.metadata["no_rope_layers"]
    td.metadata["no_rope_layer_interval"] = 2
    ours = md.load_model(spec_path("smollm3"), td, variant="tiny")
    assert ours.params["rope_layers"] == [1, 0, 1, 0]
    assert rope_layers_of(ours) == ["0", "2"]
    spec = md.load_spec(spec_path("smollm3"))
    meta = dict(md.load_weights(path).metadata)
    assert params_from_metadata(spec, {**meta, "no_rope_layers": [1, 0, 0, 1, 1]})  # "at least"
    with pytest.raises(md.WeightsError, match="no_rope_layers has 3 entries for 4 layers"):
        params_from_metadata(spec, {**meta, "no_rope_layers": [1, 0, 1]})


@pytest.mark.parametrize("extra, why", [
    ({"rope_parameters": {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 2.0}},
     "RoPE scaling yarn is not modelled"),
    ({"attention_bias": True}, "biases"),
    ({"mlp_bias": True}, "biases"),
])
def test_smollm3_refuses_what_it_does_not_model(smollm3, extra, why):
    _, path, _, _ = smollm3
    spec = md.load_spec(spec_path("smollm3"))
    meta = dict(md.load_weights(path).metadata)
    assert params_from_metadata(spec, meta)
    with pytest.raises(md.WeightsError, match=why):
        params_from_metadata(spec, {**meta, **extra})


def test_smollm3_sliding_window_matches_hf(tmp_path):
    """use_sliding_window with a 5-token window: transformers makes the NoPE layer (3)
    a sliding one (layer_types); without the window the logits differ."""
    model = make_smollm3(seed=1, use_sliding_window=True, sliding_window=5)
    assert model.config.layer_types[3] == "sliding_attention"
    _, path, ids, ref = hf_case(model, tmp_path / "hf")
    ours = load(path)
    assert ours.params["window"] == 5
    assert_logits_match("smollm3 (window 5)", ours, ids, ref)
    spec = with_hf_config(md.load_spec(spec_path("smollm3")), window="{0}")
    pre, dec = compare(load(path, spec), ref, ids)
    assert max(pre, dec) > 30 * TOL


def test_smollm3_export_round_trip(tmp_path):
    """`maxdecl export` of an HF folder with a non-default NoPE pattern and sliding
    layers writes them as arrays (smollm3.no_rope_layers, smollm3.layer_types) that
    maxdecl reads back as lists: the GGUF gives the transformers logits."""
    import gguf

    model = make_smollm3(seed=3, no_rope_layers=[1, 0, 0, 1], use_sliding_window=True,
                         sliding_window=5)
    _, path, ids, ref = hf_case(model, tmp_path / "hf")
    out = tmp_path / "x.gguf"
    subprocess.run([sys.executable, "-m", "maxdecl", "export", path, "--spec",
                    spec_path("smollm3"), "-o", str(out)], check=True, capture_output=True)
    fields = gguf.GGUFReader(str(out)).fields
    assert fields["general.architecture"].contents() == "smollm3"
    assert fields["smollm3.no_rope_layers"].contents() == [1, 0, 0, 1]
    assert fields["smollm3.attention.sliding_window"].contents() == 5
    assert fields["smollm3.rope.dimension_count"].contents() == 64   # as the converter writes
    ours = load(str(out))
    assert ours.params["rope_layers"] == [1, 0, 0, 1]
    assert ours.params["layer_types"] == model.config.layer_types
    pre, dec = compare(ours, ref, ids)
    assert pre <= TOL and dec <= TOL


def smollm3_to_gguf(model, path) -> str:
    """A SmolLM3ForCausalLM as llama.cpp's convert_hf_to_gguf.py writes it (SmolLM3Model
    is its LlamaModel with arch smollm3): LlamaModel's keys, q/k rows permuted in every
    layer, no output.weight when tied, and no key for the NoPE layers."""
    import gguf

    cfg, sd = model.config, hf_state(model)
    nh, nkv = cfg.num_attention_heads, cfg.num_key_value_heads
    w = gguf_writer(path, "smollm3", cfg)
    w.add_name("tiny-smollm3")
    w.add_layer_norm_rms_eps(cfg.rms_norm_eps)
    w.add_rope_freq_base(float(cfg.rope_parameters["rope_theta"]))
    w.add_rope_dimension_count(cfg.hidden_size // nh)
    w.add_vocab_size(cfg.vocab_size)
    w.add_file_type(gguf.LlamaFileType.ALL_F32)
    _add_tokenizer(w, cfg.vocab_size)
    t = {"token_embd.weight": sd["model.embed_tokens.weight"]}
    t.update(layer_tensors(sd, cfg.num_hidden_layers))
    for i in range(cfg.num_hidden_layers):
        t[f"blk.{i}.attn_q.weight"] = llama_cpp_permute(t[f"blk.{i}.attn_q.weight"], nh, nh)
        t[f"blk.{i}.attn_k.weight"] = llama_cpp_permute(t[f"blk.{i}.attn_k.weight"], nh, nkv)
    t["output_norm.weight"] = sd["model.norm.weight"]
    if not cfg.tie_word_embeddings:
        t["output.weight"] = sd["lm_head.weight"]
    _write(w, t)
    return str(path)


@pytest.fixture(scope="module")
def converted(tmp_path_factory):
    """transformers' default pattern (every 4th layer NoPE: [1, 1, 1, 0]), the one
    llama.cpp hard-codes for smollm3, written as the converter writes it."""
    model = make_smollm3(seed=2)
    assert model.config.no_rope_layers == [1, 1, 1, 0]
    path = smollm3_to_gguf(model, tmp_path_factory.mktemp("smollm3_gguf") / "m.gguf")
    ids = token_ids(VOCAB, seed=9)
    return model, path, ids, hf_logits(model, ids)


def test_smollm3_converter_gguf_matches_hf(converted):
    model, path, ids, ref = converted
    ours = load(path)
    assert ours.params["rope_layers"] == [1, 1, 1, 0]       # no key: llama.cpp's every 4th
    assert_logits_match("smollm3 GGUF", ours, ids, ref)


def test_smollm3_llama_cpp_runs_the_gguf_with_the_reference_logits(converted):
    llama_cpp = pytest.importorskip("llama_cpp")
    import transformers

    model, path, ids, ref = converted
    theirs = llama_cpp_logits(llama_cpp, path, ids)
    err = rel_err(theirs, ref)
    ours = np.asarray(load(path).logits(ids))
    print(f"llama.cpp vs HF: {err:.2e}; maxdecl vs llama.cpp: {rel_err(ours, theirs):.2e}")
    assert err <= TOL_LLAMA_CPP
    assert rel_err(ours, theirs) <= TOL_LLAMA_CPP
    # control: llama.cpp does skip RoPE in layer 3 (an all-RoPE model differs from it)
    all_rope = transformers.SmolLM3ForCausalLM(
        transformers.SmolLM3Config(**{**model.config.to_dict(), "no_rope_layers": [1, 1, 1, 1],
                                      "layer_types": None})).eval()
    all_rope.load_state_dict(model.state_dict())
    control = rel_err(theirs, hf_logits(all_rope, ids))
    print(f"llama.cpp vs the all-RoPE model: {control:.2e}")
    assert control > 5 * TOL_LLAMA_CPP and control > 100 * err
