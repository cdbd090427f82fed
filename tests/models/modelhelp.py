"""Helpers for the model tests: seeded HF reference models, maxdecl logits, GGUF export.

torch / transformers are imported lazily (tests only; the library never imports them).
"""

from __future__ import annotations

import dataclasses
import os
from types import MappingProxyType

import numpy as np

SPECS = os.path.join(os.path.dirname(__file__), os.pardir, os.pardir, "specs")
N_PROMPT = 12       # prefill length
N_DECODE = 4        # decode steps through the KV cache
TOL = 1e-3          # max|ours - ref| <= TOL * max|ref|


def spec_path(name: str) -> str:
    return os.path.normpath(os.path.join(SPECS, f"{name}.yaml"))


def randomize(model, seed: int, norm_center: float = 1.0, norm_spread: float = 0.2,
              bias_spread: float = 0.1, running_stats: bool = False, conv_fan_in: bool = False):
    """Seeded weights that make every parameter matter.

    Biases (``*.bias``, of norms and projections): ``bias_spread * N(0, 1)``, small next
    to the gains as in released checkpoints (a final-norm bias near 1 would add one fixed
    vector to every position, and greedy decoding would repeat one token); other 1-D
    (norm) weights: ``norm_center + norm_spread * N(0, 1)``; embedding tables (any other
    parameter named ``embed`` or ``wte`` that is not a linear or conv weight) N(0, 1);
    a patch-embedding conv (a conv filter named ``embed``), and every conv filter with
    ``conv_fan_in=True``, N(0, 1 / fan_in) over every axis but the first (a 1x1 conv's
    filter otherwise gets N(0, 1), and a softmax after it is nearly one-hot); other
    matrices and filters N(0, 1 / n) with n their last axis.

    Only parameters change, every one of them: a frozen parameter the checkpoint does
    not save (Marian's sinusoidal position table) is overwritten too, so compare with a
    model reloaded by ``from_pretrained``. Buffers (a router's persistent
    ``expert_bias``) keep their values; ``running_stats=True`` also draws every norm's
    running means (0.1 N(0, 1)) and variances (U(0.5, 1.5)), which otherwise stay 0 and 1
    and go untested: BatchNorm's and those of any module holding ``running_mean`` and
    ``running_var`` buffers (a frozen batch norm, as DETR's, whose gain and bias are
    buffers too: drawn as a norm's weight and bias). A tied output head over an N(0, 1) table makes greedy decoding
    repeat the last token: scale the table (``* 0.1``, as test_gpt2_hf does) before a
    generation test (a post-norm model, whose last LayerNorm undoes the scale, may repeat
    anyway: test generation on an untied case there).
    """
    import math

    import torch

    def weights_of(kind):
        return {f"{m_name}.weight" if m_name else "weight"
                for m_name, m in model.named_modules() if isinstance(m, kind)}

    convs = weights_of(torch.nn.modules.conv._ConvNd)
    linears = weights_of(torch.nn.Linear)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in sorted(model.named_parameters()):
            if p.ndim == 0:                 # a scalar (CLIP's logit_scale): as initialised
                continue
            if p.ndim == 1 and name.endswith(".bias"):
                p.copy_(bias_spread * torch.randn(p.shape, generator=gen))
            elif p.ndim == 1:
                p.copy_(norm_center + norm_spread * torch.randn(p.shape, generator=gen))
            elif name in convs and (conv_fan_in or "embed" in name or "wte" in name):
                fan_in = math.prod(p.shape[1:])
                p.copy_(torch.randn(p.shape, generator=gen) / fan_in ** 0.5)
            elif ("embed" in name or "wte" in name) and name not in linears:
                p.copy_(torch.randn(p.shape, generator=gen))
            else:
                p.copy_(torch.randn(p.shape, generator=gen) / p.shape[-1] ** 0.5)
        if running_stats:
            for m in model.modules():
                own = dict(m.named_buffers(recurse=False))
                if own.get("running_mean") is None or own.get("running_var") is None:
                    continue
                m.running_mean.copy_(0.1 * torch.randn(m.running_mean.shape, generator=gen))
                m.running_var.copy_(0.5 + torch.rand(m.running_var.shape, generator=gen))
                if own.get("weight") is not None:      # a frozen norm: its gain is a buffer
                    own["weight"].copy_(norm_center + norm_spread * torch.randn(
                        own["weight"].shape, generator=gen))
                if own.get("bias") is not None:
                    own["bias"].copy_(bias_spread * torch.randn(own["bias"].shape,
                                                                generator=gen))
    return model.eval()


