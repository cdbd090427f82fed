"""specs/mobilevit.yaml against transformers' MobileViTForImageClassification / MobileViTModel.

Seeded small float32 models saved with ``save_pretrained`` (safetensors + config.json),
in eval mode, with every parameter and buffer random: conv filters and linear weights
N(0, 1 / fan_in), BatchNorm and LayerNorm gains ``1 + 0.2 N(0, 1)``, biases
``0.3 N(0, 1)``; BatchNorm running statistics measured on random images, then means moved
by ``0.2 N(0, 1)`` standard deviations and variances scaled by U(0.5, 2) (so they matter,
and the output still depends on the image after five stages). Sizes come from config.json,
not the variant. The cases cover two patch sizes (2 and 3), images whose MobileViT
feature maps divide into whole patches and images that need transformers' bilinear
resize to a multiple of the patch size (odd and non-square maps, a 1x1 map), expand
ratios 2, 2.5 and 3 (make_divisible rounding), mlp_ratio 1.5, a 5x5 conv_kernel_size,
qkv_bias off, GELU, another LayerNorm eps, output_stride 8 and 16 (dilated downsampling
convs), and a bare ``MobileViTModel`` checkpoint (no ``mobilevit.`` prefix, no head: the
logits are the pooled features). Negative controls: a perturbed weight, BatchNorm
statistics reset, and the spec with nearest instead of bilinear patch resizes.
"""

import json

import numpy as np
import pytest

import maxdecl as md
from modelhelp import TOL, rel_err, spec_path

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

SPEC = spec_path("mobilevit")

CASES = {
    # the spec's tiny variant; 64x64: maps 8, 4, 2 at the MobileViT blocks (whole patches);
    # 48x40: maps 6x5 and 3x3 (resized to 6x6, 4x4), then 2x2; 32x32: the last map is 1x1
    # (resized to 2x2)
    "p2": dict(cls="MobileViTForImageClassification",
               config=dict(hidden_sizes=[16, 24, 32], neck_hidden_sizes=[8, 8, 16, 16, 24, 24, 32],
                           num_attention_heads=2, expand_ratio=2.0, num_labels=5, image_size=64),
               images=[(2, 3, 64, 64), (1, 3, 48, 40), (1, 3, 32, 32)]),
    # patch 3, output_stride 8 (layer 4 and 5 dilated), 5x5 local and fusion convs, no qkv
    # bias, GELU, mlp_ratio 1.5, expand_ratio 3; 72x72: maps 9, 9, 9 (whole patches);
    # 54x60: maps 7x8 (resized to 9x9)
    "p3_os8": dict(cls="MobileViTForImageClassification",
                   config=dict(hidden_sizes=[24, 30, 36], neck_hidden_sizes=[16, 16, 24, 32, 40, 48, 64],
                               num_attention_heads=3, expand_ratio=3.0, mlp_ratio=1.5, patch_size=3,
                               conv_kernel_size=5, output_stride=8, qkv_bias=False, hidden_act="gelu",
                               layer_norm_eps=1e-6, num_labels=4, image_size=72),
                   images=[(1, 3, 72, 72), (2, 3, 54, 60)]),
    # a bare MobileViTModel (no prefix, no head), output_stride 16, expand_ratio 2.5;
    # 64x64: maps 8, 4, 4; 44x52: maps 6x7, 3x4, 3x4 (resized)
    "model_os16": dict(cls="MobileViTModel",
                       config=dict(hidden_sizes=[16, 20, 24], neck_hidden_sizes=[8, 16, 16, 24, 24, 32, 48],
                                   num_attention_heads=4, expand_ratio=2.5, output_stride=16,
                                   image_size=64),
                       images=[(2, 3, 64, 64), (1, 3, 44, 52)]),
}


