"""specs/qwen3.yaml against transformers' Qwen3ForCausalLM (the dense Qwen3 models).

Small seeded float32 Qwen3s: grouped-query attention (4 query heads, 2 kv heads) with a
head_dim given apart from hidden_size / num_heads (96 != 256 / 4 in the untied case),
per-head RMSNorms on q and k (q_norm, k_norm: weight [head_dim], before RoPE), RoPE base
1e6 rotating halves (neox), no q/k/v biases, SwiGLU, RMSNorm; one untied (lm_head, as
Qwen3-8B and up) and one tied to the embedding (as Qwen3-0.6B/1.7B/4B, whose checkpoint
has no lm_head.weight). A third has Qwen3's optional sliding window on its upper layers.
The same weights written as llama.cpp's converter writes them (arch ``qwen3``: HF's q/k
row order kept, since llama.cpp's qwen3 rotates halves; q/k norms as
``attn_q_norm`` / ``attn_k_norm``) load with the same logits (as Q8_0 too), so does
the GGUF ``maxdecl export`` writes, and llama.cpp itself (llama-cpp-python, when
installed) runs those files with the same logits.
"""

import json
import os
import shutil

import numpy as np
import pytest

import maxdecl as md
from maxdecl.pipelines.model_loading import params_from_metadata

from modelhelp import (LLAMA_LAYERS, TOL, _add_tokenizer, _write, assert_greedy_matches_hf,
                       assert_logits_match, compare, gguf_writer, hf_case, hf_logits, hf_params,
                       hf_state, layer_tensors, llama_cpp_logits, q8_0, q8_0_dequantized,
                       randomize, spec_path, tiny_model, token_ids, with_hf_config,
                       with_tokenizer)

pytest.importorskip("torch")
pytest.importorskip("transformers")

PROMPTS = [[3, 17, 42, 91, 5, 7, 64, 1], [8, 9, 80], [5, 60, 33, 2, 90, 11, 7]]
N_NEW = 6
TOL_LLAMA_CPP = 5e-3        # of max|ref|: llama.cpp keeps its KV cache in f16


def make_qwen3(seed=1, tied=False, head_dim=96, embed_scale=0.01, **kw):
    """Qwen3ForCausalLM: dim 256, 2 layers, GQA 4/2 with head_dim ``head_dim``, q/k
    norms, SwiGLU 512, rope_theta 1e6, vocab 96.

    Tied, the table is scaled to ``embed_scale`` * N(0, 1): with larger rows (0.1 and
    up, for these seeds) each token's own embedding dominates its logits and greedy
    decoding only repeats one token. The seeds of the fixtures below are picked so that
    the greedy continuations of PROMPTS are not one token repeated."""
    import torch
    import transformers

    torch.manual_seed(seed)
    cfg = dict(vocab_size=96, hidden_size=256, intermediate_size=512, num_hidden_layers=2,
               num_attention_heads=4, num_key_value_heads=2, head_dim=head_dim,
               rms_norm_eps=1e-6, max_position_embeddings=64, rope_theta=1000000.0,
               tie_word_embeddings=tied, attention_bias=False, attn_implementation="eager")
    cfg.update(kw)
    model = randomize(transformers.Qwen3ForCausalLM(transformers.Qwen3Config(**cfg)), seed)
    if tied:
        with torch.no_grad():
            model.model.embed_tokens.weight.mul_(embed_scale)
    return model


@pytest.fixture(scope="module")
def untied(tmp_path_factory):
    return hf_case(make_qwen3(), tmp_path_factory.mktemp("qwen3_untied"))


@pytest.fixture(scope="module")
def tied(tmp_path_factory):
    return hf_case(make_qwen3(seed=8, tied=True, head_dim=64),
                   tmp_path_factory.mktemp("qwen3_tied"))


@pytest.fixture(scope="module")
def ours_untied(untied):
    return tiny_model("qwen3", untied[1])


@pytest.fixture(scope="module")
def ours_tied(tied):
    return tiny_model("qwen3", tied[1])


def _edit_config(src, dst, drop=(), **values):
    """A copy of the HF directory ``src`` in ``dst`` whose config.json lacks ``drop``
    and has ``values`` (the same safetensors)."""
    shutil.copytree(src, dst)
    with open(os.path.join(dst, "config.json")) as f:
        cfg = json.load(f)
    for k in drop:
        cfg.pop(k, None)
    cfg.update(values)
    with open(os.path.join(dst, "config.json"), "w") as f:
        json.dump(cfg, f)
    return str(dst)


