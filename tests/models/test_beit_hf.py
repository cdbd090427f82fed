"""specs/beit.yaml against transformers' BeitForImageClassification and BeitModel.

Seeded small float32 models (eager attention) saved with ``save_pretrained``
(safetensors + config.json; transformers 5 writes the legacy tensor names,
``encoder.layer.N.attention.attention.query``); every parameter random, including the
relative position bias tables (N(0, 1): transformers initialises them to zeros, which
would hide a wrong index), the [CLS] token, the absolute position embeddings and the
LayerScale gains (0.1 .. 1.5 per channel, away from 1). Images at the config's native
size. The sizes and switches come from config.json, not the variant:

- ``layer``: a relative bias table per layer, LayerScale, mean pooling + pooler norm,
  a 5-label classifier, no absolute positions;
- ``shared``: one bias table for all layers, absolute position embeddings, no
  LayerScale (layer_scale_init_value 0), [CLS] pooling after a final norm, 3 labels,
  3 heads, 2 colour channels, eps 1e-6, relu;
- ``both``: a headless BeitModel with both kinds of table (they add), LayerScale,
  absolute positions, [CLS] pooling: the spec's logits are the pooled features.
"""

import json

import numpy as np
import pytest

import maxdecl as md
from modelhelp import TOL, named_outputs, randomize, rel_err, save_hf, spec_path

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

SPEC = spec_path("beit")
N_IMAGES = 2

BASE = dict(hidden_size=48, num_hidden_layers=2, intermediate_size=96, patch_size=8,
            hidden_act="gelu")
CASES = {
    "layer": dict(BASE, num_attention_heads=4, image_size=24, use_relative_position_bias=True,
                  use_shared_relative_position_bias=False, use_absolute_position_embeddings=False,
                  layer_scale_init_value=0.1, use_mean_pooling=True, num_labels=5),
    "shared": dict(BASE, num_attention_heads=3, image_size=32, num_channels=2,
                   use_relative_position_bias=False, use_shared_relative_position_bias=True,
                   use_absolute_position_embeddings=True, layer_scale_init_value=0.0,
                   use_mean_pooling=False, num_labels=3, layer_norm_eps=1e-6, hidden_act="relu"),
    "both": dict(BASE, num_attention_heads=4, image_size=16, num_hidden_layers=3,
                 use_relative_position_bias=True, use_shared_relative_position_bias=True,
                 use_absolute_position_embeddings=True, layer_scale_init_value=0.2,
                 use_mean_pooling=False),
}
CLASSES = {"layer": "BeitForImageClassification", "shared": "BeitForImageClassification",
           "both": "BeitModel"}


def make_beit(config, cls, seed=0):
    torch.manual_seed(seed)
    cfg = transformers.BeitConfig(**config, attn_implementation="eager")
    model = randomize(getattr(transformers, cls)(cfg), seed)
    gen = torch.Generator().manual_seed(seed + 100)
    with torch.no_grad():
        for name, p in sorted(model.named_parameters()):
            if name.endswith(("lambda_1", "lambda_2")):       # LayerScale: 0.1 .. 1.5
                p.copy_(0.1 + 1.4 * torch.rand(p.shape, generator=gen))
            elif name.endswith("relative_position_bias_table"):
                p.copy_(torch.randn(p.shape, generator=gen))
            elif name.endswith(("cls_token", "position_embeddings")):
                p.copy_(torch.randn(p.shape, generator=gen))
            elif name.endswith("patch_embeddings.projection.weight"):
                p.copy_(p / float(np.prod(p.shape[1:])) ** 0.5)   # N(0, 1 / fan_in)
    return model


def hf_outputs(model, x) -> dict:
    base = model.beit if hasattr(model, "beit") else model
    with torch.no_grad():
        px = torch.from_numpy(x)
        out = base(pixel_values=px)
        logits = model(pixel_values=px).logits if base is not model else out.pooler_output
    return {"logits": logits.numpy(), "last_hidden_state": out.last_hidden_state.numpy(),
            "pooler_output": out.pooler_output.numpy()}


