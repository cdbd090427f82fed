"""specs/vjepa2.yaml against transformers' VJEPA2Model (encoder and predictor).

Seeded small float32 models saved with ``save_pretrained`` (safetensors + config.json);
every parameter random (LayerNorm gains and biases, conv bias, q/k/v biases, the
predictor's mask tokens). The sizes come from config.json, not the variant. Two cases:
``base`` (head_dim 16: three RoPE parts of 4 features and 4 unrotated; predictor
head_dim 20: parts of 6, 2 unrotated; q/k/v biases) and ``alt`` (3 heads of 16, 2
channels, a tubelet of 3 over a 3 x 3 grid, no q/k/v biases, GELU in its tanh form, one
mask token, predictor head_dim 12 with nothing unrotated). Compared: the encoder's
last_hidden_state, the predictor's output, and the masked / target rows, with the
default masks (every token, both) and with random disjoint context and target masks.
A VJEPA2ForVideoClassification checkpoint (``vjepa2.`` prefix, attentive pooler with
its own MLP ratio of 4, classifier) gives its logits first.
"""

import numpy as np
import pytest

import maxdecl as md
from modelhelp import named_outputs, randomize, rel_err, save_hf, spec_path, with_hf_config

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

SPEC = spec_path("vjepa2")
N_VIDEOS = 2
TOL = 1e-4           # max|ours - ref| <= TOL * max|ref| (float32 throughout: expect ~1e-6)

CASES = {
    "base": dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, mlp_ratio=2.0,
                 crop_size=16, patch_size=4, frames_per_clip=4, tubelet_size=2, in_chans=3,
                 qkv_bias=True, hidden_act="gelu", layer_norm_eps=1e-6,
                 pred_hidden_size=40, pred_num_hidden_layers=2, pred_num_attention_heads=2,
                 pred_mlp_ratio=2.0, pred_num_mask_tokens=3),
    "alt": dict(hidden_size=48, num_hidden_layers=3, num_attention_heads=3, mlp_ratio=3.0,
                crop_size=12, patch_size=4, frames_per_clip=6, tubelet_size=3, in_chans=2,
                qkv_bias=False, hidden_act="gelu_pytorch_tanh", layer_norm_eps=1e-5,
                pred_hidden_size=36, pred_num_hidden_layers=1, pred_num_attention_heads=3,
                pred_mlp_ratio=1.5, pred_num_mask_tokens=1),
}
OUTPUTS = ["last_hidden_state", "masked_hidden_state", "predictor_last_hidden_state",
           "target_hidden_state"]


def make_vjepa2(config, seed=0):
    torch.manual_seed(seed)
    cfg = transformers.VJEPA2Config(**config, attn_implementation="eager")
    model = randomize(transformers.VJEPA2Model(cfg), seed)
    with torch.no_grad():
        # randomize() draws N(0, 1) for names with "embed": keep the predictor's input
        # projection at N(0, 1 / fan_in) like the other matrices
        w = model.predictor.embeddings.predictor_embeddings.weight
        w.mul_(w.shape[1] ** -0.5)
    return model


def videos(cfg, frames=None, n=N_VIDEOS, seed=1) -> np.ndarray:
    shape = (n, frames or cfg.frames_per_clip, cfg.in_chans, cfg.crop_size, cfg.crop_size)
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


