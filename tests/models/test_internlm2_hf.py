"""specs/internlm2.yaml against a float32 PyTorch reference of InternLM2.

InternLM2 is not part of transformers (its checkpoints ship the model as remote code,
``modeling_internlm2.py``), so this file carries a small, faithful reference module
(``InternLM2Ref`` below) that follows the published modeling code:

- ``model.tok_embeddings``, ``model.layers.{i}.attention_norm`` / ``ffn_norm`` (RMSNorm),
  ``model.norm``, an untied ``output`` head;
- ``attention.wqkv``: one projection whose rows are laid out
  ``[num_key_value_heads, num_attention_heads // num_key_value_heads + 2, head_dim]``
  (the group's query heads, then its key head, then its value head), as the remote
  code's ``rearrange(qkv, "b q (h gs d) -> b q h gs d", gs=2 + groups)``; ``attention.wo``;
- RoPE rotating halves (``rotate_half``, as HF Llama), grouped-query attention;
- SwiGLU ``feed_forward.w2(silu(w1(x)) * w3(x))``.

The reference itself is checked against transformers' ``LlamaForCausalLM`` holding the
same weights with wqkv de-interleaved into q_proj / k_proj / v_proj.

The checkpoint is saved as Hugging Face does (config.json like internlm2's and
model.safetensors with the real names); the GGUF is written as llama.cpp's converter
(convert_hf_to_gguf.py, InternLM2Model, arch ``internlm2``) writes it: wqkv split into
attn_q / attn_k / attn_v, the q and k rows permuted to adjacent pairs as for Llama.
"""

import json
import os
import subprocess
import sys

import numpy as np
import pytest

import maxdecl as md

from modelhelp import (TOL, _add_tokenizer, _write, assert_logits_match, compare,
                       gguf_writer, hf_params, llama_cpp_logits, llama_cpp_permute, ours_logits,
                       randomize, rel_err, spec_path, tiny_model, token_ids, without_hf_transforms)

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

TOL_LLAMA_CPP = 5e-3        # of max|ref|: llama.cpp keeps its KV cache in f16
N_NEW = 6
PROMPTS = [[3, 17, 42, 90, 5, 7, 64, 1], [8, 9, 95], [5, 60, 33, 2, 300, 11, 7]]

# internlm2's config.json keys, at the test's small sizes
CONFIG = {
    "architectures": ["InternLM2ForCausalLM"],
    "model_type": "internlm2",
    "auto_map": {"AutoConfig": "configuration_internlm2.InternLM2Config",
                 "AutoModelForCausalLM": "modeling_internlm2.InternLM2ForCausalLM"},
    "bias": False,
    "hidden_act": "silu",
    "hidden_size": 256,
    "initializer_range": 0.02,
    "intermediate_size": 512,
    "max_position_embeddings": 128,
    "num_attention_heads": 8,
    "num_hidden_layers": 2,
    "num_key_value_heads": 2,
    "rms_norm_eps": 1e-5,
    "rope_scaling": None,
    "rope_theta": 1000000.0,
    "tie_word_embeddings": False,
    "torch_dtype": "float32",
    "use_cache": True,
    "vocab_size": 320,
    "bos_token_id": 1,
    "eos_token_id": 2,
    "pad_token_id": 2,
}


# -- the reference: InternLM2 as its published modeling_internlm2.py computes it ---------

class Cfg:
    """The config attributes the reference reads (InternLM2Config's names)."""

    def __init__(self, d):
        self.__dict__.update(d)


