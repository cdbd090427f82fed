"""specs/canine.yaml against transformers' CanineModel.

Small seeded float32 CANINEs run on a batch of two codepoint sequences, the second
padded (attention_mask 0 from PAD_FROM on, codepoint 0 there), with token types.
Every output position is compared, padding included.

The main case: 4 hash functions over 64 buckets, sequence length 14 with
downsampling rate 3 (4 molecules and a remainder of 2 characters, so the upsampling
repeats the last molecule 5 times), local attention blocks of 4 characters (the last
block partial, and one block entirely padding in the second sequence, where
transformers' finfo.min mask gives a uniform average), an even upsampling kernel of 4
(padding 1 before and 2 after). The second case takes the other branches: 8 hash
functions, a length that the rate divides (no remainder), blocks of 5, an odd kernel
of 3, gelu_new, three heads of 16 and one deep layer.
"""

import numpy as np
import pytest

import maxdecl as md

from modelhelp import named_outputs, randomize, rel_err, save_hf, spec_path, with_hf_config

pytest.importorskip("torch")
pytest.importorskip("transformers")

TOL = 1e-5          # max|ours - ref| <= TOL * max|ref| (measured: about 1e-6)
PAD_FROM = 6        # the second sequence is 6 characters, padded to the full length


def make_canine(seed=0, **kw):
    """CanineModel (with its pooler), seeded by ``randomize``: the hash tables and the
    character position table are N(0, 1), like the other embeddings."""
    import torch
    import transformers

    torch.manual_seed(seed)
    cfg = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
               intermediate_size=64, num_hash_functions=4, num_hash_buckets=64,
               max_position_embeddings=64, downsampling_rate=3, upsampling_kernel_size=4,
               local_transformer_stride=4, type_vocab_size=3, hidden_act="gelu",
               layer_norm_eps=1e-12)
    cfg.update(kw)
    return randomize(transformers.CanineModel(transformers.CanineConfig(**cfg)), seed)


