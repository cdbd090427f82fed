"""specs/longt5.yaml against transformers' LongT5ForConditionalGeneration and
LongT5EncoderModel.

Small seeded float32 LongT5s (vocab 100, d_model 48, 4 heads of 8, 2 encoder and 3
decoder layers, local_radius 3: blocks of 4 tokens, global_block_size 3, 16 buckets up
to distance 20):

- ``local``: encoder_attention_type local, ReLU feed-forward, tie_word_embeddings true
  (the d_model ** -0.5 output rescaling);
- ``tglobal``: transient-global, gated GELU, tie_word_embeddings false (no rescaling);
- ``encoder``: the ``tglobal`` model's encoder saved as a LongT5EncoderModel;
- ``untied``: the ``tglobal`` folder rewritten as transformers 4 saved LongT5 (as the
  google/long-t5-* checkpoints are): an lm_head.weight of its own, tie_word_embeddings
  false, no scale_decoder_outputs, is_gated_act or dense_act_fn (transformers 5 loads
  it untied and unscaled: that model is the reference).

Each case runs a batch of 2 right-padded sources (19 and 11 tokens: 5 local blocks, 6
global blocks, the last with an orphan token; the padding spans whole blocks) and 14
teacher-forced decoder tokens, and a second, shorter batch (8 and 3 tokens), and
compares the encoder's last hidden state (every position, padding included) and the LM
logits with transformers'. Negative controls: a wider local_radius, a global block
size read wrongly, the mask ignored, the output rescaling flipped.
"""

import json
import os

import numpy as np
import pytest

import maxdecl as md
from modelhelp import named_outputs, randomize, rel_err, save_hf, spec_path, with_hf_config

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

SPEC = spec_path("longt5")
VOCAB = 100
TOL = 1e-5                 # of max|ref|: float32 throughout
COMMON = dict(vocab_size=VOCAB, d_model=48, d_kv=8, num_heads=4, d_ff=64, num_layers=2,
              num_decoder_layers=3, local_radius=3, global_block_size=3,
              relative_attention_num_buckets=16, relative_attention_max_distance=20,
              layer_norm_epsilon=1e-6, attn_implementation="eager")
CONFIGS = {
    "local": dict(encoder_attention_type="local", feed_forward_proj="relu",
                  tie_word_embeddings=True),
    "tglobal": dict(encoder_attention_type="transient-global", feed_forward_proj="gated-gelu",
                    tie_word_embeddings=False),
}
CASES = ("local", "tglobal", "encoder", "untied")
# (valid lengths of the two sources, decoder length)
BATCHES = (((19, 11), 14), ((8, 3), 5))


def make_longt5(kind: str, seed: int = 0):
    torch.manual_seed(seed)
    cfg = transformers.LongT5Config(**COMMON, **CONFIGS[kind])
    model = randomize(transformers.LongT5ForConditionalGeneration(cfg), seed)
    with torch.no_grad():       # LongT5 does not scale q.k: keep the softmaxes soft
        for name, p in model.named_parameters():
            if name.endswith((".q.weight",)):
                p.mul_(cfg.d_kv ** -0.5)
            if "relative_attention_bias" in name:      # position biases that matter
                p.mul_(4.0)
    return model


def batch(lengths, n_dec, seed):
    """Right-padded source ids [2, max], their mask, decoder ids [2, n_dec]."""
    rng = np.random.default_rng(seed)
    s = max(lengths)
    ids = np.zeros((len(lengths), s), np.int64)
    mask = np.zeros((len(lengths), s), np.int64)
    for b, n in enumerate(lengths):
        ids[b, :n] = rng.integers(2, VOCAB, n)
        mask[b, :n] = 1
    dec = rng.integers(2, VOCAB, (len(lengths), n_dec)).astype(np.int64)
    return ids, mask, dec


def hf_outputs(model, ids, mask, dec) -> dict:
    t = {k: torch.tensor(v) for k, v in (("ids", ids), ("mask", mask), ("dec", dec))}
    with torch.no_grad():
        if isinstance(model, transformers.LongT5EncoderModel):
            out = model(input_ids=t["ids"], attention_mask=t["mask"])
            return {"last_hidden_state": out.last_hidden_state.numpy()}
        out = model(input_ids=t["ids"], attention_mask=t["mask"], decoder_input_ids=t["dec"],
                    use_cache=False)
    return {"logits": out.logits.numpy(),
            "last_hidden_state": out.encoder_last_hidden_state.numpy()}