def _ref_classes():
    nn = torch.nn
    F = torch.nn.functional

    class RMSNorm(nn.Module):                        # InternLM2RMSNorm (= LlamaRMSNorm)
        def __init__(self, dim, eps):
            super().__init__()
            self.weight = nn.Parameter(torch.ones(dim))
            self.eps = eps

        def forward(self, x):
            var = x.pow(2).mean(-1, keepdim=True)
            return self.weight * (x * torch.rsqrt(var + self.eps))

    def rotate_half(x):
        x1, x2 = x[..., : x.shape[-1] // 2], x[..., x.shape[-1] // 2:]
        return torch.cat((-x2, x1), dim=-1)

    def rope_cos_sin(cfg, positions):                # InternLM2RotaryEmbedding (no scaling)
        hd = cfg.hidden_size // cfg.num_attention_heads
        inv_freq = 1.0 / (cfg.rope_theta ** (torch.arange(0, hd, 2).float() / hd))
        freqs = positions.float()[:, None] * inv_freq[None, :]
        emb = torch.cat((freqs, freqs), dim=-1)
        return emb.cos(), emb.sin()                  # [seq, head_dim]

    class Attention(nn.Module):                      # InternLM2Attention, eager
        def __init__(self, cfg):
            super().__init__()
            self.cfg = cfg
            self.nh, self.nkv = cfg.num_attention_heads, cfg.num_key_value_heads
            self.hd = cfg.hidden_size // self.nh
            self.groups = self.nh // self.nkv
            self.wqkv = nn.Linear(cfg.hidden_size, (self.nh + 2 * self.nkv) * self.hd,
                                  bias=cfg.bias)
            self.wo = nn.Linear(self.nh * self.hd, cfg.hidden_size, bias=cfg.bias)

        def forward(self, x, cos, sin):
            b, s, _ = x.shape
            qkv = self.wqkv(x)
            # "b q (h gs d) -> b q h gs d", gs = groups + 2, d = head_dim
            qkv = qkv.view(b, s, self.nkv, self.groups + 2, self.hd)
            q = qkv[..., : self.groups, :].reshape(b, s, self.nh, self.hd)
            k = qkv[..., -2, :]
            v = qkv[..., -1, :]
            q, k, v = (t.transpose(1, 2) for t in (q, k, v))      # [b, heads, s, d]
            q = q * cos + rotate_half(q) * sin
            k = k * cos + rotate_half(k) * sin
            k = k.repeat_interleave(self.groups, dim=1)           # repeat_kv
            v = v.repeat_interleave(self.groups, dim=1)
            w = q @ k.transpose(2, 3) / self.hd ** 0.5
            mask = torch.full((s, s), float("-inf")).triu(1)
            w = F.softmax(w + mask, dim=-1, dtype=torch.float32)
            a = (w @ v).transpose(1, 2).reshape(b, s, self.nh * self.hd)
            return self.wo(a)

    class MLP(nn.Module):                            # InternLM2MLP
        def __init__(self, cfg):
            super().__init__()
            self.w1 = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
            self.w3 = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
            self.w2 = nn.Linear(cfg.intermediate_size, cfg.hidden_size, bias=False)

        def forward(self, x):
            return self.w2(F.silu(self.w1(x)) * self.w3(x))

    class Layer(nn.Module):                          # InternLM2DecoderLayer
        def __init__(self, cfg):
            super().__init__()
            self.attention = Attention(cfg)
            self.feed_forward = MLP(cfg)
            self.attention_norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
            self.ffn_norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)

        def forward(self, x, cos, sin):
            x = x + self.attention(self.attention_norm(x), cos, sin)
            return x + self.feed_forward(self.ffn_norm(x))

    class Model(nn.Module):                          # InternLM2Model
        def __init__(self, cfg):
            super().__init__()
            self.tok_embeddings = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
            self.layers = nn.ModuleList(Layer(cfg) for _ in range(cfg.num_hidden_layers))
            self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)

    class ForCausalLM(nn.Module):                    # InternLM2ForCausalLM
        def __init__(self, cfg):
            super().__init__()
            self.config = cfg
            self.model = Model(cfg)
            self.output = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)

        def forward(self, ids):                      # ids [b, s] -> logits [b, s, vocab]
            cos, sin = rope_cos_sin(self.config, torch.arange(ids.shape[1]))
            x = self.model.tok_embeddings(ids)
            for layer in self.model.layers:
                x = layer(x, cos, sin)
            return self.output(self.model.norm(x))

    return ForCausalLM


def make_internlm2(seed=0, **kw):
    torch.manual_seed(seed)
    cfg = Cfg({**CONFIG, **kw})
    return randomize(_ref_classes()(cfg), seed)


def ref_logits(model, ids) -> np.ndarray:
    with torch.no_grad():
        return model(torch.tensor([list(ids)]))[0].float().numpy()


