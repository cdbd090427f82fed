"""specs/dinov3_vit.yaml against transformers' DINOv3ViTModel.

Seeded small float32 models saved with ``save_pretrained`` (safetensors + config.json;
the encoder's layers are saved as ``layer.{i}...``, in memory they are
``model.layer.{i}...``). Every parameter is random: LayerNorm gains and biases, the
patch conv, the [CLS] and register tokens, and the LayerScale gains (drawn per channel
well away from 1, so a branch left unscaled shows). Images are non-square, so the 2-D
RoPE's y and x halves cannot be confused, and the patch grid comes from the image
itself (transformers ignores ``image_size`` at inference). One case has the plain GELU
MLP, 3 register tokens and no key bias; the other the gated (SiLU) MLP, no registers,
a non-square patch ``[8, 4]``, rope_theta 1000, head_dim 24, a key bias and no query or
MLP biases.
"""

import json
import math

import numpy as np
import pytest

import maxdecl as md
from modelhelp import named_outputs, randomize, rel_err, save_hf, spec_path

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

SPEC = spec_path("dinov3_vit")
TOL = 1e-5            # float32 throughout: max|ours - ref| <= TOL * max|ref|
N_IMAGES = 2

CASES = {
    "plain": dict(hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                  num_attention_heads=4, num_register_tokens=3, patch_size=8,
                  image_size=48, layer_norm_eps=1e-6, hidden_act="gelu", rope_theta=100.0,
                  key_bias=False, use_gated_mlp=False),
    "gated": dict(hidden_size=72, intermediate_size=80, num_hidden_layers=3,
                  num_attention_heads=3, num_register_tokens=0, patch_size=[8, 4],
                  num_channels=2, layer_norm_eps=1e-5, hidden_act="silu", rope_theta=1000.0,
                  query_bias=False, key_bias=True, mlp_bias=False, use_gated_mlp=True),
}
# (height, width): non-square, the first a whole number of patches, the second not
IMAGE_SIZES = {"plain": [(48, 32), (37, 61)], "gated": [(40, 28), (30, 45)]}


def make_dinov3(config, seed=0):
    torch.manual_seed(seed)
    cfg = transformers.DINOv3ViTConfig(**config, attn_implementation="eager")
    model = randomize(transformers.DINOv3ViTModel(cfg), seed)
    gen = torch.Generator().manual_seed(seed + 100)
    with torch.no_grad():
        for name, p in sorted(model.named_parameters()):
            if name.endswith("lambda1"):            # LayerScale: 0.1 .. 1.5 per channel
                p.copy_(0.1 + 1.4 * torch.rand(p.shape, generator=gen))
    return model.eval()


def hf_outputs(model, x) -> dict:
    with torch.no_grad():
        out = model(pixel_values=torch.from_numpy(x))
    return {"last_hidden_state": out.last_hidden_state.numpy(),
            "pooler_output": out.pooler_output.numpy()}


def images(cfg, size, n=N_IMAGES, seed=1) -> np.ndarray:
    h, w = size
    return np.random.default_rng(seed).standard_normal((n, cfg.num_channels, h, w)).astype(
        np.float32)


