"""specs/ernie4_5_moe.yaml against transformers' Ernie4_5_MoeForCausalLM.

Two small seeded float32 models:

- ``base``: 4 layers, the first two dense (moe_layer_start_index 2), then MoE layers
  with 8 experts (top 2), a random e_score_correction_bias that moves the choice, and 2
  shared experts; no biases, output tied to the embeddings, silu. Its sizes are the
  spec's ``tiny`` variant.
- ``biased``: use_bias (every projection and lm_head), an untied lm_head, no shared
  experts, MoE on every second layer (moe_layer_interval 2), gelu, and an explicit
  head_dim (24) that is not hidden_size / num_attention_heads.

Each is saved with ``save_pretrained`` and loaded through the spec's ``formats.hf``;
prefill logits, KV-cache decode logits and greedy generation (alone and batched) are
compared with transformers.
"""

import json
import shutil

import numpy as np
import pytest

import maxdecl as md

from modelhelp import compare, hf_case, hf_params, randomize, spec_path

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

TOL = 1e-5          # max|ours - ref| <= TOL * max|ref| (measured: about 1e-6)
N_NEW = 6
PROMPTS = [[3, 17, 42, 99, 5, 7, 64, 1], [8, 9, 120], [5, 60, 33, 2, 90, 11, 7, 200, 31]]

BASE = dict(vocab_size=256, hidden_size=64, intermediate_size=96, num_hidden_layers=4,
            num_attention_heads=4, num_key_value_heads=2, moe_intermediate_size=32,
            moe_k=2, moe_num_experts=8, moe_num_shared_experts=2, moe_layer_start_index=2,
            moe_layer_interval=1, max_position_embeddings=64, rms_norm_eps=1e-5,
            tie_word_embeddings=True, use_bias=False, hidden_act="silu",
            attn_implementation="eager")
BIASED = dict(BASE, use_bias=True, tie_word_embeddings=False, moe_num_shared_experts=0,
              moe_layer_start_index=1, moe_layer_interval=2, hidden_act="gelu", head_dim=24)


def make_ernie(seed=0, **kw):
    """A seeded Ernie4_5_MoeForCausalLM; the correction bias drawn as 0.1 N(0, 1) (of the
    order of the softmax probabilities' spread, so it changes some choices); a tied
    embedding scaled by 0.1, so greedy decoding does not repeat each token's own id."""
    torch.manual_seed(seed)
    cfg = dict(BASE)
    cfg.update(kw)
    model = randomize(transformers.Ernie4_5_MoeForCausalLM(transformers.Ernie4_5_MoeConfig(**cfg)),
                      seed)
    gen = torch.Generator().manual_seed(seed + 100)
    with torch.no_grad():
        if cfg["tie_word_embeddings"]:
            model.model.embed_tokens.weight.mul_(0.1)
        for layer in model.model.layers:
            gate = getattr(layer.mlp, "gate", None)
            if hasattr(gate, "moe_statics"):
                b = gate.moe_statics.e_score_correction_bias
                b.copy_(0.1 * torch.randn(b.shape, generator=gen))
    return model


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    return hf_case(make_ernie(seed=0), tmp_path_factory.mktemp("ernie45moe_base"))


@pytest.fixture(scope="module")
def biased(tmp_path_factory):
    return hf_case(make_ernie(seed=1, **BIASED), tmp_path_factory.mktemp("ernie45moe_biased"))


@pytest.fixture(scope="module")
def ours_base(base):
    return md.load_model(spec_path("ernie4_5_moe"), base[1], variant="tiny")


@pytest.fixture(scope="module")
def ours_biased(biased):
    return md.load_model(spec_path("ernie4_5_moe"), biased[1], variant="tiny")


def assert_close(name, ours, case):
    _, _, ids, ref = case
    pre, dec = compare(ours, ref, ids)
    print(f"{name}: prefill {pre:.2e}, decode {dec:.2e} of max|ref| {np.abs(ref).max():.2f}")
    assert pre <= TOL and dec <= TOL


def assert_greedy(hf_model, ours, prompts=PROMPTS, n_new=N_NEW):
    want = []
    for p in prompts:
        out = hf_model.generate(torch.tensor([p]), max_new_tokens=n_new, do_sample=False,
                                eos_token_id=None, pad_token_id=0)
        want.append(out[0, len(p):].tolist())
    assert len(set(want[0])) > 1                   # not one token repeated
    assert ours.generate(prompts[0], n_new, temperature=0).ids == want[0]
    assert [o.ids for o in ours.generate(prompts, n_new, temperature=0)] == want   # batched


# -- config ------------------------------------------------------------------------------

def test_ernie_config_from_hf(base, biased):
    got = hf_params("ernie4_5_moe", base[1])[2]
    assert (got["dim"], got["n_layers"], got["n_heads"], got["n_kv_heads"]) == (64, 4, 4, 2)
    assert (got["head_dim"], got["ffn_dim"], got["moe_ffn_dim"]) == (16, 96, 32)
    assert (got["n_expert"], got["n_expert_used"], got["n_shared"]) == (8, 2, 2)
    assert (got["moe_start"], got["moe_end"], got["moe_interval"]) == (2, 3, 1)
    assert (got["vocab"], got["context"], got["use_bias"]) == (256, 64, False)
    assert got["rope_theta"] == pytest.approx(500000.0)
    got = hf_params("ernie4_5_moe", biased[1])[2]
    assert (got["head_dim"], got["n_shared"], got["moe_interval"]) == (24, 0, 2)
    assert (got["use_bias"], got["hidden_act"]) == (True, "gelu")


