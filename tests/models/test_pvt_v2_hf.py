"""specs/pvt_v2.yaml against transformers' PvtV2ForImageClassification and PvtV2Model.

Seeded small float32 models saved with ``save_pretrained`` (safetensors + config.json);
every parameter random (LayerNorm gains and biases, conv and linear weights and biases),
so a weight read wrongly or left out changes the outputs. The sizes come from
config.json, not the variant: the cases differ in stage count, widths, heads, depths,
spatial-reduction ratios (> 1 in the early stages), patch sizes, MLP ratios, activation,
``qkv_bias`` and ``linear_attention`` (adaptive 7x7 pooling over maps that 7 does not
divide), and run two images whose sides are not multiples of the strides.
"""

import numpy as np
import pytest

import maxdecl as md
from modelhelp import randomize, rel_err, spec_path

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

SPEC = spec_path("pvt_v2")
TOL = 1e-4          # max|ours - ref| <= TOL * max|ref|

CASES = {
    # the spec's tiny variant's sizes; 32 x 40 -> 8 x 10 (sr 2: 4 x 5 keys) -> 4 x 5
    "two_stages": dict(head=True,
                       config=dict(num_encoder_blocks=2, depths=[1, 2], hidden_sizes=[16, 32],
                                   num_attention_heads=[1, 2], sr_ratios=[2, 1],
                                   patch_sizes=[7, 3], strides=[4, 2], mlp_ratios=[2, 2],
                                   num_labels=5),
                       images=(2, 3, 32, 40)),
    # four stages as b0 but small; odd maps (44 x 52 -> 11 x 13 -> 6 x 7 -> 3 x 4 -> 2 x 2),
    # so the reduction convs drop a remainder; no q/k/v biases; tanh GELU; 4 channels
    "four_stages": dict(head=True,
                        config=dict(num_encoder_blocks=4, depths=[2, 1, 2, 1],
                                    hidden_sizes=[8, 24, 30, 40],
                                    num_attention_heads=[2, 3, 5, 4], sr_ratios=[4, 2, 2, 1],
                                    patch_sizes=[7, 3, 3, 3], strides=[4, 2, 2, 2],
                                    mlp_ratios=[4, 2, 3, 2], num_labels=7, qkv_bias=False,
                                    hidden_act="gelu_new", num_channels=4,
                                    layer_norm_eps=1e-5),
                        images=(2, 4, 44, 52)),
    # linear attention (pvt_v2_b2_linear's kind): adaptive average pool to 7 x 7 from
    # 15 x 19 and 8 x 10 maps (uneven, overlapping windows), 1x1 conv, LN, GELU; ReLU in MLP
    "linear": dict(head=True,
                   config=dict(num_encoder_blocks=2, depths=[2, 1], hidden_sizes=[16, 24],
                               num_attention_heads=[2, 3], sr_ratios=[4, 2],
                               patch_sizes=[7, 3], strides=[4, 2], mlp_ratios=[2, 3],
                               num_labels=3, linear_attention=True),
                   images=(2, 3, 60, 76)),
    # the base model (no classifier): last_hidden_state only
    "base_model": dict(head=False,
                       config=dict(num_encoder_blocks=3, depths=[1, 1, 1],
                                   hidden_sizes=[8, 16, 24], num_attention_heads=[1, 2, 4],
                                   sr_ratios=[4, 2, 1], patch_sizes=[7, 3, 3],
                                   strides=[4, 2, 2], mlp_ratios=[2, 2, 2]),
                       images=(2, 3, 36, 28)),
}


def make_pvt(config, head=True, seed=0):
    torch.manual_seed(seed)
    cfg = transformers.PvtV2Config(**config)
    cls = transformers.PvtV2ForImageClassification if head else transformers.PvtV2Model
    return randomize(cls(cfg), seed)


def reference(model, x):
    """(logits or None, last_hidden_state [n, C, H, W]) of transformers."""
    with torch.no_grad():
        px = torch.from_numpy(x)
        if isinstance(model, transformers.PvtV2ForImageClassification):
            logits = model(pixel_values=px).logits.numpy()
            hidden = model.pvt_v2(pixel_values=px).last_hidden_state.numpy()
            return logits, hidden
        return None, model(pixel_values=px).last_hidden_state.numpy()


@pytest.fixture(scope="module", params=sorted(CASES))
def case(request, tmp_path_factory):
    c = CASES[request.param]
    model = make_pvt(c["config"], c["head"], seed=sorted(CASES).index(request.param))
    path = tmp_path_factory.mktemp(f"pvt_v2_{request.param}")
    model.save_pretrained(str(path))
    x = np.random.default_rng(1).standard_normal(c["images"]).astype(np.float32)
    m = md.load_model(SPEC, str(path))
    return request.param, model, path, m, x, reference(model, x)


