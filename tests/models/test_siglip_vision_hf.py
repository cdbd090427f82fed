"""specs/siglip_vision.yaml against transformers' SiglipVisionModel.

Seeded small float32 models saved with ``save_pretrained`` (safetensors + config.json);
every parameter random (LayerNorm gains and biases, conv bias, position embeddings,
the pooling head's probe and fused in_proj), so a weight read wrongly or left out
changes the outputs. The sizes come from config.json, not the variant: no case has
the tiny variant's sizes; one has no pooling head (``vision_use_head=False``), one a
non-square head split (5 heads) and another activation.
"""

import numpy as np
import pytest

import maxdecl as md
from modelhelp import TOL, named_outputs, randomize, rel_err, save_hf, spec_path

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

SPEC = spec_path("siglip_vision")
N_IMAGES = 3

CASES = {
    "head": dict(hidden_size=96, intermediate_size=160, num_hidden_layers=2,
                 num_attention_heads=6, image_size=48, patch_size=12, layer_norm_eps=1e-6,
                 hidden_act="gelu_pytorch_tanh", vision_use_head=True),
    "head_gelu": dict(hidden_size=80, intermediate_size=112, num_hidden_layers=3,
                      num_attention_heads=5, image_size=40, patch_size=8, num_channels=2,
                      layer_norm_eps=1e-5, hidden_act="gelu", vision_use_head=True),
    "nohead": dict(hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                   num_attention_heads=4, image_size=28, patch_size=7, layer_norm_eps=1e-6,
                   hidden_act="gelu_pytorch_tanh", vision_use_head=False),
}


def make_siglip(config, seed=0):
    torch.manual_seed(seed)
    cfg = transformers.SiglipVisionConfig(**config, attn_implementation="eager")
    model = randomize(transformers.SiglipVisionModel(cfg), seed)
    with torch.no_grad():                   # N(0, 1 / fan_in) filters: patch tokens O(1)
        w = model.embeddings.patch_embedding.weight
        w.copy_(w / float(np.prod(w.shape[1:])) ** 0.5)
    return model


@pytest.fixture(scope="module", params=sorted(CASES))
def case(request, tmp_path_factory):
    model = make_siglip(CASES[request.param])
    path = save_hf(model, tmp_path_factory.mktemp(f"siglip_{request.param}"))
    c, s = model.config.num_channels, model.config.image_size
    x = np.random.default_rng(1).standard_normal((N_IMAGES, c, s, s)).astype(np.float32)
    with torch.no_grad():
        out = model(pixel_values=torch.from_numpy(x))
    ref = {"last_hidden_state": out.last_hidden_state.numpy()}
    if out.pooler_output is not None:
        ref["pooler_output"] = out.pooler_output.numpy()
    return request.param, model, path, x, ref


