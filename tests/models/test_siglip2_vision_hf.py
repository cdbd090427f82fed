"""specs/siglip2_vision.yaml against transformers' Siglip2VisionModel (NaFlex).

Seeded small float32 models saved with ``save_pretrained`` (safetensors + config.json),
every parameter random (LayerNorm gains and biases, patch embedding, position table,
the pooling head's probe and fused in_proj). Inputs are patch sequences as
Siglip2ImageProcessor gives them: ``pixel_values [batch, seq, C * p * p]`` padded with
zeros, ``pixel_attention_mask [batch, seq]`` (int32) and ``spatial_shapes [batch, 2]``.
Each batch holds images of different grids, each padded, so the position table is
resized per image, down (antialiased) along one axis and up along the other, and the
padding keys are masked. The sizes come from config.json, not the variant: no case has
the tiny variant's sizes; one case has no pooling head, 5 heads, 2 channels, a 6 x 6
table and exact GELU.
"""

import numpy as np
import pytest

import maxdecl as md
from modelhelp import named_outputs, randomize, rel_err, save_hf, spec_path

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

SPEC = spec_path("siglip2_vision")
TOL = 1e-5          # max|ours - ref| <= TOL * max|ref|: float32 throughout

CASES = {
    "head": dict(
        config=dict(hidden_size=48, intermediate_size=80, num_hidden_layers=2,
                    num_attention_heads=4, num_channels=3, patch_size=4, num_patches=16,
                    layer_norm_eps=1e-6, hidden_act="gelu_pytorch_tanh", vision_use_head=True),
        seq=24, shapes=[[3, 7], [2, 5]]),          # 4x4 table -> 3x7 and 2x5
    "nohead_gelu": dict(
        config=dict(hidden_size=40, intermediate_size=56, num_hidden_layers=3,
                    num_attention_heads=5, num_channels=2, patch_size=3, num_patches=36,
                    layer_norm_eps=1e-5, hidden_act="gelu", vision_use_head=False),
        seq=40, shapes=[[9, 4], [2, 3]]),           # 6x6 table -> 9x4 and 2x3
}


def make_siglip2(config, seed=0):
    torch.manual_seed(seed)
    cfg = transformers.Siglip2VisionConfig(**config, attn_implementation="eager")
    model = randomize(transformers.Siglip2VisionModel(cfg), seed)
    with torch.no_grad():                   # N(0, 1 / fan_in) patch embedding: tokens O(1)
        w = model.embeddings.patch_embedding.weight
        w.copy_(w / w.shape[1] ** 0.5)
    return model


def patch_inputs(cfg, seq, shapes, seed=1):
    """(pixel_values, pixel_attention_mask, spatial_shapes) for images of these patch
    grids, each padded to ``seq`` patches with zeros (as the image processor pads)."""
    shapes = np.asarray(shapes, np.int64)
    pd = cfg.num_channels * cfg.patch_size ** 2
    x = np.random.default_rng(seed).standard_normal((len(shapes), seq, pd)).astype(np.float32)
    mask = np.zeros((len(shapes), seq), np.int32)
    for b, (h, w) in enumerate(shapes):
        mask[b, :h * w] = 1
        x[b, h * w:] = 0.0
    return x, mask, shapes


def hf_outputs(model, x, mask, shapes) -> dict:
    with torch.no_grad():
        out = model(pixel_values=torch.from_numpy(x),
                    pixel_attention_mask=torch.from_numpy(mask),
                    spatial_shapes=torch.from_numpy(shapes))
    ref = {"last_hidden_state": out.last_hidden_state.numpy()}
    if out.pooler_output is not None:
        ref["pooler_output"] = out.pooler_output.numpy()
    return ref


@pytest.fixture(scope="module", params=sorted(CASES))
def case(request, tmp_path_factory):
    c = CASES[request.param]
    model = make_siglip2(c["config"])
    path = save_hf(model, tmp_path_factory.mktemp(f"siglip2_{request.param}"))
    inputs = patch_inputs(model.config, c["seq"], c["shapes"])
    ours = md.load_model(SPEC, str(path))
    return request.param, model, ours, inputs, hf_outputs(model, *inputs)


def test_params_from_config(case):
    _, hf, ours, _, _ = case
    cfg = hf.config
    got = {k: ours.params[k] for k in ("dim", "n_layers", "n_heads", "ffn_dim", "channels",
                                       "patch", "num_patches", "grid", "norm_eps",
                                       "hidden_act", "use_head")}
    assert got == {"dim": cfg.hidden_size, "n_layers": cfg.num_hidden_layers,
                   "n_heads": cfg.num_attention_heads, "ffn_dim": cfg.intermediate_size,
                   "channels": cfg.num_channels, "patch": cfg.patch_size,
                   "num_patches": cfg.num_patches, "grid": int(cfg.num_patches ** 0.5),
                   "norm_eps": cfg.layer_norm_eps, "hidden_act": cfg.hidden_act,
                   "use_head": cfg.vision_use_head}
    assert ours.input_names == ["pixel_values", "pixel_attention_mask", "spatial_shapes"]