def ref_greedy(model, prompt, n_new) -> list[int]:
    ids = list(prompt)
    for _ in range(n_new):
        ids.append(int(np.argmax(ref_logits(model, ids)[-1])))
    return ids[len(prompt):]


def split_wqkv(w, cfg):
    """wqkv [nkv * (g + 2) * hd, dim] -> q [nh * hd, dim], k, v [nkv * hd, dim]."""
    nh, nkv, d = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.hidden_size
    hd, g = d // nh, nh // nkv
    qkv = w.reshape(nkv, g + 2, hd, d)
    return (qkv[:, :g].reshape(nh * hd, d), qkv[:, -2].reshape(nkv * hd, d),
            qkv[:, -1].reshape(nkv * hd, d))


def state(model) -> dict:
    return {k: v.detach().float().numpy().copy() for k, v in model.state_dict().items()}


def save_checkpoint(model, folder) -> str:
    """config.json + model.safetensors with InternLM2's tensor names."""
    from safetensors.numpy import save_file

    os.makedirs(folder, exist_ok=True)
    with open(os.path.join(folder, "config.json"), "w") as f:
        json.dump(vars(model.config), f, indent=2)
    save_file(state(model), os.path.join(folder, "model.safetensors"))
    return os.fspath(folder)


# -- fixtures ----------------------------------------------------------------------------

@pytest.fixture(scope="module")
def case(tmp_path_factory):
    model = make_internlm2()
    path = save_checkpoint(model, tmp_path_factory.mktemp("internlm2"))
    ids = token_ids(model.config.vocab_size)
    return model, path, ids, ref_logits(model, ids)


@pytest.fixture(scope="module")
def ours(case):
    return tiny_model("internlm2", case[1])


# -- the reference is right --------------------------------------------------------------

def test_reference_matches_transformers_llama(case):
    """The reference equals transformers' LlamaForCausalLM holding the same weights, wqkv
    de-interleaved into q_proj / k_proj / v_proj (InternLM2 is Llama with fused qkv)."""
    import transformers

    model, _, ids, ref = case
    c = model.config
    llama = transformers.LlamaForCausalLM(transformers.LlamaConfig(
        vocab_size=c.vocab_size, hidden_size=c.hidden_size, intermediate_size=c.intermediate_size,
        num_hidden_layers=c.num_hidden_layers, num_attention_heads=c.num_attention_heads,
        num_key_value_heads=c.num_key_value_heads, rms_norm_eps=c.rms_norm_eps,
        max_position_embeddings=c.max_position_embeddings, rope_theta=c.rope_theta,
        tie_word_embeddings=False, attention_bias=False, mlp_bias=False,
        attn_implementation="eager")).eval()
    sd = state(model)
    new = {"model.embed_tokens.weight": sd["model.tok_embeddings.weight"],
           "model.norm.weight": sd["model.norm.weight"], "lm_head.weight": sd["output.weight"]}
    names = {"attention_norm": "input_layernorm", "ffn_norm": "post_attention_layernorm",
             "attention.wo": "self_attn.o_proj", "feed_forward.w1": "mlp.gate_proj",
             "feed_forward.w3": "mlp.up_proj", "feed_forward.w2": "mlp.down_proj"}
    for i in range(c.num_hidden_layers):
        p = f"model.layers.{i}."
        for src, dst in names.items():
            new[p + dst + ".weight"] = sd[p + src + ".weight"]
        q, k, v = split_wqkv(sd[p + "attention.wqkv.weight"], c)
        new[p + "self_attn.q_proj.weight"], new[p + "self_attn.k_proj.weight"] = q, k
        new[p + "self_attn.v_proj.weight"] = v
    missing, unexpected = llama.load_state_dict({k: torch.from_numpy(np.ascontiguousarray(v))
                                                 for k, v in new.items()}, strict=False)
    assert not unexpected and all("rotary" in m for m in missing)
    with torch.no_grad():
        theirs = llama(torch.tensor([ids]), use_cache=False).logits[0].numpy()
    err = rel_err(ref, theirs)
    print(f"reference vs transformers Llama: {err:.2e} of max|ref|")
    assert err <= 1e-5
    # the wqkv grouping matters: reading it as plain q | k | v rows gives other logits
    for i in range(c.num_hidden_layers):
        p = f"model.layers.{i}."
        w = sd[p + "attention.wqkv.weight"]
        nq, nkv = c.hidden_size, c.num_key_value_heads * c.hidden_size // c.num_attention_heads
        llama.model.layers[i].self_attn.q_proj.weight.data = torch.from_numpy(w[:nq].copy())
        llama.model.layers[i].self_attn.k_proj.weight.data = torch.from_numpy(w[nq:nq + nkv].copy())
        llama.model.layers[i].self_attn.v_proj.weight.data = torch.from_numpy(w[nq + nkv:].copy())
    with torch.no_grad():
        wrong = llama(torch.tensor([ids]), use_cache=False).logits[0].numpy()
    assert rel_err(ref, wrong) > 100 * TOL


