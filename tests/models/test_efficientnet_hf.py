"""specs/efficientnet.yaml against transformers' EfficientNetForImageClassification and
EfficientNetModel.

Seeded small float32 models saved with ``save_pretrained`` (safetensors + config.json),
in eval mode, with every parameter and buffer random: conv filters N(0, 1 / fan_in),
BatchNorm gains ``1.5 (1 + 0.2 N(0, 1))``, biases ``0.1 N(0, 1)``, running means
``0.1 N(0, 1)`` and running variances uniform in [0.5, 2]; images N(0, 1) plus an
N(0, 1) offset per image and channel. (With gains near 1 and larger biases the signal
fades through the SE gates and BatchNorms: the pooled features of two random images then
differ by 0.1% of their size, and a 1e-3 comparison would test little; with these the
outputs of two images differ by 30-300%.) Sizes come from config.json, not the variant. The cases cover round_filters (including its "+ divisor" correction),
round_repeats (ceil of depth_coefficient), stages with and without expansion, a stride-2
first stage without expansion, kernel sizes 3, 4 (even: torch's asymmetric "same"), 5,
stride-2 depthwise padding both adjusted (bottom/right heavy) and symmetric
(``depthwise_padding``), another SE ratio, BatchNorm eps and activation, max pooling, odd
and non-square image sizes, a headless model (``num_labels`` 0) and a bare
``EfficientNetModel`` checkpoint (no ``efficientnet.`` prefix, no head).
"""

import json

import numpy as np
import pytest

import maxdecl as md
from modelhelp import TOL, rel_err, spec_path

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

SPEC = spec_path("efficientnet")

# torch's own note on padding="same" with an even kernel (the alt_headless case)
pytestmark = pytest.mark.filterwarnings("ignore:Using padding='same' with even kernel:UserWarning")

CASES = {
    # the spec's tiny variant: swish, mean pooling, widths rf = 8, 4, 8 (4.8 -> 4 -> +4), 8, 16,
    # depth 0.7 -> blocks [1, 2, 2, 3] (residuals in stages 1-3), 7 labels
    "tiny": dict(config=dict(width_coefficient=0.2, depth_coefficient=0.7, depth_divisor=4,
                             kernel_sizes=[3, 3, 5, 3], in_channels=[32, 16, 24, 40],
                             out_channels=[16, 24, 40, 80], strides=[1, 2, 2, 2],
                             num_block_repeats=[1, 2, 2, 3], expand_ratios=[1, 6, 6, 6],
                             hidden_dim=256, image_size=32, num_labels=7),
                 images=[(2, 3, 32, 32), (1, 3, 33, 45)]),
    # stride-2 first stage without expansion, even kernel, symmetric stride-2 padding for
    # block 0 and adjusted for block 3, SE ratio 0.5, gelu, max pooling, eps 1e-5, no classifier
    "alt_headless": dict(config=dict(width_coefficient=0.3, depth_coefficient=1.0, depth_divisor=8,
                                     kernel_sizes=[5, 4, 3], in_channels=[32, 16, 24],
                                     out_channels=[16, 24, 40], strides=[2, 1, 2],
                                     num_block_repeats=[2, 1, 2], expand_ratios=[1, 3, 4],
                                     depthwise_padding=[0], squeeze_expansion_ratio=0.5,
                                     hidden_act="gelu", pooling_type="max", batch_norm_eps=1e-5,
                                     hidden_dim=384, image_size=40, num_labels=0),
                         images=[(2, 3, 40, 40), (1, 3, 37, 30)]),
}


def randomize(model, seed):
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in sorted(model.state_dict().items()):
            if name.endswith("num_batches_tracked"):
                continue
            if name.endswith("running_mean"):
                p.copy_(0.1 * torch.randn(p.shape, generator=gen))
            elif name.endswith("running_var"):
                p.copy_(0.5 + 1.5 * torch.rand(p.shape, generator=gen))
            elif name.endswith(".bias"):
                p.copy_(0.1 * torch.randn(p.shape, generator=gen))
            elif p.ndim == 1:
                p.copy_(1.5 * (1.0 + 0.2 * torch.randn(p.shape, generator=gen)))
            else:
                fan_in = int(np.prod(p.shape[1:]))
                p.copy_(torch.randn(p.shape, generator=gen) / fan_in ** 0.5)
    return model.eval()


def make_efficientnet(config, seed=0, cls="EfficientNetForImageClassification"):
    torch.manual_seed(seed)
    cfg = transformers.EfficientNetConfig(**config)
    return randomize(getattr(transformers, cls)(cfg), seed)


