"""specs/upernet.yaml against transformers' UperNetForSemanticSegmentation (ConvNeXt backbone).

Seeded small float32 models saved with ``save_pretrained`` (safetensors + config.json);
every parameter random (``randomize``: LayerNorm gains and biases, layer scales, conv and
linear weights; the heads' conv filters then redrawn N(0, 1 / fan_in)) and every BatchNorm's running statistics random too (a mean far from 0,
a variance far from 1), so a weight read wrongly or left out, or a BatchNorm run in
training mode, changes the logits. Each model runs on a batch of 2 images whose size
does not halve evenly down the stages (72 x 88 -> 18 x 22 -> 9 x 11 -> 4 x 5 -> 2 x 2),
so the PSP pooling windows overlap, the FPN's bilinear upsampling interpolates for real,
and the final upsampling to the input size does too.

The sizes come from config.json, not the variant: besides the spec's tiny sizes, one
model returns only three of its four stages (``out_features`` stage2..stage4), has no
layer scale, two PSP scales, a two-conv auxiliary head with ``concat_input``, another
width, label count and activation; another has three stages and no auxiliary head.

transformers' output has no auxiliary logits; the reference for them is computed as its
forward does (``auxiliary_head`` on the backbone's feature maps, then upsampled).
"""

import numpy as np
import pytest

import maxdecl as md
from modelhelp import randomize, rel_err, spec_path

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

SPEC = spec_path("upernet")
TOL = 1e-5              # max|ours - ref| <= TOL * max|ref| (float32 throughout)
IMAGES = (2, 3, 72, 88)

CASES = {
    # the spec's tiny variant's sizes
    "tiny": dict(
        backbone=dict(hidden_sizes=[8, 16, 24, 32], depths=[1, 1, 2, 1],
                      out_features=["stage1", "stage2", "stage3", "stage4"]),
        head=dict(hidden_size=16, pool_scales=[1, 2, 3, 6], use_auxiliary_head=True,
                  auxiliary_channels=12, auxiliary_num_convs=1, num_labels=5)),
    # sizes and switches the variant does not have: config.json must win
    "subset_concat": dict(
        backbone=dict(hidden_sizes=[8, 12, 16, 20], depths=[1, 2, 1, 1],
                      out_features=["stage2", "stage3", "stage4"], layer_scale_init_value=0.0,
                      hidden_act="gelu_new"),
        head=dict(hidden_size=10, pool_scales=[1, 3], use_auxiliary_head=True,
                  auxiliary_in_channels=20, auxiliary_channels=6, auxiliary_num_convs=2,
                  auxiliary_concat_input=True, num_labels=7)),
    "three_stages_no_aux": dict(
        backbone=dict(hidden_sizes=[8, 16, 24], depths=[2, 1, 1], num_stages=3,
                      out_features=["stage1", "stage2", "stage3"]),
        head=dict(hidden_size=12, pool_scales=[1, 2, 4], use_auxiliary_head=False,
                  num_labels=4)),
}


def make_upernet(backbone, head, seed=0):
    torch.manual_seed(seed)
    bcfg = transformers.ConvNextConfig(num_channels=3, patch_size=4, **backbone)
    cfg = transformers.UperNetConfig(backbone_config=bcfg, **head)
    model = randomize(transformers.UperNetForSemanticSegmentation(cfg), seed)
    gen = torch.Generator().manual_seed(seed + 100)
    with torch.no_grad():
        for name, m in model.named_modules():
            if isinstance(m, torch.nn.Conv2d) and not name.startswith("backbone."):
                # the heads' filters N(0, 1 / fan_in), so activations stay near unit scale
                fan_in = m.weight[0].numel()
                m.weight.copy_(torch.randn(m.weight.shape, generator=gen) / fan_in ** 0.5)
            if isinstance(m, torch.nn.BatchNorm2d):
                m.running_mean.copy_(0.5 * torch.randn(m.running_mean.shape, generator=gen))
                m.running_var.copy_(0.3 + 2.0 * torch.rand(m.running_var.shape, generator=gen))
    return model.eval()


def reference(model, x):
    """(logits, auxiliary logits or None), NCHW numpy."""
    with torch.no_grad():
        px = torch.from_numpy(x)
        logits = model(pixel_values=px).logits.numpy()
        feats = model.backbone(px).feature_maps
        aux = None
        if model.auxiliary_head is not None:
            aux = torch.nn.functional.interpolate(
                model.auxiliary_head(feats), size=px.shape[2:], mode="bilinear",
                align_corners=False).numpy()
    return logits, aux


