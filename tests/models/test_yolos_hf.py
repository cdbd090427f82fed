"""specs/yolos.yaml against transformers' YolosForObjectDetection and YolosModel.

Seeded small float32 models saved with ``save_pretrained`` (safetensors + config.json;
the checkpoint holds ``encoder.mid_position_embeddings``, the module in memory
``encoder.interpolation.mid_position_embeddings``). Every parameter random ([CLS],
detection tokens, position tables, LayerNorm gains and biases). The images of each
case are of another size than config.json's ``image_size`` (a non-square grid): the
position tables are resized bicubically, once up (with a size that is not a multiple
of the patch, so the conv drops the rest) and once down. One case has mid-layer
position tables and q/k/v biases, one neither; the sizes come from config.json.
"""

import numpy as np
import pytest

import maxdecl as md
from modelhelp import named_outputs, randomize, rel_err, save_hf, spec_path

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

SPEC = spec_path("yolos")
N_IMAGES = 2
TOL = 1e-4          # max|ours - ref| <= TOL * max|ref|

CASES = {
    # config grid 4 x 6, images 44 x 61 -> grid 5 x 7 (upsampled tables)
    "mid": (dict(hidden_size=32, num_hidden_layers=3, num_attention_heads=4,
                 intermediate_size=64, image_size=[32, 48], patch_size=8, num_channels=3,
                 num_detection_tokens=5, num_labels=7, use_mid_position_embeddings=True,
                 qkv_bias=True, layer_norm_eps=1e-12, hidden_act="gelu"),
            (44, 61)),
    # config grid 5 x 7, images 24 x 40 -> grid 3 x 5 (downsampled tables)
    "plain": (dict(hidden_size=24, num_hidden_layers=2, num_attention_heads=2,
                   intermediate_size=40, image_size=[40, 56], patch_size=8, num_channels=2,
                   num_detection_tokens=3, num_labels=4, use_mid_position_embeddings=False,
                   qkv_bias=False, layer_norm_eps=1e-6, hidden_act="gelu_new"),
              (24, 40)),
}


def make_yolos(config, seed=0, cls=None):
    torch.manual_seed(seed)
    cfg = transformers.YolosConfig(**config, attn_implementation="eager")
    model = randomize((cls or transformers.YolosForObjectDetection)(cfg), seed)
    gen = torch.Generator().manual_seed(seed + 100)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("mid_position_embeddings"):     # N(0, 1): large enough to matter
                p.copy_(torch.randn(p.shape, generator=gen))
    return model


def images(cfg, size, n=N_IMAGES, seed=1) -> np.ndarray:
    h, w = size
    return np.random.default_rng(seed).standard_normal(
        (n, cfg.num_channels, h, w)).astype(np.float32)


def hf_detection(model, x) -> dict:
    with torch.no_grad():
        out = model(pixel_values=torch.from_numpy(x))
    return {"logits": out.logits.numpy(), "pred_boxes": out.pred_boxes.numpy(),
            "last_hidden_state": out.last_hidden_state.numpy()}


@pytest.fixture(scope="module", params=sorted(CASES))
def case(request, tmp_path_factory):
    config, size = CASES[request.param]
    model = make_yolos(config)
    path = save_hf(model, tmp_path_factory.mktemp(f"yolos_{request.param}"))
    x = images(model.config, size)
    return request.param, model, str(path), x, hf_detection(model, x)


@pytest.fixture(scope="module")
def loaded(case):
    return md.load_model(SPEC, case[2])


def errors(got, ref) -> dict:
    return {k: rel_err(got[k], ref[k]) for k in ref}


def test_params_from_config(case, loaded):
    name, hf, path, x, ref = case
    cfg = hf.config
    want = {"dim": cfg.hidden_size, "n_layers": cfg.num_hidden_layers,
            "n_heads": cfg.num_attention_heads, "ffn_dim": cfg.intermediate_size,
            "hidden_act": cfg.hidden_act, "norm_eps": cfg.layer_norm_eps,
            "image_h": cfg.image_size[0], "image_w": cfg.image_size[1],
            "patch": cfg.patch_size, "channels": cfg.num_channels,
            "qkv_bias": cfg.qkv_bias, "n_det": cfg.num_detection_tokens,
            "mid_pos": cfg.use_mid_position_embeddings, "n_classes": cfg.num_labels,
            "has_head": True, "has_pooler": False}
    assert {k: loaded.params[k] for k in want} == want