def test_params_from_config(case):
    name, model, path, m, x, ref = case
    cfg = model.config
    assert m.params["n_stages"] == cfg.num_encoder_blocks
    assert m.params["depths"] == list(cfg.depths)
    assert m.params["hidden_sizes"] == list(cfg.hidden_sizes)
    assert m.params["n_heads"] == list(cfg.num_attention_heads)
    assert m.params["sr_ratios"] == list(cfg.sr_ratios)
    assert m.params["patch_sizes"] == list(cfg.patch_sizes)
    assert m.params["strides"] == list(cfg.strides)
    assert m.params["mlp_ratios"] == list(cfg.mlp_ratios)
    assert m.params["n_channels"] == cfg.num_channels
    assert m.params["hidden_act"] == cfg.hidden_act
    assert m.params["norm_eps"] == cfg.layer_norm_eps
    assert m.params["linear_attention"] == cfg.linear_attention
    assert m.params["has_head"] == CASES[name]["head"]
    if CASES[name]["head"]:
        assert m.params["n_classes"] == cfg.num_labels
        assert m.output_names == ["logits", "last_hidden_state"]
    else:
        assert m.output_names == ["last_hidden_state"]


def test_outputs_match_transformers(case):
    name, model, path, m, x, (ref_logits, ref_hidden) = case
    got = dict(zip(m.output_names, m(x)))
    hidden = got["last_hidden_state"]
    assert hidden.shape == ref_hidden.shape
    err_h = rel_err(hidden, ref_hidden)
    msg = f"pvt_v2 {name} vs HF: last_hidden_state {err_h:.2e}"
    if ref_logits is not None:
        assert got["logits"].shape == ref_logits.shape == (x.shape[0], model.config.num_labels)
        err_l = rel_err(got["logits"], ref_logits)
        msg += f", logits {err_l:.2e} (max|ref| {np.abs(ref_logits).max():.2f})"
        assert err_l <= TOL
    print(msg)
    assert err_h <= TOL


def test_other_image_size(case):
    """H and W are symbolic: one loaded model runs on another image size (one image)."""
    name, model, path, m, x, ref = case
    c = model.config.num_channels
    y = np.random.default_rng(2).standard_normal((1, c, 40, 36)).astype(np.float32)
    got = dict(zip(m.output_names, m(y)))
    ref_logits, ref_hidden = reference(model, y)
    assert rel_err(got["last_hidden_state"], ref_hidden) <= TOL
    if ref_logits is not None:
        assert rel_err(got["logits"], ref_logits) <= TOL


def test_reduction_is_read(case):
    """Negative control: the outputs move when a spatial-reduction conv is zeroed."""
    name, model, path, m, x, (ref_logits, ref_hidden) = case
    td = md.load_weights(str(path), spec=SPEC)
    sr = [k for k in td.keys() if k.endswith("attention.spatial_reduction.weight")]
    cfg = model.config
    stages = (range(cfg.num_encoder_blocks) if cfg.linear_attention
              else [s for s, r in enumerate(cfg.sr_ratios) if r > 1])
    assert len(sr) == sum(cfg.depths[s] for s in stages) > 0
    for k in sr:
        td[k] = np.zeros_like(np.asarray(td[k]))
    out = dict(zip(m.output_names, md.load_model(SPEC, td)(x)))
    assert rel_err(out["last_hidden_state"], ref_hidden) > 1e-3


def test_refuses_mismatched_lists(tmp_path):
    model = make_pvt(CASES["two_stages"]["config"])
    model.save_pretrained(str(tmp_path))
    td = md.load_weights(str(tmp_path))
    td.metadata["sr_ratios"] = [2, 1, 1]
    with pytest.raises(md.WeightsError, match="must have num_encoder_blocks"):
        md.load_model(SPEC, td)


def test_zero_labels_identity_head(tmp_path):
    """num_labels 0: transformers' head is nn.Identity, logits are the pooled features."""
    model = make_pvt(dict(CASES["two_stages"]["config"], num_labels=0), seed=5)
    model.save_pretrained(str(tmp_path))
    m = md.load_model(SPEC, str(tmp_path))
    assert m.params["n_classes"] == 0
    x = np.random.default_rng(3).standard_normal((2, 3, 32, 40)).astype(np.float32)
    got = dict(zip(m.output_names, m(x)))
    ref_logits, ref_hidden = reference(model, x)
    assert got["logits"].shape == ref_logits.shape == (2, 32)
    assert rel_err(got["logits"], ref_logits) <= TOL
    assert rel_err(got["last_hidden_state"], ref_hidden) <= TOL
