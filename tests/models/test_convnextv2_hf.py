"""specs/convnextv2.yaml against transformers' ConvNextV2ForImageClassification and
ConvNextV2Model.

Seeded small float32 models saved with ``save_pretrained`` (safetensors + config.json);
every parameter random (LayerNorm gains and biases, conv and linear weights and biases,
and the GRN gammas and betas, which transformers initialises to zero, so that Global
Response Normalization changes the outputs), so a weight read wrongly or left out
changes them. The sizes come from config.json, not the variant. The cases cover four
stages with a classifier, three stages without one (``num_labels`` 0: the logits are
the pooled features) with another activation and final eps, a rectangular patch
(``patch_size`` [h, w]) with a stage of depth 0 (its downsampling layer only), and a
bare ``ConvNextV2Model`` checkpoint (no ``convnextv2.`` prefix, no head). Besides the
logits, ``pooler_output`` and ``last_hidden_state`` (NCHW) are compared.
"""

import json

import numpy as np
import pytest

import maxdecl as md
from modelhelp import TOL, rel_err, spec_path

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

SPEC = spec_path("convnextv2")

CASES = {
    # four stages, a classifier
    "four_stages": dict(config=dict(depths=[1, 1, 2, 1], hidden_sizes=[16, 24, 32, 48],
                                    num_labels=5, layer_norm_eps=1e-12),
                        images=(2, 3, 64, 64)),
    # sizes the variant does not have; no classifier (num_labels 0); silu; another eps
    "three_stages_headless": dict(config=dict(num_stages=3, depths=[2, 1, 1],
                                              hidden_sizes=[12, 24, 36], num_labels=0,
                                              hidden_act="silu", layer_norm_eps=1e-6),
                                  images=(2, 3, 48, 40)),
    # a rectangular patch, a stage of depth 0 (downsampling only), odd image sizes
    "rect_patch_empty_stage": dict(config=dict(num_stages=3, depths=[2, 0, 1],
                                               hidden_sizes=[8, 16, 24], patch_size=[2, 4],
                                               num_labels=3, hidden_act="gelu_new"),
                                   images=(1, 3, 20, 36)),
    # a bare ConvNextV2Model checkpoint: no prefix, no head
    "base_model": dict(config=dict(num_stages=2, depths=[1, 2], hidden_sizes=[16, 32]),
                       images=(2, 3, 32, 24), base=True),
}