# -- seeded tiny HF models ---------------------------------------------------------------

def make_llama(seed=0, tied=False, rope_theta=500000.0, **kw):
    """LlamaForCausalLM: GQA (4 heads, 2 kv heads), SwiGLU, RMSNorm, rope_theta 500000.

    dim 256 and ffn 512: the spec's q4_k / q6_k encodings need multiples of 256
    even when the weights come as float32.
    """
    import torch
    import transformers

    torch.manual_seed(seed)
    cfg = dict(vocab_size=96, hidden_size=256, intermediate_size=512, num_hidden_layers=2,
               num_attention_heads=4, num_key_value_heads=2, rms_norm_eps=1e-5,
               max_position_embeddings=64, rope_theta=rope_theta,
               tie_word_embeddings=tied, attn_implementation="eager")
    cfg.update(kw)
    return randomize(transformers.LlamaForCausalLM(transformers.LlamaConfig(**cfg)), seed)


def make_mpt(seed=0, n_heads=12):
    """MptForCausalLM: ALiBi (bias max 8), bias-free LayerNorm, GELU MLP, tied output.

    12 heads (not a power of two) exercise MPT's interleaved slopes.
    """
    import torch
    import transformers

    torch.manual_seed(seed)
    config = transformers.MptConfig(
        d_model=768, n_heads=n_heads, n_layers=2, expansion_ratio=4, vocab_size=64,
        max_seq_len=64, no_bias=True, layer_norm_epsilon=1e-5,
        attn_config={"alibi": True, "alibi_bias_max": 8, "clip_qkv": None, "qk_ln": False,
                     "softmax_scale": None})
    return randomize(transformers.MptForCausalLM(config), seed)


def make_gemma3(seed=0, **kw):
    """Gemma3ForCausalLM (text): 6 layers (5 sliding + 1 global), window 5,
    head_dim 48 != dim / n_heads, query_pre_attn_scalar 40 != head_dim, RoPE bases
    20000 (local) and 500000 (global), tied output."""
    import torch
    import transformers

    torch.manual_seed(seed)
    cfg = dict(vocab_size=80, hidden_size=128, intermediate_size=256, num_hidden_layers=6,
               num_attention_heads=4, num_key_value_heads=2, head_dim=48,
               query_pre_attn_scalar=40, sliding_window=5, rms_norm_eps=1e-6,
               max_position_embeddings=64, rope_theta=500000.0, rope_local_base_freq=20000.0,
               tie_word_embeddings=True, attn_implementation="eager")
    cfg.update(kw)
    config = transformers.Gemma3TextConfig(**cfg)
    # HF norms compute x * (1 + w): weights near 0 (not 1) keep the scale sane.
    return randomize(transformers.Gemma3ForCausalLM(config), seed, norm_center=0.0)


def save_hf(model, path) -> str:
    """``save_pretrained`` as safetensors (config.json included); returns the path."""
    path = os.fspath(path)
    model.save_pretrained(path, safe_serialization=True)
    return path


def hf_logits(model, ids) -> np.ndarray:
    """Reference logits [len(ids), vocab] of the whole sequence in one forward."""
    import torch

    with torch.no_grad():
        out = model(torch.tensor([list(ids)], dtype=torch.long), use_cache=False)
    return out.logits[0].float().numpy()


def token_ids(vocab: int, n: int = N_PROMPT + N_DECODE, seed: int = 7) -> list[int]:
    return [int(t) for t in np.random.default_rng(seed).integers(0, vocab, size=n)]


