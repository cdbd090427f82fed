"""specs/videomae.yaml against transformers' VideoMAEForVideoClassification / VideoMAEModel.

Seeded small float32 models saved with ``save_pretrained`` (safetensors + config.json;
transformers 5 saves the q/v biases under their legacy names ``attention.attention.q_bias``
and ``v_bias``); every parameter random (LayerNorm gains and biases, conv bias, q/v
biases, fc_norm). The sizes come from config.json, not the variant. Two cases: mean
pooling (fc_norm over the mean of all tokens) and first-token pooling (a final
LayerNorm in the encoder, then token 0), the second also with a non-square frame
(image_size [12, 8]), a tubelet of 3, two channels, no q/v biases, five heads, GELU in
its tanh form and another layer_norm_eps. The fixed sinusoidal position table (not a
checkpoint tensor) is checked on its own at the size of the released models (1568
positions x 768).
"""

import json
import os

import numpy as np
import pytest

import maxdecl as md
from modelhelp import named_outputs, randomize, rel_err, save_hf, spec_path

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

SPEC = spec_path("videomae")
N_VIDEOS = 2
TOL = 1e-4           # max|ours - ref| <= TOL * max|ref| (float32 throughout: expect ~1e-6)

CASES = {
    "mean": dict(hidden_size=48, num_hidden_layers=2, num_attention_heads=4,
                 intermediate_size=96, image_size=12, patch_size=4, num_channels=3,
                 num_frames=4, tubelet_size=2, hidden_act="gelu", layer_norm_eps=1e-12,
                 qv_bias=True, use_mean_pooling=True, num_labels=7),
    "first_token": dict(hidden_size=40, num_hidden_layers=3, num_attention_heads=5,
                        intermediate_size=72, image_size=[12, 8], patch_size=4,
                        num_channels=2, num_frames=6, tubelet_size=3, hidden_act="gelu_new",
                        layer_norm_eps=1e-6, qv_bias=False, use_mean_pooling=False,
                        num_labels=3),
}


