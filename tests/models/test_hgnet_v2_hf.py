"""specs/hgnet_v2.yaml against transformers' HGNetV2ForImageClassification (and
HGNetV2Backbone).

Seeded small float32 models saved with ``save_pretrained`` (safetensors + config.json).
Every parameter and BatchNorm statistic is random (conv filters, BN gains, biases,
running means and variances, the learnable affine blocks' scale and bias, the
classifier), so a weight read wrongly or left out changes the outputs. The sizes come
from config.json, not the variant: the cases differ in stage count, widths, depths,
layers per block, kernel sizes, light (depthwise) blocks, downsampling and strides,
learnable affine blocks, the stem's activation and the label count. Each case runs two
image sizes, one of them odd (the stem's pad-and-pool path and the strided convs'
rounding).
"""

import numpy as np
import pytest

import maxdecl as md
from modelhelp import rel_err, spec_path

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

SPEC = spec_path("hgnet_v2")
TOL = 1e-4                       # max|ours - ref| <= TOL * max|ref|

CASES = {
    # the spec's tiny variant: LAB on, light blocks in the last stage, residual blocks
    "tiny_lab_light": dict(
        stem_channels=[3, 16, 24], stem_strides=[2, 1, 1, 2, 1],
        stage_in_channels=[24, 32, 48], stage_mid_channels=[8, 16, 16],
        stage_out_channels=[32, 48, 64], stage_num_blocks=[1, 2, 2],
        stage_downsample=[False, True, True], stage_downsample_strides=[2, 2, 2],
        stage_light_block=[False, False, True], stage_kernel_size=[3, 3, 5],
        stage_numb_of_layers=[2, 3, 2], use_learnable_affine_block=True,
        hidden_sizes=[32, 48, 64], depths=[1, 2, 2], num_labels=5),
    # sizes the variant does not have: four stages, light blocks in two (as B4), no LAB,
    # a GELU stem, a downsampling first stage, another label count
    "four_stages_plain": dict(
        stem_channels=[3, 8, 12], stem_strides=[2, 1, 1, 2, 1], hidden_act="gelu",
        stage_in_channels=[12, 16, 24, 32], stage_mid_channels=[8, 8, 12, 16],
        stage_out_channels=[16, 24, 32, 40], stage_num_blocks=[2, 1, 2, 1],
        stage_downsample=[True, True, False, True], stage_downsample_strides=[2, 2, 2, 2],
        stage_light_block=[False, True, True, False], stage_kernel_size=[3, 5, 3, 5],
        stage_numb_of_layers=[3, 2, 4, 1], use_learnable_affine_block=False,
        hidden_sizes=[16, 24, 32, 40], depths=[2, 1, 2, 1], num_labels=7),
    # one stage, light, LAB, a stride-1 stem (stem1 and stem3), 2 labels (the default)
    "one_stage": dict(
        stem_channels=[3, 6, 10], stem_strides=[1, 1, 1, 1, 1],
        stage_in_channels=[10], stage_mid_channels=[6], stage_out_channels=[14],
        stage_num_blocks=[3], stage_downsample=[True], stage_downsample_strides=[2],
        stage_light_block=[True], stage_kernel_size=[3], stage_numb_of_layers=[2],
        use_learnable_affine_block=True, hidden_sizes=[14], depths=[3], num_labels=2),
}
IMAGES = [(2, 3, 64, 64), (1, 3, 45, 37)]


