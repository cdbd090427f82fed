"""specs/mobilevitv2.yaml against transformers' MobileViTV2ForImageClassification and
MobileViTV2Model.

Seeded small float32 models saved with ``save_pretrained`` (safetensors + config.json),
in eval mode, every parameter and buffer random (conv filters N(0, 1 / fan_in), norm
gains near 1, biases 0.3 N(0, 1), BatchNorm running means 0.2 N(0, 1) and variances in
[0.5, 2]). Sizes come from config.json, not the variant. The cases cover three width
multipliers (a residual first stage where ch0 == ch1, and one without), patch sizes 2
and 3, images whose feature maps are not whole multiples of the patch (F.unfold drops
the rest, F.fold gives zeros there), output_stride 8 and 16 (dilated stages), another
kernel size, activation, expand ratio, FFN multiplier and GroupNorm eps, an nn.Identity
head (``num_labels`` 0) and a headless MobileViTV2Model.
"""

import numpy as np
import pytest

import maxdecl as md
from modelhelp import rel_err, spec_path

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

SPEC = spec_path("mobilevitv2")
TOL = 1e-4          # max|ours - ref| <= TOL * max|ref|

CASES = {
    # the spec's tiny variant; 72 x 56 gives 9 x 7 maps in stage 3 (patch 2: a row and a
    # column past the last whole patch)
    "tiny": dict(config=dict(width_multiplier=0.25, n_attn_blocks=[1, 2, 1], num_labels=10),
                 images=[(2, 3, 64, 64), (2, 3, 72, 56)]),
    # wider, output_stride 8 (stages 4 and 5 undilated / dilated 2), 5x5 local convs,
    # GELU, other expansion and FFN ratios, an nn.Identity classifier
    "dilated_identity_head": dict(
        config=dict(width_multiplier=0.5, n_attn_blocks=[1, 1, 2], output_stride=8,
                    conv_kernel_size=5, hidden_act="gelu", expand_ratio=3.0, ffn_multiplier=3,
                    layer_norm_eps=1e-6, num_labels=0),
        images=[(2, 3, 48, 40)]),
    # MobileViTV2Model without a head: 3x3 patches, output_stride 16
    "base_patch3": dict(
        config=dict(width_multiplier=0.75, n_attn_blocks=[2, 1, 1], output_stride=16,
                    patch_size=3, base_attn_unit_dims=[64, 96, 128]),
        images=[(2, 3, 96, 80)], base=True),
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
                p.copy_(0.3 * torch.randn(p.shape, generator=gen))
            elif p.ndim == 1:
                p.copy_(1.0 + 0.2 * torch.randn(p.shape, generator=gen))
            else:
                fan_in = int(np.prod(p.shape[1:]))
                p.copy_(torch.randn(p.shape, generator=gen) / fan_in ** 0.5)
    return model.eval()


def make(config, base=False, seed=0):
    torch.manual_seed(seed)
    cfg = transformers.MobileViTV2Config(**config)
    cls = transformers.MobileViTV2Model if base else transformers.MobileViTV2ForImageClassification
    return randomize(cls(cfg), seed)


def hf_outputs(model, x, base):
    with torch.no_grad():
        px = torch.from_numpy(x)
        if base:
            out = model(pixel_values=px)
            return {"last_hidden_state": out.last_hidden_state.numpy(),
                    "pooler_output": out.pooler_output.numpy()}
        inner = model.mobilevitv2(pixel_values=px)
        return {"logits": model(pixel_values=px).logits.numpy(),
                "last_hidden_state": inner.last_hidden_state.numpy(),
                "pooler_output": inner.pooler_output.numpy()}


@pytest.fixture(scope="module", params=sorted(CASES))
def case(request, tmp_path_factory):
    c = CASES[request.param]
    base = c.get("base", False)
    model = make(c["config"], base)
    path = tmp_path_factory.mktemp(f"mobilevitv2_{request.param}")
    model.save_pretrained(str(path))
    rng = np.random.default_rng(1)
    batches = []
    for shape in c["images"]:
        x = rng.standard_normal(shape).astype(np.float32)
        batches.append((x, hf_outputs(model, x, base)))
    m = md.load_model(SPEC, str(path))
    return request.param, model, m, str(path), batches, base


def test_params_from_config(case):
    name, model, m, path, batches, base = case
    cfg = model.config
    assert m.params["width_multiplier"] == cfg.width_multiplier
    assert list(m.params["n_attn_blocks"]) == list(cfg.n_attn_blocks)
    assert m.params["patch_size"] == cfg.patch_size
    assert m.params["output_stride"] == cfg.output_stride
    assert m.params["is_base"] == base
    core = model if base else model.mobilevitv2
    enc = core.encoder.layer
    assert m.params["ch"][0] == core.conv_stem.convolution.out_channels
    assert m.params["ch"][1] == enc[0].layer[0].reduce_1x1.convolution.out_channels
    assert m.params["ch"][2] == enc[1].layer[1].reduce_1x1.convolution.out_channels
    for s in range(3):
        stage = enc[2 + s]
        assert m.params["ch"][3 + s] == stage.conv_projection.convolution.out_channels
        assert m.params["adim"][s] == stage.conv_1x1.convolution.out_channels
        assert m.params["ffn"][s] == stage.transformer.layer[0].ffn.conv1.convolution.out_channels
    if not base:
        assert m.params["n_classes"] == cfg.num_labels
    # every checkpoint tensor but BatchNorm's counters is bound, none twice
    n_ref = sum(int(np.prod(t.shape)) for k, t in model.state_dict().items()
                if not k.endswith("num_batches_tracked"))
    assert sum(int(np.prod(np.asarray(m.weights[k]).shape)) for k in m.weights.keys()) == n_ref


def test_outputs_match_transformers(case):
    name, model, m, path, batches, base = case
    want = ["last_hidden_state", "pooler_output"] if base else \
        ["logits", "last_hidden_state", "pooler_output"]
    assert list(m.output_names) == want
    for x, ref in batches:
        got = dict(zip(m.output_names, m(x)))
        for k in want:
            assert got[k].shape == ref[k].shape, (k, got[k].shape, ref[k].shape)
            err = rel_err(got[k], ref[k])
            print(f"mobilevitv2 {name} {x.shape} {k}: {err:.2e} of max|ref| "
                  f"({np.abs(ref[k]).max():.2f})")
            assert err <= TOL, (k, err)
            assert err < 1e-5, (k, err)         # float32 throughout: much tighter than TOL


def _run_with(path, x, edit):
    td = md.load_weights(path, spec=SPEC)
    edit(td)
    model = md.load_model(SPEC, td)
    return dict(zip(model.output_names, model(x)))


def test_attention_and_patches_matter(case):
    """Negative controls: the comparison depends on the separable attention's context
    scores (a query row of zeros makes the softmax over the patches uniform) and on the
    last stage's patch GroupNorm."""
    name, model, m, path, batches, base = case
    x, ref = batches[-1]

    def flat_query(td):
        for k in list(td.keys()):
            if k.endswith("attention.qkv_proj.convolution.weight"):
                w = np.array(td[k])
                w[0] = 0.0
                td[k] = w
            if k.endswith("attention.qkv_proj.convolution.bias"):
                b = np.array(td[k])
                b[0] = 0.0
                td[k] = b

    def unit_norm(td):
        td["encoder.layer.4.layernorm.weight"] = np.ones_like(
            np.asarray(td["encoder.layer.4.layernorm.weight"]))

    for edit in (flat_query, unit_norm):
        got = _run_with(path, x, edit)
        assert rel_err(got["pooler_output"], ref["pooler_output"]) > 1e-2, edit.__name__
