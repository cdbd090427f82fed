"""specs/codegen.yaml against transformers' CodeGenForCausalLM (Salesforce CodeGen).

A small seeded float32 CodeGen: GPT-J's parallel block (one LayerNorm feeding attention
and the MLP), a fused qkv_proj whose rows come in 4 model-parallel shards of q, v, k
(8 heads of 16: two heads per shard, so the shard layout and the head layout differ),
partial rotary embeddings (rotary_dim 8 of 16, adjacent pairs), an fc_in / fc_out MLP
with gelu_new and an untied lm_head with a bias. A second model takes the other
branches: 2 heads of 64 (one head spans two shards), rotary_dim 32, exact GELU, an
explicit n_inner and the output tied to the embedding.
"""

import json
import os
import shutil

import numpy as np
import pytest

import maxdecl as md
from maxdecl.pipelines.model_loading import params_from_metadata

from modelhelp import (assert_greedy_matches_hf, compare, hf_case, hf_params, max_abs_diff,
                       randomize, spec_path, tiny_model, without_hf_transforms)

pytest.importorskip("torch")
pytest.importorskip("transformers")

TOL = 1e-5          # max|ours - ref| <= TOL * max|ref| (float32 weights, float32 math)
PROMPTS = [[3, 17, 42, 90, 5, 7, 64, 1], [8, 9, 200], [5, 60, 33, 2, 250, 11, 7]]
N_NEW = 6


def make_codegen(seed=0, **kw):
    """CodeGenForCausalLM: dim 128 (8 heads of 16), 2 layers, ffn 4 * 128, vocab 256,
    rotary_dim 8, 128 positions (multiples of 32: the spec's q8_0 default).

    A tied table is scaled to 0.1 * N(0, 1), so that greedy decoding does not only
    repeat the last token."""
    import torch
    import transformers

    torch.manual_seed(seed)
    cfg = dict(vocab_size=256, n_embd=128, n_layer=2, n_head=8, rotary_dim=8,
               n_positions=128, n_ctx=128, n_inner=None, activation_function="gelu_new",
               layer_norm_epsilon=1e-5, tie_word_embeddings=False, bos_token_id=1,
               eos_token_id=2, attn_implementation="eager")
    cfg.update(kw)
    model = randomize(transformers.CodeGenForCausalLM(transformers.CodeGenConfig(**cfg)), seed)
    if cfg["tie_word_embeddings"]:
        with torch.no_grad():
            model.transformer.wte.weight.mul_(0.1)
    return model


# the second model: every switch the first one leaves at CodeGen's released setting
OTHER = dict(n_head=2, rotary_dim=32, activation_function="gelu", n_inner=256,
             tie_word_embeddings=True)


@pytest.fixture(scope="module")
def codegen(tmp_path_factory):
    return hf_case(make_codegen(), tmp_path_factory.mktemp("codegen_hf"))


@pytest.fixture(scope="module")
def ours(codegen):
    return tiny_model("codegen", codegen[1])


@pytest.fixture(scope="module")
def codegen_other(tmp_path_factory):
    return hf_case(make_codegen(seed=1, **OTHER), tmp_path_factory.mktemp("codegen_other"))


def assert_close(name, model, ids, ref, tol=TOL):
    pre, dec = compare(model, ref, ids)
    print(f"{name} vs HF: prefill {pre:.2e}, decode {dec:.2e} (of max|ref|); "
          f"max abs {max_abs_diff(model, ids, ref):.2e} (max|ref| {np.abs(ref).max():.1f})")
    assert pre <= tol and dec <= tol


def test_codegen_spec_validates():
    assert md.validate_spec(spec_path("codegen")) == []


def test_codegen_config_from_hf(codegen):
    _, path, _, _ = codegen
    spec, meta, got = hf_params("codegen", path)
    want = {"dim": 128, "n_layers": 2, "n_heads": 8, "ffn_dim": 512, "vocab": 256,
            "context": 128, "rot_dim": 8, "hidden_act": "gelu_new"}
    assert {k: got.get(k) for k in want} == want
    assert got["norm_eps"] == pytest.approx(1e-5)
    assert meta["n_inner"] is None                  # null: 4 * n_embd
    # config.json without n_inner / rotary_dim (CodeGenConfig's defaults: 4 * n_embd, 64)
    old = {k: v for k, v in meta.items() if k not in ("n_inner", "rotary_dim")}
    old.update(n_embd=512)
    got = params_from_metadata(spec, old)
    assert got["ffn_dim"] == 2048 and got["rot_dim"] == 64
    got = params_from_metadata(spec, {**old, "n_inner": 300, "rotary_dim": 16})
    assert got["ffn_dim"] == 300 and got["rot_dim"] == 16
    # rotary_dim null: transformers rotates n_embd features (a single head's worth)
    got = params_from_metadata(spec, {**old, "rotary_dim": None, "n_head": 1})
    assert got["rot_dim"] == 512 and got["n_heads"] == 1