def randomize(model, seed):
    """Every parameter and BN statistic random: BN gains 1 +- 0.2, biases N(0, 0.1^2),
    running means N(0, 0.2^2), running variances in [0.5, 1.5], LAB scales in
    [0.5, 1.5] and biases N(0, 0.3^2) (far from the identity 1, 0), conv and linear
    weights N(0, 2 / fan_in) (He: ReLU halves the signal at each conv)."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in sorted(model.named_parameters()):
            if name.endswith("lab.scale"):
                p.copy_(0.5 + torch.rand(p.shape, generator=gen))
            elif name.endswith("lab.bias"):
                p.copy_(0.3 * torch.randn(p.shape, generator=gen))
            elif p.ndim == 1 and name.endswith(".bias"):
                p.copy_(0.1 * torch.randn(p.shape, generator=gen))
            elif p.ndim == 1:
                p.copy_(1.0 + 0.2 * torch.randn(p.shape, generator=gen))
            else:
                fan_in = int(np.prod(p.shape[1:]))
                p.copy_(torch.randn(p.shape, generator=gen) * (2.0 / fan_in) ** 0.5)
        for name, b in sorted(model.named_buffers()):
            if name.endswith("running_mean"):
                b.copy_(0.2 * torch.randn(b.shape, generator=gen))
            elif name.endswith("running_var"):
                b.copy_(0.5 + torch.rand(b.shape, generator=gen))
    return model.eval()


def make(config, seed=0, cls="HGNetV2ForImageClassification"):
    torch.manual_seed(seed)
    cfg = transformers.HGNetV2Config(**config)
    return randomize(getattr(transformers, cls)(cfg), seed)


def images(shape, seed):
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


@pytest.fixture(scope="module", params=sorted(CASES))
def case(request, tmp_path_factory):
    name = request.param
    model = make(CASES[name], seed=sorted(CASES).index(name))
    path = tmp_path_factory.mktemp(f"hgnet_v2_{name}")
    model.save_pretrained(str(path))
    refs = []
    for k, shape in enumerate(IMAGES):
        x = images(shape, k + 1)
        with torch.no_grad():
            out = model(pixel_values=torch.from_numpy(x), output_hidden_states=True)
        refs.append((x, out.logits.numpy(), out.hidden_states[-1].numpy()))
    return name, model, path, refs


@pytest.fixture(scope="module")
def loaded(case):
    name, model, path, refs = case
    return md.load_model(SPEC, str(path))


def test_params_from_config(case, loaded):
    name, model, path, refs = case
    cfg, p = model.config, loaded.params
    for key in ("stem_channels", "stem_strides", "stage_in_channels", "stage_mid_channels",
                "stage_out_channels", "stage_num_blocks", "stage_downsample",
                "stage_downsample_strides", "stage_light_block", "stage_kernel_size",
                "stage_numb_of_layers"):
        assert list(p[key]) == list(getattr(cfg, key)), key
    assert p["use_lab"] == cfg.use_learnable_affine_block
    assert p["hidden_act"] == cfg.hidden_act
    assert p["n_classes"] == cfg.num_labels
    assert p["n_stages"] == len(cfg.stage_in_channels)


@pytest.mark.parametrize("size", range(len(IMAGES)), ids=["64x64", "45x37"])
def test_logits_match_transformers(case, loaded, size):
    name, model, path, refs = case
    x, ref_logits, ref_hidden = refs[size]
    out = dict(zip(loaded.output_names, loaded(x)))
    logits, hidden = out["logits"], out["last_hidden_state"]
    assert loaded.output_names[0] == "logits"
    assert logits.shape == ref_logits.shape == (x.shape[0], model.config.num_labels)
    assert hidden.shape == ref_hidden.shape
    e_logits, e_hidden = rel_err(logits, ref_logits), rel_err(hidden, ref_hidden)
    print(f"hgnet_v2 {name} {x.shape}: logits {e_logits:.2e} of max|ref| "
          f"({np.abs(ref_logits).max():.2f}), last hidden state {e_hidden:.2e}")
    assert e_logits <= TOL
    assert e_hidden <= TOL


def test_lab_and_light_blocks_are_read(case, loaded):
    """Negative controls: the logits move when the LAB scales are set to 1 (where the
    config has LAB), and when a light block's depthwise filter is zeroed, so the match
    above depends on both."""
    name, model, path, refs = case
    x, ref_logits, _ = refs[0]
    cfg = model.config
    td = md.load_weights(str(path), spec=SPEC)
    names = list(td.keys())
    labs = [k for k in names if k.endswith("lab.scale")]
    if cfg.use_learnable_affine_block:
        assert labs
        t2 = md.load_weights(str(path), spec=SPEC)
        for k in labs:
            t2[k] = np.ones_like(np.asarray(t2[k]))
        (logits, _) = md.load_model(SPEC, t2)(x)
        assert rel_err(logits, ref_logits) > 1e-3
    else:
        assert labs == []
    light = [k for k in names if k.endswith("conv2.convolution.weight")]
    assert bool(light) == any(cfg.stage_light_block)
    if light:
        t3 = md.load_weights(str(path), spec=SPEC)
        t3[light[0]] = np.zeros_like(np.asarray(t3[light[0]]))
        (logits, _) = md.load_model(SPEC, t3)(x)
        assert rel_err(logits, ref_logits) > 1e-3


def test_backbone_checkpoint(tmp_path):
    """An HGNetV2Backbone checkpoint (no classifier): `logits` are the pooled features
    and `last_hidden_state` the last stage's map, its feature_maps[-1]."""
    model = make(CASES["tiny_lab_light"], seed=5, cls="HGNetV2Backbone")
    model.save_pretrained(str(tmp_path))
    x = images(IMAGES[1], 9)
    with torch.no_grad():
        fmap = model(pixel_values=torch.from_numpy(x)).feature_maps[-1].numpy()
    m = md.load_model(SPEC, str(tmp_path))
    assert m.params["n_classes"] == 0
    out = dict(zip(m.output_names, m(x)))
    assert rel_err(out["last_hidden_state"], fmap) <= TOL
    assert rel_err(out["logits"], fmap.mean(axis=(2, 3))) <= TOL


def test_refuses_mismatched_head(tmp_path):
    cfg = dict(CASES["one_stage"], hidden_sizes=[20])
    torch.manual_seed(0)
    model = transformers.HGNetV2ForImageClassification(transformers.HGNetV2Config(**cfg))
    model.save_pretrained(str(tmp_path))
    with pytest.raises(md.WeightsError, match="hidden_sizes"):
        md.load_weights(str(tmp_path), spec=SPEC)