# -- config ------------------------------------------------------------------------------

def test_internlm2_config_from_hf(case):
    spec, meta, got = hf_params("internlm2", case[1])
    want = {"dim": 256, "n_layers": 2, "n_heads": 8, "n_kv_heads": 2, "ffn_dim": 512,
            "vocab": 320, "context": 128, "qkv_fused": True}
    assert {k: got.get(k) for k in want} == want
    assert got["rope_theta"] == 1000000.0 and got["norm_eps"] == pytest.approx(1e-5)


@pytest.mark.parametrize("change, match", [
    ({"bias": True}, "bias"),
    ({"rope_scaling": {"type": "dynamic", "factor": 2.0}}, "RoPE scaling dynamic"),
    ({"hidden_act": "gelu"}, "hidden_act gelu"),
])
def test_internlm2_refuses_what_it_does_not_model(case, change, match):
    td = md.load_weights(case[1])
    td.metadata.update(change)
    with pytest.raises(md.errors.WeightsError, match=match):
        md.load_model(spec_path("internlm2"), td, variant="tiny")


# -- logits and generation ---------------------------------------------------------------

def test_internlm2_prefill_and_decode_match_reference(case, ours):
    model, path, ids, ref = case
    assert ours.params["qkv_fused"] and ours.params["head_dim"] == 32
    assert ours.weights["blk.0.attn_qkv.weight"].shape == (256 + 2 * 64, 256)
    assert_logits_match("internlm2", ours, ids, ref)


def test_internlm2_greedy_matches_reference(case, ours):
    model = case[0]
    want = [ref_greedy(model, p, N_NEW) for p in PROMPTS]
    assert ours.generate(PROMPTS[0], N_NEW, temperature=0).ids == want[0]
    assert [o.ids for o in ours.generate(PROMPTS, N_NEW, temperature=0)] == want   # batched


def test_internlm2_wqkv_grouping_matters(case):
    """Negative control: without the regroup_rows transform the per-group rows are read
    as q | k | v and the logits differ."""
    model, path, ids, ref = case
    spec = without_hf_transforms(md.load_spec(spec_path("internlm2")))
    pre, dec = compare(md.load_model(spec, path, variant="tiny"), ref, ids)
    assert pre > 10 * TOL and dec > 10 * TOL


# -- GGUF, as llama.cpp's converter writes it ---------------------------------------------