def test_codegen_prefill_and_decode_match_hf(codegen, ours):
    """Prefill logits of 12 tokens, then 4 single-token steps through the KV cache."""
    assert_close("codegen", ours, codegen[2], codegen[3])


def test_codegen_greedy_generate_matches_hf(codegen, ours):
    assert_greedy_matches_hf(codegen[0], ours, PROMPTS, N_NEW)


def test_codegen_other_branches_match_hf(codegen_other):
    """2 heads of 64 (a head spans two qkv shards), rotary_dim 32, exact GELU, n_inner
    256, tied output (no lm_head.weight saved: the embedding stands in; lm_head.bias is
    still there)."""
    model, path, ids, ref = codegen_other
    got = hf_params("codegen", path)[2]
    assert got["hidden_act"] == "gelu" and got["ffn_dim"] == 256 and got["rot_dim"] == 32
    assert got["n_heads"] == 2
    keys = set(md.load_weights(path).keys())
    assert "lm_head.weight" not in keys and "lm_head.bias" in keys
    ours = tiny_model("codegen", path)
    assert "output.weight" not in ours.weights.keys()
    assert_close("codegen (2 heads, gelu, tied)", ours, ids, ref)
    assert_greedy_matches_hf(model, ours, PROMPTS, N_NEW)


@pytest.mark.parametrize("change", ["no_qkv_regroup", "full_rotary", "unchanged"])
def test_codegen_switches_matter(codegen, change):
    """Negative controls on the same weights: the qkv rows left in HF's shard order, or
    every feature of a head rotating, each give other logits; the unchanged spec on a
    copy of the metadata (the control's control) still matches."""
    _, path, ids, ref = codegen
    spec, td = md.load_spec(spec_path("codegen")), md.load_weights(path)
    if change == "no_qkv_regroup":
        spec = without_hf_transforms(spec)
    elif change == "full_rotary":
        td.metadata["rotary_dim"] = 16
    pre, dec = compare(md.load_model(spec, td, variant="tiny"), ref, ids)
    if change == "unchanged":
        assert pre <= TOL and dec <= TOL
    else:
        assert pre > 100 * TOL and dec > 100 * TOL


def _copy_with_config(src, dst, **changes):
    shutil.copytree(src, dst)
    with open(os.path.join(dst, "config.json")) as f:
        cfg = json.load(f)
    cfg.update(changes)
    with open(os.path.join(dst, "config.json"), "w") as f:
        json.dump(cfg, f)
    return str(dst)


@pytest.mark.parametrize("changes, message", [
    ({"rotary_dim": 32}, "rotary_dim 32 must be even and in 2..head_dim"),
    ({"rotary_dim": 7}, "rotary_dim 7 must be even"),
    ({"n_head": 6}, "is not a multiple of n_head 6"),
])
def test_codegen_refuses_unsupported_configs(codegen, tmp_path, changes, message):
    """Configurations transformers itself cannot run (its rotary slices would not
    broadcast, its head split fails) are refused with a message, not run wrongly."""
    path = _copy_with_config(codegen[1], tmp_path / "bad", **changes)
    with pytest.raises(md.WeightsError, match=message):
        md.load_model(spec_path("codegen"), path, variant="tiny")


def test_codegen_loads_old_buffers(codegen, tmp_path):
    """Checkpoints saved by older transformers hold a per-layer causal-mask buffer
    (attn.causal_mask, GPT-J's attn.masked_bias); the mapping drops them."""
    from safetensors.numpy import load_file, save_file

    _, path, ids, ref = codegen
    dst = tmp_path / "old"
    shutil.copytree(path, dst)
    (f,) = [n for n in os.listdir(dst) if n.endswith(".safetensors")]
    sd = load_file(os.path.join(dst, f))
    for i in range(2):
        sd[f"transformer.h.{i}.attn.causal_mask"] = np.tril(np.ones((128, 128), bool))[None, None]
        sd[f"transformer.h.{i}.attn.masked_bias"] = np.array(-1e9, np.float32)
    save_file(sd, os.path.join(dst, f), metadata={"format": "pt"})
    pre, dec = compare(tiny_model("codegen", dst), ref, ids)
    assert pre <= TOL and dec <= TOL


def test_codegen_random_weights_run():
    """The tiny variant runs on seeded random weights in its own encodings (q8_0
    matrices), as `maxdecl run` does without a checkpoint."""
    td = md.random_weights(spec_path("codegen"), variant="tiny", seed=0)
    model = md.load_model(spec_path("codegen"), td, variant="tiny")
    out = model.generate([1, 2, 3], 4, temperature=0)
    assert len(out.ids) == 4 and all(0 <= t < 256 for t in out.ids)
