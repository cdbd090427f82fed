"""specs/timesformer.yaml against transformers' TimesformerForVideoClassification.

A small seeded float32 TimeSformer: 16x16 frames cut into 4x4 patches (16 per frame),
3 frames, dim 32, 4 heads, 2 blocks, 5 classes. The default divided space-time
attention (time over each patch, temporal_dense, then space within each frame with a
copied and averaged [CLS]) is the main case; joint_space_time, space_only, a headless
TimesformerModel checkpoint and qkv_bias=False are checked too. Every comparison is
max|ours - ref| <= 1e-4 * max|ref| over two videos.
"""

import numpy as np
import pytest

import maxdecl as md

from modelhelp import hf_params, named_outputs, randomize, rel_err, save_hf, spec_path

pytest.importorskip("torch")
pytest.importorskip("transformers")

TOL = 1e-4
BATCH = 2
SIZES = dict(image_size=16, patch_size=4, num_channels=3, num_frames=3, hidden_size=32,
             num_hidden_layers=2, num_attention_heads=4, intermediate_size=64,
             layer_norm_eps=1e-6, hidden_act="gelu", num_labels=5)


def make_timesformer(seed=0, headless=False, **kw):
    """A seeded TimesformerForVideoClassification (or TimesformerModel when headless).

    randomize() draws every tensor whose name holds "embed" from N(0, 1); the patch
    projection (timesformer.embeddings.patch_embeddings.projection.weight) is a conv
    filter, scaled back to N(0, 1 / fan_in) so the patch embeddings stay O(1) next to
    the position and time embeddings."""
    import torch
    import transformers

    torch.manual_seed(seed)
    cfg = dict(SIZES, attn_implementation="eager")
    cfg.update(kw)
    config = transformers.TimesformerConfig(**cfg)
    cls = transformers.TimesformerModel if headless else transformers.TimesformerForVideoClassification
    model = randomize(cls(config), seed)
    base = model if headless else model.timesformer
    with torch.no_grad():
        w = base.embeddings.patch_embeddings.projection.weight
        w.div_(float(np.prod(w.shape[1:])) ** 0.5)
    return model


def pixels(n_frames=SIZES["num_frames"], seed=11) -> np.ndarray:
    s = SIZES
    shape = (BATCH, n_frames, s["num_channels"], s["image_size"], s["image_size"])
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


def hf_outputs(model, px) -> dict:
    import torch

    with torch.no_grad():
        out = model(torch.from_numpy(px))
    got = {}
    if getattr(out, "logits", None) is not None:
        got["logits"] = out.logits.numpy()
    if getattr(out, "last_hidden_state", None) is not None:
        got["last_hidden_state"] = out.last_hidden_state.numpy()
    return got


def hf_last_hidden(model, px) -> np.ndarray:
    import torch

    with torch.no_grad():
        return model.timesformer(torch.from_numpy(px)).last_hidden_state.numpy()


def case(tmp_path_factory, name, **kw):
    """(HF model, its save_pretrained folder, pixels, {output: reference})."""
    model = make_timesformer(**kw)
    path = save_hf(model, tmp_path_factory.mktemp(f"timesformer_{name}"))
    px = pixels()
    ref = hf_outputs(model, px)
    if "last_hidden_state" not in ref:
        ref["last_hidden_state"] = hf_last_hidden(model, px)
    return model, path, px, ref


def ours_outputs(path, px, variant="tiny") -> dict:
    model = md.load_model(spec_path("timesformer"), path, variant=variant)
    return named_outputs(model, px)


def assert_match(name, got, ref):
    for key, want in ref.items():
        err = rel_err(got[key], want)
        print(f"timesformer {name} {key} vs HF: {err:.2e} of max|ref| "
              f"(max abs {np.abs(got[key] - want).max():.2e}, max|ref| {np.abs(want).max():.2f})")
        assert err <= TOL, (key, err)


