"""specs/levit.yaml against transformers' LevitModel, LevitForImageClassification and
LevitForImageClassificationWithTeacher.

Seeded small float32 models saved with ``save_pretrained`` (safetensors + config.json),
in eval mode, with every parameter and buffer random: linear and conv weights
N(0, 1 / fan_in), BatchNorm gains ``1 + 0.2 N(0, 1)``, biases ``0.3 N(0, 1)``, running
means ``0.2 N(0, 1)``, running variances uniform in [0.5, 2] (so the folded eval-mode
BatchNorms matter) and the attention biases 2 N(0, 1) (so their relative-offset index
matters). The sizes come from config.json, not the variant. The cases cover the three
classes (no head: ``last_hidden_state`` and ``pooler_output``; one head; the teacher's two
heads and their mean), even and odd token grids (a 5x5 grid subsampled to 3x3 and 2x2),
a stage without MLP layers (``mlp_ratio`` 0, which renumbers the HF layers), different
key dims, attention ratios, head counts and depths per stage, a headless teacher
(``num_labels`` 0: every logit is the pooled feature) and transformers' default
LevitConfig (levit-128S sized, 224 px: 14x14 tokens).
"""

import json

import numpy as np
import pytest

import maxdecl as md
from modelhelp import TOL, rel_err, spec_path

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

SPEC = spec_path("levit")

CASES = {
    # the spec's tiny variant's sizes: a 4x4 grid -> 2x2 -> 1x1, one head
    "cls64": dict(cls="LevitForImageClassification",
                  config=dict(image_size=64, hidden_sizes=[32, 48, 64], num_attention_heads=[2, 3, 4],
                              depths=[1, 2, 1], key_dim=[8, 8, 16], num_labels=5),
                  images=(2, 3, 64, 64)),
    # teacher head; an odd 5x5 grid -> 3x3 -> 2x2; no MLP in stage 0; other ratios and key dims
    "teacher80": dict(cls="LevitForImageClassificationWithTeacher",
                      config=dict(image_size=80, hidden_sizes=[24, 40, 56],
                                  num_attention_heads=[3, 2, 4], depths=[2, 1, 3], key_dim=[4, 8, 8],
                                  attention_ratio=[1, 2, 4], mlp_ratio=[0, 3, 2], num_labels=7),
                      images=(2, 3, 80, 80)),
    # a bare LevitModel (no levit. prefix, no head): 6x6 -> 3x3 -> 2x2
    "base96": dict(cls="LevitModel",
                   config=dict(image_size=96, hidden_sizes=[16, 32, 48], num_attention_heads=[2, 4, 4],
                               depths=[1, 1, 2], key_dim=[8, 8, 12]),
                   images=(1, 3, 96, 96)),
}

OUTPUTS = ("logits", "cls_logits", "distillation_logits", "pooler_output", "last_hidden_state")


def randomize(model, seed):
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in sorted(model.state_dict().items()):
            if name.endswith(("num_batches_tracked", "attention_bias_idxs")):
                continue
            if name.endswith("running_mean"):
                p.copy_(0.2 * torch.randn(p.shape, generator=gen))
            elif name.endswith("running_var"):
                p.copy_(0.5 + 1.5 * torch.rand(p.shape, generator=gen))
            elif name.endswith("attention_biases"):
                p.copy_(2.0 * torch.randn(p.shape, generator=gen))
            elif name.endswith(".bias"):
                p.copy_(0.3 * torch.randn(p.shape, generator=gen))
            elif p.ndim == 1:
                p.copy_(1.0 + 0.2 * torch.randn(p.shape, generator=gen))
            else:
                fan_in = int(np.prod(p.shape[1:]))
                p.copy_(torch.randn(p.shape, generator=gen) / fan_in ** 0.5)
    return model.eval()


def make_levit(cls, config, seed=0):
    torch.manual_seed(seed)
    return randomize(getattr(transformers, cls)(transformers.LevitConfig(**config)), seed)


def reference(model, x) -> dict:
    """Every output the HF model gives, by the spec's output names."""
    with torch.no_grad():
        out = model(pixel_values=torch.from_numpy(x))
    return {k: out[k].numpy() for k in OUTPUTS if k in out}


def images(shape, seed=1):
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


def errors(m, x, ref) -> dict:
    got = dict(zip(m.output_names, m(x)))
    return {k: rel_err(got[k], v) for k, v in ref.items()}


@pytest.fixture(scope="module", params=sorted(CASES))
def case(request, tmp_path_factory):
    c = CASES[request.param]
    model = make_levit(c["cls"], c["config"])
    path = tmp_path_factory.mktemp(f"levit_{request.param}")
    model.save_pretrained(str(path))
    x = images(c["images"])
    return request.param, model, str(path), x, reference(model, x)


