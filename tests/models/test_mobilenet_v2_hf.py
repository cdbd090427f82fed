"""specs/mobilenet_v2.yaml against transformers' MobileNetV2ForImageClassification.

Seeded small float32 models saved with ``save_pretrained`` (safetensors + config.json),
in eval mode, with every parameter and buffer random: conv filters N(0, 1 / fan_in),
BatchNorm gains ``1.25 * (1 + 0.3 N(0, 1))`` (large enough that ReLU6 clips: a few
percent of the pre-activations exceed 6), biases ``0.5 N(0, 1)``, running means
``0.2 N(0, 1)`` and running variances uniform in [0.5, 2]. Sizes come from config.json,
not the variant. The cases cover TensorFlow "SAME" padding (asymmetric for even sizes,
symmetric for odd ones) and PyTorch padding, the stem's optional 1x1 expansion,
``output_stride`` 16 and 8 (dilated depthwise convs), ``finegrained_output``, other
``depth_multiplier`` / ``depth_divisible_by`` / ``min_depth`` / ``expand_ratio`` roundings,
another BatchNorm eps and activation, and a headless model (``num_labels`` 0).
"""

import json

import numpy as np
import pytest

import maxdecl as md
from modelhelp import TOL, rel_err, spec_path

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

SPEC = spec_path("mobilenet_v2")

CASES = {
    # the spec's tiny variant: TF padding, 1280 fine-grained output channels
    "tf_padding": dict(config=dict(depth_multiplier=0.35, num_labels=10),
                       images=[(2, 3, 32, 32), (2, 3, 33, 45)]),
    # PyTorch padding, stem expansion, dilation from layer 6 on, scaled last conv
    "torch_padding": dict(config=dict(depth_multiplier=0.5, expand_ratio=4.0, output_stride=16,
                                      first_layer_is_expansion=False, finegrained_output=False,
                                      tf_padding=False, num_labels=7, layer_norm_eps=1e-5),
                          images=[(2, 3, 35, 32)]),
    # TF padding with dilation from layer 3 on; other rounding rules
    "dilated_tf": dict(config=dict(depth_multiplier=0.75, depth_divisible_by=4, min_depth=16,
                                   expand_ratio=3.0, output_stride=8, num_labels=3),
                       images=[(1, 3, 30, 31), (1, 3, 24, 24)]),
    # another activation, and no classifier: the logits are the pooled features
    "headless_relu": dict(config=dict(depth_multiplier=0.35, hidden_act="relu", num_labels=0),
                          images=[(2, 3, 32, 32)]),
}


def randomize(model, seed):
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in sorted(model.state_dict().items()):
            if name.endswith("num_batches_tracked"):
                continue
            if name.endswith("running_mean"):
                p.copy_(0.2 * torch.randn(p.shape, generator=gen))
            elif name.endswith("running_var"):
                p.copy_(0.5 + 1.5 * torch.rand(p.shape, generator=gen))
            elif name.endswith(".bias"):
                p.copy_(0.5 * torch.randn(p.shape, generator=gen))
            elif p.ndim == 1:
                p.copy_(1.25 * (1.0 + 0.3 * torch.randn(p.shape, generator=gen)))
            else:
                fan_in = int(np.prod(p.shape[1:]))
                p.copy_(torch.randn(p.shape, generator=gen) / fan_in ** 0.5)
    return model.eval()


def make_mobilenet_v2(config, seed=0):
    torch.manual_seed(seed)
    cfg = transformers.MobileNetV2Config(**config)
    return randomize(transformers.MobileNetV2ForImageClassification(cfg), seed)


@pytest.fixture(scope="module", params=sorted(CASES))
def case(request, tmp_path_factory):
    c = CASES[request.param]
    model = make_mobilenet_v2(c["config"])
    path = tmp_path_factory.mktemp(f"mobilenet_v2_{request.param}")
    model.save_pretrained(str(path))
    rng = np.random.default_rng(1)
    batches = []
    for shape in c["images"]:
        x = rng.standard_normal(shape).astype(np.float32)
        with torch.no_grad():
            ref = model(pixel_values=torch.from_numpy(x)).logits.numpy()
        batches.append((x, ref))
    return request.param, model, str(path), batches


def test_logits_match_transformers(case):
    name, model, path, batches = case
    m = md.load_model(SPEC, path)
    cfg = model.config
    assert m.params["depth_multiplier"] == cfg.depth_multiplier
    assert m.params["tf_padding"] == cfg.tf_padding
    assert m.params["output_stride"] == cfg.output_stride
    assert m.params["n_classes"] == cfg.num_labels
    assert m.params["norm_eps"] == cfg.layer_norm_eps
    assert m.params["out_ch"] == model.mobilenet_v2.conv_1x1.convolution.out_channels
    assert m.params["ch"][0] == model.mobilenet_v2.conv_stem.reduce_1x1.convolution.out_channels
    assert m.params["ch"][1:] == [blk.reduce_1x1.convolution.out_channels
                                  for blk in model.mobilenet_v2.layer]
    n_ref = sum(int(np.prod(t.shape)) for k, t in model.state_dict().items()
                if not k.endswith("num_batches_tracked"))
    assert sum(int(np.prod(np.asarray(m.weights[k]).shape)) for k in m.weights.keys()) == n_ref
    for x, ref in batches:
        (logits,) = m(x)
        assert logits.shape == ref.shape
        err = rel_err(logits, ref)
        print(f"mobilenet_v2 {name} {x.shape} vs HF: {err:.2e} of max|ref| ({np.abs(ref).max():.2f})")
        assert err <= TOL
        assert err < 1e-5                       # float32 throughout: much tighter than TOL


def _logits_with(path, x, **metadata):
    td = md.load_weights(path)
    td.metadata.update(metadata)
    (logits,) = md.load_model(SPEC, td)(x)
    return logits


def test_switches_matter(case):
    """Negative controls: the comparison above depends on the padding rule, on ReLU6's
    clipping and on the BatchNorm running statistics."""
    name, model, path, batches = case
    x, ref = batches[0]
    if model.config.tf_padding:                 # symmetric padding instead of TF's SAME
        assert rel_err(_logits_with(path, x, tf_padding=False), ref) > 1e-2
    if model.config.hidden_act == "relu6":      # no clipping at 6
        assert rel_err(_logits_with(path, x, hidden_act="relu"), ref) > 1e-2
    td = md.load_weights(path, spec=SPEC)
    for k in td.keys():
        if k.endswith("running_var"):
            td[k] = np.ones_like(np.asarray(td[k]))
    (logits,) = md.load_model(SPEC, td)(x)
    assert rel_err(logits, ref) > 1e-2


def test_refuses_unmodelled_activation(tmp_path):
    model = make_mobilenet_v2(dict(depth_multiplier=0.35, num_labels=2, hidden_act="hardswish"))
    model.save_pretrained(str(tmp_path))
    assert json.loads((tmp_path / "config.json").read_text())["hidden_act"] == "hardswish"
    with pytest.raises(md.WeightsError, match="hidden_act hardswish is not modelled"):
        md.load_weights(str(tmp_path), spec=SPEC)
