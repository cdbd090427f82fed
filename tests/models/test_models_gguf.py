"""The same weights through GGUF: HF checkpoints converted the way llama.cpp's
convert_hf_to_gguf.py does (llama q/k row permutation; Gemma 3 norms stored as
1 + w; llama.cpp tensor names and metadata keys), written with ``gguf.GGUFWriter``,
give the logits of the HF directory. A Q8_0 variant is checked against the HF model
holding the dequantized weights.
"""

import numpy as np
import pytest

import maxdecl as md


from modelhelp import (TOL, compare, gemma3_to_gguf, hf_logits, llama_to_gguf, make_gemma3,
                       make_llama, ours_logits, q8_0, rel_err, save_hf, spec_path, token_ids)

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
gguf = pytest.importorskip("gguf")



def q8_0_roundtrip_(model):
    """Replace the HF model's matrices by their Q8_0-dequantized values."""
    qt = gguf.GGMLQuantizationType.Q8_0
    with torch.no_grad():
        for _, p in model.named_parameters():
            if p.ndim == 2:
                w = p.detach().numpy().astype(np.float32)
                back = gguf.quants.dequantize(gguf.quants.quantize(w, qt), qt)
                p.copy_(torch.from_numpy(np.ascontiguousarray(back, np.float32)))
    return model


def both_paths(spec, model, tmp_path, to_gguf, ids):
    hf_dir = save_hf(model, tmp_path / "hf")
    path = to_gguf(model, tmp_path / "model.gguf")
    s_hf = md.load_model(spec_path(spec), hf_dir, variant="tiny")
    s_gguf = md.load_model(spec_path(spec), path, variant="tiny")
    tok = s_gguf.tokenizer
    assert tok is not None and tok.vocab_size == model.config.vocab_size
    return ours_logits(s_hf, ids), ours_logits(s_gguf, ids), s_gguf


@pytest.mark.parametrize("spec,make,to_gguf", [
    ("llama3", lambda: make_llama(seed=21), llama_to_gguf),
    # GGUF has no key for query_pre_attn_scalar nor the local RoPE base: llama.cpp
    # takes key_length and 10000, so this model uses those.
    ("gemma3", lambda: make_gemma3(seed=22, query_pre_attn_scalar=48,
                                   rope_local_base_freq=10000.0, rope_theta=1e6), gemma3_to_gguf),
])
def test_gguf_f32_matches_hf_dir(spec, make, to_gguf, tmp_path):
    model = make()
    ids = token_ids(model.config.vocab_size, seed=3)
    ref = hf_logits(model, ids)
    (hf_pre, hf_dec), (g_pre, g_dec), ours = both_paths(spec, model, tmp_path, to_gguf, ids)
    assert all(not getattr(w, "is_quantized", False) and isinstance(w, np.ndarray)
               for w in ours.weights.values())
    d_pre, d_dec = rel_err(g_pre, hf_pre), rel_err(g_dec, hf_dec)
    print(f"{spec}: GGUF vs HF dir: prefill {d_pre:.2e}, decode {d_dec:.2e}")
    assert d_pre <= 1e-5 and d_dec <= 1e-5
    pre, dec = compare(ours, ref, ids)
    assert pre <= TOL and dec <= TOL


@pytest.mark.parametrize("spec,make,to_gguf", [
    ("llama3", lambda: make_llama(seed=31), llama_to_gguf),
    ("gemma3", lambda: make_gemma3(seed=32, query_pre_attn_scalar=48,
                                   rope_local_base_freq=10000.0, rope_theta=1e6), gemma3_to_gguf),
])
def test_gguf_q8_0_matches_dequantized_hf(spec, make, to_gguf, tmp_path):
    model = make()
    ids = token_ids(model.config.vocab_size, seed=4)
    path = to_gguf(model, tmp_path / "model-q8_0.gguf", quantize=q8_0)
    ref = hf_logits(q8_0_roundtrip_(model), ids)
    ours = md.load_model(spec_path(spec), path, variant="tiny")
    encs = {getattr(w, "encoding", "f32") for w in ours.weights.values()}
    assert "q8_0" in encs
    pre, dec = compare(ours, ref, ids)
    print(f"{spec}: GGUF Q8_0 vs HF with dequantized weights: prefill {pre:.2e}, "
          f"decode {dec:.2e}")
    assert pre <= TOL and dec <= TOL
