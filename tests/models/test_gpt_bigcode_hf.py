"""specs/gpt_bigcode.yaml against transformers' GPTBigCodeForCausalLM (and llama.cpp).

A small seeded float32 GPT-BigCode (StarCoder 1 / SantaCoder layout): learned position
embeddings (a 64-row table), LayerNorm with bias, multi-query attention (4 query heads,
one shared k/v head) from one fused c_attn [q | k | v] with bias, a GELU-tanh MLP with
biases, and the output tied to wte. multi_query false (per-head [q_h | k_h | v_h] rows in
c_attn) loads through the spec's regroup_rows transform. The GGUF is written as
llama.cpp's convert_hf_to_gguf.py StarCoderModel writes it (arch ``starcoder``).
"""

import json
import shutil

import numpy as np
import pytest

import maxdecl as md

from modelhelp import (TOL, _add_tokenizer, _write, assert_greedy_matches_hf, assert_logits_match,
                       compare, hf_case, hf_logits, hf_params, hf_state, llama_cpp_logits,
                       randomize, rel_err, save_hf, spec_path, tiny_model, token_ids,
                       without_hf_transforms)

pytest.importorskip("torch")
pytest.importorskip("transformers")

PROMPTS = [[3, 17, 42, 99, 5, 7, 64, 1], [8, 9, 120], [5, 60, 33, 2, 90, 11, 7]]
N_NEW = 6
TOL_LLAMA_CPP = 5e-3        # of max|ref|: llama.cpp keeps its KV cache in f16
SPEC = spec_path("gpt_bigcode")


def make_bigcode(seed=0, **kw):
    """GPTBigCodeForCausalLM: n_embd 256, 2 layers, 4 heads, multi_query, vocab 256.

    wte is scaled to 0.1 * N(0, 1) (the output is tied to it: otherwise each token's own
    embedding dominates the logits) and wpe drawn from N(0, 1) (randomize's 1 / fan_in
    would make positions all but vanish): so greedy decoding does not repeat one token
    and the position table matters."""
    import torch
    import transformers

    torch.manual_seed(seed)
    cfg = dict(vocab_size=256, n_embd=256, n_layer=2, n_head=4, n_positions=64,
               multi_query=True, activation_function="gelu_pytorch_tanh",
               layer_norm_epsilon=1e-5, bos_token_id=0, eos_token_id=0,
               attn_implementation="eager")
    cfg.update(kw)
    model = randomize(transformers.GPTBigCodeForCausalLM(transformers.GPTBigCodeConfig(**cfg)),
                      seed)
    gen = torch.Generator().manual_seed(seed + 5)
    with torch.no_grad():
        model.transformer.wte.weight.mul_(0.1)
        wpe = model.transformer.wpe.weight
        wpe.copy_(torch.randn(wpe.shape, generator=gen))
    return model


@pytest.fixture(scope="module")
def bigcode(tmp_path_factory):
    model = make_bigcode()
    assert model.config.multi_query and model.lm_head.weight is model.transformer.wte.weight
    return hf_case(model, tmp_path_factory.mktemp("gpt_bigcode_hf"))


@pytest.fixture(scope="module")
def ours(bigcode):
    return tiny_model("gpt_bigcode", bigcode[1])


def test_gpt_bigcode_config_from_hf(bigcode):
    model, path, _, _ = bigcode
    got = hf_params("gpt_bigcode", path)[2]
    assert (got["dim"], got["n_layers"], got["n_heads"], got["vocab"]) == (256, 2, 4, 256)
    assert got["n_kv_heads"] == 1                   # multi_query
    assert got["ffn_dim"] == 4 * 256                # n_inner is null: 4 * n_embd
    assert got["context"] == 64                     # n_positions
    assert got["norm_eps"] == pytest.approx(1e-5)
    assert got["hidden_act"] == "gelu_pytorch_tanh" and got["scale_attn_weights"] is True


def test_gpt_bigcode_prefill_and_decode_match_hf(bigcode, ours):
    model, path, ids, ref = bigcode
    assert_logits_match("gpt_bigcode", ours, ids, ref)


def test_gpt_bigcode_greedy_generate_matches_hf(bigcode, ours):
    assert_greedy_matches_hf(bigcode[0], ours, PROMPTS, N_NEW)


def test_gpt_bigcode_stops_at_the_position_table(ours):
    with pytest.raises(md.InputError, match="context of 64"):
        ours.generate(list(range(60)), 8, temperature=0)


