"""specs/gpt2.yaml against transformers' GPT2LMHeadModel.

A small seeded float32 GPT-2: learned position embeddings (a 64-row table),
LayerNorm with bias, the fused c_attn projection, gelu_new (tanh) MLP, biases on
every projection and the output tied to wte. HF keeps its projections as Conv1D
weights [in, out]: the spec's hf transforms transpose them.
"""

import numpy as np
import pytest

import maxdecl as md

from modelhelp import (TOL, _add_tokenizer, _write, assert_greedy_matches_hf, assert_logits_match,
                       compare, hf_case, hf_params, hf_state, randomize, save_hf, spec_path,
                       tiny_model)

pytest.importorskip("torch")
pytest.importorskip("transformers")

PROMPTS = [[3, 17, 42, 99, 5, 7, 64, 1], [8, 9, 120], [5, 60, 33, 2, 90, 11, 7]]
N_NEW = 6


def make_gpt2(seed=0, **kw):
    """GPT2LMHeadModel: dim 64, 2 layers, 4 heads, 64 positions, tied output.

    wte is scaled to 0.1 * N(0, 1) and the biases drawn from 0.1 * N(0, 1) (not
    randomize's 1 + 0.2 N(0, 1)): otherwise ln_f's bias and each token's own embedding
    dominate the tied logits and greedy decoding repeats one token."""
    import torch
    import transformers

    torch.manual_seed(seed)
    cfg = dict(vocab_size=128, n_embd=64, n_layer=2, n_head=4, n_positions=64,
               layer_norm_epsilon=1e-5, bos_token_id=0, eos_token_id=0,
               attn_implementation="eager")
    cfg.update(kw)
    model = randomize(transformers.GPT2LMHeadModel(transformers.GPT2Config(**cfg)), seed)
    gen = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        model.transformer.wte.weight.mul_(0.1)
        for name, p in sorted(model.named_parameters()):
            if name.endswith(".bias"):
                p.copy_(0.1 * torch.randn(p.shape, generator=gen))
    return model


@pytest.fixture(scope="module")
def gpt2(tmp_path_factory):
    model = make_gpt2()
    return hf_case(model, tmp_path_factory.mktemp("gpt2_hf"))


@pytest.fixture(scope="module")
def ours(gpt2):
    return tiny_model("gpt2", gpt2[1])


def test_gpt2_config_from_hf(gpt2):
    model, path, _, _ = gpt2
    got = hf_params("gpt2", path)[2]
    assert (got["dim"], got["n_layers"], got["n_heads"], got["vocab"]) == (64, 2, 4, 128)
    assert got["ffn_dim"] == 4 * 64                 # n_inner is null: 4 * n_embd
    assert got["context"] == 64                     # n_positions: the position table's rows
    assert got["norm_eps"] == pytest.approx(1e-5)


def test_gpt2_prefill_and_decode_match_hf(gpt2, ours):
    model, path, ids, ref = gpt2
    assert_logits_match("gpt2", ours, ids, ref)


def test_gpt2_greedy_generate_matches_hf(gpt2, ours):
    assert_greedy_matches_hf(gpt2[0], ours, PROMPTS, N_NEW)


def test_gpt2_stops_at_the_position_table(ours):
    """Learned positions end at n_positions: a prompt plus new tokens past it is an
    InputError (not an index past the table)."""
    with pytest.raises(md.InputError, match="context of 64"):
        ours.generate(list(range(60)), 8, temperature=0)


def test_gpt2_base_model_names_match_hf(gpt2, tmp_path):
    """A GPT2Model checkpoint (names without transformer., no lm_head) loads too."""
    model, _, ids, ref = gpt2
    path = save_hf(model.transformer, tmp_path / "base")
    keys = set(md.load_weights(path).keys())
    assert "wte.weight" in keys and not any(k.startswith("transformer.") for k in keys)
    ours = md.load_model(spec_path("gpt2"), path, variant="tiny")
    pre, dec = compare(ours, ref, ids)
    assert pre <= TOL and dec <= TOL