def randomize(model, seed):
    """Every parameter random: GRN gammas N(0, 0.5^2) and betas N(0, 0.3^2) (both zero
    in a fresh transformers model), other biases N(0, 0.1^2), norm gains 1 +- 0.2,
    conv and linear weights N(0, 1 / fan_in)."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in sorted(model.named_parameters()):
            if name.endswith("grn.weight"):
                p.copy_(0.5 * torch.randn(p.shape, generator=gen))
            elif name.endswith("grn.bias"):
                p.copy_(0.3 * torch.randn(p.shape, generator=gen))
            elif p.ndim == 1 and name.endswith(".bias"):
                p.copy_(0.1 * torch.randn(p.shape, generator=gen))
            elif p.ndim == 1:
                p.copy_(1.0 + 0.2 * torch.randn(p.shape, generator=gen))
            else:
                fan_in = int(np.prod(p.shape[1:]))
                p.copy_(torch.randn(p.shape, generator=gen) / fan_in ** 0.5)
    return model.eval()


def make_convnextv2(config, seed=0, base=False):
    torch.manual_seed(seed)
    cfg = transformers.ConvNextV2Config(**config)
    cls = transformers.ConvNextV2Model if base else transformers.ConvNextV2ForImageClassification
    return randomize(cls(cfg), seed)


@pytest.fixture(scope="module", params=sorted(CASES))
def case(request, tmp_path_factory):
    c = CASES[request.param]
    base = c.get("base", False)
    model = make_convnextv2(c["config"], base=base)
    path = tmp_path_factory.mktemp(f"convnextv2_{request.param}")
    model.save_pretrained(str(path))
    x = np.random.default_rng(1).standard_normal(c["images"]).astype(np.float32)
    with torch.no_grad():
        body = model if base else model.convnextv2
        out = body(pixel_values=torch.from_numpy(x))
        pooled = out.pooler_output.numpy()
        hidden = out.last_hidden_state.numpy()
        logits = pooled if base else model(pixel_values=torch.from_numpy(x)).logits.numpy()
    m = md.load_model(SPEC, str(path))
    return request.param, model, path, x, (logits, pooled, hidden), m


def test_outputs_match_transformers(case):
    name, model, path, x, (ref, ref_pooled, ref_hidden), m = case
    cfg = model.config
    assert m.params["depths"] == list(cfg.depths)
    assert m.params["hidden_sizes"] == list(cfg.hidden_sizes)
    assert m.params["n_stages"] == cfg.num_stages
    assert m.params["hidden_act"] == cfg.hidden_act
    assert m.params["norm_eps"] == cfg.layer_norm_eps
    base = isinstance(model, transformers.ConvNextV2Model)
    assert m.params["n_classes"] == (0 if base else cfg.num_labels)
    assert m.output_names[:3] == ["logits", "pooler_output", "last_hidden_state"]
    assert sum(nd.op == "sqrt" for nd in m.graph.nodes) == sum(cfg.depths)   # one GRN per block
    logits, pooled, hidden = m(x)[:3]
    assert logits.shape == ref.shape
    assert hidden.shape == ref_hidden.shape
    errs = [rel_err(logits, ref), rel_err(pooled, ref_pooled), rel_err(hidden, ref_hidden)]
    print(f"convnextv2 {name} vs HF: logits {errs[0]:.2e}, pooled {errs[1]:.2e}, "
          f"hidden {errs[2]:.2e} of max|ref| ({np.abs(ref).max():.2f})")
    assert max(errs) <= TOL
    assert max(errs) < 1e-5                     # float32 throughout: much tighter than TOL


def test_grn_is_read(case):
    """Negative control: zeroing the GRN gammas and betas (transformers' initial values,
    which make GRN the identity) moves the outputs far past the tolerance, so the
    comparison above depends on them."""
    name, model, path, x, (ref, _, ref_hidden), _ = case
    td = md.load_weights(str(path), spec=SPEC)
    grn = [k for k in td.keys() if ".grn." in k]
    assert len(grn) == 2 * sum(model.config.depths)
    for k in grn:
        td[k] = np.zeros_like(np.asarray(td[k]))
    logits, _, hidden = md.load_model(SPEC, td)(x)[:3]
    assert rel_err(hidden, ref_hidden) > 1e-2
    assert rel_err(logits, ref) > 1e-2


def test_perturbed_weight_fails(case):
    """Negative control: one perturbed depthwise filter tap gives a large error."""
    name, model, path, x, (ref, _, ref_hidden), _ = case
    td = md.load_weights(str(path), spec=SPEC)
    k = "stages.0.blk.0.dwconv.weight"
    w = np.array(td[k], copy=True)
    w[0, 0, 3, 3] += 2.0
    td[k] = w
    logits, _, hidden = md.load_model(SPEC, td)(x)[:3]
    assert rel_err(hidden, ref_hidden) > 10 * TOL


def test_refuses_unknown_activation(tmp_path):
    model = make_convnextv2(dict(num_stages=1, depths=[1], hidden_sizes=[8], num_labels=2))
    model.save_pretrained(str(tmp_path))
    cfg = json.loads((tmp_path / "config.json").read_text())
    cfg["hidden_act"] = "hardswish"
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(md.WeightsError, match="hidden_act hardswish is not modelled"):
        md.load_weights(str(tmp_path), spec=SPEC)