# -- hyperparameters ----------------------------------------------------------------------

def test_qwen3_config_from_hf(untied, tied, ours_untied):
    spec, meta, got = hf_params("qwen3", untied[1])
    want = {"dim": 256, "n_layers": 2, "n_heads": 4, "n_kv_heads": 2, "head_dim": 96,
            "ffn_dim": 512, "vocab": 96, "context": 64, "rope_type": "none",
            "attention_bias": False, "hidden_act": "silu", "use_sliding_window": False,
            "tie_word_embeddings": False}
    assert {k: got.get(k) for k in want} == want
    assert got["rope_theta"] == 1e6 and got["norm_eps"] == pytest.approx(1e-6)
    # transformers < 5 (the released Qwen3 checkpoints: 4.51) wrote rope_theta and
    # rope_scaling (null) at the top level, and no layer_types
    old = {k: v for k, v in meta.items() if k not in ("rope_parameters", "layer_types")}
    old = {**old, "rope_theta": 250000.0, "rope_scaling": None}
    p = params_from_metadata(spec, old)
    assert p["rope_theta"] == 250000.0 and p["rope_type"] == "none"
    # transformers' Qwen3Config defaults head_dim to 128, not hidden_size / heads
    assert params_from_metadata(spec, {k: v for k, v in meta.items()
                                       if k != "head_dim"})["head_dim"] == 128
    assert ours_untied.params["q_dim"] == 384
    assert "lm_head.weight" in md.load_weights(untied[1]).keys()
    tied_got = hf_params("qwen3", tied[1])[2]
    assert tied_got["head_dim"] == 64 and tied_got["tie_word_embeddings"] is True
    assert not any(k.startswith("lm_head") for k in md.load_weights(tied[1]).keys())


@pytest.mark.parametrize("values, why", [
    ({"rope_parameters": {"rope_type": "yarn", "rope_theta": 1e6, "factor": 4.0,
                          "original_max_position_embeddings": 32}}, "RoPE scaling yarn"),
    ({"attention_bias": True}, "attention_bias"),
    ({"hidden_act": "gelu"}, "hidden_act gelu"),
])
def test_qwen3_refuses_what_it_does_not_model(untied, values, why):
    td = md.load_weights(untied[1])
    td.metadata.update(values)
    with pytest.raises(md.WeightsError, match=why):
        md.load_model(spec_path("qwen3"), td, variant="tiny")


def test_qwen3_refuses_old_style_yarn(untied, tmp_path):
    """The YaRN block Qwen3's model cards add to a transformers-4 config.json."""
    path = _edit_config(untied[1], tmp_path / "yarn", drop=("rope_parameters",),
                        rope_theta=1e6, rope_scaling={"rope_type": "yarn", "factor": 4.0,
                                                      "original_max_position_embeddings": 32})
    with pytest.raises(md.WeightsError, match="RoPE scaling yarn"):
        md.load_model(spec_path("qwen3"), path, variant="tiny")
    path = _edit_config(untied[1], tmp_path / "yarn_type", drop=("rope_parameters",),
                        rope_theta=1e6, rope_scaling={"type": "yarn", "factor": 4.0})
    with pytest.raises(md.WeightsError, match="RoPE scaling yarn"):
        md.load_model(spec_path("qwen3"), path, variant="tiny")


def test_qwen3_transformers4_config_loads(untied, tmp_path):
    """config.json as the released Qwen3 checkpoints have it (transformers 4.51:
    rope_theta at the top level, rope_scaling, sliding_window null, use_sliding_window
    false, max_window_layers, no layer_types or rope_parameters) gives the same logits."""
    model, path, ids, ref = untied
    old = _edit_config(path, tmp_path / "old", drop=("rope_parameters", "layer_types", "dtype"),
                       rope_theta=1000000.0, rope_scaling=None, sliding_window=None,
                       use_sliding_window=False, max_window_layers=28, torch_dtype="float32",
                       transformers_version="4.51.0")
    ours = tiny_model("qwen3", old)
    assert ours.params["rope_theta"] == 1e6 and ours.params["rope_type"] == "none"
    pre, dec = compare(ours, ref, ids)
    assert pre <= TOL and dec <= TOL