def test_ernie_moe_layers_follow_config(ours_base, ours_biased):
    """transformers' rule: layer i is MoE when (i + 1) % interval == 0 and
    start <= i <= end; the graph's expert_linear nodes sit in exactly those layers."""
    assert ours_base.params["moe_layers"] == [False, False, True, True]
    assert ours_biased.params["moe_layers"] == [False, True, False, True]
    for ours, want in ((ours_base, {2, 3}), (ours_biased, {1, 3})):
        layers = {int(n.layer.split(".")[1]) for n in ours.graph.nodes if n.op == "expert_linear"}
        assert layers == want


def test_ernie_moe_end_index_minus_one(base, tmp_path):
    """config.json's moe_layer_end_index -1 (transformers' default) means the last layer."""
    path = shutil.copytree(base[1], tmp_path / "end_minus_one")
    cfg = json.loads((path / "config.json").read_text())
    cfg["moe_layer_end_index"] = -1
    (path / "config.json").write_text(json.dumps(cfg))
    assert hf_params("ernie4_5_moe", path)[2]["moe_end"] == 3
    del cfg["moe_layer_end_index"]
    (path / "config.json").write_text(json.dumps(cfg))
    assert hf_params("ernie4_5_moe", path)[2]["moe_end"] == 3


# -- logits ------------------------------------------------------------------------------

def test_ernie_prefill_and_decode_match_hf(base, ours_base):
    """Dense layers, then MoE with correction bias and shared experts; tied output."""
    assert_close("ernie4_5_moe base", ours_base, base)


def test_ernie_biased_untied_no_shared_match_hf(biased, ours_biased):
    """use_bias everywhere, untied lm_head (with bias), no shared experts, interval 2, gelu,
    head_dim 24."""
    assert_close("ernie4_5_moe biased", ours_biased, biased)


def test_ernie_greedy_generate_matches_hf(base, ours_base):
    assert_greedy(base[0], ours_base)


def test_ernie_biased_greedy_generate_matches_hf(biased, ours_biased):
    assert_greedy(biased[0], ours_biased)


# -- weight layouts and negative controls -------------------------------------------------

def test_ernie_fused_state_dict_matches_hf(base, tmp_path):
    """transformers 5's in-memory names (experts.gate_up_proj [E, 2F, D], gate.moe_statics)
    as a torch state_dict saved to one file, without config.json: the tiny variant gives
    the sizes."""
    from safetensors.torch import save_file

    model, _, ids, ref = base
    sd = {k: v.contiguous() for k, v in model.state_dict().items() if k != "lm_head.weight"}
    assert "model.layers.2.mlp.experts.gate_up_proj" in sd
    assert "model.layers.2.mlp.gate.moe_statics.e_score_correction_bias" in sd
    save_file(sd, str(tmp_path / "model.safetensors"))
    ours = md.load_model(spec_path("ernie4_5_moe"), str(tmp_path / "model.safetensors"),
                         variant="tiny")
    pre, dec = compare(ours, ref, ids)
    assert pre <= TOL and dec <= TOL


def test_ernie_correction_bias_matters(base):
    """Negative control: the correction bias zeroed (routing on the probabilities alone)
    changes the chosen experts, and the logits are far off."""
    model, path, ids, ref = base
    td = md.load_weights(path)
    names = [k for k in td.keys() if k.endswith("moe_statics.e_score_correction_bias")]
    assert len(names) == 2
    for k in names:
        td[k] = np.zeros_like(np.asarray(td[k]))
    ours = md.load_model(spec_path("ernie4_5_moe"), td, variant="tiny")
    pre, dec = compare(ours, ref, ids)
    assert pre > 100 * TOL and dec > 100 * TOL


def test_ernie_shared_experts_matter(base):
    """Negative control: without the shared experts' output the logits are far off."""
    model, path, ids, ref = base
    td = md.load_weights(path)
    for i in (2, 3):
        k = f"model.layers.{i}.mlp.shared_experts.down_proj.weight"
        td[k] = np.zeros_like(np.asarray(td[k]))
    ours = md.load_model(spec_path("ernie4_5_moe"), td, variant="tiny")
    pre, _ = compare(ours, ref, ids)
    assert pre > 100 * TOL


def test_ernie_missing_bias_refused(biased):
    """A use_bias checkpoint that lost a bias is refused, not run with zeros."""
    td = md.load_weights(biased[1])
    del td["model.layers.0.self_attn.q_proj.bias"]
    with pytest.raises(md.WeightsError, match=r"missing 1 \(blk\.0\.attn_q\.bias\)"):
        md.load_model(spec_path("ernie4_5_moe"), td, variant="tiny")


@pytest.mark.parametrize("key, value, why", [
    ("moe_num_experts", [8, 8], "per-modality expert settings"),
    ("rope_parameters", {"rope_type": "yarn", "rope_theta": 1e4, "factor": 2.0}, "RoPE scaling yarn"),
])
def test_ernie_unmodelled_configs_refused(base, tmp_path, key, value, why):
    """Configs the spec would run wrongly (ERNIE 4.5 VL's per-modality lists, RoPE
    scaling) are refused when they load."""
    path = shutil.copytree(base[1], tmp_path / key)
    cfg = json.loads((path / "config.json").read_text())
    cfg[key] = value
    (path / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(md.WeightsError, match=why):
        md.load_model(spec_path("ernie4_5_moe"), path, variant="tiny")
