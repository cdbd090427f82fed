"""specs/gptj.yaml against transformers' GPTJForCausalLM (EleutherAI GPT-J).

A small seeded float32 GPT-J: one LayerNorm (with bias) per block feeding attention and
the MLP in parallel, q/k/v/out projections without biases, partial rotary embeddings
(rotary_dim 16 of each head's 64 features) rotating adjacent pairs as HF's
rotate_every_two does, an fc_in / fc_out MLP with biases and gelu_new, and an untied
lm_head with a bias. A second model takes the other branches: exact GELU, an explicit
n_inner, rotary_dim 32 and the output tied to the embedding.
"""

import json
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest

import maxdecl as md
from maxdecl.pipelines.model_loading import params_from_metadata

from modelhelp import (TOL, _add_tokenizer, _write, assert_greedy_matches_hf, assert_logits_match,
                       compare, hf_case, hf_params, hf_state, randomize, spec_path, tiny_model)

pytest.importorskip("torch")
pytest.importorskip("transformers")

PROMPTS = [[3, 17, 42, 90, 5, 7, 64, 1], [8, 9, 200], [5, 60, 33, 2, 250, 11, 7]]
N_NEW = 6


def make_gptj(seed=0, **kw):
    """GPTJForCausalLM: dim 256 (4 heads of 64), 2 layers, ffn 4 * 256, vocab 256,
    rotary_dim 16, 128 positions (multiples of 32: the spec's q8_0 default).

    A tied table is scaled to 0.1 * N(0, 1), so that greedy decoding does not only
    repeat the last token."""
    import torch
    import transformers

    torch.manual_seed(seed)
    cfg = dict(vocab_size=256, n_embd=256, n_layer=2, n_head=4, rotary_dim=16,
               n_positions=128, n_inner=None, activation_function="gelu_new",
               layer_norm_epsilon=1e-5, tie_word_embeddings=False, bos_token_id=1,
               eos_token_id=2, attn_implementation="eager")
    cfg.update(kw)
    model = randomize(transformers.GPTJForCausalLM(transformers.GPTJConfig(**cfg)), seed)
    if cfg["tie_word_embeddings"]:
        with torch.no_grad():
            model.transformer.wte.weight.mul_(0.1)
    return model


# the second model: every switch the first one leaves at GPT-J 6B's setting
OTHER = dict(activation_function="gelu", n_inner=512, rotary_dim=32, tie_word_embeddings=True)


@pytest.fixture(scope="module")
def gptj(tmp_path_factory):
    return hf_case(make_gptj(), tmp_path_factory.mktemp("gptj_hf"))


@pytest.fixture(scope="module")
def ours(gptj):
    return tiny_model("gptj", gptj[1])


@pytest.fixture(scope="module")
def gptj_other(tmp_path_factory):
    return hf_case(make_gptj(seed=1, **OTHER), tmp_path_factory.mktemp("gptj_other"))


def test_gptj_config_from_hf(gptj):
    _, path, _, _ = gptj
    spec, meta, got = hf_params("gptj", path)
    want = {"dim": 256, "n_layers": 2, "n_heads": 4, "ffn_dim": 1024, "vocab": 256,
            "context": 128, "rot_dim": 16, "rope_theta": 10000.0, "hidden_act": "gelu_new"}
    assert {k: got.get(k) for k in want} == want
    assert got["norm_eps"] == pytest.approx(1e-5)
    assert meta["n_inner"] is None                  # null: 4 * n_embd
    # config.json without n_inner / rotary_dim (GPTJConfig's defaults: 4 * n_embd, 64),
    # and rotary_dim null (the whole head)
    old = {k: v for k, v in meta.items() if k not in ("n_inner", "rotary_dim")}
    old.update(n_embd=512)
    got = params_from_metadata(spec, old)
    assert got["ffn_dim"] == 2048 and got["rot_dim"] == 64
    got = params_from_metadata(spec, {**old, "rotary_dim": None, "n_inner": 300})
    assert got["ffn_dim"] == 300 and got["rot_dim"] == 128


def test_gptj_prefill_and_decode_match_hf(gptj, ours):
    assert_logits_match("gptj", ours, gptj[2], gptj[3])