@pytest.fixture(scope="module", params=sorted(CASES))
def case(request, tmp_path_factory):
    """One HF model per configuration (built and saved once for the module), its
    maxdecl model, the images and the reference outputs."""
    c = CASES[request.param]
    model = make_upernet(c["backbone"], c["head"])
    path = tmp_path_factory.mktemp(f"upernet_{request.param}")
    model.save_pretrained(str(path))
    x = np.random.default_rng(1).standard_normal(IMAGES).astype(np.float32)
    return dict(name=request.param, model=model, path=path, x=x, ref=reference(model, x),
                ours=md.load_model(SPEC, str(path)))


def test_params_from_config(case):
    m, cfg = case["ours"], case["model"].config
    bcfg = cfg.backbone_config
    assert m.params["hidden_sizes"] == list(bcfg.hidden_sizes)
    assert m.params["depths"] == list(bcfg.depths)
    assert m.params["out_indices"] == list(bcfg.out_indices)
    assert m.params["hidden_act"] == bcfg.hidden_act
    assert m.params["hidden_size"] == cfg.hidden_size
    assert m.params["pool_scales"] == list(cfg.pool_scales)
    assert m.params["use_aux"] == cfg.use_auxiliary_head
    assert m.params["n_classes"] == cfg.num_labels
    assert m.params["level_dims"] == list(case["model"].backbone.channels)
    want = ["logits", "auxiliary_logits"] if cfg.use_auxiliary_head else ["logits"]
    assert m.output_names == want
    assert m.input_names == ["pixel_values"]


def test_logits_match_transformers(case):
    """The decode head's logits (PSP, FPN, fused bottleneck, classifier, upsampling to
    the input size) for a batch of 2 images."""
    ref_logits = case["ref"][0]
    logits = case["ours"](case["x"])[0]
    n, _, hh, ww = case["x"].shape
    assert ref_logits.shape == (n, case["model"].config.num_labels, hh, ww)
    assert logits.shape == ref_logits.shape
    err = rel_err(logits, ref_logits)
    print(f"upernet {case['name']}: logits {err:.2e} (max|ref| {np.abs(ref_logits).max():.2f})")
    assert err <= TOL
    # the two images differ: a batch mixed up or broadcast would not match
    assert rel_err(logits[0], logits[1]) > 1e-2


def test_auxiliary_logits_match_transformers(case):
    """The FCN auxiliary head's logits, upsampled to the input size."""
    aux_ref = case["ref"][1]
    if aux_ref is None:
        pytest.skip("this configuration has no auxiliary head")
    aux = case["ours"](case["x"])[1]
    assert aux.shape == aux_ref.shape
    err = rel_err(aux, aux_ref)
    print(f"upernet {case['name']}: auxiliary_logits {err:.2e}")
    assert err <= TOL


def test_batch_norm_statistics_are_read(case):
    """Negative control: the logits move when one decode-head BatchNorm's running
    variance is reset to ones (BatchNorm without its statistics)."""
    td = md.load_weights(str(case["path"]), spec=SPEC)
    name = "decode_head.fpn_bottleneck.batch_norm.running_var"
    td[name] = np.ones_like(np.asarray(td[name]))
    logits = md.load_model(SPEC, td)(case["x"])[0]
    assert rel_err(logits, case["ref"][0]) > 1e-3


def test_fpn_level_order_matters(case):
    """Negative control: swapping the fpn_bottleneck's input blocks of the lowest level
    and the PSP level (the order transformers concatenates in) moves the logits."""
    td = md.load_weights(str(case["path"]), spec=SPEC)
    name = "decode_head.fpn_bottleneck.conv.weight"
    w = np.asarray(td[name]).copy()
    d = case["model"].config.hidden_size
    first, last = w[:, :d].copy(), w[:, -d:].copy()
    w[:, :d], w[:, -d:] = last, first
    td[name] = w
    logits = md.load_model(SPEC, td)(case["x"])[0]
    assert rel_err(logits, case["ref"][0]) > 1e-3


def test_refuses_other_backbones(tmp_path):
    """A ResNet-backbone UperNet (transformers' default) is refused, not run wrongly."""
    bcfg = transformers.ResNetConfig(embedding_size=8, hidden_sizes=[8, 16, 24, 32],
                                     depths=[1, 1, 1, 1],
                                     out_features=["stage1", "stage2", "stage3", "stage4"])
    cfg = transformers.UperNetConfig(backbone_config=bcfg, hidden_size=8, auxiliary_channels=8,
                                     num_labels=3)
    transformers.UperNetForSemanticSegmentation(cfg).save_pretrained(str(tmp_path))
    with pytest.raises(md.WeightsError, match="backbone resnet is not modelled"):
        md.load_model(SPEC, str(tmp_path))
