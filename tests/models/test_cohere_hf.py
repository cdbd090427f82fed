"""specs/cohere.yaml against transformers' CohereForCausalLM (Command-R, Command-R+, Aya 23).

A small seeded float32 Cohere model: one bias-free LayerNorm per block feeding attention
and the SwiGLU MLP in parallel, grouped-query attention (4 query heads, 2 kv heads), RoPE
rotating adjacent pairs (the rope op's ``normal`` style, in HF and GGUF alike), the
output tied to the embedding, and logits times ``logit_scale`` (0.5 here, so it matters).
A second model turns on the per-head q/k LayerNorm of Command-R+ (``use_qk_norm``).
"""

import pytest

import maxdecl as md

from modelhelp import (TOL, _add_tokenizer, _write, assert_greedy_matches_hf, assert_logits_match,
                       compare, gguf_writer, hf_case, hf_params, hf_state, llama_cpp_logits,
                       randomize, rel_err, spec_path, tiny_model, with_hf_config, N_PROMPT)

pytest.importorskip("torch")
pytest.importorskip("transformers")

PROMPTS = [[3, 17, 42, 90, 5, 7, 64, 1], [8, 9, 80], [5, 60, 33, 2, 90, 11, 7]]
N_NEW = 6


def make_cohere(seed=0, **kw):
    """CohereForCausalLM: dim 256, 2 layers, GQA 4/2, ffn 512, vocab 96, tied output,
    logit_scale 0.5, rope_theta 10000 (dim 256 / ffn 512: the spec's q8_0 blocks).

    The tied table is scaled to 0.1 * N(0, 1) so that greedy decoding does not only
    repeat the last token."""
    import torch
    import transformers

    torch.manual_seed(seed)
    cfg = dict(vocab_size=96, hidden_size=256, intermediate_size=512, num_hidden_layers=2,
               num_attention_heads=4, num_key_value_heads=2, layer_norm_eps=1e-5,
               max_position_embeddings=64, rope_theta=10000.0, logit_scale=0.5,
               tie_word_embeddings=True, use_qk_norm=False, bos_token_id=1, eos_token_id=2,
               pad_token_id=0, attn_implementation="eager")
    cfg.update(kw)
    model = randomize(transformers.CohereForCausalLM(transformers.CohereConfig(**cfg)), seed)
    with torch.no_grad():
        model.model.embed_tokens.weight.mul_(0.1)
    return model


@pytest.fixture(scope="module")
def cohere(tmp_path_factory):
    return hf_case(make_cohere(), tmp_path_factory.mktemp("cohere_hf"))


@pytest.fixture(scope="module")
def ours(cohere):
    return tiny_model("cohere", cohere[1])


@pytest.fixture(scope="module")
def cohere_qk(tmp_path_factory):
    """Command-R+'s q/k norms. 64 layers (narrow ones): llama.cpp's command-r loader
    creates attn_q_norm / attn_k_norm only when n_layer >= 64 (as Command-R+ has), and
    refuses a file whose tensor count differs."""
    model = make_cohere(seed=1, use_qk_norm=True, num_hidden_layers=64, hidden_size=64,
                        intermediate_size=128)
    return hf_case(model, tmp_path_factory.mktemp("cohere_qk"))


def cohere_to_gguf(model, path) -> str:
    """Write a CohereForCausalLM as llama.cpp's converter does (``CommandR2Model``, arch
    ``command-r``): the tensors under llama.cpp's names with HF's row order (no q/k
    permutation: both rotate adjacent pairs), q/k norms as ``[n_head, head_dim]``, no
    output.weight (tied), ``logit_scale`` and ``rope.scaling.type`` none in the metadata."""
    import gguf

    cfg, sd = model.config, hf_state(model)
    w = gguf_writer(path, "command-r", cfg)
    w.add_rope_freq_base(float(cfg.rope_parameters["rope_theta"]))
    w.add_layer_norm_eps(cfg.layer_norm_eps)
    w.add_logit_scale(cfg.logit_scale)
    w.add_rope_scaling_type(gguf.RopeScalingType.NONE)
    w.add_file_type(gguf.LlamaFileType.ALL_F32)
    _add_tokenizer(w, cfg.vocab_size)
    names = {"input_layernorm": "attn_norm", "self_attn.q_proj": "attn_q",
             "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v",
             "self_attn.o_proj": "attn_output", "self_attn.q_norm": "attn_q_norm",
             "self_attn.k_norm": "attn_k_norm", "mlp.gate_proj": "ffn_gate",
             "mlp.up_proj": "ffn_up", "mlp.down_proj": "ffn_down"}
    t = {"token_embd.weight": sd["model.embed_tokens.weight"]}
    for i in range(cfg.num_hidden_layers):
        for src, dst in names.items():
            if f"model.layers.{i}.{src}.weight" in sd:
                t[f"blk.{i}.{dst}.weight"] = sd[f"model.layers.{i}.{src}.weight"]
    t["output_norm.weight"] = sd["model.norm.weight"]
    assert "lm_head.weight" not in sd or cfg.tie_word_embeddings
    _write(w, t)
    return str(path)


def test_cohere_config_from_hf(cohere):
    _, path, _, _ = cohere
    spec, meta, got = hf_params("cohere", path)
    want = {"dim": 256, "n_layers": 2, "n_heads": 4, "n_kv_heads": 2, "ffn_dim": 512,
            "vocab": 96, "context": 64, "logit_scale": 0.5, "rope_type": "none",
            "use_qk_norm": False}
    assert {k: got.get(k) for k in want} == want
    assert got["rope_theta"] == 10000.0 and got["norm_eps"] == pytest.approx(1e-5)
    assert not any(k.startswith("lm_head") for k in md.load_weights(path).keys())   # tied