def ours_logits(model, ids, n_prompt: int = N_PROMPT):
    """(prefill logits [n_prompt, vocab], decode logits [len(ids) - n_prompt, vocab]) of
    a ``md.Model``.

    Prefill runs the first ``n_prompt`` tokens with every position's logits; each
    later token then goes through the KV cache one at a time.
    """
    session = model.session
    state = session.initial_state()
    pre, state = session.step(ids[:n_prompt], 0, state, all_logits=True)
    dec = []
    for pos in range(n_prompt, len(ids)):
        lg, state = session.step([ids[pos]], pos, state)
        dec.append(np.asarray(lg)[-1])
    return np.asarray(pre), np.stack(dec) if dec else np.zeros((0, pre.shape[-1]))


def rel_err(ours, ref) -> float:
    """max|ours - ref| / max|ref| (the absolute error where ref is all zeros; inf where
    either holds a NaN, so a comparison with a tolerance fails)."""
    ours, ref = np.asarray(ours, np.float64), np.asarray(ref, np.float64)
    assert ours.shape == ref.shape, (ours.shape, ref.shape)
    if ours.size == 0:
        return 0.0
    if np.isnan(ours).any() or np.isnan(ref).any():
        return float("inf")
    err = float(np.max(np.abs(ours - ref)))
    scale = float(np.max(np.abs(ref)))
    return err / scale if scale > 0 else err


def compare(model, ref, ids, n_prompt: int = N_PROMPT) -> tuple[float, float]:
    """(prefill error, decode error) of a ``md.Model`` against reference logits."""
    pre, dec = ours_logits(model, ids, n_prompt)
    return rel_err(pre, ref[:n_prompt]), rel_err(dec, ref[n_prompt:])


def tiny_model(arch: str, path):
    """``md.load_model`` of ``specs/<arch>.yaml``'s tiny variant on the weights at ``path``."""
    import maxdecl as md

    return md.load_model(spec_path(arch), path, variant="tiny")


def hf_params(arch: str, path) -> tuple:
    """(spec, metadata, params the metadata states) for ``specs/<arch>.yaml`` and the
    checkpoint at ``path`` (``params_from_metadata``)."""
    import maxdecl as md
    from maxdecl.pipelines.model_loading import params_from_metadata

    spec = md.load_spec(spec_path(arch))
    meta = md.load_weights(path).metadata
    return spec, meta, params_from_metadata(spec, meta)


# the hyperparameters of the tiny decoder configs the architecture tests build
TINY_DECODER = {"dim": 64, "n_layers": 2, "n_heads": 4, "n_kv_heads": 2, "ffn_dim": 128,
                "vocab": 128, "context": 64}


def assert_tiny_decoder_params(got: dict) -> None:
    """The params read from a tiny decoder's config are ``TINY_DECODER``."""
    assert {k: got.get(k) for k in TINY_DECODER} == TINY_DECODER


def max_abs_diff(model, ids, ref) -> float:
    """The largest |ours - ref| over the prefill and decode logits of ``ours_logits``."""
    p, d = ours_logits(model, ids)
    return float(np.abs(np.concatenate([p, d]) - ref).max())


def assert_logits_match(name: str, model, ids, ref) -> None:
    """Prefill and KV-cache decode logits within TOL of max|ref| (the figures printed)."""
    pre, dec = compare(model, ref, ids)
    print(f"{name} vs HF: prefill {pre:.2e}, decode {dec:.2e} (of max|ref|); "
          f"max abs {max_abs_diff(model, ids, ref):.2e} (max|ref| {np.abs(ref).max():.1f})")
    assert pre <= TOL and dec <= TOL


def assert_greedy_matches_hf(hf_model, ours, prompts, n_new: int) -> None:
    """``ours.generate`` (greedy) gives transformers' greedy ids for the first prompt
    alone and for all of ``prompts`` decoded together."""
    import torch

    want = []
    for p in prompts:
        out = hf_model.generate(torch.tensor([p]), max_new_tokens=n_new, do_sample=False,
                                eos_token_id=None, pad_token_id=0)
        want.append(out[0, len(p):].tolist())
    assert ours.generate(prompts[0], n_new, temperature=0).ids == want[0]
    assert [o.ids for o in ours.generate(prompts, n_new, temperature=0)] == want   # batched


def without_hf_transforms(spec):
    """The same spec with its ``formats.hf.transforms`` removed (negative controls)."""
    formats = {k: dict(v) for k, v in spec.formats.items()}
    formats["hf"].pop("transforms", None)
    return dataclasses.replace(spec, formats=MappingProxyType(formats))


