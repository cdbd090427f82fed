"""specs/sam.yaml against transformers' SamModel.

A seeded small float32 SamModel saved with ``save_pretrained`` (safetensors +
config.json), every parameter random (``modelhelp.randomize``; the relative position
tables, the absolute position table and the prompt embeddings included). The vision
encoder has 4 layers on an 8 x 8 patch grid: windows of 3 (the grid padded to 9, so
padded windows are exercised) in layers 0 and 2, global attention in layers 1 and 3,
then the conv neck. The sizes come from config.json, not the variant. Prompts: point
prompts (labels 1, 0, -1 and -10, with transformers' "not a point" pad token), box
prompts, and points with boxes; 2 images, 2 prompts per image; multimask_output True.
"""

import numpy as np
import pytest

import maxdecl as md
from modelhelp import named_outputs, randomize, rel_err, save_hf, spec_path

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

SPEC = spec_path("sam")
TOL = 1e-4          # max|ours - ref| <= TOL * max|ref|
N_IMAGES = 2

VISION = dict(hidden_size=32, output_channels=32, num_hidden_layers=4, num_attention_heads=2,
              image_size=64, patch_size=8, window_size=3, global_attn_indexes=[1, 3],
              num_pos_feats=16, mlp_dim=48, layer_norm_eps=1e-5)
PROMPT = dict(hidden_size=32, image_size=64, patch_size=8, mask_input_channels=8)
DECODER = dict(hidden_size=32, mlp_dim=40, num_hidden_layers=2, num_attention_heads=2,
               iou_head_hidden_dim=24, iou_head_depth=3)


def make_sam(seed=0):
    torch.manual_seed(seed)
    cfg = transformers.SamConfig(vision_config=VISION, prompt_encoder_config=PROMPT,
                                 mask_decoder_config=DECODER, attn_implementation="eager")
    model = randomize(transformers.SamModel(cfg), seed)
    gen = torch.Generator().manual_seed(seed + 100)
    with torch.no_grad():
        # Fourier features of moderate frequency (randomize's N(0, 1/16) is nearly linear)
        pe = model.shared_image_embedding.positional_embedding
        pe.copy_(2.0 * torch.randn(pe.shape, generator=gen))
        model.prompt_encoder.shared_embedding.positional_embedding.copy_(pe)
        # relative position tables on the scale of the attention scores
        for name, p in model.named_parameters():
            if "rel_pos" in name:
                p.copy_(0.5 * torch.randn(p.shape, generator=gen))
    return model


def images(cfg, n=N_IMAGES, seed=1) -> np.ndarray:
    c, s = cfg.vision_config.num_channels, cfg.vision_config.image_size
    return np.random.default_rng(seed).standard_normal((n, c, s, s)).astype(np.float32)


def prompts(seed=2):
    rng = np.random.default_rng(seed)
    points = rng.uniform(0, 63, size=(N_IMAGES, 2, 3, 2)).astype(np.float32)
    labels = np.array([[[1, 0, -10], [1, -1, 0]], [[0, 1, 1], [1, -10, -10]]], np.int64)
    x1y1 = rng.uniform(0, 30, size=(N_IMAGES, 2, 2))
    boxes = np.concatenate([x1y1, x1y1 + rng.uniform(5, 30, size=(N_IMAGES, 2, 2))],
                           axis=-1).astype(np.float32)              # [b, nb, 4]
    return points, labels, boxes


def hf_run(model, x, points=None, labels=None, boxes=None) -> dict:
    t = lambda a: None if a is None else torch.from_numpy(a)        # noqa: E731
    with torch.no_grad():
        out = model(pixel_values=t(x), input_points=t(points), input_labels=t(labels),
                    input_boxes=t(boxes), multimask_output=True)
        emb = model.get_image_embeddings(t(x))
    return {"iou_scores": out.iou_scores.numpy(), "pred_masks": out.pred_masks.numpy(),
            "last_hidden_state": emb.numpy()}


def ours(m, x, points=None, labels=None, boxes=None) -> dict:
    b, pb = x.shape[0], (points if points is not None else boxes).shape[1]
    if points is None:
        points = np.zeros((b, pb, 0, 2), np.float32)
        labels = np.zeros((b, pb, 0), np.int64)
    boxes = np.zeros((b, pb, 0, 4), np.float32) if boxes is None else boxes[:, :, None, :]
    return named_outputs(m, x, points, labels, boxes)


@pytest.fixture(scope="module")
def case(tmp_path_factory):
    model = make_sam()
    path = save_hf(model, tmp_path_factory.mktemp("sam"))
    x = images(model.config)
    points, labels, boxes = prompts()
    refs = {"points": hf_run(model, x, points, labels),
            "boxes": hf_run(model, x, boxes=boxes),
            "points_boxes": hf_run(model, x, points, labels, boxes)}
    inputs = {"points": (points, labels, None), "boxes": (None, None, boxes),
              "points_boxes": (points, labels, boxes)}
    return model, path, x, inputs, refs


@pytest.fixture(scope="module")
def loaded(case):
    return md.load_model(SPEC, str(case[1]))


def test_params_from_config(case, loaded):
    cfg = case[0].config
    p = loaded.params
    assert (p["vdim"], p["v_layers"], p["v_heads"], p["v_mlp"], p["window"],
            list(p["global_attn"]), p["grid"], p["v_eps"]) == (
        32, 4, 2, 48, 3, [1, 3], 8, cfg.vision_config.layer_norm_eps)
    assert (p["dim"], p["d_layers"], p["d_heads"], p["d_mlp"], p["iou_hidden"],
            p["n_mask_tokens"], p["p_grid"]) == (32, 2, 2, 40, 24, 4, 8)
    assert loaded.output_names == ["last_hidden_state", "iou_scores", "pred_masks"]


@pytest.mark.parametrize("kind", ["points", "boxes", "points_boxes"])
def test_outputs_match_transformers(case, loaded, kind):
    model, _, x, inputs, refs = case
    ref = refs[kind]
    got = ours(loaded, x, *inputs[kind])
    for k in ref:
        assert got[k].shape == ref[k].shape, (k, got[k].shape, ref[k].shape)
    errs = {k: rel_err(got[k], ref[k]) for k in ref}
    print(f"sam {kind} vs HF: " + ", ".join(
        f"{k} rel {e:.2e} (max|ref| {np.abs(ref[k]).max():.2f})" for k, e in errs.items()))
    assert all(e <= TOL for e in errs.values()), errs
    assert all(e < 1e-5 for e in errs.values()), errs   # float32 throughout: tighter than TOL
    # images are independent: the second alone gives its row of the batch
    one = ours(loaded, x[1:2], *(None if a is None else a[1:2] for a in inputs[kind]))
    for k in ref:
        assert rel_err(one[k], ref[k][1:2]) <= TOL, k


def test_pad_token_and_labels_matter(case, loaded):
    """Negative controls: the same points with a box-less prompt's pad token left out
    (a box of size 0 instead: nbox 1), or with every label 1, move the masks far past
    TOL, so the label handling and the pad token are what the match rests on."""
    model, _, x, inputs, refs = case
    points, labels, _ = inputs["points"]
    ref = refs["points"]["pred_masks"]
    ones = ours(loaded, x, points, np.ones_like(labels))["pred_masks"]
    assert rel_err(ones, ref) > 10 * TOL
    zero_box = np.zeros((x.shape[0], points.shape[1], 4), np.float32)
    boxed = ours(loaded, x, points, labels, zero_box)["pred_masks"]
    assert rel_err(boxed, ref) > 10 * TOL