def internlm2_to_gguf(model, path, permute=True) -> str:
    """Write the reference as convert_hf_to_gguf.py's InternLM2Model does (arch internlm2,
    TextModel's keys, no vocab_size key: the token list gives it): wqkv split into
    attn_q / attn_k / attn_v, q and k rows permuted (LlamaModel.permute).
    ``permute=False`` keeps HF's rotate-half rows (a negative control)."""
    import gguf

    cfg, sd = model.config, state(model)
    nh, nkv = cfg.num_attention_heads, cfg.num_key_value_heads
    w = gguf_writer(path, "internlm2", cfg)
    w.add_rope_freq_base(float(cfg.rope_theta))
    w.add_layer_norm_rms_eps(cfg.rms_norm_eps)
    w.add_file_type(gguf.LlamaFileType.ALL_F32)
    _add_tokenizer(w, cfg.vocab_size)
    t = {"token_embd.weight": sd["model.tok_embeddings.weight"]}
    names = {"attention_norm": "attn_norm", "attention.wo": "attn_output",
             "ffn_norm": "ffn_norm", "feed_forward.w1": "ffn_gate",
             "feed_forward.w3": "ffn_up", "feed_forward.w2": "ffn_down"}
    for i in range(cfg.num_hidden_layers):
        p = f"model.layers.{i}."
        q, k, v = split_wqkv(sd[p + "attention.wqkv.weight"], cfg)
        if permute:
            q, k = llama_cpp_permute(q, nh, nh), llama_cpp_permute(k, nh, nkv)
        t[f"blk.{i}.attn_q.weight"], t[f"blk.{i}.attn_k.weight"] = q, k
        t[f"blk.{i}.attn_v.weight"] = v
        for src, dst in names.items():
            t[f"blk.{i}.{dst}.weight"] = sd[p + src + ".weight"]
    t["output_norm.weight"] = sd["model.norm.weight"]
    t["output.weight"] = sd["output.weight"]
    _write(w, t)
    return os.fspath(path)


@pytest.fixture(scope="module")
def gguf_path(case, tmp_path_factory):
    return internlm2_to_gguf(case[0], tmp_path_factory.mktemp("internlm2_gguf") / "i2.gguf")


def test_internlm2_gguf_matches_reference(case, gguf_path):
    model, _, ids, ref = case
    got = hf_params("internlm2", gguf_path)[2]
    assert (got["dim"], got["n_heads"], got["n_kv_heads"], got["context"]) == (256, 8, 2, 128)
    ours = md.load_model(spec_path("internlm2"), gguf_path, variant="tiny")
    assert ours.params["vocab"] == 320 and not ours.params["qkv_fused"]
    assert "blk.0.attn_q.weight" in ours.weights.keys()
    assert_logits_match("internlm2 gguf", ours, ids, ref)


def test_internlm2_gguf_needs_the_permute(case, tmp_path):
    """Negative control: q/k rows left in HF's rotate-half order rotate the wrong pairs."""
    model, _, ids, ref = case
    path = internlm2_to_gguf(model, tmp_path / "unpermuted.gguf", permute=False)
    pre, dec = compare(md.load_model(spec_path("internlm2"), path, variant="tiny"), ref, ids)
    assert pre > 10 * TOL and dec > 10 * TOL


def test_internlm2_export_round_trip(case, tmp_path):
    """`maxdecl export` of the HF checkpoint (fused wqkv kept) reads back with the same
    logits."""
    model, path, ids, ref = case
    out = tmp_path / "exported.gguf"
    subprocess.run([sys.executable, "-m", "maxdecl", "export", "--spec", spec_path("internlm2"),
                    "--variant", "tiny", "-o", str(out), path], check=True, capture_output=True)
    pre, dec = compare(tiny_model("internlm2", out), ref, ids)
    assert pre <= TOL and dec <= TOL


def test_llama_cpp_runs_the_internlm2_gguf(case, gguf_path, tmp_path):
    """llama.cpp itself (llama-cpp-python) runs the converter-style GGUF with the
    reference's logits, and maxdecl's logits of that file agree with llama.cpp's; a file
    with unpermuted q/k rows is far off in llama.cpp too (it rotates adjacent pairs).
    Skipped without llama_cpp."""
    llama_cpp = pytest.importorskip("llama_cpp")
    model, _, ids, ref = case
    theirs = llama_cpp_logits(llama_cpp, gguf_path, ids)
    err = rel_err(theirs, ref)
    pre, dec = ours_logits(md.load_model(spec_path("internlm2"), gguf_path, variant="tiny"), ids)
    ours_err = rel_err(np.concatenate([pre, dec]), theirs)
    print(f"llama.cpp internlm2: {err:.2e} of max|ref|; maxdecl vs llama.cpp {ours_err:.2e}")
    assert err <= TOL_LLAMA_CPP and ours_err <= TOL_LLAMA_CPP
    bad = internlm2_to_gguf(model, tmp_path / "unpermuted.gguf", permute=False)
    assert rel_err(llama_cpp_logits(llama_cpp, bad, ids), ref) > 10 * TOL_LLAMA_CPP