def ours_outputs(model, ids, mask, dec) -> dict:
    feed = {"input_ids": ids, "attention_mask": mask, "decoder_input_ids": dec}
    return named_outputs(model, *(feed[n] for n in model.input_names))


def errors(ours, refs) -> dict:
    """{output: max relative error over the batches}."""
    out = {}
    for (ids, mask, dec), ref in refs:
        got = ours_outputs(ours, ids, mask, dec)
        for name, r in ref.items():
            out[name] = max(out.get(name, 0.0), rel_err(got[name], r))
    return out


def transformers4_folder(src, dst) -> str:
    """A copy of the HF folder ``src`` at ``dst`` as transformers 4 wrote LongT5: its own
    lm_head.weight, tie_word_embeddings false, no keys transformers 5 derives."""
    from safetensors.numpy import load_file, save_file

    os.makedirs(dst, exist_ok=True)
    td = load_file(os.path.join(src, "model.safetensors"))
    td["lm_head.weight"] = np.random.default_rng(5).standard_normal(
        td["shared.weight"].shape).astype(np.float32)
    save_file(td, os.path.join(dst, "model.safetensors"), metadata={"format": "pt"})
    cfg = json.load(open(os.path.join(src, "config.json")))
    cfg["tie_word_embeddings"] = False
    for key in ("scale_decoder_outputs", "is_gated_act", "dense_act_fn"):
        cfg.pop(key, None)
    json.dump(cfg, open(os.path.join(dst, "config.json"), "w"))
    return str(dst)


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    """kind -> (HF reference model, its save_pretrained folder), each built once."""
    out = {}
    for kind in CONFIGS:
        model = make_longt5(kind)
        out[kind] = model, save_hf(model, tmp_path_factory.mktemp(f"longt5_{kind}") / "hf")
    full = out["tglobal"][0]
    enc = transformers.LongT5EncoderModel(full.config)
    enc.load_state_dict({k: v for k, v in full.state_dict().items()
                         if not k.startswith(("decoder.", "lm_head."))}, strict=False)
    enc.eval()
    out["encoder"] = enc, save_hf(enc, tmp_path_factory.mktemp("longt5_encoder") / "hf")
    path = transformers4_folder(out["tglobal"][1], tmp_path_factory.mktemp("longt5_untied") / "hf")
    untied = transformers.LongT5ForConditionalGeneration.from_pretrained(path).eval()
    assert untied.lm_head.weight.data_ptr() != untied.shared.weight.data_ptr()
    out["untied"] = untied, path
    return out


@pytest.fixture(scope="module", params=CASES)
def case(request, folders):
    """(kind, HF model, folder, [(inputs, reference outputs)], loaded maxdecl model)."""
    kind = request.param
    model, path = folders[kind]
    refs = []
    for k, (lengths, n_dec) in enumerate(BATCHES):
        inputs = batch(lengths, n_dec, seed=3 + k)
        refs.append((inputs, hf_outputs(model, *inputs)))
    return kind, model, path, refs, md.load_model(SPEC, path)


def test_config_from_hf(case):
    kind, model, path, refs, ours = case
    c, p = model.config, ours.params
    assert (p["vocab"], p["dim"], p["head_dim"], p["n_heads"], p["ffn_dim"]) == (
        VOCAB, c.d_model, c.d_kv, c.num_heads, c.d_ff)
    assert (p["enc_layers"], p["local_radius"], p["gbs"], p["block"]) == (
        c.num_layers, c.local_radius, c.global_block_size, c.local_radius + 1)
    assert (p["n_buckets"], p["max_distance"]) == (c.relative_attention_num_buckets,
                                                   c.relative_attention_max_distance)
    assert p["tglobal"] is (kind != "local")
    assert p["gated"] is (kind != "local")
    assert p["ffn_act"] == ("relu" if kind == "local" else "gelu_new")
    assert p["has_decoder"] is (kind != "encoder")
    assert ("enc.blk.1.attn_gnorm.weight" in ours.weights) is (kind != "local")
    assert ("enc.blk.0.attn_grel_b.weight" in ours.weights) is (kind != "local")
    assert "enc.blk.1.attn_rel_b.weight" not in ours.weights
    if kind == "encoder":
        assert ours.output_names == ["last_hidden_state"]
        assert "decoder_input_ids" not in ours.input_names
    else:
        assert p["dec_layers"] == c.num_decoder_layers
        assert p["scale_out"] is (kind == "local") is c.scale_decoder_outputs
        assert ours.output_names == ["logits", "last_hidden_state"]
        # tied: the shared table; transformers 4's untied head: its own
        assert ("output.weight" in ours.weights) is (kind == "untied")