def test_gptj_greedy_generate_matches_hf(gptj, ours):
    assert_greedy_matches_hf(gptj[0], ours, PROMPTS, N_NEW)


def test_gptj_other_branches_match_hf(gptj_other):
    """Exact GELU, n_inner 512, rotary_dim 32, tied output (no lm_head.weight saved:
    the embedding stands in; lm_head.bias is still there)."""
    model, path, ids, ref = gptj_other
    got = hf_params("gptj", path)[2]
    assert got["hidden_act"] == "gelu" and got["ffn_dim"] == 512 and got["rot_dim"] == 32
    keys = set(md.load_weights(path).keys())
    assert "lm_head.weight" not in keys and "lm_head.bias" in keys
    ours = tiny_model("gptj", path)
    assert_logits_match("gptj (gelu, tied)", ours, ids, ref)
    assert_greedy_matches_hf(model, ours, PROMPTS[:2], N_NEW)
    # erf and tanh GELU are close: check that the select took the erf branch
    td = md.load_weights(path)
    td.metadata["activation_function"] = "gelu_new"
    tanh = max(compare(md.load_model(spec_path("gptj"), td, variant="tiny"), ref, ids))
    assert max(compare(ours, ref, ids)) < tanh / 10


def _spec_variant(tmp_path, old, new):
    """specs/gptj.yaml with the text ``old`` (a string or a list) replaced by ``new``."""
    with open(spec_path("gptj")) as f:
        text = f.read()
    for o, n in zip(*((old, new) if isinstance(old, list) else ([old], [new]))):
        assert o in text, o
        text = text.replace(o, n)
    path = tmp_path / "gptj.yaml"
    path.write_text(text)
    return md.load_spec(str(path))


SEQUENTIAL_FROM = ["    inputs: [x, cache]\n", "    block: decoder\n",
                   "      - name: ffn_up                          # fc_in\n",
                   "in: [h, .weight, .bias], out: m}"]
SEQUENTIAL_TO = ["    params: [i]\n    inputs: [x, cache]\n",
                 "    block: decoder\n    with: {i: \"{i}\"}\n",
                 "      - {op: add, in: [x, a], out: hs}\n"
                 "      - {op: layer_norm, in: [hs, \"blk.{i}.attn_norm.weight\", "
                 "\"blk.{i}.attn_norm.bias\"], out: hs}\n"
                 "      - name: ffn_up                          # fc_in\n",
                 "in: [hs, .weight, .bias], out: m}"]


@pytest.mark.parametrize("change", ["neox_rope", "full_rotary", "sequential"])
def test_gptj_switches_matter(gptj, tmp_path, change):
    """Negative controls on the same weights: rotating halves (neox) instead of adjacent
    pairs, rotating every feature of a head, or feeding the MLP x + attn (sequential)
    each give other logits, so the match above needs the spec's choices."""
    model, path, ids, ref = gptj
    spec, td = md.load_spec(spec_path("gptj")), md.load_weights(path)
    if change == "neox_rope":
        spec = _spec_variant(tmp_path, "style: normal", "style: neox")
    elif change == "full_rotary":
        td.metadata["rotary_dim"] = 64
    else:   # the MLP reads ln_1(x + attn), as a sequential block would
        spec = _spec_variant(tmp_path, SEQUENTIAL_FROM, SEQUENTIAL_TO)
    pre, dec = compare(md.load_model(spec, td, variant="tiny"), ref, ids)
    assert pre > 10 * TOL and dec > 10 * TOL


def _copy_with_config(src, dst, **changes):
    shutil.copytree(src, dst)
    with open(os.path.join(dst, "config.json")) as f:
        cfg = json.load(f)
    cfg.update(changes)
    with open(os.path.join(dst, "config.json"), "w") as f:
        json.dump(cfg, f)
    return str(dst)


def test_gptj_refuses_other_activation(gptj, tmp_path):
    path = _copy_with_config(gptj[1], tmp_path / "relu", activation_function="relu")
    with pytest.raises(md.WeightsError, match="hidden_act relu is not modelled"):
        md.load_model(spec_path("gptj"), path, variant="tiny")


