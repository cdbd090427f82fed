"""Llama 3.1 / 3.2 through specs/llama3.yaml: llama3 RoPE scaling and tied embeddings.

Small seeded float32 LlamaForCausalLM models with ``rope_scaling`` llama3 (3.1),
``tie_word_embeddings`` (3.2) or both are saved with ``save_pretrained`` and written
as GGUF the way llama.cpp's convert_hf_to_gguf.py does (permuted q/k,
``rope_freqs.weight`` divisors, no ``output.weight`` when tied). maxdecl's logits
(prefill, then decode steps through the KV cache) must match transformers' from
both. Negative controls show the RoPE divisors change the logits, so the scaled
tests cannot pass without them.
"""

import dataclasses
from types import MappingProxyType

import numpy as np
import pytest

import maxdecl as md
from maxdecl.spec import Spec

from modelhelp import (TOL, compare, hf_logits, llama_cpp_rope_freqs, llama_to_gguf,
                       make_llama, ours_logits, q8_0, rel_err, save_hf, spec_path, token_ids)

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
gguf = pytest.importorskip("gguf")

# head_dim 64, theta 500000: wavelengths 2 pi * 500000 ** (i / 32) are 6.3, 9.5, 14.3
# (< 64 / 4: kept), 21.5, 32.4, 48.9 (smoothed), 73.7 and up (> 64: divided by 8).
SCALING = dict(rope_type="llama3", factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0,
               original_max_position_embeddings=64)
KINDS = ["scaled", "tied", "scaled_tied"]          # Llama 3.1, 3.2 without scaling, 3.2
SEEDS = {"scaled": 41, "tied": 42, "scaled_tied": 43}


def make(kind):
    kw = dict(rope_scaling=dict(SCALING), max_position_embeddings=256) \
        if "scaled" in kind else {}
    return make_llama(seed=SEEDS[kind], tied="tied" in kind, **kw)


@pytest.fixture(scope="module", params=KINDS)
def case(request, tmp_path_factory):
    kind = request.param
    model = make(kind)
    tmp = tmp_path_factory.mktemp(kind)
    ids = token_ids(model.config.vocab_size, seed=SEEDS[kind])
    return dict(kind=kind, model=model, ids=ids, ref=hf_logits(model, ids),
                hf=save_hf(model, tmp / "hf"), gguf=llama_to_gguf(model, tmp / "model.gguf"))


def session(path, spec="llama3", variant="tiny"):
    s = md.load_model(spec if isinstance(spec, Spec) else spec_path(spec), path,
                         variant=variant)
    return s


def test_rope_factors_hit_every_branch_and_match_hf():
    """The converter's divisors for this config: some 1, some 8, some smoothed; they are
    HF's own inv_freq ratios, and what maxdecl computes from config.json."""
    model = make("scaled")
    freqs = llama_cpp_rope_freqs(model.config)
    assert freqs.shape == (32,)
    assert (freqs == 1).sum() == 3 and (freqs == 8).sum() == 26
    assert ((freqs > 1) & (freqs < 8)).sum() == 3
    plain = 1.0 / 500000.0 ** (np.arange(0, 64, 2, dtype=np.float64) / 64)
    hf_inv = model.model.rotary_emb.inv_freq.double().numpy()
    np.testing.assert_allclose(plain / hf_inv, freqs, rtol=1e-5)


def test_hf_dir_computes_rope_freqs_from_config(case):
    s = session(case["hf"])
    want = llama_cpp_rope_freqs(case["model"].config)
    if want is None:                                   # no scaling: the spec fills ones
        assert "rope_freqs.weight" not in s.weights
        consts = [n for n in s.graph.nodes if n.op == "constant" and n.layer == "rope_freqs"]
        assert len(consts) == 1 and np.all(consts[0].attrs["value"] == 1.0)
    else:
        np.testing.assert_allclose(s.weights["rope_freqs.weight"], want, rtol=1e-6)