def test_cohere_prefill_and_decode_match_hf(cohere, ours):
    _, _, ids, ref = cohere
    assert_logits_match("cohere", ours, ids, ref)


def test_cohere_greedy_generate_matches_hf(cohere, ours):
    assert_greedy_matches_hf(cohere[0], ours, PROMPTS, N_NEW)


def test_cohere_qk_norm_matches_hf(cohere_qk):
    """Command-R+'s per-head q/k LayerNorm (gain [heads, head_dim]) from the checkpoint's
    q_norm / k_norm weights; zeroing them (the absent fill, norm off) changes the logits."""
    _, path, ids, ref = cohere_qk
    assert_logits_match("cohere qk-norm", tiny_model("cohere", path), ids, ref)
    td = md.load_weights(path)
    for name in list(td.keys()):
        if name.endswith(("q_norm.weight", "k_norm.weight")):
            del td[name]
    pre, dec = compare(md.load_model(spec_path("cohere"), td, variant="tiny"), ref, ids)
    assert pre > 10 * TOL and dec > 10 * TOL


def test_cohere_logit_scale_matters(cohere):
    """Negative control: logit_scale read as 1 gives other logits."""
    _, path, ids, ref = cohere
    spec = with_hf_config(md.load_spec(spec_path("cohere")), logit_scale=1.0)
    pre, dec = compare(md.load_model(spec, path, variant="tiny"), ref, ids)
    assert pre > 10 * TOL and dec > 10 * TOL


def test_cohere_rope_style_matters(cohere, tmp_path):
    """Negative control: the same spec rotating halves (``neox``, Llama's HF style)
    gives other logits, so the match needs the interleaved ``normal`` style."""
    _, path, ids, ref = cohere
    text = open(spec_path("cohere")).read()
    assert text.count("style: normal") == 2
    neox = tmp_path / "cohere_neox.yaml"
    neox.write_text(text.replace("style: normal", "style: neox"))
    pre, dec = compare(md.load_model(str(neox), path, variant="tiny"), ref, ids)
    assert pre > 10 * TOL and dec > 10 * TOL


def test_cohere_refuses_what_it_does_not_model(cohere):
    from maxdecl.pipelines.model_loading import params_from_metadata

    spec = md.load_spec(spec_path("cohere"))
    base = {"maxdecl.format": "hf", "hidden_act": "silu"}
    with pytest.raises(md.WeightsError, match="RoPE scaling linear is not modelled"):
        params_from_metadata(spec, {**base, "rope_parameters": {"rope_type": "linear",
                                                                  "rope_theta": 1e4}})
    with pytest.raises(md.WeightsError, match="attention biases"):
        params_from_metadata(spec, {**base, "attention_bias": True})
    with pytest.raises(md.WeightsError, match="hidden_act gelu"):
        params_from_metadata(spec, {**base, "hidden_act": "gelu"})
    # transformers < 5: rope_theta at the top level, no rope_scaling
    got = params_from_metadata(spec, {**base, "rope_theta": 8e6, "rope_scaling": None})
    assert got["rope_theta"] == 8e6 and got["rope_type"] == "none"
    with pytest.raises(md.WeightsError, match="RoPE scaling yarn"):
        params_from_metadata(spec, {"maxdecl.format": "gguf", "general.architecture": "command-r",
                                    "command-r.rope.scaling.type": "yarn"})


@pytest.fixture(scope="module")
def cohere_gguf(cohere, tmp_path_factory):
    return cohere_to_gguf(cohere[0], tmp_path_factory.mktemp("cohere_gguf") / "tiny-cohere.gguf")


def test_cohere_gguf_matches_hf(cohere, cohere_gguf):
    """The same weights as llama.cpp's converter writes them: params from the command-r.*
    keys (logit_scale included), the tied output from token_embd.weight."""
    _, _, ids, ref = cohere
    got = hf_params("cohere", cohere_gguf)[2]
    assert got["logit_scale"] == 0.5 and got["n_kv_heads"] == 2 and got["vocab"] == 96
    assert got["rope_theta"] == 10000.0 and got["norm_eps"] == pytest.approx(1e-5)
    pre, dec = compare(md.load_model(spec_path("cohere"), cohere_gguf, variant="tiny"), ref, ids)
    assert pre <= TOL and dec <= TOL


def test_cohere_qk_norm_gguf_matches_hf(cohere_qk, tmp_path):
    model, _, ids, ref = cohere_qk
    path = cohere_to_gguf(model, tmp_path / "tiny-cohere-qk.gguf")
    pre, dec = compare(md.load_model(spec_path("cohere"), path, variant="tiny"), ref, ids)
    assert pre <= TOL and dec <= TOL


@pytest.mark.parametrize("case", ["cohere", "cohere_qk"])
def test_llama_cpp_runs_the_gguf_as_hf(case, request, tmp_path):
    """llama.cpp itself on the converter-style GGUF gives HF's logits (so the GGUF
    layout above is llama.cpp's, not just ours)."""
    llama_cpp = pytest.importorskip("llama_cpp")
    model, _, ids, ref = request.getfixturevalue(case)
    path = cohere_to_gguf(model, tmp_path / f"{case}.gguf")
    got = llama_cpp_logits(llama_cpp, path, ids)
    assert rel_err(got, ref) <= TOL
    assert rel_err(got[:N_PROMPT], ref[:N_PROMPT]) <= TOL