# -- logits and generation ----------------------------------------------------------------

def test_qwen3_prefill_and_decode_match_hf(untied, ours_untied):
    model, path, ids, ref = untied
    assert_logits_match("qwen3 (untied, head_dim 96)", ours_untied, ids, ref)


def test_qwen3_tied_prefill_and_decode_match_hf(tied, ours_tied):
    model, path, ids, ref = tied
    assert "output.weight" not in ours_tied.weights.keys()     # the table stands in
    assert_logits_match("qwen3 (tied)", ours_tied, ids, ref)


def test_qwen3_greedy_generate_matches_hf(untied, ours_untied):
    assert_greedy_matches_hf(untied[0], ours_untied, PROMPTS, N_NEW)


def test_qwen3_tied_greedy_generate_matches_hf(tied, ours_tied):
    assert_greedy_matches_hf(tied[0], ours_tied, PROMPTS, N_NEW)


def test_qwen3_bf16_checkpoint_loads(tmp_path):
    """A bf16 checkpoint (as the released ones): its matrices stay packed bf16, its norm
    weights (q/k norms included), which ops read as float, become float32 exactly, and
    the logits are the transformers model's on the same bf16 weights in float32.

    The reference rounds the parameters only: ``model.to(torch.bfloat16).float()``
    would also round RoPE's ``inv_freq`` buffer, and transformers' logits then move by
    about 1e-3 of their scale (the frequencies of a bf16 from_pretrained stay float32)."""
    import torch

    model = make_qwen3(seed=2, tied=True, head_dim=64)
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(p.to(torch.bfloat16).float())
    model.to(torch.bfloat16).save_pretrained(tmp_path, safe_serialization=True)
    model.float()
    model.model.rotary_emb = type(model.model.rotary_emb)(model.config)   # float32 again
    ours = tiny_model("qwen3", tmp_path)
    w = ours.weights
    assert w["blk.0.attn_q.weight"].encoding == "bf16"
    assert w["token_embd.weight"].encoding == "bf16"
    for name in ("blk.0.attn_norm.weight", "blk.0.attn_q_norm.weight", "blk.1.attn_k_norm.weight"):
        assert w[name].dtype == np.float32
    np.testing.assert_array_equal(
        w["blk.1.attn_k_norm.weight"],
        model.model.layers[1].self_attn.k_norm.weight.detach().float().numpy())
    ids = token_ids(model.config.vocab_size)
    pre, dec = compare(ours, hf_logits(model, ids), ids)
    assert pre <= TOL and dec <= TOL


# -- negative controls: the q/k norms matter ------------------------------------------------

def test_qwen3_qk_norm_gains_matter(untied):
    """The same weights with the q/k norm gains set to one, or swapped (q's gain on k
    and k's on q), give other logits: the match above needs both gains, each on its own
    projection."""
    model, path, ids, ref = untied
    for edit in ("ones", "swap"):
        td = md.load_weights(path)
        for i in range(model.config.num_hidden_layers):
            q, k = (f"model.layers.{i}.self_attn.{n}_norm.weight" for n in "qk")
            if edit == "ones":
                td[q] = np.ones_like(np.asarray(td[q]))
                td[k] = np.ones_like(np.asarray(td[k]))
            else:
                td[q], td[k] = np.asarray(td[k]).copy(), np.asarray(td[q]).copy()
        ours = md.load_model(spec_path("qwen3"), td, variant="tiny")
        pre, dec = compare(ours, ref, ids)
        assert pre > 10 * TOL and dec > 10 * TOL, edit


def test_qwen3_reference_depends_on_qk_normalization(untied):
    """Without the q/k RMSNorms (gains and normalization: nn.Identity), transformers'
    own logits change by far more than TOL, so matching them needs the normalization
    itself, not only its gains."""
    import copy

    import torch

    model, path, ids, ref = untied
    bare = copy.deepcopy(model)
    for layer in bare.model.layers:
        layer.self_attn.q_norm = torch.nn.Identity()
        layer.self_attn.k_norm = torch.nn.Identity()
    other = hf_logits(bare, ids)
    assert np.abs(other - ref).max() > 10 * TOL * np.abs(ref).max()


# -- the sliding window -------------------------------------------------------------------

