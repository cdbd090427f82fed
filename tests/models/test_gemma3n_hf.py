"""specs/gemma3n.yaml against transformers' Gemma3nForCausalLM (the Gemma 3n text model).

A small seeded float32 model with every Gemma 3n part switched on: 4 AltUp streams,
LAuReL (rank 8), per-layer embeddings (16 wide, a table of 200 rows for a vocabulary of
256, so prompt ids past it read row 0), Gaussian top-k activation sparsity on three of
six layers (0.95, 0.9, 0.8), per-layer FFN widths, sliding (window 5) and full layers
alternating with their own RoPE bases (5000 and
200000, not the defaults), head_dim 24 != dim / heads, the last two layers
sharing the keys and values of layers 2 (sliding) and 3 (full), and the final logit soft
cap of 30.
"""

import json
import os

import numpy as np
import pytest

import maxdecl as md

from modelhelp import (assert_greedy_matches_hf, hf_case, hf_params, ours_logits, randomize,
                       rel_err, spec_path, tiny_model, with_hf_config)

pytest.importorskip("torch")
pytest.importorskip("transformers")

TOL = 1e-5              # max|ours - ref| <= TOL * max|ref| (float32 both sides)
N_PROMPT = 12
PROMPTS = [[3, 17, 42, 99, 5, 7, 64, 1, 230, 12], [8, 9, 220], [5, 60, 33, 2, 90, 11, 7]]
N_NEW = 6
LAYER_TYPES = ["sliding_attention", "full_attention"] * 3
SPARSITY = [0.95, 0.9, 0.0, 0.8, 0.0, 0.0]
FFN = [128, 96, 128, 96, 128, 96]


def make_gemma3n(seed=0, **kw):
    """Gemma3nForCausalLM: dim 64, 6 layers (2 KV-shared), 4 heads of 24, 2 KV heads."""
    import torch
    import transformers

    torch.manual_seed(seed)
    cfg = dict(vocab_size=256, vocab_size_per_layer_input=200, hidden_size=64,
               intermediate_size=FFN, num_hidden_layers=6, num_attention_heads=4,
               num_key_value_heads=2, head_dim=24, hidden_size_per_layer_input=16,
               altup_num_inputs=4, laurel_rank=8, num_kv_shared_layers=2, sliding_window=5,
               layer_types=LAYER_TYPES, activation_sparsity_pattern=SPARSITY,
               max_position_embeddings=64, rms_norm_eps=1e-6,
               rope_parameters={"sliding_attention": {"rope_type": "default", "rope_theta": 5000.0},
                                "full_attention": {"rope_type": "default", "rope_theta": 200000.0}},
               attn_implementation="eager")
    cfg.update(kw)
    model = transformers.Gemma3nForCausalLM(transformers.Gemma3nTextConfig(**cfg))
    # Gemma 3n norms multiply by w (not 1 + w): randomize's 1 + 0.2 N(0, 1) gains fit;
    # AltUp's correct_output_scale (1-D) gets the same
    return randomize(model, seed)


@pytest.fixture(scope="module")
def g3n(tmp_path_factory):
    return hf_case(make_gemma3n(), tmp_path_factory.mktemp("gemma3n_hf"))


@pytest.fixture(scope="module")
def ours(g3n):
    return tiny_model("gemma3n", g3n[1])


def errors(model, ids, ref):
    pre, dec = ours_logits(model, ids, N_PROMPT)
    return rel_err(pre, ref[:N_PROMPT]), rel_err(dec, ref[N_PROMPT:])


def test_gemma3n_case_exercises_every_part(g3n):
    """The reference model really has what the comparisons are meant to cover."""
    model, _, ids, ref = g3n
    layers = model.model.layers
    assert [l.self_attn.is_kv_shared_layer for l in layers] == [False] * 4 + [True] * 2
    assert not hasattr(layers[4].self_attn, "k_proj")
    assert [l.mlp.activation_sparsity for l in layers] == SPARSITY
    assert any(t >= 200 for t in ids[:N_PROMPT]) and any(t >= 200 for t in ids[N_PROMPT:])
    assert N_PROMPT > model.config.sliding_window
    assert np.abs(ref).max() < 30.0            # soft-capped


def test_gemma3n_config_from_hf(g3n):
    _, path, _, _ = g3n
    got = hf_params("gemma3n", path)[2]
    assert (got["dim"], got["n_layers"], got["n_heads"], got["n_kv_heads"], got["head_dim"],
            got["vocab"], got["context"]) == (64, 6, 4, 2, 24, 256, 64)
    assert (got["ple_vocab"], got["ple_dim"], got["altup_n"], got["laurel_rank"],
            got["n_kv_shared"], got["sliding_window"]) == (200, 16, 4, 8, 2, 5)
    assert got["ffn_dims"] == FFN and got["sparsity"] == SPARSITY
    assert got["layer_types"] == LAYER_TYPES
    assert got["rope_theta_local"] == 5000.0 and got["rope_theta_global"] == 200000.0
    assert got["final_softcap"] == 30.0


def test_gemma3n_derived_params(ours):
    p = ours.params
    assert p["first_shared"] == 4 and p["kv_source"] == [0, 1, 2, 3, 2, 3]
    # torch.distributions.Normal(0, 1).icdf(0.95), (0.9), (0.8) in float32
    import torch
    want = torch.distributions.Normal(0, 1).icdf(torch.tensor(SPARSITY)).numpy()
    got = np.asarray(p["sparsity_mult"], np.float32)
    np.testing.assert_allclose(got[[0, 1, 3]], want[[0, 1, 3]], rtol=1e-6)


