"""specs/clip.yaml against transformers' CLIPModel (both towers and the contrastive head).

Seeded small float32 models (eager attention) saved with ``save_pretrained``
(safetensors + config.json); every parameter random (LayerNorm gains and biases, [CLS]
and position embeddings, projection biases) and ``logit_scale`` set away from its
initial value, so a weight read wrongly or left out changes the outputs. The sizes,
activations and the EOS pooling rule come from config.json, not the variant. Two
configurations:

- ``eos_id``: a real ``eos_token_id`` (7): the text is pooled at its first occurrence
  (one sequence holds it twice); quick_gelu in both towers; 3 texts, 2 images.
- ``argmax``: ``eos_token_id`` 2 (configs from before transformers PR #24773): pooled at
  the largest id; gelu text, gelu_new vision, 2 colour channels, LayerNorm eps 1e-6,
  another projection width; 1 text, 3 images.

In both, the largest id and the EOS token sit at different positions, so the two
pooling rules give different embeddings (a negative control checks it).
"""

import math

import numpy as np
import pytest

import maxdecl as md
from modelhelp import TOL, named_outputs, randomize, rel_err, save_hf, spec_path, with_hf_config

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

SPEC = spec_path("clip")
OUTPUTS = ("logits_per_image", "logits_per_text", "text_embeds", "image_embeds")

CASES = {
    "eos_id": dict(
        text=dict(hidden_size=48, intermediate_size=80, num_hidden_layers=2, num_attention_heads=4,
                  vocab_size=120, max_position_embeddings=16, layer_norm_eps=1e-5,
                  hidden_act="quick_gelu", bos_token_id=5, eos_token_id=7, pad_token_id=1),
        vision=dict(hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                    num_attention_heads=4, image_size=32, patch_size=8, layer_norm_eps=1e-5,
                    hidden_act="quick_gelu"),
        projection_dim=24, logit_scale=math.log(20.0), n_texts=3, seq=10, n_images=2),
    "argmax": dict(
        text=dict(hidden_size=32, intermediate_size=72, num_hidden_layers=3, num_attention_heads=2,
                  vocab_size=90, max_position_embeddings=12, layer_norm_eps=1e-6,
                  hidden_act="gelu", bos_token_id=0, eos_token_id=2, pad_token_id=1),
        vision=dict(hidden_size=48, intermediate_size=64, num_hidden_layers=1,
                    num_attention_heads=3, image_size=30, patch_size=10, num_channels=2,
                    layer_norm_eps=1e-6, hidden_act="gelu_new"),
        projection_dim=40, logit_scale=3.5, n_texts=1, seq=7, n_images=3),
}


def make_clip(case, seed=0):
    torch.manual_seed(seed)
    cfg = transformers.CLIPConfig(text_config=dict(case["text"]), vision_config=dict(case["vision"]),
                                  projection_dim=case["projection_dim"],
                                  attn_implementation="eager")
    model = randomize(transformers.CLIPModel(cfg), seed)
    with torch.no_grad():
        w = model.vision_model.embeddings.patch_embedding.weight   # N(0, 1/fan_in): O(1) tokens
        w.copy_(w / float(np.prod(w.shape[1:])) ** 0.5)
        model.logit_scale.fill_(case["logit_scale"])                 # not the initial 2.6592
    return model


def make_ids(case, rng):
    """Token ids [n_texts, seq] with the EOS token and the largest id at different places
    in every row (row 0 of ``eos_id`` holds the EOS token twice: the first counts)."""
    t = case["text"]
    vocab, eos, seq = t["vocab_size"], t["eos_token_id"], case["seq"]
    ids = rng.integers(8, vocab - 1, size=(case["n_texts"], seq))
    for r in range(ids.shape[0]):
        e = seq - 1 - r % 3                 # EOS position
        ids[r, e] = eos
        ids[r, (e + 2) % seq] = vocab - 1   # the largest id elsewhere
    if t["eos_token_id"] != 2:
        ids[0, seq - 3] = eos               # before row 0's EOS: this one is pooled
    return ids.astype(np.int64)


def eos_positions(ids, eos_token_id):
    """transformers' pooled position per row."""
    if eos_token_id == 2:
        return ids.argmax(-1)
    return (ids == eos_token_id).astype(np.int32).argmax(-1)


@pytest.fixture(scope="module", params=sorted(CASES))
def case(request, tmp_path_factory):
    c = CASES[request.param]
    model = make_clip(c)
    path = save_hf(model, tmp_path_factory.mktemp(f"clip_{request.param}"))
    rng = np.random.default_rng(1)
    ids = make_ids(c, rng)
    v = model.config.vision_config
    x = rng.standard_normal((c["n_images"], v.num_channels, v.image_size,
                             v.image_size)).astype(np.float32)
    with torch.no_grad():
        out = model(input_ids=torch.from_numpy(ids), pixel_values=torch.from_numpy(x))
    ref = {k: getattr(out, k).numpy() for k in OUTPUTS}
    ours = md.load_model(SPEC, path)
    return request.param, model, path, ids, x, ref, ours


