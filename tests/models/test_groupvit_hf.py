"""specs/groupvit.yaml against transformers' GroupViTModel (both towers, the grouping
stages with their hard assignment, the BatchNorm projections and the contrastive head).

Seeded small float32 models (eager attention, eval mode) saved with ``save_pretrained``;
every parameter random (LayerNorm gains and biases, group tokens, position embeddings,
BatchNorm running statistics) and ``logit_scale`` set away from its initial value. The
sizes, the stage layout and the pooling rule come from config.json, not the variant.
Two configurations, each with 3 texts and 2 images:

- ``three_stages``: depths [2, 1, 1], group tokens [8, 4, 0], output groups [8, 4, 4]
  (stage 1 projects stage 0's group tokens; the last stage does not group), text pooled
  at the first ``eos_token_id`` (7, twice in one row), quick_gelu text, gelu vision.
- ``two_stages``: a non-square image (24 x 32, 2 channels), depths [1, 2], group tokens
  [6, 0], output groups [3, 3], ``assign_mlp_ratio`` [1.0, 2], ``assign_eps`` 0.5,
  LayerNorm eps 1e-6, gelu_new vision, gelu text, argmax pooling (``eos_token_id`` 2).

The hard assignment (argmax over the groups) is discontinuous: the test checks that
transformers' soft assignment leaves every image token a clear winner, so a float32
rounding difference cannot flip a token to another group.
"""

import math

import numpy as np
import pytest

import maxdecl as md
from modelhelp import named_outputs, randomize, rel_err, save_hf, spec_path

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

SPEC = spec_path("groupvit")
TOL = 1e-4          # max|ours - ref| <= TOL * max|ref|
OUTPUTS = ("logits_per_image", "logits_per_text", "text_embeds", "image_embeds")
HIDDEN = {"text_last_hidden_state": "text_model_output",
          "vision_last_hidden_state": "vision_model_output"}

CASES = {
    "three_stages": dict(
        text=dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                  vocab_size=100, max_position_embeddings=16, layer_norm_eps=1e-5,
                  hidden_act="quick_gelu", bos_token_id=5, eos_token_id=7, pad_token_id=1),
        vision=dict(hidden_size=48, intermediate_size=96, num_hidden_layers=4, depths=[2, 1, 1],
                    num_group_tokens=[8, 4, 0], num_output_groups=[8, 4, 4],
                    num_attention_heads=4, image_size=32, patch_size=4, layer_norm_eps=1e-5,
                    hidden_act="gelu"),
        projection_dim=24, projection_intermediate_dim=40, logit_scale=math.log(20.0),
        seq=10, seed=0),
    "two_stages": dict(
        text=dict(hidden_size=24, intermediate_size=40, num_hidden_layers=1, num_attention_heads=2,
                  vocab_size=90, max_position_embeddings=12, layer_norm_eps=1e-6,
                  hidden_act="gelu", bos_token_id=0, eos_token_id=2, pad_token_id=1),
        vision=dict(hidden_size=32, intermediate_size=72, num_hidden_layers=3, depths=[1, 2],
                    num_group_tokens=[6, 0], num_output_groups=[3, 3], num_attention_heads=2,
                    image_size=[24, 32], patch_size=8, num_channels=2, layer_norm_eps=1e-6,
                    hidden_act="gelu_new", assign_mlp_ratio=[1.0, 2], assign_eps=0.5),
        projection_dim=16, projection_intermediate_dim=28, logit_scale=3.5, seq=7, seed=1),
}
N_TEXTS, N_IMAGES = 3, 2


def make_groupvit(case):
    torch.manual_seed(case["seed"])
    cfg = transformers.GroupViTConfig(
        text_config=dict(case["text"]), vision_config=dict(case["vision"]),
        projection_dim=case["projection_dim"],
        projection_intermediate_dim=case["projection_intermediate_dim"],
        attn_implementation="eager")
    model = randomize(transformers.GroupViTModel(cfg), case["seed"], running_stats=True)
    with torch.no_grad():
        model.logit_scale.fill_(case["logit_scale"])          # not the initial 2.6592
    return model.eval()


def make_ids(case, rng):
    """Token ids [3, seq]: the EOS token and the largest id at different positions in
    every row (row 0 holds the EOS token twice: the first counts)."""
    t = case["text"]
    vocab, eos, seq = t["vocab_size"], t["eos_token_id"], case["seq"]
    ids = rng.integers(8, vocab - 1, size=(N_TEXTS, seq))
    for r in range(N_TEXTS):
        e = seq - 1 - r
        ids[r, e] = eos
        ids[r, (e + 2) % seq] = vocab - 1
    ids[0, 1] = eos
    return ids.astype(np.int64)


def image_size(v):
    s = v.image_size
    return (s, s) if isinstance(s, int) else tuple(s)


@pytest.fixture(scope="module", params=sorted(CASES))
def case(request, tmp_path_factory):
    c = CASES[request.param]
    model = make_groupvit(c)
    path = save_hf(model, tmp_path_factory.mktemp(f"groupvit_{request.param}"))
    rng = np.random.default_rng(3)
    ids = make_ids(c, rng)
    v = model.config.vision_config
    x = rng.standard_normal((N_IMAGES, v.num_channels, *image_size(v))).astype(np.float32)
    with torch.no_grad():
        out = model(input_ids=torch.from_numpy(ids), pixel_values=torch.from_numpy(x),
                    output_attentions=True)
    ref = {k: getattr(out, k).numpy() for k in OUTPUTS}
    ref.update({k: getattr(out, v).last_hidden_state.numpy() for k, v in HIDDEN.items()})
    soft = [a.numpy() for a in out.vision_model_output.attentions]   # [n, groups, tokens]
    ours = md.load_model(SPEC, path)
    return request.param, model, path, ids, x, ref, soft, ours