def test_gpt_bigcode_multi_head_layout(tmp_path):
    """multi_query false: c_attn rows per head [q_h | k_h | v_h], regrouped to q | k | v;
    without the transform the logits are far off. Also no scaling (scale_attn_weights
    false) and the exact GELU, both read from config.json."""
    model = make_bigcode(seed=1, multi_query=False, scale_attn_weights=False,
                         activation_function="gelu")
    path = save_hf(model, tmp_path / "mha")
    ids = token_ids(model.config.vocab_size)
    ref = hf_logits(model, ids)
    got = hf_params("gpt_bigcode", path)[2]
    assert got["n_kv_heads"] == 4 and got["hidden_act"] == "gelu"
    assert got["scale_attn_weights"] is False
    pre, dec = compare(md.load_model(SPEC, path, variant="tiny"), ref, ids)
    print(f"gpt_bigcode MHA vs HF: prefill {pre:.2e}, decode {dec:.2e}")
    assert pre <= TOL and dec <= TOL
    spec = without_hf_transforms(md.load_spec(SPEC))
    pre, dec = compare(md.load_model(spec, path, variant="tiny"), ref, ids)
    assert pre > 10 * TOL and dec > 10 * TOL


def test_gpt_bigcode_cross_attention_is_refused(bigcode, tmp_path):
    _, path, _, _ = bigcode
    dst = tmp_path / "xattn"
    shutil.copytree(path, dst)
    cfg = json.loads((dst / "config.json").read_text())
    cfg["add_cross_attention"] = True
    (dst / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(md.WeightsError, match="cross-attention"):
        md.load_model(SPEC, str(dst), variant="tiny")


def bigcode_to_gguf(model, path) -> str:
    """Write a GPTBigCodeForCausalLM as convert_hf_to_gguf.py's StarCoderModel does:
    arch ``starcoder``; context_length n_positions, embedding_length n_embd,
    feed_forward_length 4 * n_embd, block_count, head_count n_head, head_count_kv 1,
    layer_norm_epsilon; every tensor renamed by gguf-py's tensor map for STARCODER and
    otherwise kept as it is (nn.Linear [out, in], c_attn rows q | k | v); no
    output.weight, since a tied checkpoint holds no lm_head.weight."""
    import gguf

    cfg = model.config
    sd = {k: v for k, v in hf_state(model).items() if k != "lm_head.weight"}
    w = gguf.GGUFWriter(str(path), gguf.MODEL_ARCH_NAMES[gguf.MODEL_ARCH.STARCODER])
    w.add_context_length(cfg.n_positions)
    w.add_embedding_length(cfg.n_embd)
    w.add_feed_forward_length(4 * cfg.n_embd)
    w.add_block_count(cfg.n_layer)
    w.add_head_count(cfg.n_head)
    w.add_head_count_kv(1)
    w.add_layer_norm_eps(cfg.layer_norm_epsilon)
    w.add_file_type(gguf.LlamaFileType.ALL_F32)
    _add_tokenizer(w, cfg.vocab_size)
    tmap = gguf.get_tensor_name_map(gguf.MODEL_ARCH.STARCODER, cfg.n_layer)
    t = {}
    for name, x in sd.items():
        new = tmap.get_name(name, try_suffixes=(".weight", ".bias"))
        assert new is not None, name
        t[new] = x
    _write(w, t)
    return str(path)


@pytest.fixture(scope="module")
def gguf_case(bigcode, tmp_path_factory):
    model = bigcode[0]
    return bigcode_to_gguf(model, tmp_path_factory.mktemp("gpt_bigcode_gguf") / "tiny.gguf")


def test_gpt_bigcode_gguf_matches_hf(bigcode, gguf_case):
    """The converter's GGUF (starcoder.* keys, no output.weight) loads with the HF logits."""
    model, _, ids, ref = bigcode
    td = md.load_weights(gguf_case)
    assert "output.weight" not in td.keys() and "blk.0.attn_qkv.weight" in td.keys()
    got = hf_params("gpt_bigcode", gguf_case)[2]
    assert (got["context"], got["ffn_dim"], got["n_heads"], got["n_kv_heads"],
            got["vocab"]) == (64, 1024, 4, 1, 256)
    ours = md.load_model(SPEC, gguf_case, variant="tiny")
    pre, dec = compare(ours, ref, ids)
    print(f"gpt_bigcode GGUF vs HF: prefill {pre:.2e}, decode {dec:.2e}")
    assert pre <= TOL and dec <= TOL


def test_gpt_bigcode_llama_cpp_runs_the_gguf(bigcode, gguf_case):
    """llama.cpp itself (llama-cpp-python) runs the same GGUF with the HF logits, and
    maxdecl's logits of that GGUF match llama.cpp's."""
    llama_cpp = pytest.importorskip("llama_cpp")
    model, _, ids, ref = bigcode
    theirs = llama_cpp_logits(llama_cpp, gguf_case, ids)
    ours = np.asarray(md.load_model(SPEC, gguf_case, variant="tiny").logits(ids))
    scale = float(np.abs(ref).max())
    print(f"llama.cpp vs HF {rel_err(theirs, ref):.2e}, maxdecl vs llama.cpp "
          f"{rel_err(ours, theirs):.2e}, maxdecl vs HF {rel_err(ours, ref):.2e}")
    assert np.abs(theirs - ref).max() <= TOL_LLAMA_CPP * scale
    assert np.abs(ours - theirs).max() <= TOL_LLAMA_CPP * scale
    assert np.abs(ours - ref).max() <= 1e-5 * scale
