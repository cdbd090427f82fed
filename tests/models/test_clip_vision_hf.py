"""specs/clip_vision.yaml against transformers' CLIPVisionModelWithProjection.

Seeded small float32 models saved with ``save_pretrained`` (safetensors + config.json);
every parameter random (LayerNorm gains and biases, [CLS] and position embeddings,
projection biases), so a weight read wrongly or left out changes the outputs. The sizes
and the MLP activation come from config.json, not the variant: neither case has the
tiny variant's sizes, and the second uses hidden_act gelu instead of CLIP's quick_gelu.
"""

import numpy as np
import pytest

import maxdecl as md
from modelhelp import (TOL, named_outputs, randomize, rel_err, save_hf, spec_path,
                       with_hf_config)

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

SPEC = spec_path("clip_vision")
N_IMAGES = 3

CASES = {
    "quick_gelu": dict(hidden_size=96, intermediate_size=160, projection_dim=40,
                       num_hidden_layers=2, num_attention_heads=6, image_size=48, patch_size=12,
                       layer_norm_eps=1e-5, hidden_act="quick_gelu"),
    "gelu": dict(hidden_size=64, intermediate_size=96, projection_dim=24, num_hidden_layers=3,
                 num_attention_heads=4, image_size=40, patch_size=8, num_channels=2,
                 layer_norm_eps=1e-6, hidden_act="gelu"),
}


def make_clip(config, seed=0):
    torch.manual_seed(seed)
    cfg = transformers.CLIPVisionConfig(**config, attn_implementation="eager")
    model = randomize(transformers.CLIPVisionModelWithProjection(cfg), seed)
    with torch.no_grad():                   # N(0, 1 / fan_in) filters: patch tokens O(1)
        w = model.vision_model.embeddings.patch_embedding.weight
        w.copy_(w / float(np.prod(w.shape[1:])) ** 0.5)
    return model


@pytest.fixture(scope="module", params=sorted(CASES))
def case(request, tmp_path_factory):
    config = CASES[request.param]
    model = make_clip(config)
    path = save_hf(model, tmp_path_factory.mktemp(f"clip_{request.param}"))
    c, s = model.config.num_channels, model.config.image_size
    x = np.random.default_rng(1).standard_normal((N_IMAGES, c, s, s)).astype(np.float32)
    with torch.no_grad():
        out = model(pixel_values=torch.from_numpy(x))
        pooled = model.vision_model(pixel_values=torch.from_numpy(x)).pooler_output
    ref = {"image_embeds": out.image_embeds.numpy(),
           "last_hidden_state": out.last_hidden_state.numpy(), "pooler_output": pooled.numpy()}
    return request.param, model, path, x, ref


def test_outputs_match_transformers(case):
    name, hf, path, x, ref = case
    m = md.load_model(SPEC, str(path))
    cfg = hf.config
    got_params = {k: m.params[k] for k in ("dim", "n_layers", "n_heads", "ffn_dim", "proj_dim",
                                           "image", "patch", "channels", "norm_eps",
                                           "hidden_act")}
    assert got_params == {"dim": cfg.hidden_size, "n_layers": cfg.num_hidden_layers,
                          "n_heads": cfg.num_attention_heads, "ffn_dim": cfg.intermediate_size,
                          "proj_dim": cfg.projection_dim, "image": cfg.image_size,
                          "patch": cfg.patch_size, "channels": cfg.num_channels,
                          "norm_eps": cfg.layer_norm_eps, "hidden_act": cfg.hidden_act}
    got = named_outputs(m, x)
    n_tokens = (cfg.image_size // cfg.patch_size) ** 2 + 1
    assert got["image_embeds"].shape == (N_IMAGES, cfg.projection_dim)
    assert got["last_hidden_state"].shape == (N_IMAGES, n_tokens, cfg.hidden_size)
    errs = {k: rel_err(got[k], ref[k]) for k in ref}
    print(f"clip_vision {name} vs HF: " + ", ".join(f"{k} {e:.2e}" for k, e in errs.items()))
    assert all(e <= TOL for e in errs.values())
    assert all(e < 1e-5 for e in errs.values())      # float32 throughout: much tighter than TOL
    # images are independent: one alone gives its row of the batch
    one = named_outputs(m, x[1:2])
    assert rel_err(one["image_embeds"], ref["image_embeds"][1:2]) < 1e-5


def test_activation_is_read_from_config(case):
    """Negative control: the other activation moves the embeddings past TOL (about 1e-2
    of max|ref| at these sizes), so the comparison above depends on config.json's
    hidden_act."""
    name, hf, path, x, ref = case
    other = "gelu" if hf.config.hidden_act == "quick_gelu" else "quick_gelu"
    spec = with_hf_config(md.load_spec(SPEC), hidden_act=f"{{'{other}'}}")
    m = md.load_model(spec, md.load_weights(str(path)))
    assert m.params["hidden_act"] == other
    assert rel_err(named_outputs(m, x)["image_embeds"], ref["image_embeds"]) > 3 * TOL


def test_embeddings_matter(case):
    """Negative control: zeroing the [CLS] embedding or the pre-encoder LayerNorm bias
    changes the embeddings, so both are read."""
    name, hf, path, x, ref = case
    for key in ("class_embd.weight", "pre_ln.bias"):
        td = md.load_weights(str(path), spec=SPEC)
        td[key] = np.zeros_like(np.asarray(td[key]))
        got = named_outputs(md.load_model(SPEC, td), x)
        assert rel_err(got["image_embeds"], ref["image_embeds"]) > 10 * TOL, key


def test_full_clip_checkpoint_gives_its_image_features(tmp_path):
    """A whole CLIPModel folder (vision and text towers, sizes under vision_config): the
    text tower is dropped (``"text_model.*": null``) and image_embeds equal
    CLIPModel.get_image_features."""
    torch.manual_seed(0)
    vision = dict(CASES["gelu"])
    cfg = transformers.CLIPConfig(
        vision_config=vision, projection_dim=vision.pop("projection_dim"),
        text_config=dict(hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                         num_attention_heads=2, vocab_size=300, bos_token_id=0,
                         eos_token_id=1, pad_token_id=1))
    model = randomize(transformers.CLIPModel(cfg), 1)
    with torch.no_grad():
        w = model.vision_model.embeddings.patch_embedding.weight
        w.copy_(w / float(np.prod(w.shape[1:])) ** 0.5)
    path = save_hf(model, tmp_path)
    x = np.random.default_rng(2).standard_normal((2, 2, 40, 40)).astype(np.float32)
    with torch.no_grad():
        ref = model.get_image_features(pixel_values=torch.from_numpy(x))
    ref = getattr(ref, "image_embeds", getattr(ref, "pooler_output", ref))
    ours = md.load_model(SPEC, str(path))
    assert ours.params["dim"] == 64 and ours.params["n_layers"] == 3
    assert rel_err(named_outputs(ours, x)["image_embeds"], np.asarray(ref)) <= TOL
