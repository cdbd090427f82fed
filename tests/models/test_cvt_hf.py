"""specs/cvt.yaml against transformers' CvtForImageClassification and CvtModel.

Seeded small float32 models saved with ``save_pretrained`` (safetensors + config.json);
every parameter random (conv and linear weights and biases, LayerNorm gains and biases,
BatchNorm gains and biases, the class token) and the BatchNorm running statistics too,
so a weight or buffer read wrongly or left out changes the outputs. The classifier has
the real configs' layout at tiny widths: three stages, a class token in the last one,
depthwise-conv q/k/v projections (stride 2 for k and v) followed by BatchNorm; it is
run on a batch of two images at 64x64 and at 50x45 (not a multiple of the patch
strides 4 * 2 * 2). A second, headless model (CvtModel) has other sizes, no class
token, no q/k/v biases and other kernels, strides and paddings, so config.json, not
the variant, must drive every size.
"""

import json

import numpy as np
import pytest

import maxdecl as md
from modelhelp import randomize, rel_err, spec_path

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

SPEC = spec_path("cvt")
TOL = 1e-5          # float32 throughout: max|ours - ref| <= TOL * max|ref|

# the spec's tiny variant's sizes; the layout of microsoft/cvt-13
CLS_CONFIG = dict(embed_dim=[16, 24, 32], num_heads=[1, 2, 4], depth=[1, 2, 3],
                  num_labels=5)
# transformers indexes its drop-path rates by the stage, so depth[k] > k is needed
HEADLESS_CONFIG = dict(embed_dim=[8, 12], num_heads=[2, 3], depth=[1, 2], patch_sizes=[5, 3],
                       patch_stride=[3, 2], patch_padding=[1, 0], mlp_ratio=[2.0, 3.0],
                       qkv_bias=[False, False], cls_token=[False, False],
                       qkv_projection_method=["dw_bn", "dw_bn"], kernel_qkv=[3, 5],
                       padding_kv=[1, 2], stride_kv=[2, 2], padding_q=[1, 2],
                       stride_q=[1, 1], attention_drop_rate=[0.0, 0.0],
                       drop_rate=[0.0, 0.0], drop_path_rate=[0.0, 0.0])
SIZES = [(64, 64), (50, 45)]


def randomized(model, seed):
    """``modelhelp.randomize`` plus BatchNorm running statistics away from 0 and 1."""
    randomize(model, seed)
    gen = torch.Generator().manual_seed(seed + 100)
    with torch.no_grad():
        for name, b in sorted(model.named_buffers()):
            if name.endswith("running_mean"):
                b.copy_(0.3 * torch.randn(b.shape, generator=gen))
            elif name.endswith("running_var"):
                b.copy_(0.5 + torch.rand(b.shape, generator=gen))
    return model.eval()


def images(size, seed=1):
    return np.random.default_rng(seed).standard_normal((2, 3, *size)).astype(np.float32)


@pytest.fixture(scope="module")
def cls_case(tmp_path_factory):
    """(HF classifier, its folder, our model, {size: (images, HF outputs)})."""
    torch.manual_seed(0)
    model = randomized(transformers.CvtForImageClassification(
        transformers.CvtConfig(**CLS_CONFIG)), 0)
    path = tmp_path_factory.mktemp("cvt_cls")
    model.save_pretrained(str(path))
    refs = {}
    for size in SIZES:
        x = images(size)
        with torch.no_grad():
            out = model(pixel_values=torch.from_numpy(x), output_hidden_states=True)
            base = model.cvt(pixel_values=torch.from_numpy(x))
        refs[size] = (x, {"logits": out.logits.numpy(),
                          "last_hidden_state": base.last_hidden_state.numpy(),
                          "hidden_states_last": out.hidden_states[-1].numpy(),
                          "cls_token_value": base.cls_token_value.numpy()})
    return model, path, md.load_model(SPEC, str(path)), refs


@pytest.fixture(scope="module")
def headless_case(tmp_path_factory):
    torch.manual_seed(1)
    model = randomized(transformers.CvtModel(transformers.CvtConfig(**HEADLESS_CONFIG)), 1)
    path = tmp_path_factory.mktemp("cvt_base")
    model.save_pretrained(str(path))
    return model, path, md.load_model(SPEC, str(path))


def ours(m, x) -> dict:
    return dict(zip(m.output_names, m(x)))