@pytest.fixture(scope="module")
def divided(tmp_path_factory):
    return case(tmp_path_factory, "divided")


@pytest.fixture(scope="module")
def ours_divided(divided):
    return md.load_model(spec_path("timesformer"), divided[1], variant="tiny")


def test_timesformer_config_from_hf(divided):
    got = hf_params("timesformer", divided[1])[2]
    assert (got["dim"], got["n_layers"], got["n_heads"], got["ffn_dim"]) == (32, 2, 4, 64)
    assert (got["image_size"], got["patch_size"], got["n_channels"], got["n_frames"]) == (16, 4, 3, 3)
    assert got["n_classes"] == 5                   # from id2label: transformers 5 writes no num_labels
    assert got["attention_type"] == "divided_space_time"
    assert got["has_head"] == 1
    assert got["norm_eps"] == pytest.approx(1e-6)


def test_timesformer_divided_space_time_matches_hf(divided, ours_divided):
    model, path, px, ref = divided
    got = named_outputs(ours_divided, px)
    assert ours_divided.output_names[0] == "logits"
    assert got["logits"].shape == (BATCH, 5)
    assert got["last_hidden_state"].shape == (BATCH, 1 + 16 * 3, 32)
    assert_match("divided", got, ref)


def test_timesformer_videos_are_independent(divided, ours_divided):
    """One video alone gives the rows it gave in the batch of two."""
    model, path, px, ref = divided
    got = named_outputs(ours_divided, px[1:])
    assert_match("divided[1:]", got, {k: v[1:] for k, v in ref.items()})


def test_timesformer_time_embeddings_matter(divided):
    """Negative control: the same checkpoint with the time embeddings zeroed is far off
    (frame order reaches the output only through them and the temporal attention)."""
    model, path, px, ref = divided
    td = md.load_weights(path)
    name = "timesformer.embeddings.time_embeddings"
    td[name] = np.zeros_like(np.asarray(td[name]))
    got = named_outputs(md.load_model(spec_path("timesformer"), td, variant="tiny"), px)
    assert rel_err(got["last_hidden_state"], ref["last_hidden_state"]) > 100 * TOL


def test_timesformer_headless_model_matches_hf(tmp_path_factory):
    """A TimesformerModel checkpoint (no timesformer. prefix, no classifier): only
    last_hidden_state."""
    model, path, px, ref = case(tmp_path_factory, "headless", headless=True)
    ours = md.load_model(spec_path("timesformer"), path, variant="tiny")
    assert ours.output_names == ["last_hidden_state"]
    assert_match("headless", named_outputs(ours, px), ref)


def test_timesformer_without_qkv_bias_matches_hf(tmp_path_factory):
    model, path, px, ref = case(tmp_path_factory, "nobias", seed=1, qkv_bias=False)
    assert_match("qkv_bias=False", ours_outputs(path, px), ref)


def test_timesformer_joint_space_time_matches_hf(tmp_path_factory):
    model, path, px, ref = case(tmp_path_factory, "joint", seed=2,
                                attention_type="joint_space_time")
    assert ref["last_hidden_state"].shape == (BATCH, 1 + 16 * 3, 32)
    assert_match("joint_space_time", ours_outputs(path, px), ref)


def test_timesformer_space_only_matches_hf(tmp_path_factory):
    """space_only runs every frame as an image: transformers' outputs have
    videos x frames rows, and so do ours."""
    model, path, px, ref = case(tmp_path_factory, "space", seed=3, attention_type="space_only")
    assert ref["logits"].shape == (BATCH * 3, 5)
    assert_match("space_only", ours_outputs(path, px), ref)


def test_timesformer_refuses_unknown_attention_type(divided):
    td = md.load_weights(divided[1])
    td.metadata["attention_type"] = "axial"
    with pytest.raises(md.WeightsError, match="unknown attention_type axial"):
        md.load_model(spec_path("timesformer"), td, variant="tiny")