def test_gptj_loads_old_buffers(gptj, tmp_path):
    """GPT-J 6B as older transformers saved it also holds per-layer causal-mask buffers
    (attn.bias, attn.masked_bias); the mapping drops them."""
    from safetensors.numpy import load_file, save_file

    _, path, ids, ref = gptj
    dst = tmp_path / "old"
    shutil.copytree(path, dst)
    (f,) = [n for n in os.listdir(dst) if n.endswith(".safetensors")]
    sd = load_file(os.path.join(dst, f))
    for i in range(2):
        sd[f"transformer.h.{i}.attn.bias"] = np.tril(np.ones((128, 128), bool))[None, None]
        sd[f"transformer.h.{i}.attn.masked_bias"] = np.array(-1e9, np.float32)
    save_file(sd, os.path.join(dst, f), metadata={"format": "pt"})
    pre, dec = compare(tiny_model("gptj", dst), ref, ids)
    assert pre <= TOL and dec <= TOL


def gptj_to_gguf(model, path) -> str:
    """Write a GPTJForCausalLM under llama.cpp's GPT-J names (gguf-py's
    ``MODEL_TENSORS[MODEL_ARCH.GPTJ]`` and its tensor map: wte -> token_embd, ln_1 ->
    attn_norm, q/k/v/out_proj -> attn_q/k/v/output, fc_in/fc_out -> ffn_up/ffn_down,
    ln_f -> output_norm, lm_head -> output) and keys (``gptj.*``); llama.cpp's converter
    has no GPT-J model, so this is what its names imply. No vocab_size key (the
    tokenizer's length gives it), no rope.freq_base (10000)."""
    import gguf

    cfg, sd = model.config, hf_state(model)
    w = gguf.GGUFWriter(os.fspath(path), "gptj")
    w.add_context_length(cfg.n_positions)
    w.add_embedding_length(cfg.n_embd)
    w.add_block_count(cfg.n_layer)
    w.add_feed_forward_length(cfg.n_inner or 4 * cfg.n_embd)
    w.add_head_count(cfg.n_head)
    w.add_rope_dimension_count(cfg.rotary_dim)
    w.add_layer_norm_eps(cfg.layer_norm_epsilon)
    w.add_file_type(gguf.LlamaFileType.ALL_F32)
    _add_tokenizer(w, cfg.vocab_size)
    names = gguf.get_tensor_name_map(gguf.MODEL_ARCH.GPTJ, cfg.n_layer)
    t = {}
    for key, arr in sd.items():
        base, kind = key.rsplit(".", 1)
        t[f"{names.get_name(base)}.{kind}"] = arr
    _write(w, t)
    return os.fspath(path)


def test_gptj_gguf_matches_hf(gptj, tmp_path):
    model, _, ids, ref = gptj
    path = gptj_to_gguf(model, tmp_path / "tiny-gptj.gguf")
    got = hf_params("gptj", path)[2]
    assert got["rot_dim"] == 16 and got["vocab"] == 256 and got["ffn_dim"] == 1024
    assert got["norm_eps"] == pytest.approx(1e-5)
    pre, dec = compare(md.load_model(spec_path("gptj"), path, variant="tiny"), ref, ids)
    assert pre <= TOL and dec <= TOL


def test_gptj_export_round_trip(gptj_other, tmp_path):
    """``maxdecl export`` of the HF checkpoint keeps gptj.hidden_act (gelu) and
    rope.dimension_count (32), writes no output.weight (tied); loading it back gives
    HF's logits."""
    model, path, ids, ref = gptj_other
    out = tmp_path / "exported.gguf"
    subprocess.run([sys.executable, "-m", "maxdecl", "export", "--spec", spec_path("gptj"),
                    "--variant", "tiny", "-o", str(out), path], check=True, capture_output=True)
    got = hf_params("gptj", out)[2]
    assert got["hidden_act"] == "gelu" and got["rot_dim"] == 32 and got["ffn_dim"] == 512
    keys = set(md.load_weights(out).keys())
    assert "output.weight" not in keys and "output.bias" in keys
    pre, dec = compare(tiny_model("gptj", out), ref, ids)
    assert pre <= TOL and dec <= TOL
