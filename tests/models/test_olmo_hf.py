"""specs/olmo.yaml against transformers' OlmoForCausalLM (OLMo v1).

Two small seeded float32 OLMo models: ``plain`` (dim 256, GQA 4/2, RoPE base 20000, no
clamping, an untied output) and ``clip`` (dim 128, 4/4 heads, clip_qkv 0.5, which
clamps most q/k/v entries, the output tied to the embedding as in OLMo-1B). Both have
OLMo's LayerNorms without weight or bias, RoPE rotating halves in HF (the spec keeps
GGUF's adjacent pairs and permutes the HF q/k rows), SwiGLU, no biases. The ``clip``
config's sizes differ from the spec's ``tiny`` variant, so every size (and the LayerNorm
gain built from ``dim``) comes from config.json. The same weights are also written as
llama.cpp's converter (OlmoModel, arch ``olmo``) writes them, run in maxdecl and, when
llama-cpp-python is installed, in llama.cpp itself.
"""

import copy
import json
import shutil
import subprocess
import sys

import numpy as np
import pytest

import maxdecl as md
from maxdecl.pipelines.model_loading import params_from_metadata

from modelhelp import (TOL, _add_tokenizer, _write, assert_greedy_matches_hf, assert_logits_match,
                       compare, gguf_writer, hf_case, hf_logits, hf_params, hf_state,
                       llama_cpp_logits, llama_cpp_permute, randomize, rel_err, spec_path,
                       tiny_model)

pytest.importorskip("torch")
pytest.importorskip("transformers")

PROMPTS = [[3, 17, 42, 99, 5, 7, 64, 1], [8, 9, 120], [5, 60, 33, 2, 90, 11, 7]]
N_NEW = 6
TOL_LLAMA_CPP = 5e-3        # of max|ref|: llama.cpp keeps its KV cache in f16

CONFIGS = {
    "plain": dict(vocab_size=512, hidden_size=256, intermediate_size=512, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
                  rope_theta=20000.0, clip_qkv=None, tie_word_embeddings=False),
    "clip": dict(vocab_size=300, hidden_size=128, intermediate_size=384, num_hidden_layers=2,
                 num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=96,
                 rope_theta=10000.0, clip_qkv=0.5, tie_word_embeddings=True),
}


def make_olmo(case="plain", seed=0, **kw):
    """A seeded OlmoForCausalLM of ``CONFIGS[case]`` (float32, eager attention)."""
    import torch
    import transformers

    torch.manual_seed(seed)
    cfg = dict(CONFIGS[case], pad_token_id=1, bos_token_id=None, eos_token_id=2,
               attn_implementation="eager")
    cfg.update(kw)
    model = randomize(transformers.OlmoForCausalLM(transformers.OlmoConfig(**cfg)), seed)
    if cfg["tie_word_embeddings"]:
        # a tied N(0, 1) table makes each token's own row dominate its logits (greedy
        # decoding would only repeat the last token)
        with torch.no_grad():
            model.model.embed_tokens.weight.mul_(0.1)
    return model


@pytest.fixture(scope="module")
def cases(tmp_path_factory):
    """case -> (HF model, HF folder, prompt ids, HF logits)."""
    return {c: hf_case(make_olmo(c), tmp_path_factory.mktemp(f"olmo_{c}")) for c in CONFIGS}


@pytest.fixture(scope="module")
def ours(cases):
    return {c: tiny_model("olmo", cases[c][1]) for c in CONFIGS}


def test_olmo_config_from_hf(cases):
    _, path, _, _ = cases["plain"]
    got = hf_params("olmo", path)[2]
    assert {k: got.get(k) for k in ("dim", "n_layers", "n_heads", "n_kv_heads", "ffn_dim",
                                    "vocab", "context")} == {
        "dim": 256, "n_layers": 2, "n_heads": 4, "n_kv_heads": 2, "ffn_dim": 512,
        "vocab": 512, "context": 128}
    assert got["rope_theta"] == 20000.0 and got["norm_eps"] == pytest.approx(1e-5)
    assert got.get("clip_qkv") is None and got["rope_type"] == "default"
    got = hf_params("olmo", cases["clip"][1])[2]
    assert (got["dim"], got["n_kv_heads"], got["vocab"]) == (128, 4, 300)
    assert got["clip_qkv"] == 0.5