def test_outputs_match_transformers(case):
    name, hf, path, x, ref = case
    m = md.load_model(SPEC, str(path))
    cfg = hf.config
    got_params = {k: m.params[k] for k in ("dim", "n_layers", "n_heads", "ffn_dim", "image",
                                           "patch", "channels", "norm_eps", "hidden_act",
                                           "use_head")}
    assert got_params == {"dim": cfg.hidden_size, "n_layers": cfg.num_hidden_layers,
                          "n_heads": cfg.num_attention_heads, "ffn_dim": cfg.intermediate_size,
                          "image": cfg.image_size, "patch": cfg.patch_size,
                          "channels": cfg.num_channels, "norm_eps": cfg.layer_norm_eps,
                          "hidden_act": cfg.hidden_act, "use_head": cfg.vision_use_head}
    got = named_outputs(m, x)
    # the graph's outputs: last_hidden_state, then pooler_output only with the head
    assert list(got) == list(ref)
    n_patches = (cfg.image_size // cfg.patch_size) ** 2
    assert got["last_hidden_state"].shape == (N_IMAGES, n_patches, cfg.hidden_size)
    errs = {k: rel_err(got[k], ref[k]) for k in ref}
    print(f"siglip_vision {name} vs HF: " + ", ".join(f"{k} {e:.2e}" for k, e in errs.items()))
    assert all(e <= TOL for e in errs.values())
    assert all(e < 1e-5 for e in errs.values())      # float32 throughout: much tighter than TOL
    # images are independent: one alone gives its row of the batch
    one = named_outputs(m, x[1:2])
    for k in ref:
        assert rel_err(one[k], ref[k][1:2]) < 1e-5, k


def test_head_weights_matter(tmp_path_factory):
    """Negative control: zeroing the probe, or swapping the k and v thirds of the fused
    in_proj, moves pooler_output far past TOL, so the split order and the probe are read."""
    model = make_siglip(CASES["head"])
    path = save_hf(model, tmp_path_factory.mktemp("siglip_control"))
    s = model.config.image_size
    x = np.random.default_rng(3).standard_normal((2, 3, s, s)).astype(np.float32)
    with torch.no_grad():
        ref = model(pixel_values=torch.from_numpy(x)).pooler_output.numpy()
    base = md.load_weights(str(path), spec=SPEC)
    assert rel_err(named_outputs(md.load_model(SPEC, base), x)["pooler_output"], ref) < 1e-5

    td = md.load_weights(str(path), spec=SPEC)
    td["head.probe"] = np.zeros_like(np.asarray(td["head.probe"]))
    assert rel_err(named_outputs(md.load_model(SPEC, td), x)["pooler_output"], ref) > 10 * TOL

    td = md.load_weights(str(path), spec=SPEC)
    for w in ("weight", "bias"):
        k, v = np.asarray(td[f"head.attn_k.{w}"]), np.asarray(td[f"head.attn_v.{w}"])
        td[f"head.attn_k.{w}"], td[f"head.attn_v.{w}"] = v.copy(), k.copy()
    assert rel_err(named_outputs(md.load_model(SPEC, td), x)["pooler_output"], ref) > 10 * TOL


def test_prefixed_checkpoint_loads(tmp_path):
    """transformers 4 (and a full SiglipModel) write the tower under ``vision_model.``:
    the same tensors with that prefix load to the same outputs."""
    from safetensors.numpy import load_file, save_file

    model = make_siglip(CASES["nohead"], seed=2)
    src = save_hf(model, tmp_path / "plain")
    tensors = load_file(f"{src}/model.safetensors")
    dst = tmp_path / "prefixed"
    dst.mkdir()
    save_file({f"vision_model.{k}": v for k, v in tensors.items()},
              str(dst / "model.safetensors"), metadata={"format": "pt"})
    (dst / "config.json").write_text((tmp_path / "plain" / "config.json").read_text())
    s = model.config.image_size
    x = np.random.default_rng(4).standard_normal((2, 3, s, s)).astype(np.float32)
    with torch.no_grad():
        ref = model(pixel_values=torch.from_numpy(x)).last_hidden_state.numpy()
    got = named_outputs(md.load_model(SPEC, str(dst)), x)
    assert list(got) == ["last_hidden_state"]
    assert rel_err(got["last_hidden_state"], ref) < 1e-5


def test_full_siglip_checkpoint_gives_its_vision_tower(tmp_path):
    """A whole SiglipModel folder (vision and text towers, sizes under vision_config,
    tensors under ``vision_model.``): the text tower and logit scale/bias are dropped and
    both outputs equal SiglipModel.vision_model's."""
    torch.manual_seed(0)
    cfg = transformers.SiglipConfig(
        vision_config=dict(hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                           num_attention_heads=4, image_size=32, patch_size=8),
        text_config=dict(hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                         num_attention_heads=2, vocab_size=300, bos_token_id=0,
                         eos_token_id=1, pad_token_id=1))
    model = randomize(transformers.SiglipModel(cfg), 1)
    path = save_hf(model, tmp_path)
    x = np.random.default_rng(2).standard_normal((2, 3, 32, 32)).astype(np.float32)
    with torch.no_grad():
        ref = model.vision_model(pixel_values=torch.from_numpy(x))
    ours = md.load_model(SPEC, str(path))
    assert ours.params["dim"] == 64 and ours.params["use_head"] is True
    got = named_outputs(ours, x)
    assert rel_err(got["last_hidden_state"], ref.last_hidden_state.numpy()) < 1e-5
    assert rel_err(got["pooler_output"], ref.pooler_output.numpy()) < 1e-5
