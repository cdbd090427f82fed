"""specs/llama4.yaml against transformers' Llama4ForCausalLM (text model).

A small seeded float32 Llama 4 text model that mixes every per-layer choice the
architecture has:

* layers 0 and 2 dense (SwiGLU of ``intermediate_size_mlp``), 1 and 3 MoE
  (``interleave_moe_layer_step`` 2): 4 experts, top-2 with a sigmoid router whose
  score scales each expert's input, plus the shared expert;
* ``no_rope_layers`` [1, 1, 0, 0]: RoPE (adjacent pairs) and the L2 q/k norm on layers
  0-1, NoPE with attention temperature tuning on layers 2-3 (``floor_scale`` 4 and
  ``attn_scale`` 0.5, so the temperature changes every 4 positions of the test);
* ``attention_chunk_size`` 5 on the RoPE layers, shorter than the 16-token test
  sequence: prefill and decode both cross chunk boundaries.

A second model takes the Scout-like settings (every layer MoE, top-1, llama3 RoPE
scaling, no q/k norm, no chunking, no temperature tuning, tied output), and the
checkpoints of Llama4TextModel and Llama4ForConditionalGeneration load too.
"""

import numpy as np
import pytest

import maxdecl as md

from modelhelp import (assert_greedy_matches_hf, hf_case, hf_logits, hf_params, ours_logits,
                       randomize, rel_err, save_hf, spec_path, tiny_model, token_ids,
                       with_hf_config)

pytest.importorskip("torch")
pytest.importorskip("transformers")

TOL = 1e-5          # max|ours - ref| <= TOL * max|ref| (measured ~1e-6)
N_PROMPT = 12
PROMPTS = [[3, 17, 42, 99, 5, 7, 64, 1], [8, 9, 120], [5, 60, 33, 2, 90, 11, 7, 200, 13]]
N_NEW = 8

BASE = dict(vocab_size=256, hidden_size=64, intermediate_size=32, intermediate_size_mlp=96,
            num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
            num_local_experts=4, num_experts_per_tok=2, interleave_moe_layer_step=2,
            no_rope_layers=[1, 1, 0, 0], attention_chunk_size=5, use_qk_norm=True,
            attn_temperature_tuning=True, floor_scale=4, attn_scale=0.5,
            max_position_embeddings=64, rms_norm_eps=1e-5, bos_token_id=1, eos_token_id=2,
            rope_parameters={"rope_type": "default", "rope_theta": 500000.0},
            attn_implementation="eager")

