"""specs/bitnet.yaml against transformers' BitNetForCausalLM with its BitNet quantization.

A small seeded float32 BitNet (GQA 4/2 heads, relu2 gated MLP, attn_sub_norm and
ffn_sub_norm, RoPE theta 500000). transformers applies the 1.58-bit scheme through the
``bitnet`` quantizer, which swaps every nn.Linear but lm_head for one of its classes;
each case below builds that model in memory (the quantizer itself needs accelerate and a
checkpoint) and writes the checkpoint as the quantizer reads it:

* ``offline`` (AutoBitLinear, offline; microsoft/bitnet-b1.58-2B-4T): packed 2-bit
  weights ``[out / 4, in]`` uint8 and a ``weight_scale`` that multiplies the output;
  activations ``round(x s).clamp(-128, 127) / s`` with ``s = 127 / max|x|`` per token;
* ``online`` (AutoBitLinear, online; the -bf16 master weights): float weights made
  ternary on every forward, ``round(W c).clamp(-1, 1) / c`` with ``c = 1 / mean|W|``;
* ``bitlinear`` (BitLinear): the same packed weights, the int8 activations times the
  ternary matrix divided by ``weight_scale * s``;
* ``none``: no quantization_config, plain nn.Linear layers.

transformers decorates these functions with ``torch.compile``; the references run them
eagerly (``torch.compiler.set_stance("force_eager")``), the same arithmetic without a
C++ toolchain.
"""

import json
import os

import numpy as np
import pytest

import maxdecl as md

from modelhelp import N_PROMPT, assert_greedy_matches_hf, ours_logits, randomize, rel_err, spec_path

pytest.importorskip("torch")
pytest.importorskip("transformers")

TOL = 1e-4          # max|ours - ref| <= TOL * max|ref|
PROMPTS = [[3, 17, 42, 99, 5, 7, 64, 1], [8, 9, 120], [5, 60, 33, 2, 90, 11, 7]]
N_NEW = 6
VOCAB = 128
MODES = ("offline", "online", "bitlinear", "none")
PROJ = ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj",
        "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj")


def make_bitnet(seed=0, **kw):
    """BitNetForCausalLM (unquantized): dim 64, 2 layers, 4 heads / 2 kv heads, ffn 128."""
    import torch
    import transformers

    torch.manual_seed(seed)
    cfg = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
               num_attention_heads=4, num_key_value_heads=2, rms_norm_eps=1e-5,
               max_position_embeddings=64, hidden_act="relu2", tie_word_embeddings=False,
               bos_token_id=0, eos_token_id=1, pad_token_id=None,
               attn_implementation="eager")
    cfg.update(kw)
    return randomize(transformers.BitNetForCausalLM(transformers.BitNetConfig(**cfg)), seed)


def ternary(w):
    """transformers' WeightQuant: (round(w c).clamp(-1, 1), c) with c = 1 / mean|w|."""
    c = 1.0 / w.abs().mean().clamp(min=1e-5)
    return (w * c).round().clamp(-1, 1), c


def quantize(model, mode):
    """(the model with transformers' BitNet linears in place, checkpoint tensors for them).

    The returned dict maps each HF name to the tensor the quantizer's checkpoint holds
    (``...weight`` and, for the packed modes, ``...weight_scale``)."""
    import torch
    from transformers.integrations.bitnet import AutoBitLinear, BitLinear, pack_weights

    tensors = {}
    for i, layer in enumerate(model.model.layers):
        for name in PROJ:
            parent, attr = name.split(".")
            lin = getattr(getattr(layer, parent), attr)
            w = lin.weight.detach().clone()
            key = f"model.layers.{i}.{name}"
            out_f, in_f = w.shape
            if mode == "online":
                new = AutoBitLinear(in_f, out_f, bias=False, online_quant=True)
                new.weight.data.copy_(w)
                tensors[f"{key}.weight"] = w
            elif mode == "offline":
                t, c = ternary(w)
                new = AutoBitLinear(in_f, out_f, bias=False, online_quant=False)
                new.weight.data.copy_(t)
                new.weight_scale.copy_((1.0 / c).reshape(1))
                tensors[f"{key}.weight"] = pack_weights(t.clone().to(torch.int8))
                tensors[f"{key}.weight_scale"] = new.weight_scale.clone()
            elif mode == "bitlinear":
                t, c = ternary(w)
                new = BitLinear(in_f, out_f, bias=False, dtype=torch.float32)
                new.weight.copy_(pack_weights(t.clone().to(torch.int8)))
                new.weight_scale.copy_(c.reshape(1))
                tensors[f"{key}.weight"] = new.weight.clone()
                tensors[f"{key}.weight_scale"] = new.weight_scale.clone()
            else:
                continue
            setattr(getattr(layer, parent), attr, new.eval())
    return model.eval(), tensors