def randomize(model, seed):
    """Random parameters; BatchNorm statistics measured on random images (so every layer
    sees O(1) activations and the output still depends on the image after five stages),
    then moved off them (means by 0.2 std, variances times 0.5 .. 2) so they matter."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in sorted(model.named_parameters()):
            if name.endswith(".bias"):
                p.copy_(0.3 * torch.randn(p.shape, generator=gen))
            elif p.ndim == 1:
                p.copy_(1.0 + 0.2 * torch.randn(p.shape, generator=gen))
            else:
                fan_in = int(np.prod(p.shape[1:]))
                p.copy_(torch.randn(p.shape, generator=gen) / fan_in ** 0.5)
        bns = [mod for mod in model.modules() if isinstance(mod, torch.nn.BatchNorm2d)]
        for bn in bns:
            bn.reset_running_stats()
            bn.momentum = 1.0                   # running stats = this batch's
        size = model.config.image_size
        model.train()
        model(pixel_values=torch.randn((4, model.config.num_channels, size, size), generator=gen))
        for bn in bns:
            std = bn.running_var.sqrt()
            bn.running_mean.add_(0.2 * std * torch.randn(std.shape, generator=gen))
            bn.running_var.mul_(0.5 + 1.5 * torch.rand(std.shape, generator=gen))
    return model.eval()


def make_mobilevit(cls, config, seed=0):
    torch.manual_seed(seed)
    cfg = transformers.MobileViTConfig(**config, hidden_dropout_prob=0.0, classifier_dropout_prob=0.0)
    return randomize(getattr(transformers, cls)(cfg), seed)


def hf_outputs(model, x) -> dict:
    """logits, pooler_output, last_hidden_state (NCHW) as the spec's outputs."""
    with torch.no_grad():
        if isinstance(model, transformers.MobileViTModel):
            out = model(pixel_values=torch.from_numpy(x))
            base, logits = out, out.pooler_output.numpy()
        else:
            logits = model(pixel_values=torch.from_numpy(x)).logits.numpy()
            base = model.mobilevit(pixel_values=torch.from_numpy(x))
    return {"logits": logits, "pooler_output": base.pooler_output.numpy(),
            "last_hidden_state": base.last_hidden_state.numpy()}


def named(model, x) -> dict:
    return dict(zip(model.output_names, model(x)))


@pytest.fixture(scope="module", params=sorted(CASES))
def case(request, tmp_path_factory):
    c = CASES[request.param]
    model = make_mobilevit(c["cls"], c["config"])
    path = tmp_path_factory.mktemp(f"mobilevit_{request.param}")
    model.save_pretrained(str(path))
    rng = np.random.default_rng(1)
    batches = []
    for shape in c["images"]:
        x = rng.standard_normal(shape).astype(np.float32)
        batches.append((x, hf_outputs(model, x)))
    return request.param, model, str(path), batches


def test_outputs_match_transformers(case):
    name, model, path, batches = case
    m = md.load_model(SPEC, path)
    cfg = model.config
    base = model if isinstance(model, transformers.MobileViTModel) else model.mobilevit
    assert m.params["hidden_sizes"] == list(cfg.hidden_sizes)
    assert m.params["neck_hidden_sizes"] == list(cfg.neck_hidden_sizes)
    assert m.params["patch"] == cfg.patch_size
    assert m.params["n_heads"] == cfg.num_attention_heads
    assert m.params["output_stride"] == cfg.output_stride
    assert m.params["qkv_bias"] == cfg.qkv_bias
    assert m.params["norm_eps"] == cfg.layer_norm_eps
    assert m.params["n_classes"] == (0 if base is model else cfg.num_labels)
    enc = base.encoder.layer
    expanded = [enc[0].layer[0].expand_1x1.convolution.out_channels,
                enc[1].layer[0].expand_1x1.convolution.out_channels,
                enc[1].layer[1].expand_1x1.convolution.out_channels] + [
                enc[k].downsampling_layer.expand_1x1.convolution.out_channels for k in (2, 3, 4)]
    e = m.params["ech"]                 # expanded widths, by input width neck[0..4]
    assert [e[0], e[1], e[2], e[2], e[3], e[4]] == expanded
    n_ref = sum(int(np.prod(t.shape)) for k, t in model.state_dict().items()
                if not k.endswith("num_batches_tracked"))
    assert sum(int(np.prod(np.asarray(m.weights[k]).shape)) for k in m.weights.keys()) == n_ref
    assert m.output_names[:3] == ["logits", "pooler_output", "last_hidden_state"]
    for x, ref in batches:
        got = named(m, x)
        errs = {k: rel_err(got[k], ref[k]) for k in ref}
        print(f"mobilevit {name} {x.shape} vs HF: " + ", ".join(f"{k} {e:.2e}" for k, e in errs.items()))
        assert all(e <= TOL for e in errs.values())
        assert all(e < 1e-5 for e in errs.values())   # float32 throughout: much tighter than TOL


