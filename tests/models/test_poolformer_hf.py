"""specs/poolformer.yaml against transformers' PoolFormerForImageClassification and
PoolFormerModel.

Small seeded float32 models: strided conv patch embeddings per stage, blocks of
GroupNorm(1, C), AvgPool2d(count_include_pad=False) minus its input, 1x1-conv MLP and
layer scales; the head is GroupNorm(1, C), a mean over H and W and a linear classifier.
Two configurations (four stages with layer scale and GELU; three stages with other
depths, widths, kernel sizes, pool size 5, gelu_new, 4 input channels and no layer
scale), each at two image sizes (one square, one not a multiple of the total stride).
"""

import numpy as np
import pytest

import maxdecl as md

from modelhelp import hf_params, named_outputs, randomize, rel_err, save_hf, spec_path

pytest.importorskip("torch")
pytest.importorskip("transformers")

TOL = 1e-5          # max|ours - ref| <= TOL * max|ref|

CONFIGS = {
    # four stages as in the released checkpoints, narrow and shallow
    "base": dict(num_channels=3, depths=[1, 1, 2, 1], hidden_sizes=[16, 24, 32, 48],
                 patch_sizes=[7, 3, 3, 3], strides=[4, 2, 2, 2], padding=[2, 1, 1, 1],
                 num_encoder_blocks=4, pool_size=3, mlp_ratio=4.0, hidden_act="gelu",
                 use_layer_scale=True, num_labels=7),
    # other depths, widths, kernels, pool size, activation, channels; no layer scale
    "other": dict(num_channels=4, depths=[2, 1, 3], hidden_sizes=[8, 20, 12],
                  patch_sizes=[5, 3, 2], strides=[2, 2, 2], padding=[1, 1, 0],
                  num_encoder_blocks=3, pool_size=5, mlp_ratio=3.0, hidden_act="gelu_new",
                  use_layer_scale=False, num_labels=5),
}
SIZES = {"base": [(64, 64), (72, 52)], "other": [(32, 32), (27, 41)]}


def make_poolformer(seed=0, headless=False, **kw):
    import torch
    import transformers

    torch.manual_seed(seed)
    config = transformers.PoolFormerConfig(**kw)
    cls = transformers.PoolFormerModel if headless else transformers.PoolFormerForImageClassification
    return randomize(cls(config), seed)


def pixels(cfg, size, batch=2, seed=11):
    h, w = size
    rng = np.random.default_rng(seed + h * 1000 + w)
    return rng.standard_normal((batch, cfg["num_channels"], h, w)).astype(np.float32)


def hf_outputs(model, x, headless=False):
    """(logits or None, last_hidden_state) of the transformers model on NCHW ``x``."""
    import torch

    with torch.no_grad():
        t = torch.from_numpy(x)
        if headless:
            return None, model(pixel_values=t).last_hidden_state.numpy()
        logits = model(pixel_values=t).logits.numpy()
        hidden = model.poolformer(pixel_values=t).last_hidden_state.numpy()
    return logits, hidden


@pytest.fixture(scope="module")
def cases(tmp_path_factory):
    """name -> (HF model, saved folder, maxdecl model)."""
    out = {}
    for k, (name, cfg) in enumerate(CONFIGS.items()):
        model = make_poolformer(seed=k, **cfg)
        path = save_hf(model, tmp_path_factory.mktemp(f"poolformer_{name}"))
        out[name] = (model, path, md.load_model(spec_path("poolformer"), path))
    return out


@pytest.fixture(scope="module")
def headless(tmp_path_factory):
    cfg = CONFIGS["base"]
    model = make_poolformer(seed=5, headless=True, **cfg)
    path = save_hf(model, tmp_path_factory.mktemp("poolformer_headless"))
    return model, path, md.load_model(spec_path("poolformer"), path)