def test_gemma3n_prefill_and_decode_match_hf(g3n, ours):
    """A 12-token prefill (every position's logits), then 4 tokens one at a time
    through the KV caches, against transformers' logits of the whole sequence."""
    _, _, ids, ref = g3n
    pre, dec = errors(ours, ids, ref)
    print(f"gemma3n vs HF: prefill {pre:.2e}, decode {dec:.2e} of max|ref| {np.abs(ref).max():.1f}")
    assert pre <= TOL and dec <= TOL


def test_gemma3n_decode_from_one_token_matches_hf(g3n, ours):
    """Every token through the caches from the first: the sliding layers' windows fill
    and slide, and the shared layers follow their sources step by step."""
    _, _, ids, ref = g3n
    pre, dec = ours_logits(ours, ids, 1)
    assert rel_err(np.concatenate([pre, dec]), ref) <= TOL


def test_gemma3n_greedy_generate_matches_hf(g3n, ours):
    """Greedy ids as transformers' generate (its DynamicCache, sliding layers and KV
    sharing), one prompt alone and three decoded together."""
    assert_greedy_matches_hf(g3n[0], ours, PROMPTS, N_NEW)


def test_gemma3n_activation_sparsity_matters(g3n):
    """Negative control: the same weights read as if no layer were sparse."""
    _, path, ids, ref = g3n
    spec = with_hf_config(md.load_spec(spec_path("gemma3n")),
                          sparsity="{[0.0] * num_hidden_layers}")
    pre, _ = errors(md.load_model(spec, path, variant="tiny"), ids, ref)
    assert pre > 100 * TOL


def test_gemma3n_softcap_from_config(tmp_path):
    """final_logit_softcapping 5 (not the default 30) is read from config.json and bites
    (a second, smaller case; transformers 5's strict config refuses null)."""
    from modelhelp import hf_logits, save_hf, token_ids

    model = make_gemma3n(seed=1, final_logit_softcapping=5.0)
    path = save_hf(model, tmp_path / "cap5")
    ids = token_ids(256, n=N_PROMPT + 2, seed=8)
    ref = hf_logits(model, ids)
    assert np.abs(ref).max() > 4.0
    ours = md.load_model(spec_path("gemma3n"), path, variant="tiny")
    assert ours.params["final_softcap"] == 5.0
    pre, dec = errors(ours, ids, ref)
    assert pre <= TOL and dec <= TOL


def test_gemma3n_multimodal_checkpoint_layout(g3n, tmp_path):
    """The text model inside a Gemma3nForConditionalGeneration checkpoint: names under
    model.language_model., the config under text_config, vision and audio towers
    beside it (dropped), and, as checkpoints saved by transformers 4 hold them, k/v
    projections and k norms of the KV-shared layers (read by nothing), and the RoPE
    bases as transformers 4 wrote them (rope_theta, rope_local_base_freq)."""
    import torch
    from safetensors.numpy import save_file

    model, path, ids, ref = g3n
    sd = {k: v.detach().numpy().copy() for k, v in model.state_dict().items()}
    out = {}
    for k, v in sd.items():
        if k.startswith("model."):
            out["model.language_model." + k[len("model."):]] = v
        elif k != "lm_head.weight":             # tied: not saved
            out[k] = v
    gen = torch.Generator().manual_seed(3)
    for i in (4, 5):
        pre = f"model.language_model.layers.{i}.self_attn."
        out[pre + "k_proj.weight"] = torch.randn(48, 64, generator=gen).numpy()
        out[pre + "v_proj.weight"] = torch.randn(48, 64, generator=gen).numpy()
        out[pre + "k_norm.weight"] = torch.randn(24, generator=gen).numpy()
    out["model.vision_tower.timm_model.conv_stem.conv.weight"] = np.zeros((4, 3, 3, 3), np.float32)
    out["model.embed_audio.embedding.weight"] = np.zeros((8, 64), np.float32)
    folder = tmp_path / "multimodal"
    folder.mkdir()
    save_file(out, os.fspath(folder / "model.safetensors"))
    with open(os.path.join(path, "config.json")) as f:
        text = json.load(f)
    # transformers 4's spelling of the RoPE bases
    text.pop("rope_parameters")
    text.update(rope_theta=200000.0, rope_local_base_freq=5000.0, rope_scaling=None)
    cfg = {"architectures": ["Gemma3nForConditionalGeneration"], "model_type": "gemma3n",
           "text_config": text, "vision_config": {"hidden_size": 2048},
           "audio_config": {"hidden_size": 1536}}
    (folder / "config.json").write_text(json.dumps(cfg))
    ours = md.load_model(spec_path("gemma3n"), os.fspath(folder), variant="tiny")
    p = ours.params
    assert p["n_kv_shared"] == 2 and p["ffn_dims"] == FFN and p["ple_vocab"] == 200
    assert (p["rope_theta_local"], p["rope_theta_global"]) == (5000.0, 200000.0)
    assert p["rope_type_global"] == "default"
    pre, dec = errors(ours, ids, ref)
    assert pre <= TOL and dec <= TOL