def test_params_from_config(cls_case):
    model, _, m, _ = cls_case
    cfg = model.config
    assert m.output_names == ["logits", "last_hidden_state", "cls_token_value"]
    for key in ("embed_dim", "num_heads", "depth", "cls_token", "stride_kv", "patch_sizes"):
        assert m.params[key] == list(getattr(cfg, key)), key
    assert m.params["n_classes"] == cfg.num_labels
    assert m.params["n_stages"] == 3
    assert m.params["has_head"] == 1
    kinds = {n.op for n in m.graph.nodes}
    assert {"conv2d", "batch_norm", "attention"} <= kinds


@pytest.mark.parametrize("size", SIZES, ids=lambda s: f"{s[0]}x{s[1]}")
def test_logits_match_transformers(cls_case, size):
    _, _, m, refs = cls_case
    x, ref = refs[size]
    got = ours(m, x)
    assert got["logits"].shape == ref["logits"].shape == (2, CLS_CONFIG["num_labels"])
    err = rel_err(got["logits"], ref["logits"])
    print(f"cvt logits {size}: {err:.2e} of max|ref| ({np.abs(ref['logits']).max():.2f})")
    assert err <= TOL


@pytest.mark.parametrize("size", SIZES, ids=lambda s: f"{s[0]}x{s[1]}")
def test_last_hidden_state_matches_transformers(cls_case, size):
    _, _, m, refs = cls_case
    x, ref = refs[size]
    got = ours(m, x)
    h, w = ((n + 2 * 2 - 7) // 4 + 1 for n in size)            # 7x7 patches, stride 4, pad 2
    for _ in range(2):                                           # 3x3, stride 2, pad 1
        h, w = (h + 2 - 3) // 2 + 1, (w + 2 - 3) // 2 + 1
    assert ref["last_hidden_state"].shape == (2, 32, h, w)
    np.testing.assert_array_equal(ref["last_hidden_state"], ref["hidden_states_last"])
    assert got["last_hidden_state"].shape == ref["last_hidden_state"].shape
    err = rel_err(got["last_hidden_state"], ref["last_hidden_state"])
    err_cls = rel_err(got["cls_token_value"], ref["cls_token_value"])
    print(f"cvt last_hidden_state {size}: {err:.2e}; cls_token_value {err_cls:.2e}")
    assert err <= TOL
    assert err_cls <= TOL


def test_batchnorm_statistics_are_read(cls_case):
    """Negative control: the logits move when the running statistics are replaced by
    the defaults (mean 0, var 1), so the comparison depends on them."""
    _, path, _, refs = cls_case
    td = md.load_weights(str(path), spec=SPEC)
    stats = [k for k in td.keys() if k.endswith("running_mean")]
    assert len(stats) == 3 * sum(CLS_CONFIG["depth"])
    for k in stats:
        td[k] = np.zeros_like(np.asarray(td[k]))
    x, ref = refs[SIZES[0]]
    got = ours(md.load_model(SPEC, td), x)
    assert rel_err(got["logits"], ref["logits"]) > 1e-2


@pytest.mark.parametrize("size", SIZES, ids=lambda s: f"{s[0]}x{s[1]}")
def test_headless_model_matches_transformers(headless_case, size):
    """CvtModel: two stages, no class token, no q/k/v biases, 5x5 q/k/v kernels."""
    model, _, m = headless_case
    assert m.output_names == ["last_hidden_state"]
    assert m.params["has_head"] == 0
    assert m.params["embed_dim"] == HEADLESS_CONFIG["embed_dim"]
    x = images(size, seed=2)
    with torch.no_grad():
        ref = model(pixel_values=torch.from_numpy(x)).last_hidden_state.numpy()
    (got,) = m(x)
    assert got.shape == ref.shape
    err = rel_err(got, ref)
    print(f"cvt headless last_hidden_state {size}: {err:.2e}")
    assert err <= TOL


def test_refuses_other_projections(tmp_path, cls_case):
    _, path, _, _ = cls_case
    for f in path.iterdir():
        (tmp_path / f.name).write_bytes(f.read_bytes())
    cfg = json.loads((tmp_path / "config.json").read_text())
    cfg["qkv_projection_method"] = ["dw_bn", "dw_bn", "avg"]
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(md.WeightsError, match="qkv_projection_method .* is not modelled"):
        md.load_weights(str(tmp_path), spec=SPEC)