def test_outputs_match_transformers(case):
    """last_hidden_state (padding rows included) and pooler_output of a padded batch of
    two grids."""
    name, hf, ours, inputs, ref = case
    got = named_outputs(ours, *inputs)
    assert list(got) == list(ref)           # pooler_output only with the head
    x = inputs[0]
    assert got["last_hidden_state"].shape == (x.shape[0], x.shape[1], hf.config.hidden_size)
    errs = {k: rel_err(got[k], ref[k]) for k in ref}
    print(f"siglip2_vision {name} vs HF: " + ", ".join(f"{k} {e:.2e}" for k, e in errs.items()))
    assert all(e <= TOL for e in errs.values()), errs


def test_each_image_alone_unpadded(case):
    """Each image alone, without padding, gives its real rows and its pooled vector of
    the padded batch: the mask hides the padding from every real patch and the head."""
    _, hf, ours, (x, mask, shapes), ref = case
    for b, (h, w) in enumerate(shapes):
        n = int(h * w)
        one = (x[b:b + 1, :n], mask[b:b + 1, :n], shapes[b:b + 1])
        got = named_outputs(ours, *one)
        want = hf_outputs(hf, *one)
        assert rel_err(got["last_hidden_state"], want["last_hidden_state"]) <= TOL
        assert rel_err(got["last_hidden_state"], ref["last_hidden_state"][b:b + 1, :n]) <= 1e-4
        if "pooler_output" in ref:
            assert rel_err(got["pooler_output"], want["pooler_output"]) <= TOL
            assert rel_err(got["pooler_output"], ref["pooler_output"][b:b + 1]) <= 1e-4


def test_spatial_shapes_matter(case):
    """Negative control: the same patches read as another grid (rows and columns
    swapped) move the outputs far past TOL, so the table is resized per image."""
    _, _, ours, (x, mask, shapes), ref = case
    got = named_outputs(ours, x, mask, shapes[:, ::-1].copy())
    assert rel_err(got["last_hidden_state"], ref["last_hidden_state"]) > 100 * TOL


def test_full_siglip2_checkpoint_gives_its_vision_tower(tmp_path):
    """A whole Siglip2Model folder (sizes under vision_config, tensors under
    ``vision_model.``): the text tower and logit scale / bias are dropped and both
    outputs equal Siglip2Model.vision_model's."""
    torch.manual_seed(0)
    cfg = transformers.Siglip2Config(
        vision_config=dict(hidden_size=32, intermediate_size=48, num_hidden_layers=1,
                           num_attention_heads=2, patch_size=2, num_patches=9),
        text_config=dict(hidden_size=32, intermediate_size=48, num_hidden_layers=1,
                         num_attention_heads=2, vocab_size=300, bos_token_id=0,
                         eos_token_id=1, pad_token_id=1))
    model = randomize(transformers.Siglip2Model(cfg), 1).eval()
    path = save_hf(model, tmp_path)
    inputs = patch_inputs(model.config.vision_config, 12, [[2, 5], [4, 3]], seed=2)
    ref = hf_outputs(model.vision_model, *inputs)
    ours = md.load_model(SPEC, str(path))
    assert ours.params["dim"] == 32 and ours.params["grid"] == 3
    got = named_outputs(ours, *inputs)
    assert rel_err(got["last_hidden_state"], ref["last_hidden_state"]) <= TOL
    assert rel_err(got["pooler_output"], ref["pooler_output"]) <= TOL


def test_grid_past_padded_length_is_refused(case):
    """A grid of more patches than the padded length stops the run (transformers
    checks ``spatial_shapes.prod(-1) <= max_length`` too)."""
    _, _, ours, (x, mask, shapes), _ = case
    too_big = shapes.copy()
    too_big[0] = [x.shape[1] + 1, 1]
    with pytest.raises(md.GraphError, match="exceeds the padded length"):
        ours(x, mask, too_big)


def test_non_square_table_is_refused(tmp_path):
    """num_patches must be a square (transformers reshapes the table to grid x grid)."""
    model = make_siglip2(dict(CASES["head"]["config"], num_patches=15))
    path = save_hf(model, tmp_path)
    with pytest.raises(md.WeightsError, match="not a square grid"):
        md.load_model(SPEC, str(path))