def test_outputs_match_transformers(case):
    name, model, path, x, ref = case
    m = md.load_model(SPEC, path)
    cfg = model.config
    assert m.params["image_size"] == cfg.image_size
    assert m.params["hidden_sizes"] == list(cfg.hidden_sizes)
    assert m.params["depths"] == list(cfg.depths)
    assert m.params["key_dim"] == list(cfg.key_dim)
    assert m.params["mlp_ratio"] == list(cfg.mlp_ratio)
    assert m.params["attention_ratio"] == list(cfg.attention_ratio)
    assert m.params["n_heads"] == list(cfg.num_attention_heads)
    teacher = "Teacher" in CASES[name]["cls"]
    assert m.params["teacher"] == teacher
    assert m.params["n_classes"] == (0 if CASES[name]["cls"] == "LevitModel" else cfg.num_labels)
    assert m.output_names[:3] == ["logits", "pooler_output", "last_hidden_state"]
    assert ("cls_logits" in m.output_names) == teacher
    errs = errors(m, x, ref)
    print(f"levit {name} vs HF: " + ", ".join(f"{k} {v:.2e}" for k, v in errs.items()))
    assert set(errs) >= ({"logits"} if name != "base96" else {"last_hidden_state", "pooler_output"})
    for k, err in errs.items():
        assert err <= TOL, (k, err)
        assert err < 1e-5, (k, err)           # float32 throughout: much tighter than TOL


def _perturbed(path, how):
    td = md.load_weights(path, spec=SPEC)
    for k in list(td.keys()):
        a = np.asarray(td[k])
        if how == "running_stats" and k.endswith("running_var"):
            td[k] = np.ones_like(a)
        elif how == "running_stats" and k.endswith("running_mean"):
            td[k] = np.zeros_like(a)
        elif how == "bias_offsets" and k.endswith("attention_biases"):
            td[k] = a[:, ::-1].copy()         # right values, wrong relative offsets
        elif how == "one_weight" and k == "encoder.stages.1.layers.0.module.queries_keys_values.linear.weight":
            td[k] = a * 1.5
    return td


@pytest.mark.parametrize("how", ["running_stats", "bias_offsets", "one_weight"])
def test_negative_controls(case, how):
    """The comparison above fails when the BatchNorm running statistics are reset to
    torch's initial ones, when the attention biases are read at the wrong offsets, or
    when one projection is scaled: each error is far above TOL (and the float32 match
    above is about 5e-7)."""
    name, model, path, x, ref = case
    m = md.load_model(SPEC, _perturbed(path, how))
    errs = errors(m, x, ref)
    key = "logits" if "logits" in ref else "last_hidden_state"
    print(f"levit {name} {how}: {key} {errs[key]:.2e}")
    assert errs[key] > 5 * TOL


def test_default_config_224(tmp_path):
    """transformers' LevitConfig() (levit-128S sized: 14x14 tokens, 196 x 196 bias index)
    with the teacher head."""
    model = make_levit("LevitForImageClassificationWithTeacher", dict(num_labels=10), seed=3)
    model.save_pretrained(str(tmp_path))
    x = images((1, 3, 224, 224), seed=4)
    ref = reference(model, x)
    m = md.load_model(SPEC, str(tmp_path))
    assert m.params["res"] == [14, 7, 4]
    errs = errors(m, x, ref)
    print("levit 224 vs HF: " + ", ".join(f"{k} {v:.2e}" for k, v in errs.items()))
    assert set(errs) == {"logits", "cls_logits", "distillation_logits"}
    assert max(errs.values()) < 1e-5


def test_headless_teacher(tmp_path):
    """num_labels 0: both heads are nn.Identity, so every logit is the pooled feature."""
    model = make_levit("LevitForImageClassificationWithTeacher",
                       dict(image_size=48, hidden_sizes=[16, 24, 32], num_attention_heads=[2, 3, 4],
                            depths=[1, 1, 1], key_dim=[8, 8, 8], num_labels=0), seed=5)
    model.save_pretrained(str(tmp_path))
    x = images((2, 3, 48, 48), seed=6)
    ref = reference(model, x)
    m = md.load_model(SPEC, str(tmp_path))
    assert m.params["n_classes"] == 0 and m.params["teacher"]
    got = dict(zip(m.output_names, m(x)))
    for k in ("logits", "cls_logits", "distillation_logits"):
        assert got[k].shape == (2, 32)
        assert rel_err(got[k], ref[k]) < 1e-5
        assert rel_err(got[k], got["pooler_output"]) < 1e-6


@pytest.mark.parametrize("edit, why", [
    (dict(image_size=[64, 64]), "image_size and patch_size must be single ints"),
    (dict(hidden_sizes=[32, 48, 64, 80], depths=[1, 1, 1, 1]), "exactly three stages"),
])
def test_refuses(tmp_path, edit, why):
    """config.json edits transformers itself cannot run are refused with a reason."""
    model = make_levit("LevitForImageClassification",
                       dict(image_size=64, hidden_sizes=[32, 48, 64], num_attention_heads=[2, 3, 4],
                            depths=[1, 1, 1], key_dim=[8, 8, 8], num_labels=2))
    model.save_pretrained(str(tmp_path))
    cfg = json.loads((tmp_path / "config.json").read_text())
    cfg.update(edit)
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(md.WeightsError, match=why):
        md.load_weights(str(tmp_path), spec=SPEC)