def test_params_from_config(case):
    name, hf, path, ids, x, ref, soft, m = case
    t, v = hf.config.text_config, hf.config.vision_config
    want = {"proj_dim": hf.config.projection_dim,
            "proj_inter": hf.config.projection_intermediate_dim,
            "t_dim": t.hidden_size, "t_layers": t.num_hidden_layers, "t_heads": t.num_attention_heads,
            "t_ffn": t.intermediate_size, "t_eps": t.layer_norm_eps, "t_act": t.hidden_act,
            "vocab": t.vocab_size, "context": t.max_position_embeddings,
            "eos_token_id": t.eos_token_id,
            "v_dim": v.hidden_size, "v_heads": v.num_attention_heads, "v_ffn": v.intermediate_size,
            "v_eps": v.layer_norm_eps, "v_act": v.hidden_act, "channels": v.num_channels,
            "depths": list(v.depths), "group_tokens": list(v.num_group_tokens),
            "output_groups": list(v.num_output_groups), "assign_eps": v.assign_eps,
            "n_stages": len(v.depths), "img_h": image_size(v)[0], "img_w": image_size(v)[1]}
    assert {k: m.params[k] for k in want} == want
    assert list(m.input_names) == ["tokens", "pixels"]
    assert list(m.output_names) == ["logits", *OUTPUTS, *HIDDEN]


def test_outputs_match_transformers(case):
    name, hf, path, ids, x, ref, soft, m = case
    got = named_outputs(m, ids, x)
    v = hf.config.vision_config
    assert got["logits_per_image"].shape == (N_IMAGES, N_TEXTS)
    assert got["vision_last_hidden_state"].shape == (N_IMAGES, v.num_output_groups[-1],
                                                     v.hidden_size)
    np.testing.assert_array_equal(got["logits"], got["logits_per_image"])
    errs = {k: rel_err(got[k], ref[k]) for k in ref}
    print(f"groupvit {name} vs HF: " + ", ".join(f"{k} {e:.2e}" for k, e in errs.items()))
    assert all(e <= TOL for e in errs.values()), errs
    np.testing.assert_allclose(np.linalg.norm(got["image_embeds"], axis=-1), 1.0, rtol=1e-5)


def test_hard_assignment_is_decisive(case):
    """Every image token's winning group leads the runner-up by far more than float32
    noise (the comparison above is not at the mercy of a near tie), and the tokens do not
    all fall into one group (the assignment is exercised)."""
    name, hf, path, ids, x, ref, soft, m = case
    assert len(soft) == sum(g > 0 for g in hf.config.vision_config.num_group_tokens)
    for a in soft:
        top2 = np.sort(a, axis=1)[:, -2:, :]
        assert float((top2[:, 1] - top2[:, 0]).min()) > 1e-4
        assert all(len(np.unique(a[i].argmax(0))) > 1 for i in range(a.shape[0]))


def test_soft_assignment_would_differ(case, monkeypatch):
    """Negative control: transformers with the plain softmax instead of the hard one
    (its training-free ``hard=False`` path) is far from our outputs."""
    name, hf, path, ids, x, ref, soft, m = case
    cls = transformers.models.groupvit.modeling_groupvit.GroupViTAssignAttention
    orig = cls.get_attn
    monkeypatch.setattr(cls, "get_attn", lambda self, attn, gumbel=True, hard=True:
                        orig(self, attn, gumbel=False, hard=False))
    with torch.no_grad():
        out = hf(input_ids=torch.from_numpy(ids), pixel_values=torch.from_numpy(x))
    got = named_outputs(m, ids, x)
    assert rel_err(got["image_embeds"], out.image_embeds.numpy()) > 100 * TOL
    assert rel_err(got["text_embeds"], out.text_embeds.numpy()) < TOL


def test_batch_rows_are_independent(case):
    """One text and one image alone give their entries of the batched outputs."""
    name, hf, path, ids, x, ref, soft, m = case
    one = named_outputs(m, ids[-1:], x[-1:])
    assert rel_err(one["text_embeds"], ref["text_embeds"][-1:]) < TOL
    assert rel_err(one["image_embeds"], ref["image_embeds"][-1:]) < TOL


def test_group_tokens_and_scale_are_read(case):
    """Negative controls: zeroed first-stage group tokens change the image embeddings;
    logit_scale + 0.5 scales the logits by e^0.5 and leaves the embeddings."""
    name, hf, path, ids, x, ref, soft, m = case
    td = md.load_weights(str(path), spec=SPEC)
    key = "vision_model.encoder.stages.0.group_token"
    td[key] = np.zeros_like(np.asarray(td[key]))
    td["logit_scale.weight"] = np.asarray(td["logit_scale.weight"]) + np.float32(0.5)
    got = named_outputs(md.load_model(SPEC, td), ids, x)
    assert rel_err(got["image_embeds"], ref["image_embeds"]) > 100 * TOL
    assert rel_err(got["text_embeds"], ref["text_embeds"]) < TOL
    td2 = md.load_weights(str(path), spec=SPEC)
    td2["logit_scale.weight"] = np.asarray(td2["logit_scale.weight"]) + np.float32(0.5)
    got2 = named_outputs(md.load_model(SPEC, td2), ids, x)
    assert rel_err(got2["logits_per_image"], ref["logits_per_image"]) == pytest.approx(
        math.exp(0.5) - 1, rel=1e-3)
