"""specs/bit.yaml against transformers' BitForImageClassification and BitModel.

Seeded small float32 models saved with ``save_pretrained`` (safetensors + config.json),
in eval mode, with every parameter random: conv filters N(0, 1) plus an offset per
filter of 0.5 N(0, 1) (so the weight standardization's mean and variance both matter),
GroupNorm gains ``1 + 0.2 N(0, 1)`` and biases ``0.3 N(0, 1)``, classifier N(0, 1 / fan_in).
Sizes come from config.json, not the variant. The cases cover both layer types
(pre-activation and plain bottleneck), global_padding SAME (TF's dynamic padding at
stride 2, which depends on whether each size is even: even and odd image sizes) and
null (torch's symmetric padding, with the stem's zero ConstantPad2d), the max pool's
dynamic zero padding on and off, output_stride 4 (dilated 3x3 convs: stage dilations 2
and 4, the first layer of the latter at 2), several activations, and a bare BitModel
checkpoint with width_factor 2 and widths that make_div rounds (no ``bit.`` prefix, no head).
"""

import json

import numpy as np
import pytest

import maxdecl as md
from modelhelp import TOL, rel_err, spec_path, with_hf_config

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

SPEC = spec_path("bit")

IMAGES = [(2, 3, 32, 32), (1, 3, 33, 30), (1, 3, 37, 41)]   # even, mixed and odd sizes

CASES = {
    # the BiT checkpoints' setting: pre-activation, SAME, dynamic max-pool padding
    "preact_same": dict(layer_type="preactivation", embedding_size=16, hidden_sizes=[32, 64, 64],
                        depths=[2, 1, 1], num_groups=4, global_padding="SAME",
                        embedding_dynamic_padding=True, num_labels=5),
    # torch padding: the stem's ConstantPad2d(1) then dynamic max-pool padding; gelu
    "preact_torch_pad": dict(layer_type="preactivation", embedding_size=16, hidden_sizes=[24, 48],
                             depths=[1, 2], num_groups=8, global_padding=None,
                             embedding_dynamic_padding=True, hidden_act="gelu", num_labels=3),
    # ViT-hybrid style layers with torch padding, plain max pool
    "bottleneck_torch_pad": dict(layer_type="bottleneck", embedding_size=16, hidden_sizes=[32, 64],
                                 depths=[1, 2], num_groups=4, global_padding=None,
                                 embedding_dynamic_padding=False, num_labels=4),
    # SAME with output_stride 4: stage 1 dilation 2 (stride 1), stage 2 dilation 4
    "bottleneck_same_dilated": dict(layer_type="bottleneck", embedding_size=16,
                                    hidden_sizes=[32, 48, 64], depths=[1, 2, 2], num_groups=4,
                                    global_padding="SAME", embedding_dynamic_padding=True,
                                    output_stride=4, hidden_act="silu", num_labels=6),
}


def randomize(model, seed):
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in sorted(model.state_dict().items()):
            if name.endswith(".bias"):
                p.copy_(0.3 * torch.randn(p.shape, generator=gen))
            elif p.ndim == 1:
                p.copy_(1.0 + 0.2 * torch.randn(p.shape, generator=gen))
            elif p.ndim == 4:                       # conv filters: standardized, so any scale
                offset = 0.5 * torch.randn((p.shape[0], 1, 1, 1), generator=gen)
                p.copy_(torch.randn(p.shape, generator=gen) + offset)
            else:
                p.copy_(torch.randn(p.shape, generator=gen) / p.shape[-1] ** 0.5)
    return model.eval()


def make_bit(config, seed=0, cls=None):
    torch.manual_seed(seed)
    cfg = transformers.BitConfig(**config)
    return randomize((cls or transformers.BitForImageClassification)(cfg), seed)


def reference(model, x):
    """(logits, pooled [n, C], last_hidden_state NCHW) of a BitForImageClassification."""
    with torch.no_grad():
        t = torch.from_numpy(x)
        logits = model(pixel_values=t).logits.numpy()
        out = model.bit(t)
    return logits, out.pooler_output.flatten(1).numpy(), out.last_hidden_state.numpy()


@pytest.fixture(scope="module", params=sorted(CASES))
def case(request, tmp_path_factory):
    model = make_bit(CASES[request.param])
    path = tmp_path_factory.mktemp(f"bit_{request.param}")
    model.save_pretrained(str(path))
    rng = np.random.default_rng(1)
    batches = []
    for shape in IMAGES:
        x = rng.standard_normal(shape).astype(np.float32)
        batches.append((x, *reference(model, x)))
    return request.param, model, str(path), batches


