"""specs/swin.yaml against transformers' SwinForImageClassification (and its SwinModel).

Seeded small float32 models saved with ``save_pretrained`` (safetensors + config.json);
every parameter random (``modelhelp.randomize``: LayerNorm gains and biases, conv and
linear weights and biases, the relative position bias tables, the absolute position
embeddings), so a weight read wrongly or left out changes the logits. The sizes come
from config.json, not the variant.

The spec takes images of any size (``pixels [n, channels, h, w]``): one model (one
built graph) per case runs every size of the case, against transformers' logits and
``last_hidden_state``. The sizes pad the image to whole patches, a stage's map to whole
windows and an odd map before patch merging, and switch the shift of a stage on or
off at run time (transformers drops it where min(H, W) <= window_size). A map smaller
than the window fails in transformers (its relative position bias stays
window x window while the window shrinks), and in the spec too.

transformers' SwinLayer overwrites its own ``shift_size`` and ``window_size`` when it
sees a map no larger than the window, so one model object run at several sizes gives
answers that depend on the order of the calls: ``hf_outputs`` restores the values the
model was built with before each reference forward.
"""

import numpy as np
import pytest

import maxdecl as md
from modelhelp import TOL, randomize, rel_err, spec_path

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

SPEC = spec_path("swin")
BATCH = 2

CASES = {
    # the spec's tiny variant's sizes: 8x8 patches, window 4 (stage 0 shifted by 2),
    # stage 1 4x4 (= the window: no shift). Other sizes: 36x44 (maps 9x11 and 5x6,
    # both padded to whole windows and both shifted), 32x48 (stage 1 4x6: no shift,
    # its width padded), 35x45 (the image padded to whole patches, then as 36x48).
    # Too small: 28x20 (stage 1 4x3) and 16x40 (stage 1 2x5).
    "window4": dict(config=dict(image_size=32, patch_size=4, embed_dim=16, depths=[2, 2],
                                num_heads=[2, 4], window_size=4, num_labels=5),
                    images=(32, 32), sizes=[(32, 32), (36, 44), (32, 48), (35, 45)],
                    too_small=[(28, 20), (16, 40)]),
    # window 2 (shift 1), patch 2, 3 stages, no absolute positions: the config's 16x16
    # gives 8x8 -> 4x4 -> 2x2 (the last unshifted); 32x32 shifts every stage; 36x44
    # (18x22 -> 9x11 -> 5x6) and 28x20 (14x10 -> 7x5 -> 4x3) pad odd maps to whole
    # windows and before merging; 12x20 (6x10 -> 3x5 -> 2x3) ends on a map as high as
    # the window (no shift) and padded in width; 27x19 pads the image.
    # Too small: 8x30 (4x15 -> 2x8 -> 1x4).
    "window2": dict(config=dict(image_size=16, patch_size=2, embed_dim=8, depths=[2, 1, 2],
                                num_heads=[1, 2, 2], window_size=2, mlp_ratio=3.0,
                                hidden_act="gelu_new", num_labels=4),
                    images=(16, 16),
                    sizes=[(16, 16), (32, 32), (36, 44), (28, 20), (12, 20), (27, 19)],
                    too_small=[(8, 30)]),
    # window 2 (shift 1) on a rectangular image, 3 stages (16x8 -> 8x4 -> 4x2, the last
    # unshifted), no q/k/v bias, absolute position embeddings, another eps and MLP ratio.
    # The position table fits 16 x 8 = 128 patches: 31x16 (padded to 32x16) and 16x32
    # (8x16 patches, added to the flat tokens as transformers does) run; 32x32 and 8x8
    # fail in transformers and in the spec.
    "window2_rect": dict(config=dict(image_size=[32, 16], patch_size=2, embed_dim=12,
                                     depths=[2, 3, 2], num_heads=[2, 3, 4], window_size=2,
                                     mlp_ratio=2.0, qkv_bias=False,
                                     use_absolute_embeddings=True, layer_norm_eps=1e-6,
                                     num_labels=3),
                         images=(32, 16), sizes=[(32, 16), (31, 16), (16, 32)],
                         too_small=[], wrong_count=[(32, 32), (8, 8)]),
}


def make_swin(config, seed=0):
    torch.manual_seed(seed)
    cfg = transformers.SwinConfig(**config)
    return randomize(transformers.SwinForImageClassification(cfg), seed)


