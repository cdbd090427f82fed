"""specs/dbrx.yaml against transformers' DbrxForCausalLM (and llama.cpp).

Three small seeded float32 DBRX models, d_model 64, 2 blocks, 4 heads (head_dim 16),
4 SwiGLU experts of width 32, vocab 256, RoPE base 50000 (config.json's top-level
rope_parameters; attn_config.rope_theta holds a decoy 777 that transformers 5 ignores):

- ``base``: 2 kv heads, top-2, moe_normalize_expert_weights 1 (the released models'),
  clip_qkv null;
- ``clip_p2``: 1 kv head (MQA), top-3, a 2-norm of the chosen weights, clip_qkv 0.5
  (clamps a good share of the fused q, k and v);
- ``mha_raw``: 4 kv heads, top-1, moe_normalize_expert_weights null (the softmax
  probability as it is), clip_qkv 2.0.

transformers 5.24's DbrxAttention cannot run clip_qkv null (``qkv.clamp(min=None,
max=None)`` raises), so where config.json says null the reference model's attention
modules get a bound of 1e30 (an identity clamp) after the checkpoint is saved.

Checked: the params read from config.json, logits of a prefill and of decode steps
through the KV cache, greedy ids (alone and batched), negative controls (the p-norm,
the clamp and the expert row blocks matter), the RoPE-scaling refusal, a GGUF written as
llama.cpp's converter writes arch ``dbrx`` (maxdecl and, when llama-cpp-python is
installed, llama.cpp itself) and maxdecl export's round trip.
"""

import copy
import json
import shutil
import subprocess
import sys

import numpy as np
import pytest

import maxdecl as md

from modelhelp import (TOL, _add_tokenizer, _write, assert_greedy_matches_hf,
                       assert_logits_match, compare, hf_logits, hf_params, hf_state,
                       llama_cpp_logits, randomize, rel_err, save_hf, spec_path, tiny_model,
                       token_ids, with_hf_config)

pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

PROMPTS = [[3, 17, 42, 199, 5, 7, 64, 1], [8, 9, 120], [250, 60, 33, 2, 90, 11, 7]]
N_NEW = 6
TOL_LLAMA_CPP = 5e-3        # of max|ref|: llama.cpp keeps its KV cache in f16
ROPE_THETA = 50000.0

CASES = {
    "base": dict(kv_n_heads=2, clip_qkv=None, moe_top_k=2, moe_normalize_expert_weights=1.0),
    "clip_p2": dict(kv_n_heads=1, clip_qkv=0.5, moe_top_k=3, moe_normalize_expert_weights=2.0),
    "mha_raw": dict(kv_n_heads=4, clip_qkv=2.0, moe_top_k=1, moe_normalize_expert_weights=None),
}


def make_dbrx(seed=0, kv_n_heads=2, clip_qkv=None, moe_top_k=2,
              moe_normalize_expert_weights=1.0):
    """DbrxForCausalLM: d_model 64, 2 blocks, 4 heads, 4 experts of width 32, vocab 256."""
    import torch

    torch.manual_seed(seed)
    config = transformers.DbrxConfig(
        d_model=64, n_heads=4, n_layers=2, max_seq_len=96, vocab_size=256,
        attn_config={"kv_n_heads": kv_n_heads, "clip_qkv": clip_qkv, "rope_theta": 777.0},
        ffn_config={"ffn_hidden_size": 32, "moe_num_experts": 4, "moe_top_k": moe_top_k,
                    "moe_normalize_expert_weights": moe_normalize_expert_weights},
        rope_parameters={"rope_type": "default", "rope_theta": ROPE_THETA},
        attn_implementation="eager")
    return randomize(transformers.DbrxForCausalLM(config), seed)


def runnable(model):
    """``model`` with clip_qkv null made runnable: transformers 5.24 calls
    ``clamp(min=None, max=None)``, which torch refuses; a bound of 1e30 is the identity.
    Call after saving, so that config.json keeps its null."""
    for block in model.transformer.blocks:
        attn = block.norm_attn_norm.attn
        if attn.clip_qkv is None:
            attn.clip_qkv = 1e30
    return model