def test_outputs_match_transformers(case):
    name, model, path, batches = case
    m = md.load_model(SPEC, path)
    cfg = model.config
    assert m.params["layer_type"] == cfg.layer_type
    assert m.params["hidden_sizes"] == list(cfg.hidden_sizes)
    assert m.params["depths"] == list(cfg.depths)
    assert m.params["num_groups"] == cfg.num_groups
    assert m.params["same"] == (cfg.global_padding == "SAME")
    assert m.params["embedding_dynamic_padding"] == cfg.embedding_dynamic_padding
    assert m.params["n_classes"] == cfg.num_labels
    assert m.output_names == ["logits", "pooler_output", "last_hidden_state"]
    convs = [nd for nd in m.graph.nodes if nd.op == "conv2d" and nd.layer.startswith("stages.")]
    assert len(convs) == 3 * sum(cfg.depths) + len(cfg.depths)   # conv1-3, one downsample per stage
    for nd in convs:                           # strides and dilations as transformers builds them
        hf = model.bit.encoder.get_submodule(nd.layer)
        assert (nd.attrs["stride"], nd.attrs["dilation"]) == (tuple(hf.stride), tuple(hf.dilation))
    for x, ref, ref_pooled, ref_last in batches:
        logits, pooled, last = m(x)
        assert logits.shape == ref.shape == (x.shape[0], cfg.num_labels)
        assert last.shape == ref_last.shape
        errs = [rel_err(logits, ref), rel_err(pooled, ref_pooled), rel_err(last, ref_last)]
        print(f"bit {name} {x.shape} vs HF: logits {errs[0]:.2e}, pooled {errs[1]:.2e}, "
              f"last_hidden_state {errs[2]:.2e} of max|ref| ({np.abs(ref).max():.2f})")
        assert max(errs) <= TOL
        assert max(errs) < 1e-5                 # float32 throughout: much tighter than TOL


def test_weight_standardization_is_computed_from_the_weights(case):
    """Each filter is normalised by its own mean and variance: scaling and shifting a
    filter as a whole changes nothing, while noise on one filter (negative control)
    moves the logits far beyond the tolerance."""
    name, model, path, batches = case
    x, ref = batches[0][:2]
    td = md.load_weights(path, spec=SPEC)
    convs = sorted(k for k in td.keys() if np.asarray(td[k]).ndim == 4)
    assert "embedder.convolution.weight" in convs and len(convs) > 4
    rng = np.random.default_rng(5)
    affine = md.load_weights(path, spec=SPEC)
    for k in convs:
        w = np.asarray(td[k])
        scale = rng.uniform(0.5, 3.0, (w.shape[0], 1, 1, 1)).astype(np.float32)
        shift = rng.standard_normal((w.shape[0], 1, 1, 1)).astype(np.float32)
        affine[k] = w * scale + shift
    assert rel_err(md.load_model(SPEC, affine)(x)[0], ref) < 1e-4
    k = "embedder.convolution.weight"
    w = np.asarray(td[k]).copy()
    w[0] += rng.standard_normal(w[0].shape).astype(np.float32)
    td[k] = w
    assert rel_err(md.load_model(SPEC, td)(x)[0], ref) > 1e-2


def test_same_padding_is_read(tmp_path):
    """Negative control: the SAME checkpoint run with torch's symmetric padding instead
    (global_padding read as null) is far off, at even and odd sizes alike."""
    model = make_bit(CASES["preact_same"])
    spec = with_hf_config(md.load_spec(SPEC), global_padding="{'none'}")
    model.save_pretrained(str(tmp_path))
    m = md.load_model(spec, str(tmp_path))
    assert m.params["same"] is False
    for shape in [(1, 3, 32, 32), (1, 3, 33, 33)]:
        x = np.random.default_rng(2).standard_normal(shape).astype(np.float32)
        assert rel_err(m(x)[0], reference(model, x)[0]) > 1e-2


def test_lowercase_same_padding(tmp_path):
    """Older config.json files may spell global_padding in lower case ("same")."""
    model = make_bit(CASES["bottleneck_same_dilated"], seed=4)
    model.save_pretrained(str(tmp_path))
    cfg = json.loads((tmp_path / "config.json").read_text())
    cfg["global_padding"] = "same"
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    m = md.load_model(SPEC, str(tmp_path))
    assert m.params["same"] is True
    x = np.random.default_rng(4).standard_normal((1, 3, 34, 31)).astype(np.float32)
    assert rel_err(m(x)[0], reference(model, x)[0]) < 1e-5


def test_refuses_valid_padding(tmp_path):
    """transformers' VALID padding fails in transformers itself (the 3x3 convs shrink the
    map); the spec refuses it by name."""
    model = make_bit(dict(embedding_size=8, hidden_sizes=[16], depths=[1], num_groups=4,
                          num_labels=2))
    model.save_pretrained(str(tmp_path))
    cfg = json.loads((tmp_path / "config.json").read_text())
    cfg["global_padding"] = "VALID"
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(md.WeightsError, match="global_padding VALID is not modelled"):
        md.load_weights(str(tmp_path), spec=SPEC)


def test_base_model_checkpoint_with_width_factor(tmp_path):
    """A BitModel folder (names without ``bit.``, no head although config.json implies 2
    labels): the logits are the pooled features. width_factor 2 and make_div's rounding
    give stage widths 40 and 72 and bottleneck widths 16 and 24 from hidden_sizes [20, 36]
    (a bottleneck model: the preactivation final norm would not fit these widths in
    transformers either)."""
    model = make_bit(dict(layer_type="bottleneck", embedding_size=16, hidden_sizes=[20, 36],
                          depths=[1, 1], num_groups=8, width_factor=2, global_padding="SAME"),
                     seed=3, cls=transformers.BitModel)
    model.save_pretrained(str(tmp_path))
    x = np.random.default_rng(3).standard_normal((2, 3, 30, 28)).astype(np.float32)
    with torch.no_grad():
        out = model(torch.from_numpy(x))
    m = md.load_model(SPEC, str(tmp_path))
    assert m.params["n_classes"] == 0
    assert m.params["widths"] == [40, 72] and m.params["mids"] == [16, 24]
    logits, pooled, last = m(x)
    ref = out.pooler_output.flatten(1).numpy()
    assert rel_err(logits, ref) < 1e-5 and rel_err(pooled, ref) < 1e-5
    assert rel_err(last, out.last_hidden_state.numpy()) < 1e-5