QCONFIG = {
    "online": {"quant_method": "bitnet", "linear_class": "autobitlinear",
               "quantization_mode": "online"},
    "offline": {"quant_method": "bitnet", "linear_class": "autobitlinear",
                "quantization_mode": "offline"},
    "bitlinear": {"quant_method": "bitnet", "linear_class": "bitlinear",
                  "quantization_mode": "offline", "modules_to_not_convert": None,
                  "use_rms_norm": False, "rms_norm_eps": 1e-6},
}


def save_checkpoint(model, tensors, mode, path):
    """``save_pretrained`` of the float model, then its projections replaced by the
    quantized tensors and config.json given the quantization_config (as the quantizer's
    checkpoints hold them)."""
    from safetensors.torch import load_file, save_file

    model.save_pretrained(path, safe_serialization=True)
    st = os.path.join(path, "model.safetensors")
    sd = load_file(st)
    sd.update({k: v.contiguous() for k, v in tensors.items()})
    save_file(sd, st, metadata={"format": "pt"})
    if mode in QCONFIG:
        cfg_path = os.path.join(path, "config.json")
        cfg = json.load(open(cfg_path))
        cfg["quantization_config"] = QCONFIG[mode]
        json.dump(cfg, open(cfg_path, "w"), indent=2)
    return str(path)


def eager():
    import torch

    return torch.compiler.set_stance("force_eager")


def hf_logits(model, ids):
    import torch

    with torch.no_grad(), eager():
        out = model(torch.tensor([list(ids)]), use_cache=False)
    return out.logits[0].float().numpy()


def ids_for(seed=7, n=N_PROMPT + 4):
    return [int(t) for t in np.random.default_rng(seed).integers(0, VOCAB, size=n)]


def build_case(mode, folder, seed=0, **kw):
    model = make_bitnet(seed=seed, **kw)
    model, tensors = quantize(model, mode)
    path = save_checkpoint(model, tensors, mode, folder)
    ids = ids_for(7 + seed)
    return model, path, ids, hf_logits(model, ids)


@pytest.fixture(scope="module")
def cases(tmp_path_factory):
    return {m: build_case(m, tmp_path_factory.mktemp(f"bitnet_{m}"), seed=k)
            for k, m in enumerate(MODES)}


@pytest.fixture(scope="module")
def ours(cases):
    return {m: md.load_model(spec_path("bitnet"), c[1], variant="tiny")
            for m, c in cases.items()}


@pytest.mark.parametrize("mode", MODES)
def test_bitnet_config_from_hf(cases, ours, mode):
    p = ours[mode].params
    assert (p["dim"], p["n_layers"], p["n_heads"], p["n_kv_heads"], p["head_dim"],
            p["ffn_dim"], p["vocab"], p["context"]) == (64, 2, 4, 2, 16, 128, VOCAB, 64)
    assert p["quant"] == mode and p["hidden_act"] == "relu2"
    assert p["rope_theta"] == pytest.approx(500000.0) and p["norm_eps"] == pytest.approx(1e-5)