def test_negative_controls(case):
    """The comparison can fail: a perturbed transformer weight, BatchNorm running
    variances reset to ones each move the outputs far past TOL."""
    name, model, path, batches = case
    x, ref = batches[0]
    key = "encoder.layer.3.transformer.layer.1.attention.attention.value.weight"
    td = md.load_weights(path, spec=SPEC)
    w = np.asarray(td[key])                 # noise as large as the weight itself
    td[key] = w + np.random.default_rng(3).standard_normal(w.shape).astype(w.dtype) * w.std()
    assert rel_err(named(md.load_model(SPEC, td), x)["last_hidden_state"],
                   ref["last_hidden_state"]) > 1e-2

    td = md.load_weights(path, spec=SPEC)
    for k in td.keys():
        if k.endswith("running_var"):
            td[k] = np.ones_like(np.asarray(td[k]))
    assert rel_err(named(md.load_model(SPEC, td), x)["last_hidden_state"],
                   ref["last_hidden_state"]) > 1e-2


@pytest.fixture(scope="module")
def nearest_spec(tmp_path_factory):
    """The spec with its patch resizes nearest instead of bilinear."""
    text = open(SPEC).read()
    assert text.count("mode: linear, align_corners: false") == 2
    path = tmp_path_factory.mktemp("mobilevit_nearest") / "mobilevit_nearest.yaml"
    path.write_text(text.replace("mode: linear, align_corners: false", "mode: nearest"))
    return str(path)


def test_resize_to_whole_patches_matters(case, nearest_spec):
    """The images whose feature maps need transformers' resize are the ones a wrong
    resize mode breaks; on whole patches the resize is the identity either way."""
    name, model, path, batches = case
    m = md.load_model(nearest_spec, path)
    whole, resized = batches[0], batches[1]
    x, ref = whole
    assert rel_err(named(m, x)["last_hidden_state"], ref["last_hidden_state"]) < 1e-5
    x, ref = resized
    assert rel_err(named(m, x)["last_hidden_state"], ref["last_hidden_state"]) > 1e-2


def test_refuses_segmentation_checkpoint(tmp_path):
    model = make_mobilevit("MobileViTForSemanticSegmentation",
                           dict(hidden_sizes=[16, 24, 32], neck_hidden_sizes=[8, 8, 16, 16, 24, 24, 32],
                                num_attention_heads=2, expand_ratio=2.0, num_labels=3,
                                aspp_out_channels=16))
    model.save_pretrained(str(tmp_path))
    cfg = json.loads((tmp_path / "config.json").read_text())
    assert cfg["architectures"] == ["MobileViTForSemanticSegmentation"]
    with pytest.raises(md.WeightsError, match="MobileViTForSemanticSegmentation"):
        md.load_weights(str(tmp_path), spec=SPEC)
    # the other refusals, on the same folder read as a classifier's
    for metadata, why in [(dict(patch_size=[2, 2]), "patch_size \\[2, 2\\] must be one int"),
                          (dict(num_attention_heads=5), "must be multiples of num_attention_heads 5"),
                          (dict(hidden_act="hardswish"), "hidden_act hardswish is not modelled")]:
        td = md.load_weights(str(tmp_path))
        td.metadata.update(architectures=["MobileViTForImageClassification"], **metadata)
        with pytest.raises(md.WeightsError, match=why):
            md.load_model(SPEC, td)