def test_source_is_longer_than_the_local_window():
    """The first batch's sources span several local blocks and global blocks, and the
    short one ends mid-block with whole blocks of padding after it."""
    (lengths, _), _ = BATCHES
    block = COMMON["local_radius"] + 1
    assert max(lengths) > 2 * COMMON["local_radius"] + 1
    assert max(lengths) % block and max(lengths) % COMMON["global_block_size"]
    assert (max(lengths) - min(lengths)) >= block


def test_outputs_match_hf(case):
    kind, model, path, refs, ours = case
    errs = errors(ours, refs)
    print(f"longt5 {kind} vs HF: " + ", ".join(f"{k} {v:.2e}" for k, v in errs.items()))
    assert set(errs) == ({"last_hidden_state"} if kind == "encoder"
                         else {"logits", "last_hidden_state"})
    assert max(errs.values()) <= TOL


def test_padding_does_not_change_the_valid_rows(case):
    """The short source alone, unpadded, gives the rows of its valid tokens (and, with a
    decoder, the same logits): the mask is applied, not just the ids."""
    kind, model, path, refs, ours = case
    (ids, mask, dec), _ = refs[0]
    n = int(mask[1].sum())
    both = ours_outputs(ours, ids, mask, dec)
    alone = ours_outputs(ours, ids[1:, :n], mask[1:, :n], dec[1:])
    ref = hf_outputs(model, ids[1:, :n], mask[1:, :n], dec[1:])
    assert rel_err(alone["last_hidden_state"], ref["last_hidden_state"]) <= TOL
    # padding keys and the global blocks of padding get -1e10: no weight
    assert rel_err(both["last_hidden_state"][1:, :n], alone["last_hidden_state"]) <= TOL
    if "logits" in both:
        assert rel_err(both["logits"][1:], alone["logits"]) <= TOL
        assert rel_err(alone["logits"], ref["logits"]) <= TOL


# -- negative controls --------------------------------------------------------------------

@pytest.mark.parametrize("key, value", [
    ("local_radius", "{local_radius + 4}"),            # a wider window: locality matters
    ("gbs", "{global_block_size + 1}"),                # other global blocks
])
def test_wrong_hyperparameter_fails(case, key, value):
    kind, model, path, refs, ours = case
    if key == "gbs" and kind == "local":
        pytest.skip("local attention has no global blocks")
    bad = md.load_model(with_hf_config(md.load_spec(SPEC), **{key: value}), path)
    assert errors(bad, refs)["last_hidden_state"] > 100 * TOL


def test_mask_matters(case):
    """The padded batch with an all-ones mask: other encoder states and logits."""
    kind, model, path, refs, ours = case
    (ids, mask, dec), ref = refs[0]
    got = ours_outputs(ours, ids, np.ones_like(mask), dec)
    assert rel_err(got["last_hidden_state"], ref["last_hidden_state"]) > 100 * TOL
    if "logits" in ref:
        assert rel_err(got["logits"], ref["logits"]) > 100 * TOL


def test_output_scaling_matters(case):
    kind, model, path, refs, ours = case
    if kind == "encoder":
        pytest.skip("no decoder")
    flipped = "{False}" if kind == "local" else "{True}"          # untied: tie_word_embeddings
    m = md.load_model(with_hf_config(md.load_spec(SPEC), scale_out=flipped), path)
    assert errors(m, refs[:1])["logits"] > 100 * TOL


def test_bare_longt5_model_is_refused(folders, tmp_path):
    """A LongT5Model (no LM head) is refused, not run as if its output were tied."""
    full = folders["local"][0]
    bare = transformers.LongT5Model(full.config)
    path = save_hf(bare, tmp_path / "bare")
    with pytest.raises(md.WeightsError, match="LongT5Model has no LM head"):
        md.load_model(SPEC, path)
