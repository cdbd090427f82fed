"""specs/regnet.yaml against transformers' RegNetForImageClassification.

Seeded small float32 models saved with ``save_pretrained`` (safetensors + config.json),
in eval mode, with every parameter and buffer random: conv filters N(0, 1 / fan_in),
BatchNorm gains ``1 + 0.2 N(0, 1)``, biases ``0.3 N(0, 1)``, running means
``0.2 N(0, 1)`` and running variances uniform in [0.5, 2]. Sizes come from config.json,
not the variant. The cases cover both layer types (Y: squeeze-and-excitation, whose
reduced width ``int(round(cin / 4))`` rounds half to even for an input width of 18), stride-2
stages with projection shortcuts, a first stage with and without downsampling (so with
an identity shortcut), grouped 3x3 convs (``max(1, cout // groups_width)`` groups,
including the clamp to 1), another activation, odd image sizes, a headless model
(``num_labels`` 0: the logits are the pooled features), a stage of depth 0 (transformers
still builds its first layer) and a bare ``RegNetModel`` checkpoint (no ``regnet.`` prefix,
no head).
"""

import json

import numpy as np
import pytest

import maxdecl as md
from modelhelp import TOL, rel_err, spec_path

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

SPEC = spec_path("regnet")

CASES = {
    # Y: SE; stage 0 downsamples; embedding 18 -> SE width round(4.5) = 4; groups 1, 2, 3
    "y": dict(config=dict(layer_type="y", embedding_size=18, hidden_sizes=[12, 32, 48],
                          depths=[1, 2, 2], groups_width=16, downsample_in_first_stage=True,
                          num_labels=7),
              images=[(2, 3, 32, 32), (1, 3, 29, 35)]),
    # X: no SE; stage 0 keeps the resolution and width (identity shortcut); groups 2, 4, 6
    "x": dict(config=dict(layer_type="x", embedding_size=16, hidden_sizes=[16, 32, 48],
                          depths=[2, 1, 2], groups_width=8, downsample_in_first_stage=False,
                          num_labels=5),
              images=[(2, 3, 24, 24), (1, 3, 17, 22)]),
    # Y, another activation, two stages, no classifier
    "y_headless_silu": dict(config=dict(layer_type="y", embedding_size=8, hidden_sizes=[16, 24],
                                        depths=[2, 1], groups_width=8, hidden_act="silu",
                                        num_labels=0),
                            images=[(2, 3, 20, 20)]),
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


def make_regnet(config, seed=0):
    torch.manual_seed(seed)
    cfg = transformers.RegNetConfig(**config)
    return randomize(transformers.RegNetForImageClassification(cfg), seed)


@pytest.fixture(scope="module", params=sorted(CASES))
def case(request, tmp_path_factory):
    c = CASES[request.param]
    model = make_regnet(c["config"])
    path = tmp_path_factory.mktemp(f"regnet_{request.param}")
    model.save_pretrained(str(path))
    rng = np.random.default_rng(1)
    batches = []
    for shape in c["images"]:
        x = rng.standard_normal(shape).astype(np.float32)
        with torch.no_grad():
            out = model(pixel_values=torch.from_numpy(x), output_hidden_states=False)
            pooled = model.regnet(torch.from_numpy(x)).pooler_output
        batches.append((x, out.logits.numpy(), pooled.flatten(1).numpy()))
    return request.param, model, path, batches


def test_logits_match_transformers(case):
    name, model, path, batches = case
    m = md.load_model(SPEC, str(path))
    cfg = model.config
    assert m.params["layer_type"] == cfg.layer_type
    assert m.params["hidden_sizes"] == list(cfg.hidden_sizes)
    assert m.params["depths"] == list(cfg.depths)
    assert m.params["embedding_size"] == cfg.embedding_size
    assert m.params["groups_width"] == cfg.groups_width
    assert m.params["downsample_in_first_stage"] == cfg.downsample_in_first_stage
    assert m.params["n_classes"] == cfg.num_labels
    assert m.output_names[:2] == ["logits", "pooler_output"]
    se_nodes = [nd for nd in m.graph.nodes if nd.op == "sigmoid"]
    assert bool(se_nodes) == (cfg.layer_type == "y")
    for x, ref, ref_pooled in batches:
        logits, pooled = m(x)[:2]
        n_out = cfg.num_labels or cfg.hidden_sizes[-1]
        assert logits.shape == ref.shape == (x.shape[0], n_out)
        err = rel_err(logits, ref)
        perr = rel_err(pooled, ref_pooled)
        print(f"regnet {name} {x.shape} vs HF: logits {err:.2e}, pooled {perr:.2e} "
              f"of max|ref| ({np.abs(ref).max():.2f})")
        assert err <= TOL and perr <= TOL
        assert err < 1e-5 and perr < 1e-5       # float32 throughout: much tighter than TOL


def test_running_stats_are_read(case):
    """Negative control: the logits move when the BatchNorm running statistics are
    replaced by torch's initial ones, so the comparison above depends on them."""
    name, model, path, batches = case
    td = md.load_weights(str(path), spec=SPEC)
    for k in list(td.keys()):
        if k.endswith("running_var"):
            td[k] = np.ones_like(np.asarray(td[k]))
        elif k.endswith("running_mean"):
            td[k] = np.zeros_like(np.asarray(td[k]))
    x, ref, _ = batches[0]
    logits = md.load_model(SPEC, td)(x)[0]
    assert rel_err(logits, ref) > 1e-2


def test_refuses_unknown_activation(tmp_path):
    model = make_regnet(dict(layer_type="x", embedding_size=8, hidden_sizes=[8], depths=[1],
                             groups_width=8, num_labels=2))
    model.save_pretrained(str(tmp_path))
    cfg = json.loads((tmp_path / "config.json").read_text())
    cfg["hidden_act"] = "hardswish"
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(md.WeightsError, match="hidden_act hardswish is not modelled"):
        md.load_weights(str(tmp_path), spec=SPEC)


def test_stage_of_depth_zero(tmp_path):
    """transformers builds a stage's first layer even for depth 0."""
    model = make_regnet(dict(layer_type="y", embedding_size=8, hidden_sizes=[8, 16], depths=[0, 1],
                             groups_width=4, num_labels=3))
    model.save_pretrained(str(tmp_path))
    x = np.random.default_rng(2).standard_normal((1, 3, 16, 16)).astype(np.float32)
    with torch.no_grad():
        ref = model(pixel_values=torch.from_numpy(x)).logits.numpy()
    logits = md.load_model(SPEC, str(tmp_path))(x)[0]
    assert rel_err(logits, ref) < 1e-5


def test_base_model_checkpoint(tmp_path):
    """A RegNetModel folder: names without ``regnet.``, no head although config.json
    implies 2 labels; the spec's logits are then the pooled features."""
    torch.manual_seed(0)
    cfg = transformers.RegNetConfig(layer_type="x", embedding_size=8, hidden_sizes=[8, 16],
                                    depths=[1, 2], groups_width=4)
    model = randomize(transformers.RegNetModel(cfg), 0)
    model.save_pretrained(str(tmp_path))
    x = np.random.default_rng(3).standard_normal((2, 3, 16, 18)).astype(np.float32)
    with torch.no_grad():
        ref = model(torch.from_numpy(x)).pooler_output.flatten(1).numpy()
    m = md.load_model(SPEC, str(tmp_path))
    assert m.params["n_classes"] == 0
    logits, pooled = m(x)[:2]
    assert rel_err(logits, ref) < 1e-5 and rel_err(pooled, ref) < 1e-5