def batch_inputs(seq: int, seed: int = 7):
    """(codepoints, attention_mask, token_type_ids), int64 [2, seq]: [CLS] (U+E000)
    first, then codepoints over the whole Unicode range (hashes far past the bucket
    count), a [SEP] (U+E001); the second row padded with codepoint 0 from PAD_FROM."""
    rng = np.random.default_rng(seed)
    tokens = rng.integers(32, 0x110000, size=(2, seq)).astype(np.int64)
    tokens[:, 0] = 0xE000
    tokens[:, seq // 2] = 0xE001
    tokens[1, PAD_FROM - 1] = 0xE001
    mask = np.ones((2, seq), np.int64)
    mask[1, PAD_FROM:] = 0
    tokens[1, PAD_FROM:] = 0
    types = np.zeros((2, seq), np.int64)
    types[0, seq // 2 + 1:] = 1
    types[1, 3:PAD_FROM] = 2 if seq < 16 else 1
    return tokens, mask, types


def hf_outputs(model, inputs) -> dict:
    import torch

    tokens, mask, types = (torch.from_numpy(a) for a in inputs)
    with torch.no_grad():
        out = model(input_ids=tokens, attention_mask=mask, token_type_ids=types)
    return {"last_hidden_state": out.last_hidden_state.numpy(),
            "pooler_output": out.pooler_output.numpy()}


CASES = {
    "main": (dict(), 14),
    "other": (dict(hidden_size=48, num_attention_heads=3, intermediate_size=96,
                   num_hidden_layers=1, num_hash_functions=8, num_hash_buckets=97,
                   downsampling_rate=4, upsampling_kernel_size=3, local_transformer_stride=5,
                   type_vocab_size=16, hidden_act="gelu_new", layer_norm_eps=1e-5), 16),
}


@pytest.fixture(scope="module")
def cases(tmp_path_factory):
    """name -> (HF model, its save_pretrained folder, inputs, reference outputs)."""
    out = {}
    for k, (name, (kw, seq)) in enumerate(CASES.items()):
        model = make_canine(seed=k, **kw)
        path = save_hf(model, tmp_path_factory.mktemp(f"canine_{name}"))
        inputs = batch_inputs(seq, seed=7 + k)
        out[name] = (model, path, inputs, hf_outputs(model, inputs))
    return out


@pytest.fixture(scope="module")
def ours(cases):
    return {name: md.load_model(spec_path("canine"), c[1], variant="tiny")
            for name, c in cases.items()}


def errors(model, inputs, ref) -> dict:
    got = named_outputs(model, *inputs)
    return {k: rel_err(got[k], ref[k]) for k in ref}


def test_canine_config_from_hf(ours):
    p = ours["main"].params
    assert (p["dim"], p["n_layers"], p["n_heads"], p["head_dim"], p["ffn_dim"]) == (32, 2, 4, 8, 64)
    assert (p["n_hash"], p["n_buckets"], p["shard_dim"], p["n_types"]) == (4, 64, 8, 3)
    assert (p["rate"], p["up_kernel"], p["local_stride"]) == (3, 4, 4)
    assert (p["up_pad_before"], p["up_pad_after"]) == (1, 2)
    assert p["hidden_act"] == "gelu" and p["norm_eps"] == pytest.approx(1e-12)
    q = ours["other"].params
    assert (q["dim"], q["n_layers"], q["n_heads"], q["head_dim"]) == (48, 1, 3, 16)
    assert (q["n_hash"], q["n_buckets"], q["shard_dim"], q["n_types"]) == (8, 97, 6, 16)
    assert (q["rate"], q["up_kernel"], q["local_stride"]) == (4, 3, 5)
    assert (q["up_pad_before"], q["up_pad_after"]) == (1, 1)
    assert q["hidden_act"] == "gelu_new" and q["norm_eps"] == pytest.approx(1e-5)
    # the hash tables, stacked: [n_hash * n_buckets, hidden_size / n_hash]
    assert ours["main"].weights["char_embd.hash.weight"].shape == (4 * 64, 8)
    assert ours["other"].weights["char_embd.hash.weight"].shape == (8 * 97, 6)


@pytest.mark.parametrize("name", list(CASES))
def test_canine_matches_hf(cases, ours, name):
    """Last hidden state (every character, padding included) and pooler output of a
    padded batch."""
    model, path, inputs, ref = cases[name]
    assert ours[name].input_names == ["tokens", "attention_mask", "token_type_ids"]
    assert ours[name].output_names == ["last_hidden_state", "pooler_output"]
    err = errors(ours[name], inputs, ref)
    print(f"canine {name} vs HF:", {k: f"{v:.2e}" for k, v in err.items()})
    assert max(err.values()) <= TOL


def test_canine_headed_checkpoint_matches_hf(cases, tmp_path):
    """A CanineForSequenceClassification checkpoint (``canine.`` prefix, a classifier
    the spec drops) gives the base model's outputs."""
    import transformers

    model, _, inputs, ref = cases["main"]
    clf = transformers.CanineForSequenceClassification(model.config).eval()
    clf.canine.load_state_dict(model.state_dict())
    path = save_hf(clf, tmp_path / "clf")
    keys = set(md.load_weights(path).keys())
    assert "canine.char_embeddings.HashBucketCodepointEmbedder_0.weight" in keys
    assert "classifier.weight" in keys
    err = errors(md.load_model(spec_path("canine"), path, variant="tiny"), inputs, ref)
    print("canine headed checkpoint vs HF:", {k: f"{v:.2e}" for k, v in err.items()})
    assert max(err.values()) <= TOL


def test_canine_padding_mask_matters(cases, ours):
    """Negative control: without the mask the padded sequence's characters see the
    padding (the first, unpadded sequence is unchanged)."""
    _, _, (tokens, mask, types), ref = cases["main"]
    got = named_outputs(ours["main"], tokens, np.ones_like(mask), types)
    h, r = got["last_hidden_state"], ref["last_hidden_state"]
    assert rel_err(h[0], r[0]) <= TOL
    assert rel_err(h[1, :PAD_FROM], r[1, :PAD_FROM]) > 100 * TOL


def test_canine_local_attention_matters(cases):
    """Negative control: blocks wider than the sequence (full attention in the initial
    encoder) change the outputs, so the local blocks are really applied."""
    _, path, inputs, ref = cases["main"]
    spec = with_hf_config(md.load_spec(spec_path("canine")), local_stride="{1000}")
    err = errors(md.load_model(spec, path, variant="tiny"), inputs, ref)
    assert err["last_hidden_state"] > 100 * TOL


@pytest.mark.parametrize("k", [0, 3])
def test_canine_each_hash_table_matters(cases, k):
    """Negative control: zeroing one hash function's table changes the outputs, so
    every hash (its prime and its shard of the embedding) is used."""
    _, path, inputs, ref = cases["main"]
    td = md.load_weights(path)
    name = f"char_embeddings.HashBucketCodepointEmbedder_{k}.weight"
    td[name] = np.zeros_like(np.asarray(td[name]))
    err = errors(md.load_model(spec_path("canine"), td, variant="tiny"), inputs, ref)
    assert err["last_hidden_state"] > 100 * TOL


def test_canine_refuses_bad_hash_count(tmp_path):
    """A hidden size the hash count does not divide is refused with the spec's reason
    (transformers itself fails on it at the first forward)."""
    import json

    import transformers

    model = make_canine(seed=3)
    path = save_hf(model, tmp_path / "bad")
    config = tmp_path / "bad" / "config.json"
    cfg = json.loads(config.read_text())
    cfg["num_hash_functions"] = 5
    config.write_text(json.dumps(cfg))
    assert isinstance(model, transformers.CanineModel)
    with pytest.raises(md.WeightsError, match="not a multiple of num_hash_functions 5"):
        md.load_model(spec_path("canine"), path, variant="tiny")
