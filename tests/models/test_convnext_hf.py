"""specs/convnext.yaml against transformers' ConvNextForImageClassification.

Seeded small float32 models saved with ``save_pretrained`` (safetensors + config.json);
every parameter random (LayerNorm gains and biases, layer-scale gammas, conv and linear
weights and biases), so a weight read wrongly or left out changes the logits. The
sizes come from config.json, not the variant: the second model has three stages,
other widths and depths, another label count, no layer scale
(``layer_scale_init_value = 0``: the spec's ``absent: 1.0``) and another final eps.
"""

import json

import numpy as np
import pytest

import maxdecl as md
from modelhelp import TOL, rel_err, spec_path

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

SPEC = spec_path("convnext")

CASES = {
    # the spec's tiny variant's sizes; layer scale on
    "four_stages": dict(config=dict(depths=[1, 1, 2, 1], hidden_sizes=[32, 64, 128, 256],
                                    num_labels=5, layer_scale_init_value=0.5,
                                    layer_norm_eps=1e-12),
                        images=(3, 3, 64, 64)),
    # sizes the variant does not have: config.json must win; no layer scale
    "three_stages": dict(config=dict(num_stages=3, depths=[2, 1, 1], hidden_sizes=[24, 48, 96],
                                     num_labels=7, layer_scale_init_value=0.0,
                                     layer_norm_eps=1e-6),
                         images=(2, 3, 48, 40)),
    # one stage (the stages-after-the-first repeat runs 0 times), and a stage of 0 blocks
    "one_stage": dict(config=dict(num_stages=1, depths=[2], hidden_sizes=[16], num_labels=3),
                      images=(2, 3, 32, 32)),
    "empty_stage": dict(config=dict(num_stages=3, depths=[1, 0, 1], hidden_sizes=[8, 16, 24],
                                    num_labels=2),
                        images=(1, 3, 32, 32)),
}


def randomize(model, seed):
    """Every parameter random: norm gains 1 +- 0.2, biases N(0, 0.1^2), layer-scale
    gammas uniform in [0.2, 1.5] (far from the 1.0 fill used when they are absent),
    conv and linear weights N(0, 1 / fan_in)."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in sorted(model.named_parameters()):
            if name.endswith("layer_scale_parameter"):
                p.copy_(0.2 + 1.3 * torch.rand(p.shape, generator=gen))
            elif p.ndim == 1 and name.endswith(".bias"):
                p.copy_(0.1 * torch.randn(p.shape, generator=gen))
            elif p.ndim == 1:
                p.copy_(1.0 + 0.2 * torch.randn(p.shape, generator=gen))
            else:
                fan_in = int(np.prod(p.shape[1:]))
                p.copy_(torch.randn(p.shape, generator=gen) / fan_in ** 0.5)
    return model.eval()


def make_convnext(config, seed=0):
    torch.manual_seed(seed)
    cfg = transformers.ConvNextConfig(**config)
    return randomize(transformers.ConvNextForImageClassification(cfg), seed)


@pytest.fixture(scope="module", params=sorted(CASES))
def case(request, tmp_path_factory):
    c = CASES[request.param]
    model = make_convnext(c["config"])
    path = tmp_path_factory.mktemp(f"convnext_{request.param}")
    model.save_pretrained(str(path))
    x = np.random.default_rng(1).standard_normal(c["images"]).astype(np.float32)
    with torch.no_grad():
        ref = model(pixel_values=torch.from_numpy(x)).logits.numpy()
    return request.param, model, path, x, ref


def test_logits_match_transformers(case):
    name, model, path, x, ref = case
    m = md.load_model(SPEC, str(path))
    cfg = model.config
    assert m.params["depths"] == list(cfg.depths)
    assert m.params["hidden_sizes"] == list(cfg.hidden_sizes)
    assert m.params["n_stages"] == cfg.num_stages
    assert m.params["n_classes"] == cfg.num_labels
    assert m.params["norm_eps"] == cfg.layer_norm_eps
    (logits,) = m(x)
    assert logits.shape == ref.shape == (x.shape[0], cfg.num_labels)
    err = rel_err(logits, ref)
    print(f"convnext {name} vs HF: {err:.2e} of max|ref| ({np.abs(ref).max():.2f})")
    assert err <= TOL
    assert err < 1e-5                           # float32 throughout: much tighter than TOL


def test_layer_scale_is_read(case):
    """Negative control: the logits move when the layer-scale gammas (or their
    absence) are ignored, so the comparison above depends on them."""
    name, model, path, x, ref = case
    td = md.load_weights(str(path), spec=SPEC)
    gammas = [k for k in td.keys() if k.endswith(".gamma.weight")]
    if model.config.layer_scale_init_value > 0:
        assert len(gammas) == sum(model.config.depths)
        for k in gammas:
            td[k] = np.ones_like(np.asarray(td[k]))
        (logits,) = md.load_model(SPEC, td)(x)
        assert rel_err(logits, ref) > 1e-2
    else:
        assert gammas == []                     # the absent: 1.0 fill stands in


def test_refuses_other_activations(tmp_path):
    model = make_convnext(dict(depths=[1, 1], hidden_sizes=[8, 16], num_stages=2,
                               num_labels=2, hidden_act="relu"))
    model.save_pretrained(str(tmp_path))
    assert json.loads((tmp_path / "config.json").read_text())["hidden_act"] == "relu"
    with pytest.raises(md.WeightsError, match="hidden_act relu is not modelled"):
        md.load_weights(str(tmp_path), spec=SPEC)
