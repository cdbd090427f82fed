"""specs/detr.yaml against transformers' DetrForObjectDetection.

Small seeded float32 DETRs with transformers' own ResNet backbone
(use_timm_backbone=False): the main case a bottleneck ResNet of four stages with 2-D
sine position embeddings, a second case a basic-block ResNet read up to its third stage
(the checkpoint's later stages feed nothing), downsampling in the first stage and
learned position embeddings. Batches of two images of a non-square size that no stride
divides; outputs compared with max|ours - ref| <= 1e-4 max|ref|.
"""

import json
import shutil

import numpy as np
import pytest

import maxdecl as md

from modelhelp import hf_params, named_outputs, randomize, rel_err, save_hf, spec_path

pytest.importorskip("torch")
pytest.importorskip("transformers")

TOL = 1e-4
IMAGE = (2, 3, 80, 112)             # batch, channels, height, width: a 3x4 feature map


def frozen_bn_stats(model, seed):
    """DetrFrozenBatchNorm2d keeps gain, bias and statistics as buffers, which
    ``randomize`` leaves at 1 / 0: draw them too."""
    import torch

    gen = torch.Generator().manual_seed(seed + 100)
    with torch.no_grad():
        for m in model.modules():
            if type(m).__name__ == "DetrFrozenBatchNorm2d":
                n = m.weight.shape[0]
                m.weight.copy_(1.0 + 0.2 * torch.randn(n, generator=gen))
                m.bias.copy_(0.1 * torch.randn(n, generator=gen))
                m.running_mean.copy_(0.1 * torch.randn(n, generator=gen))
                m.running_var.copy_(0.5 + torch.rand(n, generator=gen))
    return model


def make_detr(seed=0, backbone=None, **kw):
    import torch
    import transformers

    torch.manual_seed(seed)
    bb = dict(embedding_size=8, hidden_sizes=[8, 16, 24, 32], depths=[1, 2, 1, 1],
              layer_type="bottleneck", out_features=["stage4"])
    bb.update(backbone or {})
    cfg = dict(use_timm_backbone=False, backbone_config=transformers.ResNetConfig(**bb),
               d_model=32, encoder_layers=2, decoder_layers=2, encoder_attention_heads=4,
               decoder_attention_heads=4, encoder_ffn_dim=64, decoder_ffn_dim=48,
               num_queries=10, num_labels=5, attn_implementation="eager")
    cfg.update(kw)
    model = transformers.DetrForObjectDetection(transformers.DetrConfig(**cfg))
    model = randomize(model, seed, conv_fan_in=True)
    return frozen_bn_stats(model, seed).eval()


def pixels(seed=3):
    rng = np.random.default_rng(seed)
    return rng.standard_normal(IMAGE).astype(np.float32)


def hf_outputs(model, pv, mask):
    import torch

    with torch.no_grad():
        out = model(torch.from_numpy(pv), pixel_mask=torch.from_numpy(mask))
    return {k: getattr(out, k).float().numpy() for k in
            ("logits", "pred_boxes", "last_hidden_state", "encoder_last_hidden_state")}


def case(tmp_path_factory, name, variant, **kw):
    model = make_detr(**kw)
    path = save_hf(model, tmp_path_factory.mktemp(name))
    pv = pixels()
    mask = np.ones((IMAGE[0], IMAGE[2], IMAGE[3]), np.int64)
    ours = md.load_model(spec_path("detr"), path, variant=variant)
    return model, path, ours, pv, mask


@pytest.fixture(scope="module")
def detr(tmp_path_factory):
    return case(tmp_path_factory, "detr_hf", "tiny")


@pytest.fixture(scope="module")
def detr_basic(tmp_path_factory):
    return case(tmp_path_factory, "detr_basic_hf", "tiny-basic-learned", seed=1,
                backbone=dict(layer_type="basic", embedding_size=8, hidden_sizes=[8, 16, 24, 40],
                              depths=[2, 1, 1, 1], downsample_in_first_stage=True,
                              out_features=["stage3"]),
                position_embedding_type="learned", d_model=48, encoder_attention_heads=6,
                decoder_attention_heads=3, num_queries=7, num_labels=3,
                encoder_layers=1, decoder_layers=3, activation_function="gelu")


def assert_match(model, ours, pv, mask, label):
    ref = hf_outputs(model, pv, mask)
    got = named_outputs(ours, pv, mask)
    assert list(got)[0] == "logits"
    errs = {k: rel_err(got[k], ref[k]) for k in ref}
    print(f"{label}: " + ", ".join(f"{k} {e:.2e}" for k, e in errs.items()))
    assert all(e <= TOL for e in errs.values()), errs
    return errs