def test_bitnet_checkpoint_layout(cases):
    """The packed checkpoint holds uint8 [out / 4, in] and a weight_scale [1], as
    microsoft/bitnet-b1.58-2B-4T does; the spec reads both."""
    td = md.load_weights(cases["offline"][1])
    w = np.asarray(td["model.layers.0.mlp.down_proj.weight"])
    assert w.dtype == np.uint8 and w.shape == (64 // 4, 128)
    assert np.asarray(td["model.layers.0.mlp.down_proj.weight_scale"]).shape == (1,)


@pytest.mark.parametrize("mode", MODES)
def test_bitnet_prefill_and_decode_match_hf(cases, ours, mode):
    """Every position's logits of a 12-token prefill, then 4 tokens one at a time
    through the KV cache, against transformers' full-sequence forward."""
    _, _, ids, ref = cases[mode]
    pre, dec = ours_logits(ours[mode], ids)
    e_pre, e_dec = rel_err(pre, ref[:N_PROMPT]), rel_err(dec, ref[N_PROMPT:])
    print(f"bitnet {mode} vs HF: prefill {e_pre:.2e}, decode {e_dec:.2e} (of max|ref|)")
    assert e_pre <= TOL and e_dec <= TOL


@pytest.mark.parametrize("mode", MODES)
def test_bitnet_greedy_generate_matches_hf(cases, ours, mode):
    with eager():
        assert_greedy_matches_hf(cases[mode][0], ours[mode], PROMPTS, N_NEW)


def test_bitnet_tied_output(tmp_path):
    """A tied lm_head (the released 2B-4T's) reads the embedding table."""
    model, path, ids, ref = build_case("offline", tmp_path / "tied", seed=5,
                                       tie_word_embeddings=True)
    td = md.load_weights(path)
    assert "lm_head.weight" not in set(td.keys())
    pre, dec = ours_logits(md.load_model(spec_path("bitnet"), path, variant="tiny"), ids)
    assert rel_err(pre, ref[:N_PROMPT]) <= TOL and rel_err(dec, ref[N_PROMPT:]) <= TOL


@pytest.mark.parametrize("mode", ["offline", "online", "bitlinear"])
def test_bitnet_quantization_matters(cases, ours, mode):
    """Negative control: the same weights without the activation quantization (and,
    online, without the ternary weights) are far from what transformers computes."""
    import torch

    model, _, ids, ref = cases[mode]
    plain = make_bitnet(seed=MODES.index(mode))
    if mode != "online":                # dequantized ternary weights, float activations
        for i, layer in enumerate(plain.model.layers):
            for name in PROJ:
                parent, attr = name.split(".")
                lin = getattr(getattr(layer, parent), attr)
                t, c = ternary(lin.weight.detach())
                with torch.no_grad():
                    lin.weight.copy_(t / c)
    unq = hf_logits(plain, ids)
    assert rel_err(unq, ref) > 30 * TOL
    pre, _ = ours_logits(ours[mode], ids)
    assert rel_err(pre, ref[:N_PROMPT]) <= TOL


def test_bitnet_weight_scale_matters(cases):
    """Negative control: a packed checkpoint whose weight scales are all 1."""
    _, path, ids, ref = cases["offline"]
    td = md.load_weights(path)
    for k in list(td.keys()):
        if k.endswith("weight_scale"):
            td[k] = np.ones(1, np.float32)
    pre, _ = ours_logits(md.load_model(spec_path("bitnet"), td, variant="tiny"), ids)
    assert rel_err(pre, ref[:N_PROMPT]) > 30 * TOL


@pytest.mark.parametrize("qc, why", [
    ({"quant_method": "bitnet", "linear_class": "bitlinear", "use_rms_norm": True},
     "use_rms_norm"),
    ({"quant_method": "bitnet", "modules_to_not_convert": ["lm_head", "model.layers.0.mlp"]},
     "modules_to_not_convert"),
])
def test_bitnet_refuses_what_it_does_not_model(cases, tmp_path, qc, why):
    import shutil

    path = shutil.copytree(cases["bitlinear"][1], tmp_path / "ck")
    cfg = json.load(open(path / "config.json"))
    cfg["quantization_config"] = qc
    json.dump(cfg, open(path / "config.json", "w"))
    with pytest.raises(md.WeightsError, match=why):
        md.load_model(spec_path("bitnet"), str(path), variant="tiny")


def test_bitnet_default_linear_class_is_bitlinear(cases, tmp_path):
    """A quantization_config of only ``quant_method: bitnet`` is BitNetQuantConfig's
    defaults: BitLinear, offline."""
    import shutil

    path = shutil.copytree(cases["bitlinear"][1], tmp_path / "ck")
    cfg = json.load(open(path / "config.json"))
    cfg["quantization_config"] = {"quant_method": "bitnet"}
    json.dump(cfg, open(path / "config.json", "w"))
    assert md.load_model(spec_path("bitnet"), str(path), variant="tiny").params["quant"] \
        == "bitlinear"
