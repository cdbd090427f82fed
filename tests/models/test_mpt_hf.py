"""specs/replit.yaml against transformers' MptForCausalLM.

MPT as transformers implements it: ALiBi (alibi_bias_max 8) instead of position
embeddings, LayerNorm without bias, a fused Wqkv projection (no grouped-query
attention in transformers' MPT: kv heads = heads), a GELU MLP (expansion 4) and
the output tied to the token embedding. 12 heads (not a power of two) exercise
MPT's interleaved slopes for the extra heads.
"""

import pytest

import maxdecl as md
from maxdecl.pipelines.model_loading import params_from_metadata

from modelhelp import TOL, compare, hf_case, make_mpt, spec_path

pytest.importorskip("torch")
pytest.importorskip("transformers")


@pytest.fixture(scope="module")
def mpt(tmp_path_factory):
    model = make_mpt()
    return hf_case(model, tmp_path_factory.mktemp("mpt_hf"))


def test_replit_config_from_hf(mpt):
    model, path, _, _ = mpt
    got = params_from_metadata(md.load_spec(spec_path("replit")), md.load_weights(path).metadata)
    assert got["dim"] == 768 and got["n_heads"] == 12 and got["n_layers"] == 2
    assert got["n_kv_heads"] == 12                # no kv_n_heads in transformers' MptConfig
    assert got["ffn_dim"] == 4 * 768
    assert got["alibi_bias_max"] == 8
    assert got["vocab"] == 64


def test_replit_kv_heads_from_attn_config():
    """replit's own config.json carries attn_config.kv_n_heads (grouped-query)."""
    meta = {"maxdecl.format": "hf", "d_model": 3072, "n_heads": 24, "n_layers": 32,
            "expansion_ratio": 4, "vocab_size": 32768, "max_seq_len": 4096,
            "attn_config": {"kv_n_heads": 8, "alibi_bias_max": 8}}
    got = params_from_metadata(md.load_spec(spec_path("replit")), meta)
    assert got["n_kv_heads"] == 8 and got["n_heads"] == 24 and got["ffn_dim"] == 12288


def test_replit_prefill_and_decode_match_hf(mpt):
    model, path, ids, ref = mpt
    ours = md.load_model(spec_path("replit"), path, variant="tiny")
    pre, dec = compare(ours, ref, ids)
    print(f"replit/MPT vs HF: prefill {pre:.2e}, decode {dec:.2e} (of max|ref|)")
    assert pre <= TOL and dec <= TOL


def test_replit_alibi_slopes_matter(mpt):
    """Negative control: other ALiBi slopes (bias max 4 instead of 8) give other logits.
    (transformers' MPT always builds its slopes with bias max 8.)"""
    model, path, ids, ref = mpt
    td = md.load_weights(path)
    td.metadata["attn_config"] = {**td.metadata["attn_config"], "alibi_bias_max": 4}
    ours = md.load_model(spec_path("replit"), td, variant="tiny")
    pre, dec = compare(ours, ref, ids)
    assert pre > 10 * TOL and dec > 10 * TOL
