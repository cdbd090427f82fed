"""specs/segformer_seg.yaml against transformers' SegformerForSemanticSegmentation.

Seeded small float32 models saved with ``save_pretrained`` (safetensors + config.json);
every parameter random (LayerNorm gains and biases, conv and linear weights and biases)
and the decode head's BatchNorm running statistics random too (a mean far from 0 and a
variance far from 1), so a weight read wrongly or left out, or a BatchNorm run in
training mode, changes the logits. The sizes come from config.json, not the variant:
the second model has three stages, other widths, head counts, sequence-reduction ratios
(4, 2, 1), MLP ratios, decode-head width, label count and activation. Each model runs
on two image sizes, one whose stage maps do not divide evenly (so the stage maps are
not integer multiples of one another and bilinear upsampling does real interpolation).
"""

import numpy as np
import pytest

import maxdecl as md
from modelhelp import TOL, randomize, rel_err, spec_path

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

SPEC = spec_path("segformer_seg")

CASES = {
    # the spec's tiny variant's sizes
    "two_stages": dict(config=dict(num_encoder_blocks=2, depths=[1, 2], hidden_sizes=[16, 32],
                                   num_attention_heads=[1, 2], sr_ratios=[2, 1],
                                   patch_sizes=[7, 3], strides=[4, 2], mlp_ratios=[4, 2],
                                   decoder_hidden_size=24, num_labels=5),
                       # 32 x 40 -> 8 x 10 -> 4 x 5;  26 x 38 -> 7 x 10 -> 4 x 5
                       images=[(2, 3, 32, 40), (1, 3, 26, 38)]),
    # sizes the variant does not have: config.json must win
    "three_stages": dict(config=dict(num_encoder_blocks=3, depths=[2, 1, 1],
                                     hidden_sizes=[8, 24, 32], num_attention_heads=[2, 3, 4],
                                     sr_ratios=[4, 2, 1], patch_sizes=[7, 3, 3],
                                     strides=[4, 2, 2], mlp_ratios=[2, 4, 3],
                                     decoder_hidden_size=20, num_labels=7,
                                     hidden_act="gelu_new"),
                         # 36 x 44 -> 9 x 11 -> 5 x 6 -> 3 x 3;  32 x 32 -> 8 -> 4 -> 2
                         images=[(2, 3, 36, 44), (1, 3, 32, 32)]),
}


def make_segformer_seg(config, seed=0):
    torch.manual_seed(seed)
    cfg = transformers.SegformerConfig(**config)
    model = randomize(transformers.SegformerForSemanticSegmentation(cfg), seed)
    gen = torch.Generator().manual_seed(seed + 100)
    bn = model.decode_head.batch_norm
    with torch.no_grad():
        bn.running_mean.copy_(0.5 * torch.randn(bn.running_mean.shape, generator=gen))
        bn.running_var.copy_(0.3 + 2.0 * torch.rand(bn.running_var.shape, generator=gen))
    return model.eval()


def reference(model, x):
    """(logits [n, labels, H/4, W/4], encoder last_hidden_state [n, C, h, w]), NCHW."""
    with torch.no_grad():
        px = torch.from_numpy(x)
        logits = model(pixel_values=px).logits.numpy()
        last = model.segformer(pixel_values=px).last_hidden_state.numpy()
    return logits, last


@pytest.fixture(scope="module", params=sorted(CASES))
def case(request, tmp_path_factory):
    """One HF model per configuration (built and saved once for the module), its
    maxdecl model, the images and the reference outputs."""
    c = CASES[request.param]
    model = make_segformer_seg(c["config"])
    path = tmp_path_factory.mktemp(f"segformer_seg_{request.param}")
    model.save_pretrained(str(path))
    rng = np.random.default_rng(1)
    images = [rng.standard_normal(s).astype(np.float32) for s in c["images"]]
    refs = [reference(model, x) for x in images]
    return dict(name=request.param, model=model, path=path, images=images, refs=refs,
                ours=md.load_model(SPEC, str(path)))


def test_params_from_config(case):
    m, cfg = case["ours"], case["model"].config
    assert m.params["n_stages"] == cfg.num_encoder_blocks
    assert m.params["depths"] == list(cfg.depths)
    assert m.params["hidden_sizes"] == list(cfg.hidden_sizes)
    assert m.params["sr_ratios"] == list(cfg.sr_ratios)
    assert m.params["dec_dim"] == cfg.decoder_hidden_size
    assert m.params["n_classes"] == cfg.num_labels
    assert m.params["hidden_act"] == cfg.hidden_act
    assert m.output_names[:2] == ["logits", "last_hidden_state"]