def reset_windows(model):
    """The shift and window sizes transformers' SwinLayers are built with (a forward on a
    map no larger than the window overwrites them)."""
    ws = model.config.window_size
    for stage in model.swin.encoder.layers:
        for j, blk in enumerate(stage.blocks):
            blk.shift_size = 0 if j % 2 == 0 else ws // 2
            blk.window_size = ws


def hf_outputs(model, x, reset=True):
    """(logits, last_hidden_state) of a fresh transformers forward of the images ``x``."""
    if reset:
        reset_windows(model)
    with torch.no_grad():
        out = model(pixel_values=torch.from_numpy(x))
        if reset:
            reset_windows(model)
        base = model.swin(pixel_values=torch.from_numpy(x))
    return out.logits.numpy(), base.last_hidden_state.numpy()


def images(h, w, seed=1):
    return np.random.default_rng(seed).standard_normal((BATCH, 3, h, w)).astype(np.float32)


@pytest.fixture(scope="module", params=sorted(CASES))
def case(request, tmp_path_factory):
    """name, HF model, its folder, the config-size images, HF logits there, the spec's
    model (built once), and HF's (logits, last_hidden_state) at every size of the case."""
    c = CASES[request.param]
    model = make_swin(c["config"])
    path = tmp_path_factory.mktemp(f"swin_{request.param}")
    model.save_pretrained(str(path))
    x = images(*c["images"])
    refs = {hw: (images(*hw, seed=2 + k),) + hf_outputs(model, images(*hw, seed=2 + k))
            for k, hw in enumerate(c["sizes"])}
    ref = hf_outputs(model, x)[0]
    ours = md.load_model(SPEC, str(path))
    return request.param, model, path, x, ref, ours, refs


def test_logits_match_transformers(case):
    name, model, path, x, ref, m, _ = case
    cfg = model.config
    assert m.params["depths"] == list(cfg.depths)
    assert m.params["n_heads"] == list(cfg.num_heads)
    assert m.params["window"] == cfg.window_size
    assert m.params["shift"] == cfg.window_size // 2
    size = cfg.image_size if isinstance(cfg.image_size, list) else [cfg.image_size] * 2
    assert [m.params["img_h"], m.params["img_w"]] == size == list(x.shape[2:])
    assert m.params["n_classes"] == cfg.num_labels
    assert m.params["norm_eps"] == cfg.layer_norm_eps
    assert m.output_names[:2] == ["logits", "last_hidden_state"]
    logits, _ = m(x)
    assert logits.shape == ref.shape == (x.shape[0], cfg.num_labels)
    err = rel_err(logits, ref)
    print(f"swin {name} vs HF: {err:.2e} of max|ref| ({np.abs(ref).max():.2f}), "
          f"max abs {np.abs(logits - ref).max():.2e}")
    assert err <= TOL
    assert err < 1e-5                           # float32 throughout: much tighter than TOL


def test_any_size_one_graph(case):
    """Every size of the case through the one model (one graph, built once): logits
    and last_hidden_state [n, H*W, C] as transformers gives them."""
    name, model, path, x, ref, m, refs = case
    assert m.graph.inputs[0].type.shape == ("n", model.config.num_channels, "h", "w")
    graph = m.graph
    for (h, w), (xs, ref_logits, ref_hidden) in refs.items():
        logits, hidden = m(xs)
        assert m.graph is graph
        assert logits.shape == ref_logits.shape
        assert hidden.shape == ref_hidden.shape
        e_logits, e_hidden = rel_err(logits, ref_logits), rel_err(hidden, ref_hidden)
        print(f"swin {name} {h}x{w} vs HF: logits {e_logits:.2e}, last_hidden_state "
              f"{e_hidden:.2e} (tokens {hidden.shape[1]})")
        assert e_logits < 1e-5 and e_hidden < 1e-5


