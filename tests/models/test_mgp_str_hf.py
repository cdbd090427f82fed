"""specs/mgp_str.yaml against transformers' MgpstrForSceneTextRecognition.

Small seeded float32 MGP-STR models: a ViT encoder over a fixed-size text image (patch
conv, [CLS], learned position table, fused qkv, exact GELU), then three A^3 modules
(grouped 1x1 convs, a softmax over the tokens, a weighted sum, a LayerNorm) and the
character, BPE and WordPiece heads. A batch of two images; every logits output, the
encoder's last hidden state and the A^3 attention maps are compared.

Two configs: the `tiny` variant's sizes, and one that differs from the variant in every
size the spec reads (non-square patches, image size, width, depth, heads, MLP ratio,
no qkv bias, epsilon, label counts), loaded with `variant="tiny"`: config.json must
drive them all.
"""

import numpy as np
import pytest

import maxdecl as md

from modelhelp import hf_params, named_outputs, randomize, rel_err, save_hf, spec_path

pytest.importorskip("torch")
pytest.importorskip("transformers")

TOL = 1e-4          # max|ours - ref| <= TOL * max|ref|
BATCH = 2

TINY = dict(image_size=[16, 32], patch_size=4, num_channels=3, max_token_length=7,
            num_character_labels=38, num_bpe_labels=300, num_wordpiece_labels=260,
            hidden_size=64, num_hidden_layers=2, num_attention_heads=4, mlp_ratio=4.0,
            qkv_bias=True, layer_norm_eps=1e-5)

# every size differs from the tiny variant's
OTHER = dict(image_size=[24, 48], patch_size=[4, 8], num_channels=3, max_token_length=5,
             num_character_labels=40, num_bpe_labels=257, num_wordpiece_labels=270,
             hidden_size=48, num_hidden_layers=3, num_attention_heads=3, mlp_ratio=2.5,
             qkv_bias=False, layer_norm_eps=1e-6)


def make_mgp_str(seed=0, **kw):
    """MgpstrForSceneTextRecognition with randomize's weights; the 1x1 convs of the A^3
    modules (filters [out, in / groups, 1, 1], whose last axis randomize would take as the
    fan-in) drawn N(0, 1 / fan_in) instead, so the attention maps stay soft."""
    import math

    import torch
    import transformers

    torch.manual_seed(seed)
    cfg = dict(TINY)
    cfg.update(kw)
    model = randomize(transformers.MgpstrForSceneTextRecognition(
        transformers.MgpstrConfig(**cfg)), seed)
    gen = torch.Generator().manual_seed(seed + 100)
    with torch.no_grad():
        for name, p in sorted(model.named_parameters()):
            if "a3_module" in name and p.ndim == 4:
                p.copy_(torch.randn(p.shape, generator=gen) / math.sqrt(math.prod(p.shape[1:])))
    return model


def pixels(cfg: dict, seed: int = 3) -> np.ndarray:
    h, w = cfg["image_size"]
    rng = np.random.default_rng(seed)
    return rng.standard_normal((BATCH, cfg["num_channels"], h, w)).astype(np.float32)


def hf_outputs(model, px) -> dict:
    import torch

    with torch.no_grad():
        out = model(torch.from_numpy(px), output_a3_attentions=True, output_hidden_states=True)
    char, bpe, wp = (t.numpy() for t in out.logits)
    a_char, a_bpe, a_wp = (t.numpy() for t in out.a3_attentions)
    return {"logits": char, "bpe_logits": bpe, "wp_logits": wp,
            "last_hidden_state": out.hidden_states[-1].numpy(),
            "char_a3_attentions": a_char, "bpe_a3_attentions": a_bpe,
            "wp_a3_attentions": a_wp}


def case(tmp_path_factory, name, seed, cfg):
    model = make_mgp_str(seed=seed, **cfg)
    path = save_hf(model, tmp_path_factory.mktemp(f"mgp_str_{name}"))
    px = pixels({**TINY, **cfg}, seed=seed + 3)
    return model, path, px, hf_outputs(model, px)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return case(tmp_path_factory, "tiny", 0, {})


@pytest.fixture(scope="module")
def other(tmp_path_factory):
    return case(tmp_path_factory, "other", 1, OTHER)


@pytest.fixture(scope="module")
def ours_tiny(tiny):
    return md.load_model(spec_path("mgp_str"), tiny[1], variant="tiny")


def errors(ours, px, ref) -> dict:
    got = named_outputs(ours, px)
    return {k: rel_err(got[k], v) for k, v in ref.items()}