@pytest.mark.parametrize("k", [0, 1])
def test_outputs_match_transformers(case, k):
    """Logits and the encoder's last hidden state, on both image sizes, with one
    loaded model (H and W are symbolic)."""
    x = case["images"][k]
    ref_logits, ref_last = case["refs"][k]
    logits, last = case["ours"](x)[:2]
    n, _, hh, ww = x.shape
    cfg = case["model"].config
    assert logits.shape == ref_logits.shape
    assert logits.shape[:2] == (n, cfg.num_labels)
    assert ref_logits.shape[2:] == ((hh + 3) // 4, (ww + 3) // 4)     # stage 0's map
    assert last.shape == ref_last.shape
    e_logits, e_last = rel_err(logits, ref_logits), rel_err(last, ref_last)
    print(f"segformer_seg {case['name']} {x.shape}: logits {e_logits:.2e}, "
          f"last_hidden_state {e_last:.2e}")
    assert e_logits <= TOL and e_last <= TOL
    assert e_logits < 1e-5 and e_last < 1e-5    # float32 throughout: much tighter than TOL


def _spec_variant(tmp_path, old, new, count):
    text = open(SPEC).read()
    assert text.count(old) == count, old
    p = tmp_path / "segformer_seg_variant.yaml"
    p.write_text(text.replace(old, new))
    return str(p)


def test_nearest_upsampling_differs(case, tmp_path):
    """Negative control: the same spec with nearest instead of bilinear upsampling
    misses the reference on the image whose stage maps do not divide evenly."""
    spec = _spec_variant(tmp_path, "attrs: {mode: linear, align_corners: false}",
                         "attrs: {mode: nearest}", 2)
    x = case["images"][0]
    ref_logits, ref_last = case["refs"][0]
    logits, last = md.load_model(spec, str(case["path"]))(x)[:2]
    assert rel_err(last, ref_last) < 1e-5       # the encoder is untouched
    assert rel_err(logits, ref_logits) > 1e-3


def test_batch_norm_statistics_are_read(case):
    """Negative control: the logits move when the running variance is reset to ones
    (BatchNorm without its statistics)."""
    td = md.load_weights(str(case["path"]), spec=SPEC)
    td["head_bn.running_var"] = np.ones_like(np.asarray(td["head_bn.running_var"]))
    x = case["images"][0]
    logits = md.load_model(SPEC, td)(x)[0]
    assert rel_err(logits, case["refs"][0][0]) > 1e-3


def test_concat_order_matters(case):
    """Negative control: swapping the fuse conv's input blocks of the first and last
    stage (the order transformers concatenates in) moves the logits."""
    td = md.load_weights(str(case["path"]), spec=SPEC)
    w = np.asarray(td["head_fuse.weight"]).copy()
    d = case["model"].config.decoder_hidden_size
    first, last = w[:, :d].copy(), w[:, -d:].copy()
    w[:, :d], w[:, -d:] = last, first
    td["head_fuse.weight"] = w
    x = case["images"][0]
    logits = md.load_model(SPEC, td)(x)[0]
    assert rel_err(logits, case["refs"][0][0]) > 1e-3


def test_state_dict_names(tmp_path):
    """transformers 5's in-memory names (a torch state_dict saved as one file, no
    config.json) load too, with the tiny variant's sizes."""
    from safetensors.torch import save_file

    c = CASES["two_stages"]
    model = make_segformer_seg(c["config"], seed=3)
    sd = {k: v.contiguous() for k, v in model.state_dict().items()}
    assert any(".linear_projections." in k for k in sd)
    save_file(sd, str(tmp_path / "model.safetensors"))
    m = md.load_model(SPEC, str(tmp_path / "model.safetensors"), variant="tiny")
    x = np.random.default_rng(4).standard_normal((1, 3, 28, 36)).astype(np.float32)
    logits, last = m(x)[:2]
    ref_logits, ref_last = reference(model, x)
    assert rel_err(logits, ref_logits) < 1e-5
    assert rel_err(last, ref_last) < 1e-5


def test_refuses_token_shaped_last_stage(tmp_path):
    model = make_segformer_seg(CASES["two_stages"]["config"])
    model.save_pretrained(str(tmp_path))
    td = md.load_weights(str(tmp_path))
    td.metadata["reshape_last_stage"] = False
    with pytest.raises(md.WeightsError, match="reshape_last_stage false"):
        md.load_model(SPEC, td)