def test_shift_and_bias_matter(case):
    """Negative controls: the reference moves when transformers' blocks do not shift
    (so the match above covers the roll and the shift mask), and ours moves when the
    relative position bias tables are zeroed (so they are read)."""
    name, model, path, x, ref, _, _ = case
    reset_windows(model)
    saved = {}
    for mod_name, mod in model.named_modules():
        if isinstance(mod, transformers.models.swin.modeling_swin.SwinLayer) and mod.shift_size:
            saved[mod_name] = mod.shift_size
            mod.shift_size = 0
    assert saved
    try:
        with torch.no_grad():
            unshifted = model(pixel_values=torch.from_numpy(x)).logits.numpy()
    finally:
        reset_windows(model)
    assert rel_err(unshifted, ref) > 1e-2

    td = md.load_weights(str(path), spec=SPEC)
    tables = [k for k in td.keys() if k.endswith(".attn_rel_b.weight")]
    assert len(tables) == sum(model.config.depths)
    for k in tables:
        td[k] = np.zeros_like(np.asarray(td[k]))
    logits, _ = md.load_model(SPEC, td)(x)
    assert rel_err(logits, ref) > 1e-2


def test_shift_is_decided_per_call(case):
    """The window4 case's stage 1 is unshifted at 32x32 (4x4 map) and shifted at 36x44
    (5x6): a transformers model that ran 32x32 first keeps stage 1 unshifted and gives
    another 36x44 answer (so the shift there matters), while the spec, which ran 32x32
    first too (test_any_size_one_graph), decides per call and matches a fresh model."""
    name, model, path, x, ref, m, refs = case
    if name != "window4":
        pytest.skip("one case shows it")
    xs, fresh, _ = refs[(36, 44)]
    hf_outputs(model, refs[(32, 32)][0])                   # stage 1 now has shift_size 0
    stale = hf_outputs(model, xs, reset=False)[0]
    reset_windows(model)
    assert rel_err(stale, fresh) > 1e-2
    m(refs[(32, 32)][0])
    assert rel_err(m(xs)[0], fresh) < 1e-5


def test_map_smaller_than_window_fails(case):
    """A map smaller than the window at some stage: transformers shrinks the window but
    not its relative position bias and fails; the spec fails too, in the stage's
    window_fit layer, rather than give numbers transformers does not define."""
    name, model, path, x, ref, m, _ = case
    sizes = CASES[name]["too_small"]
    if not sizes:
        pytest.skip("no such size in this case")
    for h, w in sizes:
        xs = images(h, w)
        with pytest.raises(RuntimeError):
            hf_outputs(model, xs)
        with pytest.raises(md.GraphError, match=r"stages\.\d+\.window_fit"):
            m(xs)
    reset_windows(model)
    assert rel_err(m(x)[0], ref) < 1e-5                  # the model still runs afterwards


def test_absolute_positions_need_the_patch_count(case):
    """With use_absolute_embeddings the table is added to the flat patch tokens, as in
    transformers: another number of patches fails in both (interpolate_pos_encoding is
    not modelled)."""
    name, model, path, x, ref, m, _ = case
    sizes = CASES[name].get("wrong_count", [])
    if not sizes:
        pytest.skip("no absolute position embeddings in this case")
    for h, w in sizes:
        xs = images(h, w)
        with pytest.raises(RuntimeError):
            hf_outputs(model, xs)
        with pytest.raises(md.GraphError, match="position_embd"):
            m(xs)


@pytest.mark.parametrize("config, sizes", [
    # were refused as "not a multiple of window_size": maps 9x9 and 5x5 with window 4
    (dict(image_size=36, patch_size=4, window_size=4), [(36, 36), (40, 28)]),
    # were refused as "not a multiple of patch_size": the image is padded to 32x32
    (dict(image_size=30, patch_size=4, window_size=2), [(30, 30), (13, 22)]),
])
def test_former_refusals_now_run(tmp_path, config, sizes):
    """Checkpoints the fixed-size spec refused (their image_size needed padding) load and
    match transformers at their image_size and at other sizes."""
    model = make_swin(dict(embed_dim=8, depths=[1, 2], num_heads=[1, 2], num_labels=2, **config))
    model.save_pretrained(str(tmp_path))
    m = md.load_model(SPEC, str(tmp_path))
    for k, (h, w) in enumerate(sizes):
        xs = images(h, w, seed=5 + k)
        ref_logits, ref_hidden = hf_outputs(model, xs)
        logits, hidden = m(xs)
        e_logits, e_hidden = rel_err(logits, ref_logits), rel_err(hidden, ref_hidden)
        print(f"swin {config} {h}x{w} vs HF: logits {e_logits:.2e}, "
              f"last_hidden_state {e_hidden:.2e}")
        assert e_logits < 1e-5 and e_hidden < 1e-5
