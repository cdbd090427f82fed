"""specs/owlvit.yaml against transformers' OwlViTForObjectDetection (text-queried).

A small seeded float32 OWL-ViT: a 2-layer text tower (dim 32, exact-GELU MLP, causal
attention with right padding, pooled at the highest token id) and a 2-layer vision tower
(dim 48, quick_gelu, a 32x32 image in 8x8 patches: a 4x4 grid), each tower with its own
LayerNorm epsilon, so every size and switch comes from config.json. Two images with
three text queries each; image 1's last query is padding (all ids 0, attention mask all
0), which transformers masks to float32's lowest logit.
"""

import numpy as np
import pytest

import maxdecl as md

from modelhelp import hf_params, named_outputs, randomize, rel_err, save_hf, spec_path

pytest.importorskip("torch")
pytest.importorskip("transformers")

TOL = 1e-4                  # max|ours - ref| <= TOL * max|ref|
BATCH, QUERIES, SEQ = 2, 3, 7
VOCAB, EOS = 100, 99        # EOS is the highest id: transformers pools there
LOWEST = np.finfo(np.float32).min

TEXT = dict(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
            num_attention_heads=4, max_position_embeddings=16, hidden_act="gelu",
            layer_norm_eps=1e-5, bos_token_id=98, eos_token_id=EOS)
VISION = dict(hidden_size=48, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
              image_size=32, patch_size=8, hidden_act="quick_gelu", layer_norm_eps=1e-6)


def make_owlvit(seed=0):
    import torch
    import transformers

    torch.manual_seed(seed)
    config = transformers.OwlViTConfig(text_config=TEXT, vision_config=VISION,
                                       projection_dim=32, attn_implementation="eager")
    return randomize(transformers.OwlViTForObjectDetection(config), seed)


def make_inputs(seed=3):
    """pixels [B, 3, 32, 32]; ids and mask [B, Q, SEQ] with right padding after EOS."""
    rng = np.random.default_rng(seed)
    pixels = rng.standard_normal((BATCH, 3, 32, 32)).astype(np.float32)
    ids = np.zeros((BATCH, QUERIES, SEQ), np.int64)
    mask = np.zeros((BATCH, QUERIES, SEQ), np.int64)
    lengths = [[7, 4, 2], [5, 6, 0]]           # 0: a padding query
    for b in range(BATCH):
        for q in range(QUERIES):
            n = lengths[b][q]
            if n:
                ids[b, q, :n - 1] = rng.integers(1, EOS, size=n - 1)
                ids[b, q, n - 1] = EOS
                mask[b, q, :n] = 1
    return pixels, ids, mask


@pytest.fixture(scope="module")
def case(tmp_path_factory):
    import torch

    model = make_owlvit()
    path = save_hf(model, tmp_path_factory.mktemp("owlvit_hf"))
    pixels, ids, mask = make_inputs()
    with torch.no_grad():
        out = model(input_ids=torch.from_numpy(ids.reshape(-1, SEQ)),
                    pixel_values=torch.from_numpy(pixels),
                    attention_mask=torch.from_numpy(mask.reshape(-1, SEQ)))
    ref = {"logits": out.logits, "pred_boxes": out.pred_boxes, "text_embeds": out.text_embeds,
           "image_embeds": out.image_embeds, "class_embeds": out.class_embeds,
           "text_last_hidden_state": out.text_model_output.last_hidden_state,
           "text_pooler_output": out.text_model_output.pooler_output,
           "vision_last_hidden_state": out.vision_model_output.last_hidden_state}
    ref = {k: v.float().numpy() for k, v in ref.items()}
    return model, path, (pixels, ids, mask), ref


@pytest.fixture(scope="module")
def ours(case):
    return md.load_model(spec_path("owlvit"), case[1], variant="tiny")


@pytest.fixture(scope="module")
def got(case, ours):
    return named_outputs(ours, *case[2])


def test_owlvit_config_from_hf(case):
    got = hf_params("owlvit", case[1])[2]
    assert (got["t_dim"], got["t_layers"], got["t_heads"], got["t_ffn"]) == (32, 2, 4, 64)
    assert (got["v_dim"], got["v_layers"], got["v_heads"], got["v_ffn"]) == (48, 2, 4, 96)
    assert (got["image_size"], got["patch"], got["proj_dim"]) == (32, 8, 32)
    assert (got["t_act"], got["v_act"]) == ("gelu", "quick_gelu")
    assert got["t_eps"] == pytest.approx(1e-5) and got["v_eps"] == pytest.approx(1e-6)


def test_owlvit_output_names(ours):
    assert ours.output_names[:5] == ["logits", "pred_boxes", "text_embeds", "image_embeds",
                                     "class_embeds"]


def test_owlvit_logits_match_hf(case, got):
    """Class logits [B, patches, Q]: the padding query is float32's lowest in both, the
    real queries within TOL."""
    ref, ours = case[3]["logits"], got["logits"]
    assert ours.shape == ref.shape == (BATCH, 16, QUERIES)
    padded = np.zeros(ref.shape, bool)
    padded[1, :, 2] = True
    assert np.all(ref[padded] == LOWEST) and np.all(ours[padded] == LOWEST)
    err = rel_err(ours[~padded], ref[~padded])
    print(f"owlvit logits: {err:.2e} of max|ref| {np.abs(ref[~padded]).max():.2f}")
    assert err <= TOL


@pytest.mark.parametrize("name", ["pred_boxes", "text_embeds", "image_embeds", "class_embeds",
                                  "text_last_hidden_state", "text_pooler_output",
                                  "vision_last_hidden_state"])
def test_owlvit_outputs_match_hf(case, got, name):
    ref, ours = case[3][name], got[name]
    err = rel_err(ours, ref)
    print(f"owlvit {name} {ref.shape}: {err:.2e} of max|ref| {np.abs(ref).max():.2f}")
    assert err <= TOL


def test_owlvit_pred_boxes_in_unit_square(got):
    boxes = got["pred_boxes"]
    assert boxes.shape == (BATCH, 16, 4)
    assert np.all((boxes >= 0) & (boxes <= 1))


def test_owlvit_query_mask_follows_first_token(case, ours):
    """Negative control: a real query whose first id becomes 0 is masked to the lowest
    logit, the others unchanged."""
    pixels, ids, mask = case[2]
    ids2 = ids.copy()
    ids2[0, 1, 0] = 0
    lg = named_outputs(ours, pixels, ids2, mask)["logits"]
    assert np.all(lg[0, :, 1] == LOWEST)
    ref = case[3]["logits"]
    assert rel_err(lg[0, :, [0, 2]], ref[0, :, [0, 2]]) <= TOL


def test_owlvit_queries_are_per_image(case, ours):
    """Swapping the two images' query sets swaps the text embeddings and, logits being
    per image, changes them (the grouping of queries by image is real)."""
    pixels, ids, mask = case[2]
    out = named_outputs(ours, pixels, ids[::-1].copy(), mask[::-1].copy())
    ref = case[3]
    assert rel_err(out["text_embeds"], ref["text_embeds"][::-1]) <= TOL
    assert rel_err(out["pred_boxes"], ref["pred_boxes"]) <= TOL      # boxes ignore the text
    assert rel_err(out["logits"][0, :, :2], ref["logits"][0, :, :2]) > 100 * TOL