def with_hf_config(spec, **values):
    """The same spec with some ``formats.hf.config`` entries replaced (negative controls)."""
    formats = {k: dict(v) for k, v in spec.formats.items()}
    formats["hf"]["config"] = {**formats["hf"]["config"], **values}
    return dataclasses.replace(spec, formats=MappingProxyType(formats))


# HF Llama-style layer tensors -> llama.cpp's converter names (blk.N.<name>)
LLAMA_LAYERS = MappingProxyType({
    "input_layernorm": "attn_norm", "self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k",
    "self_attn.v_proj": "attn_v", "self_attn.o_proj": "attn_output",
    "post_attention_layernorm": "ffn_norm", "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up",
    "mlp.down_proj": "ffn_down"})


def layer_tensors(sd, n_layers: int, names=LLAMA_LAYERS, prefix="model.layers.") -> dict:
    """``blk.{i}.{gguf name}.{weight|bias}`` for every ``{prefix}{i}.{hf name}.{weight|bias}``
    that ``sd`` holds, ``names`` mapping HF names to llama.cpp's."""
    t = {}
    for i in range(n_layers):
        for src, dst in names.items():
            for kind in ("weight", "bias"):
                if f"{prefix}{i}.{src}.{kind}" in sd:
                    t[f"blk.{i}.{dst}.{kind}"] = sd[f"{prefix}{i}.{src}.{kind}"]
    return t


def llama_layer_tensors(sd, cfg) -> dict:
    """A Llama-layout HF state dict's blocks, final norm and (untied) head under llama.cpp's
    names, q/k rows permuted as its converter does (LlamaModel and its kin)."""
    nh, nkv = cfg.num_attention_heads, cfg.num_key_value_heads
    t = layer_tensors(sd, cfg.num_hidden_layers)
    for i in range(cfg.num_hidden_layers):
        t[f"blk.{i}.attn_q.weight"] = llama_cpp_permute(t[f"blk.{i}.attn_q.weight"], nh, nh)
        t[f"blk.{i}.attn_k.weight"] = llama_cpp_permute(t[f"blk.{i}.attn_k.weight"], nh, nkv)
    t["output_norm.weight"] = sd["model.norm.weight"]
    if not cfg.tie_word_embeddings:
        t["output.weight"] = sd["lm_head.weight"]
    return t


def llama_cpp_logits(llama_cpp, path, ids) -> np.ndarray:
    """llama.cpp's own logits (llama-cpp-python, ``llama_cpp`` the imported module) at
    every position of ``ids`` for the GGUF at ``path``."""
    llm = llama_cpp.Llama(model_path=str(path), n_threads=2, n_ctx=128, verbose=False,
                          logits_all=True)
    llm.eval(ids)
    return np.asarray(llm.eval_logits)[-len(ids):]


def q8_0_dequantized(model):
    """A copy of the HF ``model`` whose matrices went through Q8_0 and back (the
    reference for a Q8_0 GGUF of it)."""
    import copy

    import gguf
    import torch

    deq = copy.deepcopy(model)
    qt = gguf.GGMLQuantizationType.Q8_0
    with torch.no_grad():
        for _, p in deq.named_parameters():
            if p.ndim == 2:
                back = gguf.quants.dequantize(gguf.quants.quantize(p.numpy(), qt), qt)
                p.copy_(torch.from_numpy(np.ascontiguousarray(back, np.float32)))
    return deq


# -- GGUF export, as llama.cpp's convert_hf_to_gguf.py does it --------------------------

def llama_cpp_permute(w: np.ndarray, n_head: int, n_head_kv: int | None = None) -> np.ndarray:
    """llama.cpp's ``LlamaModel.permute``: HF q/k rows (halves) -> GGUF rows (pairs)."""
    if n_head_kv is not None and n_head != n_head_kv:
        n_head = n_head_kv
    return (w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:])
            .swapaxes(1, 2).reshape(w.shape))


def _add_tokenizer(writer, vocab: int):
    writer.add_tokenizer_model("llama")
    writer.add_token_list([f"<t{i}>" for i in range(vocab)])
    writer.add_token_scores([0.0] * vocab)
    writer.add_token_types([1] * vocab)
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(2)