def images(cfg, n=N_IMAGES, seed=1) -> np.ndarray:
    c, s = cfg.num_channels, cfg.image_size
    return np.random.default_rng(seed).standard_normal((n, c, s, s)).astype(np.float32)


_CACHE = {}


def built(name, tmp_path_factory):
    """(name, HF model, saved folder, images, HF outputs), built once per module."""
    if name not in _CACHE:
        model = make_beit(CASES[name], CLASSES[name])
        path = save_hf(model, tmp_path_factory.mktemp(f"beit_{name}"))
        x = images(model.config)
        _CACHE[name] = (name, model, path, x, hf_outputs(model, x))
    return _CACHE[name]


@pytest.fixture(scope="module", params=sorted(CASES))
def case(request, tmp_path_factory):
    return built(request.param, tmp_path_factory)


def errors(got, ref) -> dict:
    return {k: rel_err(got[k], ref[k]) for k in ref}


def test_outputs_match_transformers(case):
    name, hf, path, x, ref = case
    m = md.load_model(SPEC, str(path))
    cfg = hf.config
    got_params = {k: m.params[k] for k in ("dim", "n_layers", "n_heads", "ffn_dim", "image",
                                           "patch", "channels", "norm_eps", "hidden_act",
                                           "abs_pos", "rel_pos", "shared_rel_pos",
                                           "layer_scale", "mean_pool", "n_classes")}
    assert got_params == {
        "dim": cfg.hidden_size, "n_layers": cfg.num_hidden_layers,
        "n_heads": cfg.num_attention_heads, "ffn_dim": cfg.intermediate_size,
        "image": cfg.image_size, "patch": cfg.patch_size, "channels": cfg.num_channels,
        "norm_eps": cfg.layer_norm_eps, "hidden_act": cfg.hidden_act,
        "abs_pos": cfg.use_absolute_position_embeddings,
        "rel_pos": cfg.use_relative_position_bias,
        "shared_rel_pos": cfg.use_shared_relative_position_bias,
        "layer_scale": cfg.layer_scale_init_value, "mean_pool": cfg.use_mean_pooling,
        "n_classes": cfg.num_labels if CLASSES[name] != "BeitModel" else 0}
    got = named_outputs(m, x)
    assert list(got) == ["logits", "last_hidden_state", "pooler_output"]
    n_tokens = (cfg.image_size // cfg.patch_size) ** 2 + 1
    assert got["last_hidden_state"].shape == (N_IMAGES, n_tokens, cfg.hidden_size)
    assert got["pooler_output"].shape == (N_IMAGES, cfg.hidden_size)
    errs = errors(got, ref)
    print(f"beit {name} vs HF: " + ", ".join(f"{k} {e:.2e}" for k, e in errs.items()))
    assert all(e <= TOL for e in errs.values()), errs
    assert all(e < 1e-5 for e in errs.values()), errs   # float32 throughout
    # images are independent: one alone gives its row of the batch
    one = named_outputs(m, x[1:2])
    for k in ref:
        assert rel_err(one[k], ref[k][1:2]) < 1e-5, k


def _load_with(path, edit):
    td = md.load_weights(str(path), spec=SPEC)
    for k in list(td.keys()):
        new = edit(k, np.asarray(td[k]))
        if new is not None:
            td[k] = new
    return md.load_model(SPEC, td)


def _tables(k):
    return k == "rel_pos_bias.weight" or k.endswith(".attn_rel_b.weight")


def test_relative_bias_matters(case):
    """Negative controls: the bias tables zeroed, or only their three [CLS] rows
    (cls to token, token to cls, cls to cls) rolled, move the outputs far past TOL;
    so the tables are read, through an index whose [CLS] entries are right."""
    name, hf, path, x, ref = case
    zeroed = named_outputs(_load_with(path, lambda k, w: np.zeros_like(w) if _tables(k) else None), x)
    assert rel_err(zeroed["last_hidden_state"], ref["last_hidden_state"]) > 10 * TOL

    def roll_cls(k, w):
        if not _tables(k):
            return None
        w = w.copy()
        w[-3:] = np.roll(w[-3:], 1, axis=0)
        return w
    rolled = named_outputs(_load_with(path, roll_cls), x)
    assert rel_err(rolled["last_hidden_state"], ref["last_hidden_state"]) > 10 * TOL

    def transpose_grid(k, w):                   # dy and dx swapped in the patch entries
        if not _tables(k):
            return None
        g = 2 * (hf.config.image_size // hf.config.patch_size) - 1
        w = w.copy()
        w[:-3] = w[:-3].reshape(g, g, -1).transpose(1, 0, 2).reshape(g * g, -1)
        return w
    swapped = named_outputs(_load_with(path, transpose_grid), x)
    assert rel_err(swapped["last_hidden_state"], ref["last_hidden_state"]) > 10 * TOL


def test_layer_scale_and_pooling_matter(case):
    """Negative controls: LayerScale gains set to ones (where present), and the
    pooler's norm (mean pooling) or the final norm ([CLS] pooling) shifted."""
    name, hf, path, x, ref = case
    if hf.config.layer_scale_init_value > 0:
        got = named_outputs(_load_with(path, lambda k, w: np.ones_like(w)
                                       if k.endswith((".ls1.weight", ".ls2.weight")) else None), x)
        assert rel_err(got["last_hidden_state"], ref["last_hidden_state"]) > 10 * TOL
    else:
        m = md.load_model(SPEC, str(path))
        assert not any(k.endswith((".ls1.weight", ".ls2.weight")) for k in m.weights.keys())
    norm = "pool_norm.bias" if hf.config.use_mean_pooling else "post_ln.bias"
    got = named_outputs(_load_with(path, lambda k, w: w + 0.5 if k == norm else None), x)
    assert rel_err(got["pooler_output"], ref["pooler_output"]) > 10 * TOL


def test_state_dict_names(tmp_path, tmp_path_factory):
    """transformers 5's in-memory names (``layers.N.attention.q_proj``,
    ``shared_position_bias``, ``layers.N.relative_position_bias``; a ``state_dict``
    saved as it is), with ``relative_position_index`` buffers beside them, load to the
    same outputs."""
    from safetensors.torch import save_file

    name, hf, path, x, ref = built("both", tmp_path_factory)
    sd = {k: v.contiguous() for k, v in hf.state_dict().items()}
    assert "layers.0.attention.q_proj.weight" in sd
    assert "shared_position_bias.relative_position_bias_table" in sd
    # older checkpoints also store the index buffers, which the spec drops
    n_tok = (hf.config.image_size // hf.config.patch_size) ** 2 + 1
    sd["shared_position_bias.relative_position_index"] = torch.zeros(n_tok, n_tok, dtype=torch.int64)
    sd["layers.0.relative_position_bias.relative_position_index"] = torch.zeros(n_tok, n_tok, dtype=torch.int64)
    save_file(sd, str(tmp_path / "model.safetensors"), metadata={"format": "pt"})
    (tmp_path / "config.json").write_text(json.dumps(hf.config.to_dict()))
    got = named_outputs(md.load_model(SPEC, str(tmp_path)), x)
    for k in ref:
        assert rel_err(got[k], ref[k]) < 1e-5, k


def test_refusals(tmp_path):
    """A non-square image_size and a masked-image-modeling checkpoint are refused."""
    model = make_beit(dict(CASES["layer"], num_hidden_layers=1), "BeitModel", seed=3)
    path = save_hf(model, tmp_path / "square")
    cfg = json.loads((tmp_path / "square" / "config.json").read_text())
    cfg["image_size"] = [24, 16]
    (tmp_path / "square" / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(md.WeightsError, match="only square images"):
        md.load_model(SPEC, str(path))

    mim = make_beit(dict(CASES["layer"], num_hidden_layers=1, use_mask_token=True),
                    "BeitForMaskedImageModeling", seed=4)
    path = save_hf(mim, tmp_path / "mim")
    with pytest.raises(md.WeightsError, match="BeitForMaskedImageModeling"):
        md.load_model(SPEC, str(path))
