"""A Hugging Face byte-level BPE ``tokenizer.json`` -> GGUF "gpt2" tokenizer keys, checked.

llama.cpp's own converter names the pre-tokenizer (``tokenizer.ggml.pre``) by hashing the
tokens of a test text; here the name is found by comparing the file's split regexes with
the ones maxdecl's BPE knows (``tokenizer_bpe.PRE_TOKENIZERS``), then every candidate is
checked by encoding a mixed sample text both ways: keys are returned only when maxdecl's
GGUF tokenizer built from them gives exactly the ids of the ``tokenizers`` package.

    tokens       the vocabulary by id (holes filled with ``[PADn]``, type UNUSED, as llama.cpp)
    token_type   added special tokens CONTROL, other added tokens USER_DEFINED, else NORMAL
    merges       the model's merges, ``"left right"``
    add_bos/eos  whether the file's post-processor adds them
"""

from __future__ import annotations

import json

from ..errors import MaxdeclError
from .tokenizer import CONTROL, NORMAL, UNUSED, USER_DEFINED

__all__ = ["hf_to_gguf_keys", "SAMPLE"]

# Text the candidates must tokenize identically (llama.cpp's chktxt in spirit).
SAMPLE = ("\n \n\n \n\n\n \t \t\t \t\n  \n   \n    \n     \n🚀 (normal) 😶‍🌫️ (multiple emojis "
          "concatenated) ✅ 🦙🦙 3 33 333 3333 33333 333333 3333333 33333333 3.3 3..3 3...3 "
          "កាន់តែពិសេសអាច😁 ?我想在apple工作1314151天～ ------======= нещо на Български "
          "''''''```````\"\"\"\"......!!!!!!?????? I've been 'told he's there, 'RE you sure? "
          "'M not sure I'll make it, 'D you like some tea? We'Ve a'lL hEllO wOrLd")
# How Hugging Face files spell regexes that maxdecl writes differently.
_HF_SPELLINGS = {
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+"
    r"[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+": "llama-bpe",
}


def hf_to_gguf_keys(tok) -> dict:
    """GGUF "gpt2" tokenizer keys equivalent to an HfTokenizer, or MaxdeclError why not."""
    from .tokenizer_bpe import PRE_TOKENIZERS, BpeTokenizer

    data = json.loads(tok._tk.to_str())
    model = data.get("model") or {}
    if model.get("type") != "BPE" or not _byte_level(data):
        raise MaxdeclError("only byte-level BPE tokenizer.json files convert to GGUF keys "
                           f"(this one: {model.get('type')}, not byte-level)")
    keys = _keys(tok, data, model)
    patterns = _split_patterns(data.get("pre_tokenizer"))
    named = [n for n, (pats, ignore, _) in PRE_TOKENIZERS.items()
             if pats == patterns and ignore == bool(model.get("ignore_merges"))]
    if patterns and len(patterns) == 1 and patterns[0] in _HF_SPELLINGS:
        named.insert(0, _HF_SPELLINGS[patterns[0]])
    candidates = list(dict.fromkeys(named + list(PRE_TOKENIZERS)))
    texts = [SAMPLE, *SAMPLE.split(" ")]
    want = [tok.encode(t) for t in texts]
    for pre in candidates:
        keys["tokenizer.ggml.pre"] = pre
        try:
            ours = BpeTokenizer.from_gguf_metadata(keys, "tokenizer.json")
        except MaxdeclError:
            continue
        if [ours.encode(t) for t in texts] == want:
            return keys
    raise MaxdeclError("no llama.cpp pre-tokenizer maxdecl knows splits text as this "
                       "tokenizer.json does")


def _byte_level(data: dict) -> bool:
    text = json.dumps([data.get("pre_tokenizer"), data.get("decoder")])
    return '"ByteLevel"' in text


def _split_patterns(pre) -> tuple | None:
    """The Split regexes in order (a ByteLevel with use_regex adds GPT-2's), or None."""
    from .tokenizer_bpe import PRE_TOKENIZERS

    if not isinstance(pre, dict):
        return None
    steps = pre.get("pretokenizers", []) if pre.get("type") == "Sequence" else [pre]
    out = []
    for step in steps:
        kind = step.get("type")
        if kind == "Split" and isinstance(step.get("pattern"), dict) \
                and "Regex" in step["pattern"] and step.get("behavior") == "Isolated":
            out.append(step["pattern"]["Regex"])
        elif kind == "ByteLevel":
            if step.get("use_regex", True):
                out.append(PRE_TOKENIZERS["gpt2"][0][0])
        else:
            return None
    return tuple(out)


def _keys(tok, data: dict, model: dict) -> dict:
    vocab = dict(model.get("vocab") or {})
    added = {a["id"]: a for a in data.get("added_tokens") or []}
    for i, a in added.items():
        vocab[a["content"]] = i
    n = max(vocab.values()) + 1 if vocab else 0
    tokens, types = [f"[PAD{i}]" for i in range(n)], [UNUSED] * n
    for text, i in vocab.items():
        tokens[i] = text
        types[i] = (CONTROL if added[i].get("special") else USER_DEFINED) if i in added \
            else NORMAL
    merges = [m if isinstance(m, str) else " ".join(m) for m in model.get("merges") or []]
    plain, full = tok.encode("a", add_bos=False), tok.encode("a")
    bos, eos = tok.bos_id, tok.eos_id
    add_bos = len(full) > len(plain) and full[len(full) - len(plain):] == plain
    add_eos = len(full) > len(plain) and full[:len(plain)] == plain and not add_bos
    if add_bos:
        bos = full[0]                          # the post-processor's BOS
    if add_eos:
        eos = full[-1]
    keys = {"tokenizer.ggml.model": "gpt2", "tokenizer.ggml.tokens": tokens,
            "tokenizer.ggml.token_type": types, "tokenizer.ggml.merges": merges,
            "tokenizer.ggml.add_bos_token": add_bos, "tokenizer.ggml.add_eos_token": add_eos}
    if bos is not None:
        keys["tokenizer.ggml.bos_token_id"] = int(bos)
    if eos is not None:
        keys["tokenizer.ggml.eos_token_id"] = int(eos)
    return keys