def with_tokenizer(src, dst, vocab: int) -> str:
    """A copy of the GGUF ``src`` (its architecture, keys and tensors) with the test
    tokenizer added: llama.cpp loads no GGUF without one, and ``maxdecl export`` of a
    Hugging Face folder without tokenizer files writes none."""
    import gguf

    r = gguf.GGUFReader(src)
    arch = r.fields["general.architecture"].contents()
    w = gguf.GGUFWriter(str(dst), arch)
    for f in r.fields.values():
        if not f.name.startswith("GGUF.") and f.name != "general.architecture":
            w.add_key_value(f.name, f.contents(), f.types[0])
    _add_tokenizer(w, vocab)
    for t in r.tensors:
        w.add_tensor(t.name, np.asarray(t.data))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return str(dst)


def gguf_writer(path, arch: str, cfg):
    """A gguf.GGUFWriter for ``arch`` with the hyperparameters every decoder's converter
    writes, from a transformers config's standard names (context, width, layers, FFN
    width, query and key/value heads)."""
    import gguf

    w = gguf.GGUFWriter(os.fspath(path), arch)
    w.add_context_length(cfg.max_position_embeddings)
    w.add_embedding_length(cfg.hidden_size)
    w.add_block_count(cfg.num_hidden_layers)
    w.add_feed_forward_length(cfg.intermediate_size)
    w.add_head_count(cfg.num_attention_heads)
    w.add_head_count_kv(cfg.num_key_value_heads)
    return w


def _write(writer, tensors: dict, quantize=None):
    """Write ``tensors``; ``quantize(name, array)`` may return (bytes uint8, GGMLQuantizationType)."""
    for name, arr in tensors.items():
        arr = np.ascontiguousarray(arr, np.float32)
        q = quantize(name, arr) if quantize else None
        if q is None:
            writer.add_tensor(name, arr)
        else:
            data, qtype = q
            writer.add_tensor(name, data, raw_shape=data.shape, raw_dtype=qtype)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def hf_state(model) -> dict:
    return {k: v.detach().float().numpy() for k, v in model.state_dict().items()}


def rope_scaling(cfg) -> dict | None:
    """The llama3 rope-scaling parameters of a config (``rope_parameters`` in
    transformers >= 5, ``rope_scaling`` before), or None."""
    for attr in ("rope_parameters", "rope_scaling"):
        rp = getattr(cfg, attr, None)
        if isinstance(rp, dict) and rp.get("rope_type", rp.get("type")) == "llama3":
            return rp
    return None


def q8_0(name, arr):
    """A ``quantize=`` hook for the GGUF writers: every matrix as Q8_0 (gguf-py), 1-D
    tensors (norms) stay float32."""
    import gguf

    if arr.ndim != 2:
        return None
    qt = gguf.GGMLQuantizationType.Q8_0
    return gguf.quants.quantize(arr, qt), qt


def llama_cpp_rope_freqs(cfg) -> np.ndarray | None:
    """``rope_freqs.weight`` as convert_hf_to_gguf.py computes it (float32 torch
    frequencies, per-frequency divisors), or None without llama3 rope scaling.

    (The converter reads ``original_max_position_embeddings`` from the top level of
    config.json, defaulting to 8192 - the value inside rope_scaling for every real
    Llama 3.x; here it is taken from the scaling parameters.)"""
    import math

    import torch

    rp = rope_scaling(cfg)
    if rp is None:
        return None
    base = _rope_theta(cfg)
    dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    freqs = 1.0 / (base ** (torch.arange(0, dim, 2, dtype=torch.float32) / dim))
    factor, low, high = rp["factor"], rp["low_freq_factor"], rp["high_freq_factor"]
    old_ctx = rp["original_max_position_embeddings"]
    out = []
    for freq in freqs:
        wavelen = 2 * math.pi / freq
        if wavelen < old_ctx / high:
            out.append(1)
        elif wavelen > old_ctx / low:
            out.append(factor)
        else:
            smooth = (old_ctx / wavelen - low) / (high - low)
            out.append(1 / ((1 - smooth) / factor + smooth))
    return torch.tensor(out, dtype=torch.float32).numpy()


