"""specs/focalnet.yaml against transformers' FocalNetForImageClassification / FocalNetModel.

Seeded small float32 models saved with ``save_pretrained`` (safetensors + config.json);
every parameter random (LayerNorm gains and biases, layer-scale gammas, conv and linear
weights and biases), so a weight read wrongly or left out changes the outputs. Each case
runs 2 images; the sizes come from config.json, not the variant:

- ``two_stages``: per-stage focal levels (2, 3) and windows (3, 5): hierarchical
  depthwise convs of kernels 3, 5 and 5, 7, 9, their gates and the global context;
- ``all_options``: layer scale, post-layernorm, post-layernorm in the modulation,
  normalize_modulator, gelu_new MLP, another eps, and an image whose sides are no
  multiple of the patch (transformers pads it) and whose maps turn odd (the
  downsampling pads them);
- ``conv_embed``: the 7x7 stride-4 stem and 3x3 stride-2 downsampling convs, on an
  image whose sides are no multiple of the patch;
- ``headless``: a FocalNetModel checkpoint (no ``focalnet.`` prefix, no classifier).
"""

import numpy as np
import pytest

import maxdecl as md
from modelhelp import named_outputs, rel_err, spec_path

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

SPEC = spec_path("focalnet")
TOL = 1e-5          # float32 throughout; well under the 1e-4 asked for

CASES = {
    "two_stages": dict(config=dict(embed_dim=16, depths=[1, 2], hidden_sizes=[32, 64],
                                   focal_levels=[2, 3], focal_windows=[3, 5], num_labels=5),
                       images=(2, 3, 64, 48)),
    "all_options": dict(config=dict(embed_dim=8, depths=[1, 1, 2], hidden_sizes=[16, 32, 64],
                                    focal_levels=[1, 2, 2], focal_windows=[3, 3, 5],
                                    mlp_ratio=2.0, hidden_act="gelu_new", layer_norm_eps=1e-6,
                                    use_layerscale=True, use_post_layernorm=True,
                                    use_post_layernorm_in_modulation=True,
                                    normalize_modulator=True, num_labels=7),
                        images=(2, 3, 70, 54)),
    "conv_embed": dict(config=dict(embed_dim=8, depths=[1, 1, 1], hidden_sizes=[16, 32, 64],
                                   focal_levels=[2, 1, 2], focal_windows=[3, 3, 3],
                                   use_conv_embed=True, num_labels=3),
                       images=(2, 3, 66, 49)),
    "headless": dict(config=dict(embed_dim=16, depths=[2, 1], hidden_sizes=[32, 64],
                                 focal_levels=[2, 2], focal_windows=[3, 3]),
                     images=(2, 3, 32, 32), headless=True),
}