def test_detr_config_from_hf(detr, detr_basic):
    got = hf_params("detr", detr[1])[2]
    assert (got["dim"], got["n_enc_layers"], got["n_dec_layers"], got["enc_heads"],
            got["dec_heads"], got["enc_ffn"], got["dec_ffn"], got["n_queries"],
            got["n_labels"]) == (32, 2, 2, 4, 4, 64, 48, 10, 5)
    assert (got["emb"], got["hidden_sizes"], got["depths"], got["layer_type"],
            got["out_stage"], got["pos_type"]) == (8, [8, 16, 24, 32], [1, 2, 1, 1],
                                                   "bottleneck", 4, "sine")
    got = hf_params("detr", detr_basic[1])[2]
    assert (got["dim"], got["enc_heads"], got["dec_heads"], got["n_dec_layers"],
            got["layer_type"], got["out_stage"], got["pos_type"], got["act"],
            got["downsample_in_first_stage"]) == (48, 6, 3, 3, "basic", 3, "learned",
                                                  "gelu", True)


def test_detr_outputs_match_hf(detr):
    """logits, pred_boxes, the decoder's last_hidden_state and the encoder's output of
    a batch of two images, pixel_mask all ones."""
    model, _, ours, pv, mask = detr
    assert_match(model, ours, pv, mask, "detr")


def test_detr_padded_pixel_mask_matches_hf(detr):
    """A pixel_mask with padding (the second image's lower right, as the image
    processor pads a smaller image): the mask is resized to the feature map, shapes the
    sine positions and masks the encoder's and the cross-attention's keys."""
    model, _, ours, pv, mask = detr
    mask = mask.copy()
    mask[1, 56:, :] = 0
    mask[1, :, 70:] = 0
    pv = pv.copy()
    pv[1][:, mask[1] == 0] = 0.0
    assert_match(model, ours, pv, mask, "detr padded")


def test_detr_basic_learned_matches_hf(detr_basic):
    """Basic ResNet layers, downsampling in the first stage, the feature map of stage 3
    (stage 4's tensors in the checkpoint are dropped), learned position embeddings,
    GELU MLPs, unequal encoder and decoder head counts."""
    model, _, ours, pv, mask = detr_basic
    assert_match(model, ours, pv, mask, "detr basic/learned")


def test_detr_timm_backbone_refused(detr, tmp_path):
    """A checkpoint with a timm backbone (use_timm_backbone=True) is refused by name."""
    src = detr[1]
    dst = tmp_path / "timm"
    shutil.copytree(src, dst)
    cfg = json.loads((dst / "config.json").read_text())
    cfg["backbone_config"] = {"model_type": "timm_backbone", "backbone": "resnet50",
                              "out_indices": [1, 2, 3, 4]}
    cfg["use_timm_backbone"] = True
    (dst / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(md.WeightsError, match="timm_backbone is not modelled"):
        md.load_model(spec_path("detr"), str(dst), variant="tiny")


def test_detr_frozen_bn_stats_matter(detr):
    """Negative control: with the backbone's running variances reset to 1 the outputs
    move far off."""
    model, path, _, pv, mask = detr
    td = md.load_weights(path)
    for k in list(td.keys()):
        if k.endswith("running_var"):
            td[k] = np.ones_like(np.asarray(td[k]))
    bad = md.load_model(spec_path("detr"), td, variant="tiny")
    ref = hf_outputs(model, pv, mask)
    got = named_outputs(bad, pv, mask)
    assert rel_err(got["logits"], ref["logits"]) > 100 * TOL


def test_detr_state_dict_names_match_hf(detr, tmp_path):
    """A torch state_dict saved as one file holds transformers 5's in-memory names
    (model.backbone.model., self_attn.o_proj, mlp.fc1) and no config.json: the tiny
    variant's sizes, which are this model's, and the same outputs."""
    import safetensors.torch

    model, _, _, pv, mask = detr
    sd = {k: v.contiguous() for k, v in model.state_dict().items()}
    assert any(".o_proj." in k for k in sd) and any(".mlp.fc1." in k for k in sd)
    path = tmp_path / "detr.safetensors"
    safetensors.torch.save_file(sd, str(path))
    ours = md.load_model(spec_path("detr"), str(path), variant="tiny")
    assert_match(model, ours, pv, mask, "detr state_dict")