def test_gpt2_checkpoint_with_mask_buffers_loads(gpt2):
    """Older GPT-2 checkpoints also store each layer's causal-mask buffers
    (attn.bias, attn.masked_bias): the spec's null mappings drop them."""
    model, path, ids, ref = gpt2
    td = md.load_weights(path)
    for i in range(2):
        td[f"transformer.h.{i}.attn.bias"] = np.tril(np.ones((1, 1, 64, 64), np.float32))
        td[f"transformer.h.{i}.attn.masked_bias"] = np.array(-1e4, np.float32)
    ours = md.load_model(spec_path("gpt2"), td, variant="tiny")
    pre, dec = compare(ours, ref, ids)
    assert pre <= TOL and dec <= TOL


def test_gpt2_conv1d_transpose_matters(gpt2):
    """Negative control: c_proj is square, so without its transpose the weights still
    fit but the logits are far off."""
    model, path, ids, ref = gpt2
    td = md.load_weights(path)
    for i in range(2):
        name = f"transformer.h.{i}.attn.c_proj.weight"
        td[name] = np.ascontiguousarray(np.asarray(td[name]).T)
    ours = md.load_model(spec_path("gpt2"), td, variant="tiny")
    pre, dec = compare(ours, ref, ids)
    assert pre > 10 * TOL and dec > 10 * TOL


def gpt2_to_gguf(model, path) -> str:
    """Write a GPT2LMHeadModel as llama.cpp's converter does (arch ``gpt2``): Conv1D
    weights transposed to [out, in], output.weight a copy of the embedding."""
    import gguf

    cfg, sd = model.config, hf_state(model)
    w = gguf.GGUFWriter(str(path), "gpt2")
    w.add_context_length(cfg.n_positions)
    w.add_embedding_length(cfg.n_embd)
    w.add_feed_forward_length(4 * cfg.n_embd)
    w.add_block_count(cfg.n_layer)
    w.add_head_count(cfg.n_head)
    w.add_layer_norm_eps(cfg.layer_norm_epsilon)
    w.add_file_type(gguf.LlamaFileType.ALL_F32)
    _add_tokenizer(w, cfg.vocab_size)
    names = {"ln_1": "attn_norm", "attn.c_attn": "attn_qkv", "attn.c_proj": "attn_output",
             "ln_2": "ffn_norm", "mlp.c_fc": "ffn_up", "mlp.c_proj": "ffn_down"}
    t = {"token_embd.weight": sd["transformer.wte.weight"],
         "position_embd.weight": sd["transformer.wpe.weight"]}
    for i in range(cfg.n_layer):
        for src, dst in names.items():
            x = sd[f"transformer.h.{i}.{src}.weight"]
            t[f"blk.{i}.{dst}.weight"] = x.T if "ln_" not in src else x
            t[f"blk.{i}.{dst}.bias"] = sd[f"transformer.h.{i}.{src}.bias"]
    t["output_norm.weight"] = sd["transformer.ln_f.weight"]
    t["output_norm.bias"] = sd["transformer.ln_f.bias"]
    t["output.weight"] = sd["transformer.wte.weight"]
    _write(w, t)
    return str(path)


def test_gpt2_gguf_matches_hf(gpt2, tmp_path):
    """The same weights as a llama.cpp-style GGUF (gpt2.* keys, [out, in] weights)."""
    model, _, ids, ref = gpt2
    path = gpt2_to_gguf(model, tmp_path / "tiny-gpt2.gguf")
    got = hf_params("gpt2", path)[2]
    assert (got["context"], got["ffn_dim"], got["n_heads"], got["vocab"]) == (64, 256, 4, 128)
    ours = md.load_model(spec_path("gpt2"), path, variant="tiny")
    pre, dec = compare(ours, ref, ids)
    assert pre <= TOL and dec <= TOL