def n_tokens(cfg, size) -> int:
    ph, pw = cfg.patch_size if isinstance(cfg.patch_size, (list, tuple)) else (cfg.patch_size,) * 2
    return 1 + cfg.num_register_tokens + (size[0] // ph) * (size[1] // pw)


@pytest.fixture(scope="module", params=sorted(CASES))
def case(request, tmp_path_factory):
    name = request.param
    model = make_dinov3(CASES[name])
    path = save_hf(model, tmp_path_factory.mktemp(f"dinov3_vit_{name}"))
    ours = md.load_model(SPEC, str(path))
    xs = [images(model.config, s, seed=1 + k) for k, s in enumerate(IMAGE_SIZES[name])]
    refs = [hf_outputs(model, x) for x in xs]
    return name, model, path, ours, xs, refs


def test_params_from_config(case):
    name, hf, path, m, xs, refs = case
    cfg = hf.config
    ph, pw = cfg.patch_size if isinstance(cfg.patch_size, list) else (cfg.patch_size,) * 2
    want = {"dim": cfg.hidden_size, "n_layers": cfg.num_hidden_layers,
            "n_heads": cfg.num_attention_heads, "ffn_dim": cfg.intermediate_size,
            "n_reg": cfg.num_register_tokens, "patch_h": ph, "patch_w": pw,
            "channels": cfg.num_channels, "norm_eps": cfg.layer_norm_eps,
            "rope_theta": cfg.rope_theta, "hidden_act": cfg.hidden_act,
            "gated_mlp": cfg.use_gated_mlp, "q_bias": cfg.query_bias, "k_bias": cfg.key_bias,
            "v_bias": cfg.value_bias, "o_bias": cfg.proj_bias, "mlp_bias": cfg.mlp_bias}
    assert {k: m.params[k] for k in want} == want
    assert m.params["head_dim"] == cfg.hidden_size // cfg.num_attention_heads
    # the weights a configuration has, and only those
    names = set(m.weights.keys())
    assert ("reg_tokens.weight" in names) == (cfg.num_register_tokens > 0)
    assert ("blk.0.ffn_gate.weight" in names) == cfg.use_gated_mlp
    assert ("blk.0.attn_k.bias" in names) == cfg.key_bias
    assert ("blk.0.attn_q.bias" in names) == cfg.query_bias


def test_outputs_match_transformers(case):
    """last_hidden_state and pooler_output of non-square images (one a whole number of
    patches, one not) match transformers within TOL of the reference's largest value."""
    name, hf, path, m, xs, refs = case
    assert m.output_names[:2] == ["last_hidden_state", "pooler_output"]
    for x, ref in zip(xs, refs):
        got = named_outputs(m, x)
        size = x.shape[2:]
        assert got["last_hidden_state"].shape == (N_IMAGES, n_tokens(hf.config, size),
                                                  hf.config.hidden_size)
        assert got["pooler_output"].shape == (N_IMAGES, hf.config.hidden_size)
        errs = {k: rel_err(got[k], ref[k]) for k in ref}
        abs_errs = {k: float(np.max(np.abs(got[k] - ref[k]))) for k in ref}
        print(f"dinov3_vit {name} {tuple(size)} vs HF: " + ", ".join(
            f"{k} rel {errs[k]:.2e} abs {abs_errs[k]:.2e}" for k in ref))
        assert all(e <= TOL for e in errs.values()), errs
        # images are independent: one alone gives its row of the batch
        one = named_outputs(m, x[1:2])
        for k in ref:
            assert rel_err(one[k], ref[k][1:2]) <= TOL, k


def _rope_override(model, mode):
    """Replace transformers' RoPE tables: ``off`` (cos 1, sin 0: no rotation) or ``swap``
    (the x coordinate on the first half of the pairs, y on the second)."""
    rope = model.rope_embeddings
    orig = rope.forward

    def forward(pixel_values):
        cos, sin = orig(pixel_values)
        if mode == "off":
            return torch.ones_like(cos), torch.zeros_like(sin)
        cfg = model.config
        ph, pw = cfg.patch_size if isinstance(cfg.patch_size, list) else (cfg.patch_size,) * 2
        h, w = pixel_values.shape[2] // ph, pixel_values.shape[3] // pw
        from transformers.models.dinov3_vit.modeling_dinov3_vit import (
            get_patches_center_coordinates)
        coords = get_patches_center_coordinates(h, w, torch.float32, pixel_values.device)
        coords = coords[:, [1, 0]]
        ang = (2 * math.pi * coords[:, :, None] * rope.inv_freq[None, None, :]).flatten(1, 2)
        ang = ang.tile(2)
        return torch.cos(ang), torch.sin(ang)

    return forward


def test_rope_register_tokens_and_layer_scale_matter(case):
    """Negative controls: the comparison above is sensitive to every feature it claims to
    cover. transformers with its RoPE switched off, or with the y and x axes swapped,
    is far from ours; so are ours with the LayerScale gains set to ones and with the
    register tokens zeroed."""
    name, hf, path, m, xs, refs = case
    x, ref = xs[0], refs[0]
    ours = named_outputs(m, x)["last_hidden_state"]
    for mode in ("off", "swap"):
        saved = hf.rope_embeddings.forward
        hf.rope_embeddings.forward = _rope_override(hf, mode)
        try:
            other = hf_outputs(hf, x)["last_hidden_state"]
        finally:
            hf.rope_embeddings.forward = saved
        assert rel_err(ours, other) > 100 * TOL, mode
    assert rel_err(hf_outputs(hf, x)["last_hidden_state"], ref["last_hidden_state"]) == 0.0

    td = md.load_weights(str(path), spec=SPEC)
    for k in list(td.keys()):
        if k.endswith((".ls1.weight", ".ls2.weight")):
            td[k] = np.ones_like(np.asarray(td[k]))
    assert rel_err(named_outputs(md.load_model(SPEC, td), x)["last_hidden_state"],
                   ref["last_hidden_state"]) > 100 * TOL
    if hf.config.num_register_tokens:
        td = md.load_weights(str(path), spec=SPEC)
        td["reg_tokens.weight"] = np.zeros_like(np.asarray(td["reg_tokens.weight"]))
        assert rel_err(named_outputs(md.load_model(SPEC, td), x)["last_hidden_state"],
                       ref["last_hidden_state"]) > 100 * TOL


def test_state_dict_names(case, tmp_path):
    """A ``state_dict`` saved as it is (``model.layer.{i}...``, transformers' in-memory
    names) loads to the same outputs."""
    from safetensors.torch import save_file

    name, hf, path, m, xs, refs = case
    sd = {k: v.contiguous() for k, v in hf.state_dict().items()}
    assert "model.layer.0.norm1.weight" in sd
    save_file(sd, str(tmp_path / "model.safetensors"), metadata={"format": "pt"})
    (tmp_path / "config.json").write_text(json.dumps(hf.config.to_dict()))
    got = named_outputs(md.load_model(SPEC, str(tmp_path)), xs[0])
    for k in refs[0]:
        assert rel_err(got[k], refs[0][k]) <= TOL, k


def test_head_dim_not_multiple_of_4_refused(tmp_path):
    """2-D RoPE needs head_dim / 4 frequencies per axis: a config.json whose head_dim is
    not a multiple of 4 is refused when it loads."""
    path = save_hf(make_dinov3(CASES["plain"], seed=3), tmp_path)
    cfg = json.loads((tmp_path / "config.json").read_text())
    cfg["hidden_size"], cfg["num_attention_heads"] = 60, 6      # head_dim 10
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(md.WeightsError, match="multiple of 4"):
        md.load_model(SPEC, str(path))