def n_tokens(cfg, frames=None) -> int:
    frames = frames or cfg.frames_per_clip
    if frames < cfg.tubelet_size:
        frames *= cfg.tubelet_size
    return (frames // cfg.tubelet_size) * (cfg.crop_size // cfg.patch_size) ** 2


def default_masks(n, batch=N_VIDEOS):
    m = np.tile(np.arange(n, dtype=np.int64), (batch, 1))
    return m, m.copy()


def random_masks(n, n_ctx, n_tgt, batch=N_VIDEOS, seed=3):
    """Per video a random context and a disjoint random target set, each unsorted."""
    rng = np.random.default_rng(seed)
    cm, tm = [], []
    for _ in range(batch):
        p = rng.permutation(n)
        cm.append(p[:n_ctx])
        tm.append(p[n_ctx:n_ctx + n_tgt])
    return np.stack(cm).astype(np.int64), np.stack(tm).astype(np.int64)


def hf_outputs(model, x, cm, tm) -> dict:
    with torch.no_grad():
        out = model(pixel_values_videos=torch.from_numpy(x),
                    context_mask=[torch.from_numpy(cm)], target_mask=[torch.from_numpy(tm)])
    return {"last_hidden_state": out.last_hidden_state.numpy(),
            "masked_hidden_state": out.masked_hidden_state.numpy(),
            "predictor_last_hidden_state": out.predictor_output.last_hidden_state.numpy(),
            "target_hidden_state": out.predictor_output.target_hidden_state.numpy()}


def check(name, got, ref, tol=TOL) -> dict:
    errs = {k: rel_err(got[k], ref[k]) for k in ref}
    print(f"vjepa2 {name} vs HF: " + ", ".join(
        f"{k} rel {errs[k]:.2e} abs {float(np.max(np.abs(got[k] - ref[k]))):.2e}" for k in ref))
    for k, e in errs.items():
        assert e <= tol, (k, e)
    return errs


@pytest.fixture(scope="module", params=sorted(CASES))
def case(request, tmp_path_factory):
    model = make_vjepa2(CASES[request.param], seed=len(request.param))
    path = save_hf(model, tmp_path_factory.mktemp(f"vjepa2_{request.param}"))
    return request.param, model, path, md.load_model(SPEC, str(path))


def test_params_from_config(case):
    name, hf, path, m = case
    cfg = hf.config
    got = {k: m.params[k] for k in ("dim", "n_layers", "n_heads", "ffn_dim", "hidden_act",
                                    "norm_eps", "qkv_bias", "channels", "patch", "tubelet",
                                    "crop", "grid", "pred_dim", "pred_layers", "pred_heads",
                                    "pred_ffn_dim", "n_mask_tokens", "rot_part",
                                    "pred_rot_part")}
    hd, phd = cfg.hidden_size // cfg.num_attention_heads, \
        cfg.pred_hidden_size // cfg.pred_num_attention_heads
    assert got == {"dim": cfg.hidden_size, "n_layers": cfg.num_hidden_layers,
                   "n_heads": cfg.num_attention_heads,
                   "ffn_dim": int(cfg.hidden_size * cfg.mlp_ratio),
                   "hidden_act": cfg.hidden_act, "norm_eps": cfg.layer_norm_eps,
                   "qkv_bias": cfg.qkv_bias, "channels": cfg.in_chans,
                   "patch": cfg.patch_size, "tubelet": cfg.tubelet_size,
                   "crop": cfg.crop_size, "grid": cfg.crop_size // cfg.patch_size,
                   "pred_dim": cfg.pred_hidden_size, "pred_layers": cfg.pred_num_hidden_layers,
                   "pred_heads": cfg.pred_num_attention_heads,
                   "pred_ffn_dim": int(cfg.pred_hidden_size * cfg.pred_mlp_ratio),
                   "n_mask_tokens": cfg.pred_num_mask_tokens,
                   "rot_part": 2 * ((hd // 3) // 2), "pred_rot_part": 2 * ((phd // 3) // 2)}
    assert m.output_names[:4] == OUTPUTS


def test_default_masks_match_transformers(case):
    """VJEPA2Model(pixel_values_videos) with context_mask = target_mask = None:
    transformers' arange(N) for both; fed explicitly here."""
    name, hf, _, m = case
    x = videos(hf.config)
    n = n_tokens(hf.config)
    cm, tm = default_masks(n)
    with torch.no_grad():
        out = hf(pixel_values_videos=torch.from_numpy(x))
    ref = {"last_hidden_state": out.last_hidden_state.numpy(),
           "masked_hidden_state": out.masked_hidden_state.numpy(),
           "predictor_last_hidden_state": out.predictor_output.last_hidden_state.numpy(),
           "target_hidden_state": out.predictor_output.target_hidden_state.numpy()}
    got = named_outputs(m, x, cm, tm)
    assert got["last_hidden_state"].shape == (N_VIDEOS, n, hf.config.hidden_size)
    assert got["predictor_last_hidden_state"].shape == (N_VIDEOS, n, hf.config.hidden_size)
    errs = check(f"{name} default masks", got, ref)
    assert all(e < 1e-5 for e in errs.values())
    # videos are independent: one alone gives its row of the batch
    one = named_outputs(m, x[1:2], cm[1:2], tm[1:2])
    for k in ref:
        assert rel_err(one[k], ref[k][1:2]) < 1e-5, k


def test_random_masks_match_transformers(case):
    """Random, unsorted, disjoint context and target token sets per video."""
    name, hf, _, m = case
    x = videos(hf.config, seed=4)
    n = n_tokens(hf.config)
    cm, tm = random_masks(n, n_ctx=n // 2, n_tgt=n // 3)
    ref = hf_outputs(hf, x, cm, tm)
    got = named_outputs(m, x, cm, tm)
    assert got["predictor_last_hidden_state"].shape == (N_VIDEOS, n // 3, hf.config.hidden_size)
    errs = check(f"{name} random masks", got, ref)
    assert all(e < 1e-5 for e in errs.values())


@pytest.mark.parametrize("frames", [1, 2, 5])
def test_other_frame_counts(case, frames):
    """An image (one frame, fewer than a tubelet: transformers repeats the clip), two
    frames (a whole tubelet in ``base``; in ``alt`` fewer than its tubelet of 3, so the
    clip is tiled f0 f1 f0 f1 f0 f1) and a clip that is not a whole number of tubelets
    (the conv drops the last frames)."""
    name, hf, _, m = case
    x = videos(hf.config, frames=frames, seed=6)
    n = n_tokens(hf.config, frames)
    cm, tm = random_masks(n, n_ctx=max(1, n // 2), n_tgt=max(1, n // 4), seed=5)
    ref = hf_outputs(hf, x, cm, tm)
    got = named_outputs(m, x, cm, tm)
    assert got["last_hidden_state"].shape == (N_VIDEOS, n, hf.config.hidden_size)
    check(f"{name} {frames} frames", got, ref)


def test_encoder_only_with_empty_masks(case):
    """Zero-length context and target masks skip the predictor's work (transformers'
    skip_predictor=True): the encoder's output alone, predictor outputs empty."""
    name, hf, _, m = case
    x = videos(hf.config, seed=10)
    empty = np.zeros((N_VIDEOS, 0), np.int64)
    with torch.no_grad():
        ref = hf(pixel_values_videos=torch.from_numpy(x), skip_predictor=True)
    got = named_outputs(m, x, empty, empty)
    assert got["predictor_last_hidden_state"].shape == (N_VIDEOS, 0, hf.config.hidden_size)
    check(f"{name} encoder only", {"last_hidden_state": got["last_hidden_state"]},
          {"last_hidden_state": ref.last_hidden_state.numpy()}, 1e-5)


def test_rope_grid_and_mask_token_matter(case):
    """Negative controls: the RoPE grid taken from another crop size, or another of the
    predictor's mask tokens, move the outputs far past TOL."""
    name, hf, path, _ = case
    x = videos(hf.config, seed=4)
    n = n_tokens(hf.config)
    cm, tm = random_masks(n, n_ctx=n // 2, n_tgt=n // 3)
    ref = hf_outputs(hf, x, cm, tm)
    spec = with_hf_config(md.load_spec(SPEC), crop="{crop_size + patch_size}")
    got = named_outputs(md.load_model(spec, str(path)), x, cm, tm)
    assert rel_err(got["last_hidden_state"], ref["last_hidden_state"]) > 10 * TOL
    if hf.config.pred_num_mask_tokens > 1:
        td = md.load_weights(str(path), spec=SPEC)
        key = "predictor.embeddings.mask_tokens.weight"
        td[key] = np.roll(np.asarray(td[key]), 1, axis=0)
        got = named_outputs(md.load_model(SPEC, td), x, cm, tm)
        assert rel_err(got["predictor_last_hidden_state"],
                       ref["predictor_last_hidden_state"]) > 10 * TOL


def test_classifier_checkpoint(tmp_path):
    """VJEPA2ForVideoClassification: logits first (the pooler's self-attention layers,
    the cross-attention of the learned query, the classifier), then the model's outputs."""
    cfg = dict(CASES["alt"], num_pooler_layers=2, num_labels=5)
    torch.manual_seed(11)
    hf = randomize(transformers.VJEPA2ForVideoClassification(
        transformers.VJEPA2Config(**cfg, attn_implementation="eager")), 11)
    with torch.no_grad():
        w = hf.vjepa2.predictor.embeddings.predictor_embeddings.weight
        w.mul_(w.shape[1] ** -0.5)
    path = save_hf(hf, tmp_path / "cls")
    x = videos(hf.config, seed=8)
    n = n_tokens(hf.config)
    cm, tm = random_masks(n, n_ctx=n // 2, n_tgt=n // 3, seed=9)
    with torch.no_grad():
        logits = hf(pixel_values_videos=torch.from_numpy(x)).logits.numpy()
    ref = {"logits": logits, **hf_outputs(hf.vjepa2, x, cm, tm)}
    m = md.load_model(SPEC, str(path))
    assert m.params["has_head"] is True and m.params["n_classes"] == 5
    assert m.params["pooler_ffn_dim"] == 4 * hf.config.hidden_size
    assert m.output_names == ["logits", *OUTPUTS]
    got = named_outputs(m, x, cm, tm)
    assert got["logits"].shape == (N_VIDEOS, 5)
    errs = check("classifier", got, ref)
    assert all(e < 1e-5 for e in errs.values())