def test_olmo_config_as_released(cases):
    """config.json as the OLMo-*-hf repositories ship it (transformers < 5): top-level
    rope_theta, rope_scaling null, clip_qkv null or a number (OLMo 1.7: 8.0)."""
    spec, meta, _ = hf_params("olmo", cases["plain"][1])
    old = {k: v for k, v in meta.items() if k != "rope_parameters"}
    got = params_from_metadata(spec, {**old, "rope_theta": 30000.0, "rope_scaling": None,
                                      "clip_qkv": 8.0})
    assert got["rope_theta"] == 30000.0 and got["clip_qkv"] == 8.0
    assert "rope_type" not in got
    got = params_from_metadata(spec, {**old, "rope_theta": 30000.0, "clip_qkv": None})
    assert got.get("clip_qkv") is None


@pytest.mark.parametrize("case", list(CONFIGS))
def test_olmo_prefill_and_decode_match_hf(cases, ours, case):
    _, _, ids, ref = cases[case]
    assert_logits_match(f"olmo {case}", ours[case], ids, ref)


@pytest.mark.parametrize("case", list(CONFIGS))
def test_olmo_greedy_generate_matches_hf(cases, ours, case):
    assert_greedy_matches_hf(cases[case][0], ours[case], PROMPTS, N_NEW)


def test_olmo_clip_qkv_binds(cases, tmp_path):
    """clip_qkv 0.5 changes transformers' own logits (the clamp binds), and the spec run
    without it (config.json's clip_qkv null) misses them: the match above needs the
    clamp."""
    model, path, ids, ref = cases["clip"]
    unclipped = copy.deepcopy(model)
    unclipped.config.clip_qkv = None
    assert rel_err(hf_logits(unclipped, ids), ref) > 10 * TOL
    folder = tmp_path / "noclip"
    shutil.copytree(path, folder)
    cfg = json.loads((folder / "config.json").read_text())
    cfg["clip_qkv"] = None
    (folder / "config.json").write_text(json.dumps(cfg))
    pre, dec = compare(md.load_model(spec_path("olmo"), str(folder), variant="tiny"), ref, ids)
    assert pre > 10 * TOL and dec > 10 * TOL


