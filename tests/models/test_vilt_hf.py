"""specs/vilt.yaml against transformers' ViltModel.

A small seeded float32 ViLT (dim 32, 2 layers, 4 heads, 32x32 images of 8x8 patches:
a 4x4 position table). transformers picks the image tokens with torch.multinomial (a
random permutation of the valid patches); the spec takes those draws as its
``image_patch_ids`` input, so each test records them from ``visual_embed`` and feeds
the same ones.
"""

import numpy as np
import pytest

import maxdecl as md

from modelhelp import hf_params, randomize, rel_err, save_hf, spec_path

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

TOL = 1e-4           # max|ours - ref| <= TOL * max|ref|
BATCH, SEQ = 2, 7
CFG = dict(vocab_size=64, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
           intermediate_size=64, max_position_embeddings=40, image_size=32, patch_size=8,
           num_channels=3, layer_norm_eps=1e-12, hidden_act="gelu",
           attn_implementation="eager")


def make_vilt(seed=0, **kw):
    torch.manual_seed(seed)
    cfg = {**CFG, **kw}
    return randomize(transformers.ViltModel(transformers.ViltConfig(**cfg)), seed)


def hf_run(model, feed, seed=123):
    """transformers' outputs and the flat patch index of each image token it drew."""
    rec = {}
    orig = model.embeddings.visual_embed

    def recording(*a, **k):
        out = orig(*a, **k)
        rec["patch_index"], _ = out[2]
        return out

    model.embeddings.visual_embed = recording
    try:
        torch.manual_seed(seed)
        with torch.no_grad():
            out = model(**{k: torch.from_numpy(v) for k, v in feed.items()})
    finally:
        del model.embeddings.visual_embed
    pv = feed["pixel_values"]
    grid_w = pv.shape[3] // model.config.patch_size
    pi = rec["patch_index"].numpy()
    ids = (pi[..., 0] * grid_w + pi[..., 1]).astype(np.int64)
    pooled = None if out.pooler_output is None else out.pooler_output.numpy()
    return out.last_hidden_state.numpy(), pooled, ids


def make_feed(height=32, width=32, seed=1, pixel_mask=None):
    rng = np.random.default_rng(seed)
    feed = {
        "input_ids": rng.integers(0, CFG["vocab_size"], (BATCH, SEQ)).astype(np.int64),
        "attention_mask": np.ones((BATCH, SEQ), np.int64),
        "token_type_ids": np.zeros((BATCH, SEQ), np.int64),
        "pixel_values": rng.standard_normal((BATCH, 3, height, width)).astype(np.float32),
        "pixel_mask": (np.ones((BATCH, height, width), np.int64) if pixel_mask is None
                       else pixel_mask),
    }
    return feed


def ours_run(ours, feed, ids):
    got = dict(zip(ours.output_names, ours(*(feed[n] for n in [
        "input_ids", "attention_mask", "token_type_ids", "pixel_values", "pixel_mask"]), ids)))
    return got


@pytest.fixture(scope="module")
def vilt(tmp_path_factory):
    model = make_vilt()
    path = save_hf(model, tmp_path_factory.mktemp("vilt_hf"))
    feed = make_feed()
    return model, path, feed, hf_run(model, feed)


@pytest.fixture(scope="module")
def ours(vilt):
    return md.load_model(spec_path("vilt"), vilt[1], variant="tiny")


def test_vilt_config_from_hf(vilt):
    got = hf_params("vilt", vilt[1])[2]
    assert (got["dim"], got["n_layers"], got["n_heads"], got["ffn_dim"]) == (32, 2, 4, 64)
    assert (got["vocab"], got["context"], got["image_size"], got["patch_size"]) == (64, 40, 32, 8)
    assert got["norm_eps"] == pytest.approx(1e-12)


def test_vilt_io_names(ours):
    assert ours.input_names[:6] == ["input_ids", "attention_mask", "token_type_ids",
                                    "pixel_values", "pixel_mask", "image_patch_ids"]
    assert ours.output_names[:2] == ["last_hidden_state", "pooler_output"]


def test_vilt_matches_hf(vilt, ours):
    """last_hidden_state and pooler_output for a batch of 2, HF's own patch draws."""
    _, _, feed, (ref_h, ref_p, ids) = vilt
    assert ids.shape == (BATCH, 16)
    assert not (ids == np.arange(16)).all()          # the draws do shuffle the patches
    got = ours_run(ours, feed, ids)
    eh = rel_err(got["last_hidden_state"], ref_h)
    ep = rel_err(got["pooler_output"], ref_p)
    print(f"vilt vs HF: last_hidden_state {eh:.2e}, pooler_output {ep:.2e} (of max|ref|)")
    assert got["last_hidden_state"].shape == (BATCH, SEQ + 1 + 16, 32)
    assert eh <= TOL and ep <= TOL