def saved_case(model, folder):
    """hf_case with the clamp fix applied between saving and computing the reference."""
    path = save_hf(model, folder)
    runnable(model)
    ids = token_ids(model.config.vocab_size)
    return model, path, ids, hf_logits(model, ids)


_CACHE = {}


@pytest.fixture(scope="module")
def cases(tmp_path_factory):
    """name -> (model, HF folder, ids, reference logits), built once per module, lazily."""
    def get(name):
        if name not in _CACHE:
            seed = list(CASES).index(name)
            _CACHE[name] = saved_case(make_dbrx(seed=seed, **CASES[name]),
                                      tmp_path_factory.mktemp(f"dbrx_{name}"))
        return _CACHE[name]
    yield get
    _CACHE.clear()
    _MODELS.clear()


_MODELS = {}                # name -> the md.Model of that case's HF folder


def ours_for(cases, name):
    if name not in _MODELS:
        _MODELS[name] = tiny_model("dbrx", cases(name)[1])
    return _MODELS[name]


@pytest.mark.parametrize("name", list(CASES))
def test_dbrx_params_and_weights_from_hf(cases, name):
    _, path, _, _ = cases(name)
    c = CASES[name]
    _, _, got = hf_params("dbrx", path)
    assert (got["dim"], got["n_layers"], got["n_heads"]) == (64, 2, 4)
    assert got["n_kv_heads"] == c["kv_n_heads"]
    assert (got["ffn_dim"], got["n_expert"], got["n_expert_used"]) == (32, 4, c["moe_top_k"])
    assert got["moe_norm_p"] == (c["moe_normalize_expert_weights"] or 0.0)
    assert got["clip_qkv"] == (c["clip_qkv"] or 0.0)
    assert got["rope_theta"] == ROPE_THETA and got["rope_type"] == "default"
    assert got["context"] == 96 and got["vocab"] == 256
    ours = ours_for(cases, name)
    kv = 16 * c["kv_n_heads"]
    assert ours.weights["blk.0.attn_qkv.weight"].shape == (64 + 2 * kv, 64)
    for w in ("gate", "up"):                    # HF's [E * F, D] as llama.cpp's stacks
        assert ours.weights[f"blk.1.ffn_{w}_exps.weight"].shape == (4, 32, 64)
    assert ours.weights["blk.1.ffn_down_exps.weight"].shape == (4, 64, 32)


@pytest.mark.parametrize("name", list(CASES))
def test_dbrx_prefill_and_decode_match_hf(cases, name):
    _, _, ids, ref = cases(name)
    assert_logits_match(f"dbrx {name}", ours_for(cases, name), ids, ref)


def test_dbrx_greedy_generate_matches_hf(cases):
    model = cases("clip_p2")[0]
    assert_greedy_matches_hf(model, ours_for(cases, "clip_p2"), PROMPTS, N_NEW)


@pytest.mark.parametrize("entry,value", [("moe_norm_p", "{1.0}"), ("clip_qkv", "{0.0}")])
def test_dbrx_norm_and_clamp_matter(cases, entry, value):
    """Negative controls: reading the 2-norm as a 1-norm, or the clamp as off, from the
    same checkpoint gives other logits."""
    _, path, ids, ref = cases("clip_p2")
    spec = with_hf_config(md.load_spec(spec_path("dbrx"), variant="tiny"), **{entry: value})
    ours = md.load_model(spec, path, variant="tiny")
    pre, dec = compare(ours, ref, ids)
    assert pre > 10 * TOL and dec > 10 * TOL


def test_dbrx_expert_blocks_matter(cases, tmp_path):
    """Negative control: the row blocks of w2 rolled by one expert (expert e's down
    projection given to expert e + 1) in the checkpoint give other logits."""
    import torch

    model, _, ids, ref = cases("base")
    bad = copy.deepcopy(model)
    with torch.no_grad():
        for block in bad.transformer.blocks:
            w2 = block.ffn.experts.mlp.w2
            w2.copy_(torch.roll(w2, shifts=32, dims=0))
    ours = tiny_model("dbrx", save_hf(bad, tmp_path / "rolled"))
    pre, dec = compare(ours, ref, ids)
    assert pre > 10 * TOL and dec > 10 * TOL