def llama_to_gguf(model, path, quantize=None, rope_freqs=True) -> str:
    """Write a LlamaForCausalLM as a llama.cpp GGUF (arch ``llama``): with llama3 rope
    scaling a ``rope_freqs.weight`` tensor (unless ``rope_freqs=False``: a negative
    control), and no ``output.weight`` when the embeddings are tied."""
    import gguf

    cfg, sd = model.config, hf_state(model)
    nh = cfg.num_attention_heads
    w = gguf_writer(path, "llama", cfg)
    w.add_name("tiny-llama")
    w.add_layer_norm_rms_eps(cfg.rms_norm_eps)
    w.add_rope_freq_base(float(_rope_theta(cfg)))
    w.add_rope_dimension_count(cfg.hidden_size // nh)
    w.add_vocab_size(cfg.vocab_size)
    w.add_file_type(gguf.LlamaFileType.ALL_F32)
    _add_tokenizer(w, cfg.vocab_size)
    t = {"token_embd.weight": sd["model.embed_tokens.weight"]}
    freqs = llama_cpp_rope_freqs(cfg)
    if freqs is not None and rope_freqs:
        t["rope_freqs.weight"] = freqs
    t.update(llama_layer_tensors(sd, cfg))
    _write(w, t, quantize)
    return os.fspath(path)


def gemma3_to_gguf(model, path, quantize=None) -> str:
    """Write a Gemma3ForCausalLM (text) as a llama.cpp GGUF (arch ``gemma3``); norm
    weights are stored as ``1 + w`` as llama.cpp's converter does."""
    import gguf

    cfg, sd = model.config, hf_state(model)
    w = gguf_writer(path, "gemma3", cfg)
    w.add_name("tiny-gemma3")
    w.add_rope_freq_base(float(_rope_theta(cfg, "full_attention")))
    w.add_layer_norm_rms_eps(cfg.rms_norm_eps)
    w.add_key_length(cfg.head_dim)
    w.add_value_length(cfg.head_dim)
    w.add_sliding_window(cfg.sliding_window)
    w.add_file_type(gguf.LlamaFileType.ALL_F32)
    _add_tokenizer(w, cfg.vocab_size)
    t = {"token_embd.weight": sd["model.embed_tokens.weight"]}
    names = {
        "input_layernorm": "attn_norm", "self_attn.q_proj": "attn_q",
        "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v",
        "self_attn.q_norm": "attn_q_norm", "self_attn.k_norm": "attn_k_norm",
        "self_attn.o_proj": "attn_output", "post_attention_layernorm": "post_attention_norm",
        "pre_feedforward_layernorm": "ffn_norm", "mlp.gate_proj": "ffn_gate",
        "mlp.up_proj": "ffn_up", "mlp.down_proj": "ffn_down",
        "post_feedforward_layernorm": "post_ffw_norm",
    }
    for i in range(cfg.num_hidden_layers):
        for src, dst in names.items():
            x = sd[f"model.layers.{i}.{src}.weight"]
            t[f"blk.{i}.{dst}.weight"] = x + 1.0 if "norm" in src else x
    t["output_norm.weight"] = sd["model.norm.weight"] + 1.0
    _write(w, t, quantize)
    return os.fspath(path)


def _rope_theta(cfg, layer_type: str | None = None) -> float:
    rp = getattr(cfg, "rope_parameters", None)
    if isinstance(rp, dict):
        if layer_type is not None and isinstance(rp.get(layer_type), dict):
            return float(rp[layer_type]["rope_theta"])
        if "rope_theta" in rp:
            return float(rp["rope_theta"])
    return float(cfg.rope_theta)


def hf_case(model, folder):
    """(model, HF directory saved in ``folder``, prompt ids, the model's logits on them):
    what each architecture test's module fixture holds."""
    path = save_hf(model, folder)
    ids = token_ids(model.config.vocab_size)
    return model, path, ids, hf_logits(model, ids)


def named_outputs(model, *inputs) -> dict:
    """``{output name: array}`` of one call of a loaded model that is not a language model."""
    return dict(zip(model.output_names, model(*inputs)))