SCOUT_LIKE = dict(BASE, num_experts_per_tok=1, interleave_moe_layer_step=1,
                  no_rope_layers=[1, 0, 1, 1], attention_chunk_size=None, use_qk_norm=False,
                  attn_temperature_tuning=False, tie_word_embeddings=True,
                  rope_parameters={"rope_type": "llama3", "rope_theta": 10000.0, "factor": 8.0,
                                   "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                   "original_max_position_embeddings": 64})


def make_llama4(seed=0, **kw):
    import torch
    import transformers

    torch.manual_seed(seed)
    cfg = dict(BASE)
    cfg.update(kw)
    model = transformers.Llama4ForCausalLM(transformers.Llama4TextConfig(**cfg))
    return randomize(model, seed)


def hf_hidden(model, ids):
    """transformers' last_hidden_state [len(ids), dim] (after the final norm)."""
    import torch

    with torch.no_grad():
        out = model(torch.tensor([list(ids)]), use_cache=False)
    return out.last_hidden_state[0].float().numpy()


def run_graph(ours, ids):
    """All outputs of one prefill call of the loaded model (every position's logits)."""
    ids = np.asarray(ids, np.int64)
    feed = {"tokens": ids, "positions": np.arange(len(ids), dtype=np.int64),
            "logit_rows": np.arange(len(ids), dtype=np.int64)}
    args = []
    for v in ours.graph.inputs:
        if v.name in feed:
            args.append(feed[v.name])
        else:   # a state's first value: symbolic dims 0
            args.append(np.zeros([d if isinstance(d, int) else 0 for d in v.type.shape],
                                 v.type.dtype.numpy))
    return dict(zip(ours.output_names, ours(*args)))


@pytest.fixture(scope="module")
def llama4(tmp_path_factory):
    return hf_case(make_llama4(), tmp_path_factory.mktemp("llama4_hf"))


@pytest.fixture(scope="module")
def ours(llama4):
    return tiny_model("llama4", llama4[1])


def test_llama4_config_from_hf(llama4, ours):
    got = hf_params("llama4", llama4[1])[2]
    assert (got["dim"], got["n_layers"], got["n_heads"], got["n_kv_heads"], got["head_dim"],
            got["vocab"], got["context"]) == (64, 4, 4, 2, 16, 256, 64)
    assert (got["ffn_dim"], got["ffn_dim_mlp"], got["n_expert"], got["n_expert_used"]) == (
        32, 96, 4, 2)
    assert (got["chunk"], got["floor_scale"], got["attn_scale"]) == (5, 4, 0.5)
    p = ours.params
    assert list(p["moe_list"]) == [1, 3]
    assert list(p["rope_list"]) == [1, 1, 0, 0]
    assert list(p["chunked_list"]) == [True, True, False, False]
    assert p["use_qk_norm"] is True and p["temp_tuning"] is True


def test_llama4_prefill_and_decode_match_hf(llama4, ours):
    _, _, ids, ref = llama4
    pre, dec = ours_logits(ours, ids, N_PROMPT)
    e_pre, e_dec = rel_err(pre, ref[:N_PROMPT]), rel_err(dec, ref[N_PROMPT:])
    print(f"llama4 vs HF: prefill {e_pre:.2e}, decode {e_dec:.2e} (of max|ref| "
          f"{np.abs(ref).max():.2f})")
    assert e_pre <= TOL and e_dec <= TOL


def test_llama4_last_hidden_state_matches_hf(llama4, ours):
    model, _, ids, _ = llama4
    got = run_graph(ours, ids)["last_hidden_state"]
    err = rel_err(got, hf_hidden(model.model, ids))
    print(f"llama4 last_hidden_state vs HF: {err:.2e}")
    assert err <= TOL


def test_llama4_batch_of_two_prompts_matches_hf(llama4, ours):
    """transformers' logits of a [2, 14] batch, each row against maxdecl's logits of that
    prompt (chunks of 5 and the temperature steps at every row)."""
    import torch

    model = llama4[0]
    batch = [token_ids(256, 14, seed=11), token_ids(256, 14, seed=12)]
    with torch.no_grad():
        ref = model(torch.tensor(batch), use_cache=False).logits.float().numpy()
    errs = [rel_err(ours.logits(p), ref[b]) for b, p in enumerate(batch)]
    print(f"llama4 batch of 2 vs HF: {errs[0]:.2e}, {errs[1]:.2e}")
    assert max(errs) <= TOL


def test_llama4_greedy_generate_matches_hf(llama4, ours):
    assert_greedy_matches_hf(llama4[0], ours, PROMPTS, N_NEW)


@pytest.mark.parametrize("what,change", [
    ("chunked attention", {"chunk": "{0}", "layer_types": "{None}"}),
    ("temperature tuning", {"temp_tuning": "{False}"}),
    ("q/k L2 norm", {"use_qk_norm": "{False}"}),
    ("NoPE layers", {"no_rope_layers": "{[1, 1, 1, 1]}", "layer_types": "{None}"}),
])
def test_llama4_each_feature_matters(llama4, what, change):
    """Negative controls: with one feature switched off in the mapping, the logits are far
    from transformers' (so each part of the spec is exercised by the test config)."""
    _, path, ids, ref = llama4
    spec = with_hf_config(md.load_spec(spec_path("llama4")), **change)
    model = md.load_model(spec, path, variant="tiny")
    err = rel_err(model.logits(ids), ref)
    print(f"llama4 without {what}: {err:.2e}")
    assert err > 100 * TOL


def test_llama4_text_model_checkpoint_loads(llama4, tmp_path):
    """A Llama4TextModel checkpoint (bare names, no lm_head): last_hidden_state matches."""
    model, _, ids, _ = llama4
    path = save_hf(model.model, tmp_path / "base")
    keys = set(md.load_weights(path).keys())
    assert "embed_tokens.weight" in keys and "lm_head.weight" not in keys
    ours = md.load_model(spec_path("llama4"), path, variant="tiny")
    err = rel_err(run_graph(ours, ids)["last_hidden_state"], hf_hidden(model.model, ids))
    assert err <= TOL


@pytest.fixture(scope="module")
def scout_like(tmp_path_factory):
    return hf_case(make_llama4(seed=1, **SCOUT_LIKE), tmp_path_factory.mktemp("llama4_scout"))


def test_llama4_scout_like_matches_hf(scout_like):
    """Every layer MoE with top-1, llama3 RoPE scaling (rope_freqs computed from
    config.json), no chunking, no q/k norm, no temperature tuning, tied output."""
    model, path, ids, ref = scout_like
    assert "lm_head.weight" not in md.load_weights(path).keys()
    ours = tiny_model("llama4", path)
    p = ours.params
    assert list(p["moe_list"]) == [0, 1, 2, 3] and p["rope_type"] == "llama3"
    assert not any(p["chunked_list"])
    factors = np.asarray(ours.weights["rope_freqs.weight"])
    assert factors.min() == 1.0 and factors.max() == 8.0 and len(set(factors.tolist())) > 2
    pre, dec = ours_logits(ours, ids, N_PROMPT)
    e_pre, e_dec = rel_err(pre, ref[:N_PROMPT]), rel_err(dec, ref[N_PROMPT:])
    print(f"llama4 scout-like vs HF: prefill {e_pre:.2e}, decode {e_dec:.2e}")
    assert e_pre <= TOL and e_dec <= TOL
    assert_greedy_matches_hf(model, ours, PROMPTS[:2], N_NEW)


def test_llama4_conditional_generation_checkpoint(tmp_path):
    """The language model of a Llama4ForConditionalGeneration checkpoint (config.json's
    text_config, language_model.* names, the vision tower dropped): text-only logits."""
    import torch
    import transformers

    torch.manual_seed(2)
    text = {k: v for k, v in BASE.items() if k != "attn_implementation"}
    vision = dict(hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                  intermediate_size=64, vision_output_dim=32, image_size=28, patch_size=14,
                  projector_input_dim=32, projector_output_dim=32)
    cfg = transformers.Llama4Config(text_config=text, vision_config=vision,
                                    image_token_index=255, boi_token_index=253,
                                    eoi_token_index=254, attn_implementation="eager")
    model = randomize(transformers.Llama4ForConditionalGeneration(cfg), 2)
    path = save_hf(model, tmp_path / "mm")
    ids = token_ids(250, 16, seed=9)
    # transformers 5.24's Llama4ForConditionalGeneration.forward fails without an image
    # (MoeCausalLMOutputWithPast has no image_outputs): its language model is the reference
    ref = hf_logits(model.language_model, ids)
    ours = md.load_model(spec_path("llama4"), path, variant="tiny")
    assert ours.params["dim"] == 64 and list(ours.params["moe_list"]) == [1, 3]
    pre, dec = ours_logits(ours, ids, N_PROMPT)
    assert rel_err(pre, ref[:N_PROMPT]) <= TOL and rel_err(dec, ref[N_PROMPT:]) <= TOL


def test_llama4_prompt_lookup_gives_greedy_ids(ours):
    """The key-position state grows along axis -3 like the KV caches, so prompt lookup
    (drafts cut back after a miss) gives plain greedy decoding's ids."""
    prompt = [3, 17, 42, 3, 17, 42, 3, 17, 42, 5]
    plain = ours.generate(prompt, 20, temperature=0).ids
    out = ours.generate(prompt, 20, temperature=0, lookup=4)
    assert out.ids == plain and out.drafted > 0


def test_llama4_scout_rope_scaling_low_equals_high(tmp_path):
    """Llama 4 Scout's own rope scaling (factor 16, low_freq_factor == high_freq_factor
    == 1, original context 8192): no smoothing band, factors 1 or 16."""
    rp = {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 16.0,
          "low_freq_factor": 1.0, "high_freq_factor": 1.0,
          "original_max_position_embeddings": 8192}
    model = make_llama4(seed=3, **dict(SCOUT_LIKE, rope_parameters=rp))
    path = save_hf(model, tmp_path / "scout")
    ids = token_ids(256, 16, seed=5)
    ours = md.load_model(spec_path("llama4"), path, variant="tiny")
    assert set(np.asarray(ours.weights["rope_freqs.weight"]).tolist()) == {1.0, 16.0}
    assert rel_err(ours.logits(ids), hf_logits(model, ids)) <= TOL