def test_vilt_patches_in_order(vilt, ours):
    """image_patch_ids = arange gives the image tokens in grid order: HF's output
    with its permutation undone."""
    _, _, feed, (ref_h, ref_p, ids) = vilt
    got = ours_run(ours, feed, np.tile(np.arange(16, dtype=np.int64), (BATCH, 1)))
    h = got["last_hidden_state"]
    img = h[:, SEQ + 1:]
    undone = np.stack([img[b, ids[b]] for b in range(BATCH)])
    assert rel_err(h[:, :SEQ + 1], ref_h[:, :SEQ + 1]) <= TOL
    assert rel_err(undone, ref_h[:, SEQ + 1:]) <= TOL
    assert rel_err(got["pooler_output"], ref_p) <= TOL


def _agrees(model, ours, feed, label):
    """Our hidden states and pooler output for ``feed`` within TOL of transformers'."""
    ref_h, ref_p, ids = hf_run(model, feed)
    got = ours_run(ours, feed, ids)
    eh = rel_err(got["last_hidden_state"], ref_h)
    ep = rel_err(got["pooler_output"], ref_p)
    print(f"vilt {label} vs HF: {eh:.2e}, {ep:.2e}")
    assert eh <= TOL and ep <= TOL


def test_vilt_other_image_size_resizes_positions(vilt, ours):
    """A 48x40 image (6x5 patches): the 4x4 position table is resized (bilinear,
    align_corners) to the grid, as transformers does."""
    model = vilt[0]
    _agrees(model, ours, make_feed(48, 40, seed=2), "48x40")


def test_vilt_padded_images_and_text(vilt, ours):
    """A padded batch: image 1 covers 24x16 of the 32x32 pixels (3x2 patches), text 1
    has 3 padding tokens. transformers resizes the position table per image to its own
    grid and fills the token list with random padded patches (masked out)."""
    model = vilt[0]
    pm = np.ones((BATCH, 32, 32), np.int64)
    pm[1, 24:, :] = 0
    pm[1, :, 16:] = 0
    feed = make_feed(seed=3, pixel_mask=pm)
    feed["attention_mask"][1, SEQ - 3:] = 0
    feed["token_type_ids"][0, 3:] = 1
    _agrees(model, ours, feed, "padded")


def test_vilt_position_table_matters(vilt):
    """Negative control: a shuffled image position table moves the outputs."""
    _, path, feed, (ref_h, _, ids) = vilt
    td = md.load_weights(path)
    t = np.asarray(td["embeddings.position_embeddings"]).copy()
    td["embeddings.position_embeddings"] = np.ascontiguousarray(t[:, ::-1])
    bad = md.load_model(spec_path("vilt"), td, variant="tiny")
    got = ours_run(bad, feed, ids)
    assert rel_err(got["last_hidden_state"], ref_h) > 100 * TOL


def test_vilt_max_image_length(vilt, ours):
    """config.max_image_length 10: transformers keeps 10 of the 16 patches, drawn at
    random; the same draws as image_patch_ids give its output."""
    model, _, feed, _ = vilt
    model.config.max_image_length = 10
    try:
        ref_h, ref_p, ids = hf_run(model, feed, seed=5)
    finally:
        model.config.max_image_length = -1
    assert ids.shape == (BATCH, 10)
    got = ours_run(ours, feed, ids)
    assert rel_err(got["last_hidden_state"], ref_h) <= TOL
    assert rel_err(got["pooler_output"], ref_p) <= TOL


def test_vilt_without_qkv_bias(tmp_path):
    """qkv_bias false: the q/k/v biases are absent (zeros) and the checkpoint loads."""
    model = make_vilt(seed=1, qkv_bias=False)
    path = save_hf(model, tmp_path / "nobias")
    feed = make_feed(seed=4)
    ref_h, ref_p, ids = hf_run(model, feed)
    got = ours_run(md.load_model(spec_path("vilt"), path, variant="tiny"), feed, ids)
    assert rel_err(got["last_hidden_state"], ref_h) <= TOL
    assert rel_err(got["pooler_output"], ref_p) <= TOL


def test_vilt_token_classification_has_no_pooler(tmp_path):
    """ViltForTokenClassification (vilt. prefix, no pooler, a classifier head dropped):
    the encoder's last_hidden_state only."""
    torch.manual_seed(2)
    full = randomize(transformers.ViltForTokenClassification(
        transformers.ViltConfig(**CFG, num_labels=3)), 2)
    path = save_hf(full, tmp_path / "tokcls")
    feed = make_feed(seed=5)
    ref_h, ref_p, ids = hf_run(full.vilt, feed)
    assert ref_p is None
    ours = md.load_model(spec_path("vilt"), path, variant="tiny")
    assert ours.output_names == ["last_hidden_state"]
    got = ours_run(ours, feed, ids)
    assert rel_err(got["last_hidden_state"], ref_h) <= TOL
