"""specs/segformer.yaml against transformers' SegformerForImageClassification.

Seeded small float32 models saved with ``save_pretrained`` (safetensors + config.json);
every parameter random (LayerNorm gains and biases, conv and linear weights and biases),
so a weight read wrongly or left out changes the logits. The sizes come from
config.json, not the variant: the second model has three stages, other widths, head
counts, sequence-reduction ratios (4, 2, 1), MLP ratios, another label count and
another activation, and runs on images whose sides are not multiples of the strides.
"""

import numpy as np
import pytest

import maxdecl as md
from modelhelp import TOL, randomize, rel_err, spec_path

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

SPEC = spec_path("segformer")

CASES = {
    # the spec's tiny variant's sizes
    "two_stages": dict(config=dict(num_encoder_blocks=2, depths=[1, 2], hidden_sizes=[16, 32],
                                   num_attention_heads=[1, 2], sr_ratios=[2, 1],
                                   patch_sizes=[7, 3], strides=[4, 2], mlp_ratios=[4, 2],
                                   num_labels=5),
                       images=(2, 3, 32, 40)),
    # sizes the variant does not have: config.json must win; odd feature-map sizes
    # (36 x 44 -> 9 x 11 -> 5 x 6 -> 3 x 3), so the reduction convs drop a remainder
    "three_stages": dict(config=dict(num_encoder_blocks=3, depths=[2, 1, 1],
                                     hidden_sizes=[8, 24, 32], num_attention_heads=[2, 3, 4],
                                     sr_ratios=[4, 2, 1], patch_sizes=[7, 3, 3],
                                     strides=[4, 2, 2], mlp_ratios=[2, 4, 3], num_labels=7,
                                     hidden_act="gelu_new"),
                         images=(2, 3, 36, 44)),
}


def make_segformer(config, seed=0):
    torch.manual_seed(seed)
    cfg = transformers.SegformerConfig(**config)
    return randomize(transformers.SegformerForImageClassification(cfg), seed)


def reference(model, x):
    with torch.no_grad():
        return model(pixel_values=torch.from_numpy(x)).logits.numpy()


@pytest.fixture(scope="module", params=sorted(CASES))
def case(request, tmp_path_factory):
    c = CASES[request.param]
    model = make_segformer(c["config"])
    path = tmp_path_factory.mktemp(f"segformer_{request.param}")
    model.save_pretrained(str(path))
    x = np.random.default_rng(1).standard_normal(c["images"]).astype(np.float32)
    return request.param, model, path, x, reference(model, x)


def test_logits_match_transformers(case):
    name, model, path, x, ref = case
    m = md.load_model(SPEC, str(path))
    cfg = model.config
    assert m.params["n_stages"] == cfg.num_encoder_blocks
    assert m.params["depths"] == list(cfg.depths)
    assert m.params["hidden_sizes"] == list(cfg.hidden_sizes)
    assert m.params["sr_ratios"] == list(cfg.sr_ratios)
    assert m.params["n_classes"] == cfg.num_labels
    assert m.params["hidden_act"] == cfg.hidden_act
    (logits,) = m(x)
    assert logits.shape == ref.shape == (x.shape[0], cfg.num_labels)
    err = rel_err(logits, ref)
    print(f"segformer {name} vs HF: {err:.2e} of max|ref| ({np.abs(ref).max():.2f})")
    assert err <= TOL
    assert err < 1e-5                           # float32 throughout: much tighter than TOL


def test_other_image_size(case):
    """H and W are symbolic: one loaded model runs on another image size too."""
    name, model, path, x, ref = case
    m = md.load_model(SPEC, str(path))
    y = np.random.default_rng(2).standard_normal((1, 3, 24, 28)).astype(np.float32)
    (logits,) = m(y)
    assert rel_err(logits, reference(model, y)) < 1e-5


def test_reduction_is_read(case):
    """Negative control: the logits move when a sequence-reduction conv changes."""
    name, model, path, x, ref = case
    td = md.load_weights(str(path), spec=SPEC)
    sr = [k for k in td.keys() if k.endswith(".attn_sr.weight")]
    reduced = [s for s, r in enumerate(model.config.sr_ratios) if r > 1]
    assert len(sr) == sum(model.config.depths[s] for s in reduced)
    for k in sr:
        td[k] = np.zeros_like(np.asarray(td[k]))
    (logits,) = md.load_model(SPEC, td)(x)
    assert rel_err(logits, ref) > 1e-3


def test_state_dict_names(tmp_path):
    """transformers 5's in-memory names (a torch state_dict saved as one file, no
    config.json) load too, with the tiny variant's sizes."""
    from safetensors.torch import save_file

    c = CASES["two_stages"]
    model = make_segformer(c["config"], seed=3)
    sd = {k: v.contiguous() for k, v in model.state_dict().items()}
    assert any(".q_proj." in k for k in sd)
    save_file(sd, str(tmp_path / "model.safetensors"))
    m = md.load_model(SPEC, str(tmp_path / "model.safetensors"), variant="tiny")
    x = np.random.default_rng(4).standard_normal((1, 3, 32, 32)).astype(np.float32)
    (logits,) = m(x)
    assert rel_err(logits, reference(model, x)) < 1e-5


def test_refuses_mismatched_lists(tmp_path):
    model = make_segformer(CASES["two_stages"]["config"])
    model.save_pretrained(str(tmp_path))
    td = md.load_weights(str(tmp_path))
    td.metadata["sr_ratios"] = [2, 1, 1]
    with pytest.raises(md.WeightsError, match="must have num_encoder_blocks entries"):
        md.load_model(SPEC, td)