def make_videomae(config, seed=0, cls=None):
    torch.manual_seed(seed)
    cfg = transformers.VideoMAEConfig(**config, attn_implementation="eager")
    model = randomize((cls or transformers.VideoMAEForVideoClassification)(cfg), seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("patch_embeddings.projection.weight"):   # N(0, 1 / fan_in)
                p.copy_(p / float(np.prod(p.shape[1:])) ** 0.5)
    return model


def videos(cfg, n=N_VIDEOS, seed=1) -> np.ndarray:
    s = cfg.image_size if isinstance(cfg.image_size, (list, tuple)) else [cfg.image_size] * 2
    shape = (n, cfg.num_frames, cfg.num_channels, *s)
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


def hf_outputs(model, x) -> dict:
    """logits (a classifier) and the encoder's last_hidden_state."""
    px = torch.from_numpy(x)
    with torch.no_grad():
        if isinstance(model, transformers.VideoMAEForVideoClassification):
            return {"logits": model(pixel_values=px).logits.numpy(),
                    "last_hidden_state": model.videomae(pixel_values=px).last_hidden_state.numpy()}
        base = model.videomae if hasattr(model, "videomae") else model
        return {"last_hidden_state": base(pixel_values=px).last_hidden_state.numpy()}


def n_patches(cfg) -> int:
    s = cfg.image_size if isinstance(cfg.image_size, (list, tuple)) else [cfg.image_size] * 2
    p = cfg.patch_size if isinstance(cfg.patch_size, (list, tuple)) else [cfg.patch_size] * 2
    return (cfg.num_frames // cfg.tubelet_size) * (s[0] // p[0]) * (s[1] // p[1])


def check(name, got, ref, tol=TOL) -> dict:
    errs = {k: rel_err(got[k], ref[k]) for k in ref}
    print(f"videomae {name} vs HF: " + ", ".join(
        f"{k} rel {errs[k]:.2e} abs {float(np.max(np.abs(got[k] - ref[k]))):.2e}" for k in ref))
    for k, e in errs.items():
        assert e <= tol, (k, e)
    return errs


@pytest.fixture(scope="module", params=sorted(CASES))
def case(request, tmp_path_factory):
    model = make_videomae(CASES[request.param])
    path = save_hf(model, tmp_path_factory.mktemp(f"videomae_{request.param}"))
    x = videos(model.config)
    return request.param, model, path, x, hf_outputs(model, x)


def test_saved_names_are_legacy(case):
    """The premise of the q_bias / v_bias mapping (and of qv_bias=False dropping them)."""
    from safetensors import safe_open

    name, hf, path, _, _ = case
    with safe_open(os.path.join(path, "model.safetensors"), "pt") as f:
        keys = set(f.keys())
    has = "videomae.encoder.layer.0.attention.attention.q_bias" in keys
    assert has == hf.config.qv_bias
    assert "videomae.encoder.layer.0.attention.attention.query.bias" not in keys


def test_classifier_matches_transformers(case):
    name, hf, path, x, ref = case
    cfg = hf.config
    m = md.load_model(SPEC, str(path))
    s = cfg.image_size if isinstance(cfg.image_size, (list, tuple)) else [cfg.image_size] * 2
    got_params = {k: m.params[k] for k in ("dim", "n_layers", "n_heads", "ffn_dim", "hidden_act",
                                           "norm_eps", "channels", "frames", "tubelet",
                                           "image_h", "image_w", "patch_h", "patch_w",
                                           "use_mean_pooling", "has_head", "n_classes",
                                           "n_patches")}
    assert got_params == {"dim": cfg.hidden_size, "n_layers": cfg.num_hidden_layers,
                          "n_heads": cfg.num_attention_heads, "ffn_dim": cfg.intermediate_size,
                          "hidden_act": cfg.hidden_act, "norm_eps": cfg.layer_norm_eps,
                          "channels": cfg.num_channels, "frames": cfg.num_frames,
                          "tubelet": cfg.tubelet_size, "image_h": s[0], "image_w": s[1],
                          "patch_h": cfg.patch_size, "patch_w": cfg.patch_size,
                          "use_mean_pooling": cfg.use_mean_pooling, "has_head": True,
                          "n_classes": cfg.num_labels, "n_patches": n_patches(cfg)}
    got = named_outputs(m, x)
    assert list(got) == ["logits", "last_hidden_state"]
    assert got["logits"].shape == (N_VIDEOS, cfg.num_labels)
    assert got["last_hidden_state"].shape == (N_VIDEOS, n_patches(cfg), cfg.hidden_size)
    errs = check(name, got, ref)
    assert all(e < 1e-5 for e in errs.values())          # float32 throughout: far below TOL
    # videos are independent: one alone gives its row of the batch
    one = named_outputs(m, x[1:2])
    for k in ref:
        assert rel_err(one[k], ref[k][1:2]) < 1e-5, k


def test_bare_encoder_checkpoint(case, tmp_path):
    """A VideoMAEModel checkpoint (no ``videomae.`` prefix, no head): last_hidden_state only."""
    name, hf, _, x, ref = case
    path = save_hf(hf.videomae, tmp_path / "bare")
    m = md.load_model(SPEC, str(path))
    assert m.params["has_head"] is False
    got = named_outputs(m, x)
    assert list(got) == ["last_hidden_state"]
    check(f"{name} (VideoMAEModel)", got, {"last_hidden_state": ref["last_hidden_state"]}, 1e-5)


def test_state_dict_names(case, tmp_path):
    """transformers 5's in-memory names (``attention.attention.query.bias``; a
    ``state_dict`` saved as it is) load to the same outputs."""
    from safetensors.torch import save_file

    name, hf, _, x, ref = case
    sd = {k: v.contiguous() for k, v in hf.state_dict().items()}
    if hf.config.qv_bias:
        assert "videomae.encoder.layer.0.attention.attention.query.bias" in sd
    raw = tmp_path / "state_dict"
    raw.mkdir()
    save_file(sd, str(raw / "model.safetensors"), metadata={"format": "pt"})
    cfg = hf.config.to_dict()
    cfg["architectures"] = ["VideoMAEForVideoClassification"]
    (raw / "config.json").write_text(json.dumps(cfg))
    check(f"{name} (state_dict)", named_outputs(md.load_model(SPEC, str(raw)), x), ref, 1e-5)


def test_qv_biases_and_fc_norm_matter(case):
    """Negative controls: the q/v biases zeroed, or the pooled LayerNorm (fc_norm, or the
    encoder's final one) set to the identity, move the logits far past TOL."""
    name, hf, path, x, ref = case
    edits = [("blk.0.attn_q.bias", np.zeros_like), ("blk.0.attn_v.bias", np.zeros_like)]
    norm = "fc_norm" if hf.config.use_mean_pooling else "output_norm"
    edits += [(f"{norm}.weight", np.ones_like), (f"{norm}.bias", np.zeros_like)]
    for key, fill in edits:
        td = md.load_weights(str(path), spec=SPEC)
        if key not in td.keys():                  # qv_bias=False: no bias to zero
            assert not hf.config.qv_bias and "attn_" in key
            continue
        td[key] = fill(np.asarray(td[key]))
        got = named_outputs(md.load_model(SPEC, td), x)
        assert rel_err(got["logits"], ref["logits"]) > 10 * TOL, key


def test_pretraining_checkpoint_runs_encoder(tmp_path):
    """A VideoMAEForPreTraining checkpoint: the decoder's tensors are dropped, the encoder
    gives VideoMAEModel's last_hidden_state (no mask: every patch visible)."""
    cfg = dict(CASES["first_token"], decoder_hidden_size=16, decoder_num_hidden_layers=1,
               decoder_num_attention_heads=2, decoder_intermediate_size=32)
    cfg.pop("num_labels")
    model = make_videomae(cfg, seed=3, cls=transformers.VideoMAEForPreTraining)
    path = save_hf(model, tmp_path)
    x = videos(model.config, seed=5)
    m = md.load_model(SPEC, str(path))
    got = named_outputs(m, x)
    assert list(got) == ["last_hidden_state"]
    check("pretraining encoder", got, hf_outputs(model, x), 1e-5)


@pytest.mark.parametrize("dim,heads,positions", [(768, 12, 1568), (45, 5, 50)])
def test_position_table(tmp_path, dim, heads, positions):
    """The sinusoid table as transformers builds it (float64, then float32) at the size of
    the released checkpoints (1568 positions, width 768), and at an odd width (the last
    cos column dropped): an encoder with no layers and a zero patch projection outputs
    the table itself, one row per tubelet (1-pixel frames keep it cheap)."""
    cfg = dict(hidden_size=dim, num_hidden_layers=0, num_attention_heads=heads,
               intermediate_size=64, image_size=1, patch_size=1, num_channels=1,
               num_frames=2 * positions, tubelet_size=2, use_mean_pooling=True)
    torch.manual_seed(0)
    model = transformers.VideoMAEModel(transformers.VideoMAEConfig(**cfg)).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.zero_()
    path = save_hf(model, tmp_path)
    x = np.random.default_rng(2).standard_normal((1, 2 * positions, 1, 1, 1)).astype(np.float32)
    ref = hf_outputs(model, x)["last_hidden_state"]
    want = model.embeddings.position_embeddings.numpy()
    assert np.array_equal(ref, want)
    got = named_outputs(md.load_model(SPEC, str(path)), x)["last_hidden_state"]
    err = float(np.max(np.abs(got - ref)))
    print(f"videomae position table {positions} x {dim}: max abs error {err:.2e}")
    assert err < 1e-6