def test_config_json_as_released_uses_rope_scaling(tmp_path):
    """Llama 3.1/3.2 config.json as released (transformers < 5): ``rope_theta`` at the
    top and ``rope_scaling``, not ``rope_parameters``."""
    import json
    import shutil

    model = make("scaled_tied")
    src = save_hf(model, tmp_path / "v5")
    path = tmp_path / "released"
    shutil.copytree(src, path)
    cfg = json.loads((path / "config.json").read_text())
    params = cfg.pop("rope_parameters")
    cfg["rope_theta"] = params.pop("rope_theta")
    cfg["rope_scaling"] = params
    (path / "config.json").write_text(json.dumps(cfg))
    s = session(str(path), variant=None)     # 8b: head_dim 128, until config.json says 64
    np.testing.assert_allclose(s.weights["rope_freqs.weight"],
                               llama_cpp_rope_freqs(model.config), rtol=1e-6)
    ids = token_ids(model.config.vocab_size, seed=5)
    pre, dec = compare(s, hf_logits(model, ids), ids)
    assert pre <= TOL and dec <= TOL


@pytest.mark.parametrize("fmt", ["hf", "gguf"])
def test_logits_match_transformers(case, fmt):
    s = session(case[fmt])
    pre, dec = compare(s, case["ref"], case["ids"])
    print(f"{case['kind']} {fmt} vs HF: prefill {pre:.2e}, decode {dec:.2e} (of max|ref|)")
    assert pre <= TOL and dec <= TOL


def test_gguf_and_hf_dir_agree(case):
    (hp, hd), (gp, gd) = (ours_logits(session(case[f]), case["ids"]) for f in ("hf", "gguf"))
    assert rel_err(gp, hp) <= 1e-5 and rel_err(gd, hd) <= 1e-5


def test_tied_output_reuses_token_embd(case):
    tied = "tied" in case["kind"]
    for fmt in ("hf", "gguf"):
        s = session(case[fmt])
        assert ("output.weight" in s.weights) != tied
        assert ("output.weight" in s.graph.weights) != tied
        (lin,) = [n for n in s.graph.nodes if n.layer == "output" and n.op == "linear"]
        assert lin.inputs[1].node.attrs["name"] == ("token_embd.weight" if tied
                                                    else "output.weight")


@pytest.mark.parametrize("kind", ["scaled", "scaled_tied"])
def test_without_rope_factors_the_logits_differ(kind, tmp_path):
    """Negative controls: a GGUF without rope_freqs.weight, and the HF dir read by a
    spec without formats.hf.computed, both rotate unscaled and miss the reference."""
    model = make(kind)
    ids = token_ids(model.config.vocab_size, seed=SEEDS[kind])
    ref = hf_logits(model, ids)
    bare = llama_to_gguf(model, tmp_path / "bare.gguf", rope_freqs=False)
    assert "rope_freqs.weight" not in md.load_weights(bare)
    spec = md.load_spec(spec_path("llama3"))
    formats = {k: dict(v) for k, v in spec.formats.items()}
    del formats["hf"]["computed"]
    unscaled = dataclasses.replace(spec, formats=MappingProxyType(formats))
    for s in (session(bare), session(save_hf(model, tmp_path / "hf"), unscaled)):
        pre, dec = compare(s, ref, ids)
        print(f"{kind} unscaled vs HF: prefill {pre:.2e}, decode {dec:.2e}")
        assert pre > 10 * TOL and dec > 10 * TOL      # matched: ~1e-6


def test_q8_0_gguf_with_tied_quantized_embedding(tmp_path):
    """Llama 3.2 as usually shipped: the output projection is the quantized token_embd."""
    model = make("scaled_tied")
    qt = gguf.GGMLQuantizationType.Q8_0
    with torch.no_grad():
        for _, p in model.named_parameters():
            if p.ndim == 2:
                w = p.detach().numpy().astype(np.float32)
                p.copy_(torch.from_numpy(np.ascontiguousarray(
                    gguf.quants.dequantize(gguf.quants.quantize(w, qt), qt), np.float32)))
    ids = token_ids(model.config.vocab_size, seed=9)
    ref = hf_logits(model, ids)
    s = session(llama_to_gguf(model, tmp_path / "q8_0.gguf", quantize=q8_0))
    assert s.weights["token_embd.weight"].encoding == "q8_0"
    assert any(n.op == "linear" and n.layer == "output" and n.inputs[1].encoding == "q8_0"
               for n in s.graph.nodes)
    pre, dec = compare(s, ref, ids)
    assert pre <= TOL and dec <= TOL