def test_dbrx_rope_theta_from_attn_config_without_rope_parameters(cases, tmp_path):
    """A config.json written by transformers 4 (the released checkpoints) has no
    rope_parameters: the base is attn_config.rope_theta, as transformers 4 and llama.cpp's
    converter read it (transformers 5 would fall back to 10000 there)."""
    _, path, _, _ = cases("base")
    old = tmp_path / "old"
    shutil.copytree(path, old)
    cfg = json.loads((old / "config.json").read_text())
    del cfg["rope_parameters"]
    cfg["attn_config"]["rope_theta"] = 500000.0
    (old / "config.json").write_text(json.dumps(cfg))
    _, _, got = hf_params("dbrx", old)
    assert got["rope_theta"] == 500000.0 and "rope_type" not in got     # the default


def test_dbrx_rope_scaling_is_refused(cases, tmp_path):
    _, path, _, _ = cases("base")
    scaled = tmp_path / "scaled"
    shutil.copytree(path, scaled)
    cfg = json.loads((scaled / "config.json").read_text())
    cfg["rope_parameters"] = {"rope_type": "linear", "factor": 2.0, "rope_theta": ROPE_THETA}
    (scaled / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(md.WeightsError, match="RoPE scaling linear is not modelled"):
        tiny_model("dbrx", scaled)


# -- GGUF, as llama.cpp's convert_hf_to_gguf.py (DbrxModel) writes it --------------------

def dbrx_to_gguf(model, path) -> str:
    """Arch ``dbrx``: Wqkv kept fused as ``attn_qkv`` (no permute: llama.cpp's dbrx
    rotates halves), norm_2 as ``attn_output_norm``, the experts viewed
    [E, ffn, d_model]: w1 -> ``ffn_gate_exps``, v1 -> ``ffn_up_exps``, w2 permuted
    (0, 2, 1) -> ``ffn_down_exps`` [E, d_model, ffn]; clip_qkv as
    ``attention.clamp_kqv``, LayerNorm eps 1e-5 (a constant in the converter), the RoPE
    base (here the one transformers 5 uses), no key for moe_normalize_expert_weights."""
    import gguf

    cfg, sd = model.config, hf_state(model)
    a, f = cfg.attn_config, cfg.ffn_config
    w = gguf.GGUFWriter(str(path), "dbrx")
    w.add_block_count(cfg.n_layers)
    w.add_context_length(cfg.max_seq_len)
    w.add_embedding_length(cfg.d_model)
    w.add_feed_forward_length(f.ffn_hidden_size)
    w.add_head_count(cfg.n_heads)
    w.add_head_count_kv(a.kv_n_heads)
    w.add_rope_freq_base(float(cfg.rope_parameters["rope_theta"]))
    w.add_clamp_kqv(float(a.clip_qkv))
    w.add_expert_count(f.moe_num_experts)
    w.add_expert_used_count(f.moe_top_k)
    w.add_layer_norm_eps(1e-5)
    w.add_file_type(gguf.LlamaFileType.ALL_F32)
    _add_tokenizer(w, cfg.vocab_size)
    n_exp, ffn, dim = f.moe_num_experts, f.ffn_hidden_size, cfg.d_model
    names = {"norm_attn_norm.norm_1.weight": "attn_norm.weight",
             "norm_attn_norm.attn.Wqkv.weight": "attn_qkv.weight",
             "norm_attn_norm.attn.out_proj.weight": "attn_output.weight",
             "norm_attn_norm.norm_2.weight": "attn_output_norm.weight",
             "ffn.router.layer.weight": "ffn_gate_inp.weight"}
    t = {"token_embd.weight": sd["transformer.wte.weight"]}
    for i in range(cfg.n_layers):
        p = f"transformer.blocks.{i}."
        t.update({f"blk.{i}.{dst}": sd[p + src] for src, dst in names.items()})
        experts = {k: sd[p + f"ffn.experts.mlp.{k}"].reshape(n_exp, ffn, dim)
                   for k in ("w1", "v1", "w2")}
        t[f"blk.{i}.ffn_gate_exps.weight"] = experts["w1"]
        t[f"blk.{i}.ffn_up_exps.weight"] = experts["v1"]
        t[f"blk.{i}.ffn_down_exps.weight"] = experts["w2"].transpose(0, 2, 1)
    t["output_norm.weight"] = sd["transformer.norm_f.weight"]
    t["output.weight"] = sd["lm_head.weight"]
    _write(w, t)
    return str(path)


@pytest.fixture(scope="module")
def dbrx_gguf(tmp_path_factory):
    """The released models' options (top-2 renormalised by the sum, clip_qkv set), as
    llama.cpp's graph implements them."""
    model = make_dbrx(seed=4, kv_n_heads=2, clip_qkv=1.0)
    path = dbrx_to_gguf(model, tmp_path_factory.mktemp("dbrx_gguf") / "d.gguf")
    ids = token_ids(model.config.vocab_size, seed=9)
    return model, path, ids, hf_logits(model, ids)


def test_dbrx_converter_gguf_matches_hf(dbrx_gguf):
    _, path, ids, ref = dbrx_gguf
    ours = md.load_model(spec_path("dbrx"), path, variant="tiny")
    assert ours.params["clip_qkv"] == 1.0
    assert ours.params["moe_norm_p"] == 1.0 and ours.params["rope_theta"] == ROPE_THETA
    assert ours.params["context"] == 96 and ours.params["vocab"] == 256
    assert ours.weights["blk.0.ffn_down_exps.weight"].shape == (4, 64, 32)
    assert_logits_match("dbrx converter GGUF", ours, ids, ref)


def test_dbrx_gguf_runs_in_llama_cpp(dbrx_gguf):
    llama_cpp = pytest.importorskip("llama_cpp")
    _, path, ids, ref = dbrx_gguf
    theirs = llama_cpp_logits(llama_cpp, path, ids)
    ours = np.asarray(md.load_model(spec_path("dbrx"), path, variant="tiny").logits(ids))
    err_cpp, err_ours = rel_err(theirs, ref), rel_err(ours, ref)
    print(f"dbrx GGUF: llama.cpp vs HF {err_cpp:.2e}, maxdecl vs HF {err_ours:.2e}, "
          f"maxdecl vs llama.cpp {rel_err(ours, theirs):.2e} (of max|ref|)")
    assert err_cpp <= TOL_LLAMA_CPP and err_ours <= TOL


def _export(path, out):
    subprocess.run([sys.executable, "-m", "maxdecl", "export", str(path), "--spec",
                    spec_path("dbrx"), "-o", str(out), "--variant", "tiny"],
                   check=True, capture_output=True, text=True)
    return md.load_weights(str(out))


@pytest.fixture(scope="module")
def exported(cases, tmp_path_factory):
    _, path, ids, ref = cases("clip_p2")
    out = tmp_path_factory.mktemp("dbrx_export") / "export.gguf"
    return _export(path, out), out, ids, ref


def test_dbrx_export_round_trip(exported):
    """maxdecl export of the HF folder (2-norm, clamp 0.5) writes the p and the clamp;
    the GGUF reloads with the same logits."""
    td, out, ids, ref = exported
    assert float(td.metadata["dbrx.attention.clamp_kqv"]) == 0.5
    assert float(td.metadata["dbrx.moe_normalize_expert_weights"]) == 2.0
    ours = md.load_model(spec_path("dbrx"), str(out), variant="tiny")
    assert_logits_match("dbrx export round trip", ours, ids, ref)


def test_dbrx_export_has_llama_cpp_expert_stacks(exported):
    """hf.transforms reshape HF's [E * F, D] experts (and transpose w2) on load, so an
    exported HF checkpoint holds llama.cpp's stacks."""
    td = exported[0]
    assert td["blk.0.ffn_gate_exps.weight"].shape == (4, 32, 64)
    assert td["blk.0.ffn_down_exps.weight"].shape == (4, 64, 32)