@pytest.fixture(scope="module")
def windowed(tmp_path_factory):
    """Window 4 on layer 1 only (max_window_layers 1): 12-token prompts reach past it."""
    return hf_case(make_qwen3(seed=3, use_sliding_window=True, sliding_window=4,
                              max_window_layers=1),
                   tmp_path_factory.mktemp("qwen3_window"))


def test_qwen3_sliding_window_matches_hf(windowed, tmp_path):
    model, path, ids, ref = windowed
    assert model.config.layer_types == ["full_attention", "sliding_attention"]
    got = hf_params("qwen3", path)[2]
    assert got["use_sliding_window"] is True and got["sliding_window"] == 4
    assert_logits_match("qwen3 (window 4 on layer 1)", tiny_model("qwen3", path), ids, ref)
    # a transformers-4 config.json: no layer_types, the window from max_window_layers on
    old = _edit_config(path, tmp_path / "old", drop=("layer_types",))
    pre, dec = compare(tiny_model("qwen3", old), ref, ids)
    assert pre <= TOL and dec <= TOL


def test_qwen3_sliding_window_matters(windowed):
    """Negative controls: with the window ignored (use_sliding_window read as false),
    or on every layer (max_window_layers 0, no layer_types), the logits differ."""
    model, path, ids, ref = windowed
    spec = md.load_spec(spec_path("qwen3"))
    for changed in (with_hf_config(spec, use_sliding_window="{False}"),
                    with_hf_config(spec, max_window_layers=0, layer_types="{None}")):
        ours = md.load_model(changed, path, variant="tiny")
        pre, dec = compare(ours, ref, ids)
        assert pre > 10 * TOL and dec > 10 * TOL


# -- GGUF as llama.cpp's converter writes it ----------------------------------------------

def qwen3_to_gguf(model, path, quantize=None) -> str:
    """Write a Qwen3ForCausalLM as llama.cpp's convert_hf_to_gguf.py does (its
    Qwen3Model is a Qwen2Model with arch ``qwen3``): HF's q/k row order kept (llama.cpp
    runs qwen3 with neox rope, so no permute), head_dim as ``key_length`` /
    ``value_length``, the q/k norms as ``attn_q_norm`` / ``attn_k_norm`` [head_dim], no
    output.weight when the embeddings are tied."""
    import gguf

    cfg, sd = model.config, hf_state(model)
    w = gguf_writer(path, "qwen3", cfg)
    w.add_name("tiny-qwen3")
    w.add_layer_norm_rms_eps(cfg.rms_norm_eps)
    w.add_rope_freq_base(float(cfg.rope_parameters["rope_theta"]))
    w.add_key_length(cfg.head_dim)
    w.add_value_length(cfg.head_dim)
    w.add_file_type(gguf.LlamaFileType.ALL_F32)
    _add_tokenizer(w, cfg.vocab_size)
    names = {**LLAMA_LAYERS, "self_attn.q_norm": "attn_q_norm", "self_attn.k_norm": "attn_k_norm"}
    t = {"token_embd.weight": sd["model.embed_tokens.weight"],
         **layer_tensors(sd, cfg.num_hidden_layers, names)}
    t["output_norm.weight"] = sd["model.norm.weight"]
    if not cfg.tie_word_embeddings:
        t["output.weight"] = sd["lm_head.weight"]
    _write(w, t, quantize)
    return str(path)


@pytest.fixture(scope="module")
def gguf_files(untied, tied, tmp_path_factory):
    folder = tmp_path_factory.mktemp("qwen3_gguf")
    return {"untied": qwen3_to_gguf(untied[0], folder / "untied.gguf"),
            "tied": qwen3_to_gguf(tied[0], folder / "tied.gguf")}


@pytest.mark.parametrize("case", ["untied", "tied"])
def test_qwen3_gguf_matches_hf(case, untied, tied, gguf_files):
    """The same weights as a llama.cpp-style GGUF: params from the qwen3.* keys (head_dim
    from key_length), the tied output from token_embd.weight."""
    model, _, ids, ref = {"untied": untied, "tied": tied}[case]
    path = gguf_files[case]
    got = hf_params("qwen3", path)[2]
    assert got["head_dim"] == model.config.head_dim and got["n_kv_heads"] == 2
    assert got["rope_theta"] == 1e6 and got["vocab"] == 96 and got["ffn_dim"] == 512
    ours = md.load_model(spec_path("qwen3"), path, variant="tiny")
    assert ("output.weight" in ours.weights.keys()) == (case == "untied")
    pre, dec = compare(ours, ref, ids)
    assert pre <= TOL and dec <= TOL