@pytest.mark.parametrize("key, value, why", [
    ("attention_bias", True, "attention biases"),
    ("hidden_act", "gelu", "hidden_act gelu"),
    ("rope_parameters", {"rope_type": "linear", "rope_theta": 10000.0, "factor": 2.0},
     "RoPE scaling linear"),
])
def test_olmo_unmodelled_configs_are_refused(cases, tmp_path, key, value, why):
    _, path, _, _ = cases["plain"]
    folder = tmp_path / "odd"
    shutil.copytree(path, folder)
    cfg = json.loads((folder / "config.json").read_text())
    cfg[key] = value
    (folder / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(md.WeightsError, match=why):
        md.load_model(spec_path("olmo"), str(folder), variant="tiny")


def olmo_to_gguf(model, path, permute=True, eps=1e-5) -> str:
    """Write an OlmoForCausalLM as llama.cpp's converter (OlmoModel) does: arch ``olmo``,
    q/k rows permuted as for Llama (``permute=False``: a negative control),
    ``olmo.attention.layer_norm_epsilon`` 1e-5, ``olmo.attention.clamp_kqv`` only when
    clip_qkv is set, no norm tensors, no ``output.weight`` when tied."""
    import gguf

    cfg, sd = model.config, hf_state(model)
    nh, nkv = cfg.num_attention_heads, cfg.num_key_value_heads
    w = gguf_writer(path, "olmo", cfg)
    w.add_rope_freq_base(float(cfg.rope_parameters["rope_theta"]))
    w.add_layer_norm_eps(eps)
    if cfg.clip_qkv is not None:
        w.add_clamp_kqv(cfg.clip_qkv)
    w.add_file_type(gguf.LlamaFileType.ALL_F32)
    _add_tokenizer(w, cfg.vocab_size)
    names = {"self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k",
             "self_attn.v_proj": "attn_v", "self_attn.o_proj": "attn_output",
             "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up", "mlp.down_proj": "ffn_down"}
    t = {"token_embd.weight": sd["model.embed_tokens.weight"]}
    for i in range(cfg.num_hidden_layers):
        for src, dst in names.items():
            t[f"blk.{i}.{dst}.weight"] = sd[f"model.layers.{i}.{src}.weight"]
        if permute:
            t[f"blk.{i}.attn_q.weight"] = llama_cpp_permute(t[f"blk.{i}.attn_q.weight"], nh, nh)
            t[f"blk.{i}.attn_k.weight"] = llama_cpp_permute(t[f"blk.{i}.attn_k.weight"], nh, nkv)
    if not cfg.tie_word_embeddings:
        t["output.weight"] = sd["lm_head.weight"]
    _write(w, t)
    return str(path)


@pytest.mark.parametrize("case", list(CONFIGS))
def test_olmo_gguf_matches_hf_and_llama_cpp(cases, case, tmp_path):
    """The converter-style GGUF runs in maxdecl with HF's logits and, when
    llama-cpp-python is installed, in llama.cpp with them too (loosely: f16 KV cache)."""
    model, _, ids, ref = cases[case]
    path = olmo_to_gguf(model, tmp_path / f"olmo-{case}.gguf")
    got = hf_params("olmo", path)[2]
    cfg = model.config
    assert (got["dim"], got["n_kv_heads"], got["vocab"]) == (
        cfg.hidden_size, cfg.num_key_value_heads, cfg.vocab_size)
    assert got["norm_eps"] == pytest.approx(1e-5)
    assert got.get("clip_qkv") == (None if cfg.clip_qkv is None else pytest.approx(cfg.clip_qkv))
    ours = md.load_model(spec_path("olmo"), path, variant="tiny")
    pre, dec = compare(ours, ref, ids)
    print(f"olmo {case} GGUF vs HF: prefill {pre:.2e}, decode {dec:.2e}")
    assert pre <= TOL and dec <= TOL
    try:
        import llama_cpp
    except ImportError:
        return
    theirs = llama_cpp_logits(llama_cpp, path, ids)
    err = rel_err(theirs, ref)
    print(f"olmo {case} llama.cpp vs HF: {err:.2e}")
    assert err <= TOL_LLAMA_CPP


def test_olmo_gguf_rows_unpermuted_do_not_match(cases, tmp_path):
    """Negative control: HF's q/k row order in a GGUF (no converter permutation) gives
    other logits, so GGUF files rotate adjacent pairs and the HF weights need
    permute_qk."""
    model, _, ids, ref = cases["plain"]
    path = olmo_to_gguf(model, tmp_path / "unpermuted.gguf", permute=False)
    pre, _ = compare(md.load_model(spec_path("olmo"), path, variant="tiny"), ref, ids)
    assert pre > 10 * TOL


def test_olmo_gguf_epsilon_is_read(cases, tmp_path):
    """olmo.attention.layer_norm_epsilon is read from the file (a value other than the
    variant's 1e-5)."""
    path = olmo_to_gguf(cases["clip"][0], tmp_path / "eps.gguf", eps=1e-3)
    assert hf_params("olmo", path)[2]["norm_eps"] == pytest.approx(1e-3)


def test_olmo_export_is_the_converters_gguf(cases, tmp_path):
    """``maxdecl export`` of the HF folder writes the converter's tensors (q/k rows
    permuted) and keys (clamp_kqv, layer_norm_epsilon), and runs with HF's logits."""
    import gguf

    model, path, ids, ref = cases["clip"]
    out = tmp_path / "exported.gguf"
    subprocess.run([sys.executable, "-m", "maxdecl", "export", "--spec", spec_path("olmo"),
                    "--variant", "tiny", "-o", str(out), path], check=True, capture_output=True)
    conv = olmo_to_gguf(model, tmp_path / "converter.gguf")
    exported, converted = gguf.GGUFReader(str(out)), gguf.GGUFReader(conv)
    assert {t.name for t in exported.tensors} == {t.name for t in converted.tensors}
    ex = {t.name: t for t in exported.tensors}
    for t in converted.tensors:
        np.testing.assert_array_equal(np.asarray(ex[t.name].data), np.asarray(t.data))
    keys = [k for k in converted.fields if k.startswith("olmo.")]
    for k in keys:
        assert k in exported.fields, k
        np.testing.assert_allclose(exported.fields[k].contents(), converted.fields[k].contents(),
                                   rtol=1e-6)
    pre, dec = compare(tiny_model("olmo", out), ref, ids)
    assert pre <= TOL and dec <= TOL