def images(rng, shape):
    """N(0, 1) pixels plus an N(0, 1) offset per image and channel (float32 NCHW)."""
    return (rng.standard_normal(shape) + rng.standard_normal(shape[:2] + (1, 1))).astype(np.float32)


def reference(model, x):
    """(logits, pooled features, last hidden state NCHW) of transformers."""
    with torch.no_grad():
        px = torch.from_numpy(x)
        base = model if isinstance(model, transformers.EfficientNetModel) else model.efficientnet
        out = base(px)
        logits = model(pixel_values=px).logits if base is not model else out.pooler_output
    return logits.numpy(), out.pooler_output.numpy(), out.last_hidden_state.numpy()


@pytest.fixture(scope="module", params=sorted(CASES))
def case(request, tmp_path_factory):
    c = CASES[request.param]
    model = make_efficientnet(c["config"])
    path = tmp_path_factory.mktemp(f"efficientnet_{request.param}")
    model.save_pretrained(str(path))
    rng = np.random.default_rng(1)
    batches = []
    for shape in c["images"]:
        x = images(rng, shape)
        batches.append((x, *reference(model, x)))
    return request.param, model, str(path), batches


def test_outputs_match_transformers(case):
    name, model, path, batches = case
    m = md.load_model(SPEC, path)
    cfg = model.config
    for key in ("width_coefficient", "depth_coefficient", "depth_divisor", "hidden_dim",
                "squeeze_expansion_ratio", "pooling_type", "hidden_act"):
        assert m.params[key] == getattr(cfg, key), key
    assert m.params["kernel_sizes"] == list(cfg.kernel_sizes)
    assert m.params["depthwise_padding"] == list(cfg.depthwise_padding)
    assert m.params["norm_eps"] == cfg.batch_norm_eps
    assert m.params["n_classes"] == cfg.num_labels
    enc = model.efficientnet.encoder
    assert m.params["n_blocks"] == len(enc.blocks)
    assert m.params["stem_ch"] == model.efficientnet.embeddings.convolution.out_channels
    assert m.params["b_out"] == [blk.projection.project_conv.out_channels for blk in enc.blocks]
    assert m.params["b_se"] == [blk.squeeze_excite.dim_se for blk in enc.blocks]
    assert m.params["top_ch"] == enc.top_conv.out_channels
    assert m.output_names[:3] == ["logits", "pooler_output", "last_hidden_state"]
    n_ref = sum(int(np.prod(t.shape)) for k, t in model.state_dict().items()
                if not k.endswith("num_batches_tracked"))
    assert sum(int(np.prod(np.asarray(m.weights[k]).shape)) for k in m.weights.keys()) == n_ref
    n_res = sum(1 for nd in m.graph.nodes if nd.op == "add" and "projection" in nd.layer)
    assert n_res == sum(blk.projection.apply_dropout for blk in enc.blocks) > 0
    for x, ref, ref_pooled, ref_hidden in batches:
        logits, pooled, hidden = m(x)[:3]
        assert logits.shape == ref.shape == (x.shape[0], cfg.num_labels or cfg.hidden_dim)
        assert hidden.shape == ref_hidden.shape
        errs = rel_err(logits, ref), rel_err(pooled, ref_pooled), rel_err(hidden, ref_hidden)
        print(f"efficientnet {name} {x.shape} vs HF: logits {errs[0]:.2e}, pooled {errs[1]:.2e}, "
              f"hidden {errs[2]:.2e} of max|ref| ({np.abs(ref).max():.2f})")
        assert max(errs) <= TOL
        assert max(errs) < 1e-5                 # float32 throughout: much tighter than TOL


def test_perturbed_weight_fails(case):
    """Negative control: block 1's depthwise filters perturbed by noise of their own scale
    give a large error, so the comparison above can fail."""
    name, model, path, batches = case
    td = md.load_weights(path, spec=SPEC)
    k = "encoder.blocks.1.depthwise_conv.depthwise_conv.weight"
    w = np.asarray(td[k])
    td[k] = (w + np.random.default_rng(5).standard_normal(w.shape) * w.std()).astype(np.float32)
    x, ref, ref_pooled, _ = batches[0]
    logits, pooled = md.load_model(SPEC, td)(x)[:2]
    assert rel_err(pooled, ref_pooled) > 0.1
    assert rel_err(logits, ref) > 0.1


def test_running_stats_are_read(case):
    """Negative control: torch's initial running statistics instead of the random ones."""
    name, model, path, batches = case
    td = md.load_weights(path, spec=SPEC)
    for k in list(td.keys()):
        if k.endswith("running_var"):
            td[k] = np.ones_like(np.asarray(td[k]))
        elif k.endswith("running_mean"):
            td[k] = np.zeros_like(np.asarray(td[k]))
    x, ref, _, _ = batches[0]
    assert rel_err(md.load_model(SPEC, td)(x)[0], ref) > 0.1