def test_qwen3_gguf_refuses_yarn(untied, gguf_files):
    td = md.load_weights(gguf_files["untied"])
    td.metadata["qwen3.rope.scaling.type"] = "yarn"
    with pytest.raises(md.WeightsError, match="RoPE scaling yarn"):
        md.load_model(spec_path("qwen3"), td, variant="tiny")


def test_qwen3_q8_0_gguf_matches_dequantized_hf(untied, tmp_path):
    """Every matrix as Q8_0 (norms, the q/k norms included, stay float32): the packed
    kernels, with a q_dim (384) that is not dim, give the logits of the HF model
    holding the dequantized weights."""
    model, _, ids, _ = untied
    path = qwen3_to_gguf(model, tmp_path / "q8_0.gguf", quantize=q8_0)
    ours = md.load_model(spec_path("qwen3"), path, variant="tiny")
    assert ours.weights["blk.0.attn_output.weight"].encoding == "q8_0"
    assert ours.weights["blk.0.attn_q_norm.weight"].dtype == np.float32
    pre, dec = compare(ours, hf_logits(q8_0_dequantized(model), ids), ids)
    assert pre <= TOL and dec <= TOL


def _export(src, out) -> str:
    from maxdecl.cli import main

    assert main(["export", str(src), "--spec", spec_path("qwen3"), "--variant", "tiny",
                 "-o", str(out)]) == 0
    return str(out)


def test_qwen3_export_round_trip(untied, windowed, gguf_files, tmp_path):
    """``maxdecl export`` of the HF checkpoint writes the converter's tensors, keys
    llama.cpp reads (rope.scaling.type ``none``: llama.cpp aborts on transformers'
    ``default``) and the vocab size (the HF directory has no tokenizer, so no token list
    says it); it loads back with HF's logits, the windowed one with its window."""
    from gguf import GGUFReader

    model, path, ids, ref = untied
    out = _export(path, tmp_path / "exported.gguf")
    fields = GGUFReader(out).fields
    assert fields["qwen3.rope.scaling.type"].contents() == "none"
    assert fields["qwen3.attention.key_length"].contents() == 96
    assert fields["qwen3.vocab_size"].contents() == 96
    exported, converted = md.load_weights(out), md.load_weights(gguf_files["untied"])
    assert sorted(exported.keys()) == sorted(converted.keys())
    for name in converted.keys():
        np.testing.assert_array_equal(np.asarray(exported[name]), np.asarray(converted[name]))
    pre, dec = compare(tiny_model("qwen3", out), ref, ids)
    assert pre <= TOL and dec <= TOL
    model, path, ids, ref = windowed
    out = _export(path, tmp_path / "windowed.gguf")
    got = hf_params("qwen3", out)[2]
    assert got["use_sliding_window"] is True and got["sliding_window"] == 4
    assert got["max_window_layers"] == 1
    pre, dec = compare(tiny_model("qwen3", out), ref, ids)
    assert pre <= TOL and dec <= TOL



@pytest.mark.parametrize("case", ["untied", "tied", "exported"])
def test_llama_cpp_runs_the_qwen3_gguf_with_the_reference_logits(case, untied, tied, gguf_files,
                                                                 tmp_path):
    """llama.cpp itself (llama-cpp-python) runs the converter-style files, and the
    file ``maxdecl export`` writes from the HF checkpoint, with transformers' logits."""
    llama_cpp = pytest.importorskip("llama_cpp")
    model, hf_dir, ids, ref = untied if case != "tied" else tied
    if case == "exported":
        path = with_tokenizer(_export(hf_dir, tmp_path / "exported.gguf"),
                               tmp_path / "exported_tok.gguf", model.config.vocab_size)
    else:
        path = gguf_files[case]
    try:
        theirs = llama_cpp_logits(llama_cpp, path, ids)
    except ValueError as e:                   # a llama.cpp build without arch qwen3
        pytest.skip(f"this llama.cpp does not load qwen3: {e}")
    scale = float(np.abs(ref).max())
    assert np.abs(theirs - ref).max() <= TOL_LLAMA_CPP * scale
    ours = np.asarray(md.load_model(spec_path("qwen3"), path, variant="tiny").logits(ids))
    assert np.abs(ours - ref).max() <= 1e-5 * scale