def test_poolformer_config_from_hf(cases):
    for name, cfg in CONFIGS.items():
        got = hf_params("poolformer", cases[name][1])[2]
        assert got["depths"] == cfg["depths"]
        assert got["hidden_sizes"] == cfg["hidden_sizes"]
        assert got["patch_sizes"] == cfg["patch_sizes"]
        assert got["strides"] == cfg["strides"]
        assert got["padding"] == cfg["padding"]
        assert got["n_stages"] == cfg["num_encoder_blocks"]
        assert got["pool_size"] == cfg["pool_size"]
        assert got["mlp_ratio"] == cfg["mlp_ratio"]
        assert got["hidden_act"] == cfg["hidden_act"]
        assert got["num_channels"] == cfg["num_channels"]
        assert got["n_classes"] == cfg["num_labels"]
        assert got["has_head"] == 1
    assert cases["base"][2].output_names[:2] == ["logits", "last_hidden_state"]


@pytest.mark.parametrize("name,size_index", [(n, i) for n in CONFIGS for i in range(2)])
def test_poolformer_matches_hf(cases, name, size_index):
    model, _, ours = cases[name]
    size = SIZES[name][size_index]
    x = pixels(CONFIGS[name], size)
    ref_logits, ref_hidden = hf_outputs(model, x)
    got = named_outputs(ours, x)
    e_logits = rel_err(got["logits"], ref_logits)
    e_hidden = rel_err(got["last_hidden_state"], ref_hidden)
    print(f"poolformer {name} {size}: logits {e_logits:.2e}, last_hidden_state "
          f"{e_hidden:.2e} (of max|ref|), hidden shape {ref_hidden.shape}")
    assert got["logits"].shape == ref_logits.shape
    assert got["last_hidden_state"].shape == ref_hidden.shape
    assert e_logits <= TOL and e_hidden <= TOL


def test_poolformer_headless_model_matches_hf(headless):
    """A PoolFormerModel checkpoint (no poolformer. prefix, no norm or classifier)."""
    model, path, ours = headless
    assert ours.output_names == ["last_hidden_state"]
    assert hf_params("poolformer", path)[2]["has_head"] == 0
    for size in SIZES["base"]:
        x = pixels(CONFIGS["base"], size, batch=1)
        _, ref = hf_outputs(model, x, headless=True)
        (got,) = ours(x)
        err = rel_err(got, ref)
        print(f"poolformer headless {size}: last_hidden_state {err:.2e}")
        assert err <= TOL


def test_poolformer_layer_scale_matters(cases):
    """Negative control: with the checkpoint's layer scales replaced by ones (what the
    absent fill gives a model without them) the outputs are far off, so the spec reads
    them; a checkpoint whose config has use_layer_scale but lacks them is refused."""
    model, path, _ = cases["base"]
    td = md.load_weights(path)
    names = [k for k in td.keys() if "layer_scale" in k]
    assert names
    for k in names:
        td[k] = np.ones_like(np.asarray(td[k]))
    ours = md.load_model(spec_path("poolformer"), td)
    x = pixels(CONFIGS["base"], SIZES["base"][0])
    ref_logits, ref_hidden = hf_outputs(model, x)
    got = named_outputs(ours, x)
    assert rel_err(got["last_hidden_state"], ref_hidden) > 100 * TOL
    for k in names:
        del td[k]
    with pytest.raises(md.WeightsError, match=r"missing 10 \(encoder.block.0.0.layer_scale_1"):
        md.load_model(spec_path("poolformer"), td)


def test_poolformer_without_labels_matches_hf(tmp_path):
    """num_labels 0: transformers' classifier is nn.Identity, logits are the pooled
    normed features (the spec's classifier group repeats 0 times)."""
    cfg = dict(CONFIGS["base"], num_labels=0)
    model = make_poolformer(seed=3, **cfg)
    path = save_hf(model, tmp_path / "nolabels")
    ours = md.load_model(spec_path("poolformer"), path)
    assert ours.params["n_classes"] == 0
    x = pixels(cfg, SIZES["base"][1])
    ref_logits, ref_hidden = hf_outputs(model, x)
    got = named_outputs(ours, x)
    assert got["logits"].shape == ref_logits.shape == (2, cfg["hidden_sizes"][-1])
    assert rel_err(got["logits"], ref_logits) <= TOL
    assert rel_err(got["last_hidden_state"], ref_hidden) <= TOL
