"""specs/swiftformer.yaml against transformers' SwiftFormerForImageClassification.

Seeded small float32 models saved with ``save_pretrained`` (safetensors + config.json);
every parameter random (conv, linear and BatchNorm weights and biases, the layer-scale
gains) and the BatchNorm running statistics too, so a weight or statistic read wrongly
changes the outputs. The sizes come from config.json, not the variant: the second model
has three stages, one of them empty, a stage boundary without downsampling (so the
``encoder.network`` indices shift), a downsampler that only the width change asks for,
no layer scale, another MLP activation, ratio, downsampling kernel, padding and eps.
Batches of two images, compared as max|ours - ref| / max|ref|.
"""

import numpy as np
import pytest

import maxdecl as md
from modelhelp import rel_err, spec_path

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

SPEC = spec_path("swiftformer")
TOL = 1e-4

CASES = {
    # the tiny variant's sizes, layer scale on
    "four_stages": dict(config=dict(depths=[2, 1, 2, 1], embed_dims=[8, 16, 24, 32],
                                    downsamples=[True, True, True, True], num_labels=5),
                        images=(2, 3, 64, 48)),
    # network = [stage 0, stage 1 (empty), downsampler (8 -> 16 though downsamples[1] is
    # False), stage 2]: no downsampler after stage 0, so stage 2 is network.3
    "mixed": dict(config=dict(depths=[1, 0, 3], embed_dims=[8, 8, 16],
                              downsamples=[False, False, True], num_labels=3,
                              use_layer_scale=False, hidden_act="silu", mlp_ratio=2,
                              down_patch_size=2, down_stride=2, down_pad=0,
                              batch_norm_eps=1e-3),
                  images=(2, 3, 40, 56)),
    # num_labels 0 (both heads nn.Identity: the logits are the pooled features), a
    # non-square downsampling kernel and stride 3
    "no_labels": dict(config=dict(depths=[1, 2], embed_dims=[8, 16], num_labels=0,
                                  down_patch_size=[3, 2], down_stride=3, down_pad=1),
                      images=(2, 3, 32, 40)),
}


def randomize(model, seed):
    """Norm gains 1 +- 0.2, biases N(0, 0.1^2), layer scales uniform in [0.2, 1.5],
    other weights N(0, 1 / fan_in); BatchNorm running means N(0, 0.1^2) and variances
    uniform in [0.5, 1.5]."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in sorted(model.named_parameters()):
            if "layer_scale" in name:
                p.copy_(0.2 + 1.3 * torch.rand(p.shape, generator=gen))
            elif p.ndim == 1 and name.endswith(".bias"):
                p.copy_(0.1 * torch.randn(p.shape, generator=gen))
            elif p.ndim == 1:
                p.copy_(1.0 + 0.2 * torch.randn(p.shape, generator=gen))
            else:
                fan_in = int(np.prod(p.shape[1:]))
                p.copy_(torch.randn(p.shape, generator=gen) / fan_in ** 0.5)
        for name, b in sorted(model.named_buffers()):
            if name.endswith("running_mean"):
                b.copy_(0.1 * torch.randn(b.shape, generator=gen))
            elif name.endswith("running_var"):
                b.copy_(0.5 + torch.rand(b.shape, generator=gen))
    return model.eval()


def make_swiftformer(config, seed=0, cls=None):
    torch.manual_seed(seed)
    cfg = transformers.SwiftFormerConfig(**config)
    cls = cls or transformers.SwiftFormerForImageClassification
    return randomize(cls(cfg), seed)


@pytest.fixture(scope="module", params=sorted(CASES))
def case(request, tmp_path_factory):
    c = CASES[request.param]
    model = make_swiftformer(c["config"])
    path = tmp_path_factory.mktemp(f"swiftformer_{request.param}")
    model.save_pretrained(str(path))
    x = np.random.default_rng(1).standard_normal(c["images"]).astype(np.float32)
    with torch.no_grad():
        out = model(pixel_values=torch.from_numpy(x), output_hidden_states=True)
    ref = {"logits": out.logits.numpy(),
           "hidden_states": [h.numpy() for h in out.hidden_states]}
    ours = md.load_model(SPEC, str(path))
    got = dict(zip(ours.output_names, ours(x)))
    return request.param, model, path, x, ref, ours, got


def test_params_from_config(case):
    name, model, path, x, ref, ours, got = case
    cfg = model.config
    p = ours.params
    assert p["depths"] == list(cfg.depths)
    assert p["embed_dims"] == list(cfg.embed_dims)
    assert p["downsamples"] == list(cfg.downsamples)
    assert p["n_classes"] == cfg.num_labels
    assert p["use_layer_scale"] == cfg.use_layer_scale
    assert p["hidden_act"] == cfg.hidden_act
    assert p["bn_eps"] == cfg.batch_norm_eps
    assert p["mlp_ratio"] == cfg.mlp_ratio
    # the spec's network indices are transformers' module indices
    n_net = len(model.swiftformer.encoder.network)
    assert p["net_idx"][-1] == n_net - 1


def test_logits_match_transformers(case):
    name, model, path, x, ref, ours, got = case
    assert ours.output_names[0] == "logits"
    logits = got["logits"]
    width = model.config.num_labels or model.config.embed_dims[-1]
    assert logits.shape == ref["logits"].shape == (x.shape[0], width)
    err = rel_err(logits, ref["logits"])
    print(f"swiftformer {name} logits vs HF: {err:.2e} of max|ref| "
          f"({np.abs(ref['logits']).max():.2f})")
    assert err <= TOL


def test_hidden_states_match_transformers(case):
    """transformers' hidden_states: the stem's output, then one per encoder.network
    module (stages and downsamplers), NCHW; last_hidden_state is the last of them."""
    name, model, path, x, ref, ours, got = case
    names = [n for n in ours.output_names if n.endswith(".hidden_state")]
    assert names[0] == "patch_embed.hidden_state"
    assert names[1:] == [f"encoder.network.{k}.hidden_state"
                         for k in range(len(model.swiftformer.encoder.network))]
    assert len(names) == len(ref["hidden_states"])
    errs = []
    for n, want in zip(names, ref["hidden_states"]):
        assert got[n].shape == want.shape, n
        errs.append(rel_err(got[n], want))
    last = rel_err(got["last_hidden_state"], ref["hidden_states"][-1])
    print(f"swiftformer {name} hidden states vs HF: max {max(errs):.2e}, last {last:.2e}")
    assert max(errs) <= TOL and last <= TOL


def test_layer_scale_is_read(case):
    """Negative control: the logits move when the layer scales are set to ones; without
    use_layer_scale the encoder blocks have none (the spec's absent: 1.0 stands in)."""
    name, model, path, x, ref, ours, got = case
    td = md.load_weights(str(path), spec=SPEC)
    scales = [k for k in td.keys() if "layer_scale" in k]
    block_scales = [k for k in scales if k.endswith(("layer_scale_1", "layer_scale_2"))]
    assert bool(block_scales) == model.config.use_layer_scale
    assert scales
    for k in scales:
        td[k] = np.ones_like(np.asarray(td[k]))
    (logits, *_) = md.load_model(SPEC, td)(x)
    assert rel_err(logits, ref["logits"]) > 1e-2


def test_refuses_headless_checkpoint(tmp_path):
    model = make_swiftformer(dict(depths=[1, 1], embed_dims=[8, 16]),
                             cls=transformers.SwiftFormerModel)
    model.save_pretrained(str(tmp_path))
    with pytest.raises(md.WeightsError, match="only SwiftFormerForImageClassification"):
        md.load_model(SPEC, str(tmp_path))