def test_depthwise_padding_matters(case):
    """Negative control: the stride-2 depthwise padding rule (adjusted or symmetric) is
    what the comparison depends on: flipping it for every block moves the outputs."""
    name, model, path, batches = case
    n_blocks = len(model.efficientnet.encoder.blocks)
    td = md.load_weights(path)
    pad = set(model.config.depthwise_padding)
    td.metadata["depthwise_padding"] = [b for b in range(n_blocks) if b not in pad]
    x, ref, ref_pooled, _ = batches[0]
    _, pooled = md.load_model(SPEC, td)(x)[:2]
    assert rel_err(pooled, ref_pooled) > 0.1


def test_base_model_checkpoint(tmp_path):
    """An EfficientNetModel folder: names without ``efficientnet.``, no head; the spec's
    logits are then the pooled features."""
    model = make_efficientnet(dict(width_coefficient=0.25, depth_coefficient=0.5, depth_divisor=8,
                                   kernel_sizes=[3, 5], in_channels=[32, 16], out_channels=[16, 24],
                                   strides=[1, 2], num_block_repeats=[1, 3], expand_ratios=[1, 4],
                                   hidden_dim=320), seed=3, cls="EfficientNetModel")
    model.save_pretrained(str(tmp_path))
    assert "EfficientNetModel" in json.loads((tmp_path / "config.json").read_text())["architectures"]
    x = images(np.random.default_rng(3), (2, 3, 24, 27))
    ref, ref_pooled, ref_hidden = reference(model, x)
    m = md.load_model(SPEC, str(tmp_path))
    assert m.params["n_classes"] == 0
    logits, pooled, hidden = m(x)[:3]
    assert rel_err(logits, ref) < 1e-5 and rel_err(pooled, ref_pooled) < 1e-5
    assert rel_err(hidden, ref_hidden) < 1e-5


def test_b0_variant(tmp_path):
    """The spec's b0 variant is google/efficientnet-b0's config (transformers' defaults with
    width and depth 1.0, hidden_dim 1280, 224 pixels), and a model of that size (16 blocks,
    5.3M parameters, random weights, 1000 labels) matches transformers end to end."""
    b0 = dict(width_coefficient=1.0, depth_coefficient=1.0, hidden_dim=1280, image_size=224,
              num_labels=1000)
    model = make_efficientnet(b0, seed=4)
    model.save_pretrained(str(tmp_path))
    m = md.load_model(SPEC, str(tmp_path))
    variant = dict(md.load_spec(SPEC).variants["b0"])
    for key, value in variant.items():
        assert m.params[key] == value, key
    assert m.params["n_blocks"] == len(model.efficientnet.encoder.blocks) == 16
    x = images(np.random.default_rng(4), (1, 3, 64, 64))
    ref, ref_pooled, _ = reference(model, x)
    logits, pooled = m(x)[:2]
    assert sum(int(np.prod(np.asarray(m.weights[k]).shape)) for k in m.weights.keys()) > 5_000_000
    print(f"efficientnet b0 {x.shape} vs HF: logits {rel_err(logits, ref):.2e}, "
          f"pooled {rel_err(pooled, ref_pooled):.2e}")
    assert rel_err(logits, ref) < 1e-5 and rel_err(pooled, ref_pooled) < 1e-5


@pytest.mark.parametrize("change, why", [
    (dict(hidden_act="hardswish"), "hidden_act hardswish is not modelled"),
    (dict(hidden_dim=100), "hidden_dim 100 differs from the top conv's width 320"),
    (dict(strides=[1, 3]), "only 1 and 2 are modelled"),
    (dict(kernel_sizes=[3]), "must have one entry per stage"),
    (dict(kernel_sizes=[3, 1]), "a 1x1 depthwise conv with stride 2"),
    (dict(pooling_type="median"), "pooling_type median is not mean or max"),
    (dict(in_channels=[32, 40]), "do not chain"),
])
def test_refuses_unmodelled_configs(tmp_path, change, why):
    model = make_efficientnet(dict(width_coefficient=0.25, depth_coefficient=0.5,
                                   kernel_sizes=[3, 3], in_channels=[32, 16], out_channels=[16, 24],
                                   strides=[1, 2], num_block_repeats=[1, 1], expand_ratios=[1, 2],
                                   hidden_dim=320, num_labels=2))
    model.save_pretrained(str(tmp_path))
    cfg = json.loads((tmp_path / "config.json").read_text())
    cfg.update(change)
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(md.WeightsError, match=why):
        md.load_weights(str(tmp_path), spec=SPEC)