def test_detection_matches_transformers(case, loaded):
    """Class logits, boxes and the encoder's output for a batch of two images of a size
    other than config.json's (interpolated position tables)."""
    name, hf, path, x, ref = case
    cfg = hf.config
    got = named_outputs(loaded, x)
    assert list(got) == ["logits", "pred_boxes", "last_hidden_state"]
    h, w = x.shape[2] // cfg.patch_size, x.shape[3] // cfg.patch_size
    assert (h, w) != (cfg.image_size[0] // cfg.patch_size, cfg.image_size[1] // cfg.patch_size)
    n_det = cfg.num_detection_tokens
    assert got["logits"].shape == (N_IMAGES, n_det, cfg.num_labels + 1)
    assert got["pred_boxes"].shape == (N_IMAGES, n_det, 4)
    assert got["last_hidden_state"].shape == (N_IMAGES, 1 + h * w + n_det, cfg.hidden_size)
    errs = errors(got, ref)
    abs_errs = {k: float(np.max(np.abs(got[k] - ref[k]))) for k in ref}
    print(f"yolos {name} vs HF at {x.shape[2]}x{x.shape[3]}: " + ", ".join(
        f"{k} rel {errs[k]:.2e} abs {abs_errs[k]:.2e}" for k in ref))
    assert all(e <= TOL for e in errs.values()), errs
    # images are independent: one alone gives its row of the batch
    one = named_outputs(loaded, x[1:2])
    for k in ref:
        assert rel_err(one[k], ref[k][1:2]) <= TOL, k


def test_native_size_matches_transformers(case, loaded):
    """At config.json's own image size the resize is the identity."""
    name, hf, path, x, ref = case
    xs = images(hf.config, hf.config.image_size, seed=3)
    ref = hf_detection(hf, xs)
    errs = errors(named_outputs(loaded, xs), ref)
    print(f"yolos {name} native size: " + ", ".join(f"{k} {e:.2e}" for k, e in errs.items()))
    assert all(e <= TOL for e in errs.values()), errs


def test_position_tables_matter(case):
    """Negative controls: the mid-layer tables zeroed, or the detection tokens' slots of
    the first position table zeroed, move the outputs far past TOL."""
    name, hf, path, x, ref = case
    cfg = hf.config
    if cfg.use_mid_position_embeddings:
        td = md.load_weights(path, spec=SPEC)
        td["mid_pos_embd.weight"] = np.zeros_like(np.asarray(td["mid_pos_embd.weight"]))
        got = named_outputs(md.load_model(SPEC, td), x)
        assert rel_err(got["logits"], ref["logits"]) > 100 * TOL
    td = md.load_weights(path, spec=SPEC)
    pos = np.array(td["pos_embd.weight"])
    pos[:, -cfg.num_detection_tokens:] = 0.0
    td["pos_embd.weight"] = pos
    got = named_outputs(md.load_model(SPEC, td), x)
    assert rel_err(got["pred_boxes"], ref["pred_boxes"]) > 100 * TOL


def test_yolos_model_checkpoint(tmp_path):
    """A YolosModel checkpoint (no ``vit.`` prefix, a pooler, no detection head):
    last_hidden_state and pooler_output, at another image size."""
    config, size = CASES["mid"]
    model = make_yolos(config, seed=5, cls=transformers.YolosModel)
    path = save_hf(model, tmp_path)
    x = images(model.config, size, seed=6)
    with torch.no_grad():
        out = model(pixel_values=torch.from_numpy(x))
    ref = {"last_hidden_state": out.last_hidden_state.numpy(),
           "pooler_output": out.pooler_output.numpy()}
    m = md.load_model(SPEC, str(path))
    assert (m.params["has_head"], m.params["has_pooler"]) == (False, True)
    got = named_outputs(m, x)
    assert list(got) == ["last_hidden_state", "pooler_output"]
    errs = errors(got, ref)
    print("yolos YolosModel: " + ", ".join(f"{k} {e:.2e}" for k, e in errs.items()))
    assert all(e <= TOL for e in errs.values()), errs


def test_state_dict_names(tmp_path):
    """A torch ``state_dict`` saved as one file (the in-memory name
    ``encoder.interpolation.mid_position_embeddings``) loads to the same outputs."""
    import json

    from safetensors.torch import save_file

    config, size = CASES["mid"]
    model = make_yolos(config, seed=7)
    x = images(model.config, size, seed=8)
    ref = hf_detection(model, x)
    sd = {k: v.contiguous() for k, v in model.state_dict().items()}
    assert "vit.encoder.interpolation.mid_position_embeddings" in sd
    save_file(sd, str(tmp_path / "model.safetensors"), metadata={"format": "pt"})
    (tmp_path / "config.json").write_text(json.dumps(model.config.to_dict()))
    errs = errors(named_outputs(md.load_model(SPEC, str(tmp_path)), x), ref)
    assert all(e <= TOL for e in errs.values()), errs