def randomize(model, seed):
    """Every parameter random: norm gains 1 +- 0.2, biases N(0, 0.1^2), layer-scale
    gammas uniform in [0.2, 1.5] (far from the 1.0 fill used when they are absent),
    conv and linear weights N(0, 1 / fan_in)."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in sorted(model.named_parameters()):
            if name.endswith(("gamma_1", "gamma_2")):
                p.copy_(0.2 + 1.3 * torch.rand(p.shape, generator=gen))
            elif p.ndim == 1 and name.endswith(".bias"):
                p.copy_(0.1 * torch.randn(p.shape, generator=gen))
            elif p.ndim == 1:
                p.copy_(1.0 + 0.2 * torch.randn(p.shape, generator=gen))
            else:
                fan_in = int(np.prod(p.shape[1:]))
                p.copy_(torch.randn(p.shape, generator=gen) / fan_in ** 0.5)
    return model.eval()


def make_focalnet(config, seed=0, headless=False):
    torch.manual_seed(seed)
    cfg = transformers.FocalNetConfig(**config)
    cls = transformers.FocalNetModel if headless else transformers.FocalNetForImageClassification
    return randomize(cls(cfg), seed)


@pytest.fixture(scope="module", params=sorted(CASES))
def case(request, tmp_path_factory):
    c = CASES[request.param]
    headless = c.get("headless", False)
    model = make_focalnet(c["config"], seed=len(request.param), headless=headless)
    path = tmp_path_factory.mktemp(f"focalnet_{request.param}")
    model.save_pretrained(str(path))
    x = np.random.default_rng(1).standard_normal(c["images"]).astype(np.float32)
    base = model if headless else model.focalnet
    with torch.no_grad():
        out = base(pixel_values=torch.from_numpy(x))
        ref = {"last_hidden_state": out.last_hidden_state.numpy(),
               "pooler_output": out.pooler_output.numpy()}
        if not headless:
            ref["logits"] = model(pixel_values=torch.from_numpy(x)).logits.numpy()
    return request.param, model, str(path), x, ref


@pytest.fixture(scope="module")
def loaded(case):
    name, model, path, x, ref = case
    return md.load_model(SPEC, path)


def test_params_from_config(case, loaded):
    name, model, path, x, ref = case
    cfg, p = model.config, loaded.params
    assert p["embed_dim"] == cfg.embed_dim
    assert p["depths"] == list(cfg.depths)
    assert p["focal_levels"] == list(cfg.focal_levels)
    assert p["focal_windows"] == list(cfg.focal_windows)
    assert p["norm_eps"] == cfg.layer_norm_eps
    assert p["hidden_act"] == cfg.hidden_act
    assert p["layerscale"] == cfg.use_layerscale
    assert p["post_ln"] == cfg.use_post_layernorm
    assert p["post_ln_mod"] == cfg.use_post_layernorm_in_modulation
    assert p["normalize_modulator"] == cfg.normalize_modulator
    assert p["conv_embed"] == cfg.use_conv_embed
    assert p["has_head"] == (0 if CASES[name].get("headless") else 1)
    if p["has_head"]:
        assert p["n_classes"] == cfg.num_labels


def test_outputs_match_transformers(case, loaded):
    name, model, path, x, ref = case
    got = named_outputs(loaded, x)
    want = ["last_hidden_state", "pooler_output"]
    if "logits" in ref:
        want = ["logits"] + want
    assert list(loaded.output_names) == want
    for key in want:
        assert got[key].shape == ref[key].shape, (key, got[key].shape, ref[key].shape)
        err = rel_err(got[key], ref[key])
        print(f"focalnet {name} {key} vs HF: {err:.2e} of max|ref| "
              f"({np.abs(ref[key]).max():.2f})")
        assert err <= TOL, (key, err)


def test_modulation_weights_matter(case):
    """Negative controls: the outputs move when the deepest focal level's filter, the
    gates' rows of projection_in (global-context gate included) or the layer-scale
    gammas are zeroed / reset, so the comparison above depends on each."""
    name, model, path, x, ref = case
    key = "logits" if "logits" in ref else "pooler_output"
    cfg = model.config
    s = len(cfg.depths) - 1
    lvl = cfg.focal_levels[s] - 1
    pre = f"encoder.stages.{s}.layers.0"
    dim = cfg.embed_dim * 2 ** s

    def moved(edit):
        td = md.load_weights(path, spec=SPEC)
        edit(td)
        out = named_outputs(md.load_model(SPEC, td), x)[key]
        return rel_err(out, ref[key])

    def zero_filter(td):
        k = f"{pre}.modulation.focal_layers.{lvl}.weight"
        td[k] = np.zeros_like(np.asarray(td[k]))

    def global_gate(td):
        k = f"{pre}.modulation.projection_in.weight"
        w = np.array(td[k])
        w[2 * dim + cfg.focal_levels[s]] = 0.0      # the global-context gate's row
        td[k] = w
        kb = f"{pre}.modulation.projection_in.bias"
        b = np.array(td[kb])
        b[2 * dim + cfg.focal_levels[s]] = 0.0
        td[kb] = b

    assert moved(zero_filter) > 1e-3
    assert moved(global_gate) > 1e-3
    if cfg.use_layerscale:
        def unit_gammas(td):
            for k in list(td.keys()):
                if k.endswith((".gamma_1", ".gamma_2")):
                    td[k] = np.ones_like(np.asarray(td[k]))
        assert moved(unit_gammas) > 1e-3
    else:
        assert not [k for k in md.load_weights(path, spec=SPEC).keys()
                    if k.endswith(".gamma_1")]              # the absent: 1.0 fill stands in


def test_refuses_identity_classifier(tmp_path):
    model = make_focalnet(dict(embed_dim=8, depths=[1], hidden_sizes=[8], focal_levels=[1],
                               focal_windows=[3], num_labels=0))
    model.save_pretrained(str(tmp_path))
    with pytest.raises(md.WeightsError, match="identity classifier"):
        md.load_weights(str(tmp_path), spec=SPEC)
