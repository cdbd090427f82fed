"""The GGUF layouts of the shipped qwen2, gpt2, phi3, starcoder2, olmo2, gptneox and bloom
specs are llama.cpp's own: the files these tests write, as llama.cpp's converter names
and lays them out (GPT-NeoX's and BLOOM's fused q/k/v rows reordered), run in llama.cpp
itself (llama-cpp-python) and give the transformers model's logits;
maxdecl reads the same files. llama-cpp-python is not a test dependency (it builds
llama.cpp): without it this module is skipped; `pip install llama-cpp-python` runs it.

Phi-3 is made without a sliding window here: llama.cpp does not apply Phi-3's window
(it matters only past 2047 tokens in the released models), so with the 5-position
window of test_phi3_hf.py the two disagree by design. StarCoder2 likewise: llama.cpp
attends over the whole context for starcoder2 (its converter writes no window, and a
starcoder2.attention.sliding_window key is not applied), so that case too is made
without a window (4096 of 16384 tokens in the released models).
"""

import numpy as np
import pytest

import maxdecl as md

from modelhelp import hf_logits, llama_cpp_logits, spec_path, token_ids

llama_cpp = pytest.importorskip("llama_cpp")
pytest.importorskip("transformers")

TOL_LLAMA_CPP = 5e-3        # of max|ref|: llama.cpp keeps its KV cache in f16


def _cases():
    import test_bloom_hf
    import test_gpt2_hf
    import test_gptneox_hf
    import test_olmo2_hf
    import test_phi3_hf
    import test_qwen2_hf
    import test_starcoder2_hf

    return {"qwen2": (test_qwen2_hf.make_qwen2, test_qwen2_hf.qwen2_to_gguf, {}),
            "gpt2": (test_gpt2_hf.make_gpt2, test_gpt2_hf.gpt2_to_gguf, {}),
            "phi3": (test_phi3_hf.make_phi3, test_phi3_hf.phi3_to_gguf,
                     {"sliding_window": None}),
            "starcoder2": (test_starcoder2_hf.make_starcoder2,
                           test_starcoder2_hf.starcoder2_to_gguf, {"sliding_window": None}),
            "olmo2": (test_olmo2_hf.make_olmo2, test_olmo2_hf.olmo2_to_gguf, {}),
            "gptneox": (test_gptneox_hf.make_gptneox, test_gptneox_hf.gptneox_to_gguf, {}),
            "bloom": (test_bloom_hf.make_bloom, test_bloom_hf.bloom_to_gguf, {})}


@pytest.mark.parametrize("arch", ["qwen2", "gpt2", "phi3", "starcoder2", "olmo2", "gptneox",
                                  "bloom"])
def test_llama_cpp_runs_the_gguf_with_the_reference_logits(arch, tmp_path):
    make, to_gguf, kw = _cases()[arch]
    model = make(**kw)
    path = to_gguf(model, str(tmp_path / f"{arch}.gguf"))
    ids = token_ids(model.config.vocab_size)
    ref = hf_logits(model, ids)
    theirs = llama_cpp_logits(llama_cpp, path, ids)
    ours = np.asarray(md.load_model(spec_path(arch), path, variant="tiny").logits(ids))
    scale = float(np.abs(ref).max())
    assert np.abs(theirs - ref).max() <= TOL_LLAMA_CPP * scale
    assert np.abs(ours - ref).max() <= 1e-5 * scale