def test_mgp_str_config_from_hf(tiny, other):
    got = hf_params("mgp_str", tiny[1])[2]
    assert (got["dim"], got["n_layers"], got["n_heads"], got["img_h"], got["img_w"],
            got["patch_h"], got["patch_w"], got["n_out_tokens"], got["n_char"],
            got["n_bpe"], got["n_wp"]) == (64, 2, 4, 16, 32, 4, 4, 7, 38, 300, 260)
    got = hf_params("mgp_str", other[1])[2]
    assert (got["dim"], got["n_layers"], got["n_heads"], got["img_h"], got["img_w"],
            got["patch_h"], got["patch_w"], got["n_out_tokens"], got["n_char"],
            got["n_bpe"], got["n_wp"], got["qkv_bias"]) == (
        48, 3, 3, 24, 48, 4, 8, 5, 40, 257, 270, False)
    assert got["mlp_ratio"] == pytest.approx(2.5)
    assert got["norm_eps"] == pytest.approx(1e-6)


def test_mgp_str_outputs_match_hf(tiny, ours_tiny):
    """All three heads through their A^3 modules, the encoder output and the A^3
    attention maps, for a batch of two images."""
    _, _, px, ref = tiny
    assert ours_tiny.output_names[:3] == ["logits", "bpe_logits", "wp_logits"]
    errs = errors(ours_tiny, px, ref)
    print("mgp_str tiny vs HF (of max|ref|):", {k: f"{v:.2e}" for k, v in errs.items()})
    assert all(v <= TOL for v in errs.values()), errs
    got = named_outputs(ours_tiny, px)
    assert got["logits"].shape == (BATCH, 7, 38)
    assert got["bpe_logits"].shape == (BATCH, 7, 300)
    assert got["wp_logits"].shape == (BATCH, 7, 260)


def test_mgp_str_images_are_independent(tiny, ours_tiny):
    """Each image of the batch alone gives its rows of the batched call."""
    _, _, px, ref = tiny
    for b in range(BATCH):
        got = named_outputs(ours_tiny, px[b:b + 1])
        for k in ("logits", "bpe_logits", "wp_logits"):
            assert rel_err(got[k][0], ref[k][b]) <= TOL


def test_mgp_str_config_drives_every_size(other):
    """A checkpoint whose sizes all differ from the variant (non-square patches, no qkv
    bias, MLP ratio 2.5, eps 1e-6) loaded with variant tiny."""
    _, path, px, ref = other
    ours = md.load_model(spec_path("mgp_str"), path, variant="tiny")
    assert "encoder.blocks.0.attn.qkv.bias" not in ours.weights   # filled with zeros
    errs = errors(ours, px, ref)
    print("mgp_str other vs HF (of max|ref|):", {k: f"{v:.2e}" for k, v in errs.items()})
    assert all(v <= TOL for v in errs.values()), errs


def test_mgp_str_base_variant_loads_tiny_checkpoint(tiny):
    """The default (base) variant takes its sizes from config.json as well."""
    _, path, px, ref = tiny
    ours = md.load_model(spec_path("mgp_str"), path)
    errs = errors(ours, px, ref)
    assert all(v <= TOL for v in errs.values()), errs


def test_mgp_str_unprefixed_names_load(tiny):
    """The encoder's names without `mgp_str.` (as MgpstrModel saves them), beside the
    heads' names, map the same way: `hf.prefixes` strips the prefix."""
    _, path, px, ref = tiny
    td = md.load_weights(path)
    prefixed = [k for k in td.keys() if k.startswith("mgp_str.")]
    assert "mgp_str.embeddings.pos_embed" in prefixed
    for k in prefixed:
        td[k[len("mgp_str."):]] = td.pop(k)
    ours = md.load_model(spec_path("mgp_str"), td, variant="tiny")
    errs = errors(ours, px, ref)
    assert all(v <= TOL for v in errs.values()), errs


def test_mgp_str_group_order_matters(tiny):
    """Negative control: the grouped 1x1 conv read as a dense one in the wrong group
    order (the filter's output channels rolled by one group) gives wrong logits."""
    _, path, px, ref = tiny
    td = md.load_weights(path)
    name = "char_a3_module.feat.weight"
    w = np.asarray(td[name])
    td[name] = np.ascontiguousarray(np.roll(w, w.shape[0] // 8, axis=0))
    ours = md.load_model(spec_path("mgp_str"), td, variant="tiny")
    assert rel_err(named_outputs(ours, px)["logits"], ref["logits"]) > 100 * TOL


def test_mgp_str_refuses_distilled(tiny, tmp_path):
    """transformers sizes pos_embed for a distillation token it never adds: refused."""
    import json
    import shutil

    _, path, _, _ = tiny
    dst = tmp_path / "distilled"
    shutil.copytree(path, dst)
    cfg = json.loads((dst / "config.json").read_text())
    cfg["distilled"] = True
    (dst / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(md.WeightsError, match="distill"):
        md.load_model(spec_path("mgp_str"), str(dst), variant="tiny")