def test_params_from_config(case):
    name, hf, path, ids, x, ref, m = case
    t, v = hf.config.text_config, hf.config.vision_config
    want = {"proj_dim": hf.config.projection_dim,
            "t_dim": t.hidden_size, "t_layers": t.num_hidden_layers,
            "t_heads": t.num_attention_heads, "t_ffn": t.intermediate_size,
            "t_eps": t.layer_norm_eps, "t_act": t.hidden_act, "vocab": t.vocab_size,
            "context": t.max_position_embeddings, "eos_token_id": t.eos_token_id,
            "v_dim": v.hidden_size, "v_layers": v.num_hidden_layers,
            "v_heads": v.num_attention_heads, "v_ffn": v.intermediate_size,
            "v_eps": v.layer_norm_eps, "v_act": v.hidden_act, "image": v.image_size,
            "patch": v.patch_size, "channels": v.num_channels}
    assert {k: m.params[k] for k in want} == want
    assert m.params["argmax_pooling"] == (t.eos_token_id == 2)
    assert list(m.input_names) == ["tokens", "pixels"]
    assert list(m.output_names) == ["logits", *OUTPUTS]    # logits: logits_per_image


def test_outputs_match_transformers(case):
    name, hf, path, ids, x, ref, m = case
    got = named_outputs(m, ids, x)
    b, n, p = ids.shape[0], x.shape[0], hf.config.projection_dim
    assert got["logits_per_image"].shape == (n, b)
    assert got["logits_per_text"].shape == (b, n)
    assert got["text_embeds"].shape == (b, p)
    assert got["image_embeds"].shape == (n, p)
    np.testing.assert_array_equal(got["logits"], got["logits_per_image"])
    errs = {k: rel_err(got[k], ref[k]) for k in OUTPUTS}
    print(f"clip {name} vs HF: " + ", ".join(f"{k} {e:.2e}" for k, e in errs.items()))
    assert all(e <= TOL for e in errs.values())
    assert all(e < 1e-5 for e in errs.values())      # float32 throughout: much tighter than TOL
    np.testing.assert_allclose(np.linalg.norm(got["text_embeds"], axis=-1), 1.0, rtol=1e-5)
    np.testing.assert_allclose(np.linalg.norm(got["image_embeds"], axis=-1), 1.0, rtol=1e-5)


def test_batch_rows_are_independent(case):
    """One text and one image alone give their entries of the batched outputs."""
    name, hf, path, ids, x, ref, m = case
    one = named_outputs(m, ids[-1:], x[-1:])
    assert rel_err(one["text_embeds"], ref["text_embeds"][-1:]) < 1e-5
    assert rel_err(one["image_embeds"], ref["image_embeds"][-1:]) < 1e-5
    lg = ref["logits_per_image"]                     # one entry: against the batch's scale
    assert np.abs(one["logits_per_image"] - lg[-1:, -1:]).max() < 1e-5 * np.abs(lg).max()


def test_pooling_rule_matters(case):
    """Negative control: the other pooling rule (argmax of the ids against the first
    eos_token_id) picks another position in every row and moves text_embeds far past
    TOL; image_embeds do not depend on it."""
    name, hf, path, ids, x, ref, m = case
    eos = hf.config.text_config.eos_token_id
    other = 2 if eos != 2 else int(ids[0, 0])        # a real id: pooled at position 0
    assert np.all(eos_positions(ids, eos) != eos_positions(ids, other))
    spec = with_hf_config(md.load_spec(SPEC), eos_token_id=f"{{{other}}}")
    wrong = md.load_model(spec, md.load_weights(str(path)))
    assert wrong.params["eos_token_id"] == other
    got = named_outputs(wrong, ids, x)
    assert rel_err(got["text_embeds"], ref["text_embeds"]) > 30 * TOL
    assert rel_err(got["image_embeds"], ref["image_embeds"]) < 1e-5


def test_logit_scale_is_read(case):
    """Negative control: logit_scale + 0.5 scales both logit matrices by e^0.5 (an
    error of about 0.65 of max|ref|) and leaves the embeddings as they were."""
    name, hf, path, ids, x, ref, m = case
    td = md.load_weights(str(path), spec=SPEC)
    assert float(np.asarray(td["logit_scale.weight"])) == pytest.approx(
        CASES[name]["logit_scale"], rel=1e-6)
    td["logit_scale.weight"] = np.asarray(td["logit_scale.weight"]) + np.float32(0.5)
    got = named_outputs(md.load_model(SPEC, td), ids, x)
    for k in ("logits_per_image", "logits_per_text"):
        assert rel_err(got[k], ref[k]) == pytest.approx(math.exp(0.5) - 1, rel=1e-3)
    for k in ("text_embeds", "image_embeds"):
        assert rel_err(got[k], ref[k]) < 1e-5


def test_text_positions_matter(case):
    """Negative control: without the text position table the causal text tower gives
    other embeddings (the positions are read, at 0 .. seq-1)."""
    name, hf, path, ids, x, ref, m = case
    td = md.load_weights(str(path), spec=SPEC)
    td["t.position_embd.weight"] = np.zeros_like(np.asarray(td["t.position_embd.weight"]))
    got = named_outputs(md.load_model(SPEC, td), ids, x)
    assert rel_err(got["text_embeds"], ref["text_embeds"]) > 10 * TOL
