"""specs/dinov2.yaml against transformers' Dinov2Model.

Seeded small float32 models saved with ``save_pretrained`` (safetensors + config.json;
transformers 5 writes the legacy tensor names, ``attention.attention.query`` and the
fused SwiGLU ``mlp.weights_in``); every parameter random (LayerNorm gains and biases,
conv bias, [CLS] token, position embeddings, and the LayerScale gains, drawn per
channel well away from 1 so a branch left unscaled or scaled by the wrong gain
shows). Images at the config's native size (no position-embedding interpolation).
The sizes come from config.json, not the variant: one case has the plain GELU MLP,
one the SwiGLU MLP (with a width that rounds up to a multiple of 8, five heads,
two colour channels and no q/k/v biases).
"""

import json

import numpy as np
import pytest

import maxdecl as md
from modelhelp import TOL, named_outputs, randomize, rel_err, save_hf, spec_path

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

SPEC = spec_path("dinov2")
N_IMAGES = 2

CASES = {
    "mlp": dict(hidden_size=96, num_hidden_layers=2, num_attention_heads=6, mlp_ratio=3,
                image_size=42, patch_size=14, layer_norm_eps=1e-6, hidden_act="gelu",
                use_swiglu_ffn=False),
    "swiglu": dict(hidden_size=80, num_hidden_layers=3, num_attention_heads=5, mlp_ratio=4,
                   image_size=40, patch_size=8, num_channels=2, layer_norm_eps=1e-5,
                   qkv_bias=False, use_swiglu_ffn=True),
}


def make_dinov2(config, seed=0, cls=None):
    torch.manual_seed(seed)
    cfg = transformers.Dinov2Config(**config, attn_implementation="eager")
    model = randomize((cls or transformers.Dinov2Model)(cfg), seed)
    gen = torch.Generator().manual_seed(seed + 100)
    with torch.no_grad():
        for name, p in sorted(model.named_parameters()):
            if name.endswith("lambda1"):            # LayerScale: 0.1 .. 1.5 per channel
                p.copy_(0.1 + 1.4 * torch.rand(p.shape, generator=gen))
            elif name.endswith("patch_embeddings.projection.weight"):
                p.copy_(p / float(np.prod(p.shape[1:])) ** 0.5)   # N(0, 1 / fan_in)
    return model


def hf_outputs(model, x) -> dict:
    with torch.no_grad():
        out = model(pixel_values=torch.from_numpy(x))
    return {"last_hidden_state": out.last_hidden_state.numpy(),
            "pooler_output": out.pooler_output.numpy()}


def images(cfg, n=N_IMAGES, seed=1) -> np.ndarray:
    c, s = cfg.num_channels, cfg.image_size
    return np.random.default_rng(seed).standard_normal((n, c, s, s)).astype(np.float32)


@pytest.fixture(scope="module", params=sorted(CASES))
def case(request, tmp_path_factory):
    model = make_dinov2(CASES[request.param])
    path = save_hf(model, tmp_path_factory.mktemp(f"dinov2_{request.param}"))
    x = images(model.config)
    return request.param, model, path, x, hf_outputs(model, x)


def test_outputs_match_transformers(case):
    name, hf, path, x, ref = case
    m = md.load_model(SPEC, str(path))
    cfg = hf.config
    got_params = {k: m.params[k] for k in ("dim", "n_layers", "n_heads", "mlp_ratio", "swiglu",
                                           "image", "patch", "channels", "norm_eps")}
    assert got_params == {"dim": cfg.hidden_size, "n_layers": cfg.num_hidden_layers,
                          "n_heads": cfg.num_attention_heads, "mlp_ratio": cfg.mlp_ratio,
                          "swiglu": cfg.use_swiglu_ffn, "image": cfg.image_size,
                          "patch": cfg.patch_size, "channels": cfg.num_channels,
                          "norm_eps": cfg.layer_norm_eps}
    mlp = hf.encoder.layer[0].mlp
    hidden = (mlp.up_proj if cfg.use_swiglu_ffn else mlp.fc1).out_features
    assert m.params["ffn_dim"] == hidden
    got = named_outputs(m, x)
    assert list(got) == ["last_hidden_state", "pooler_output"]
    n_tokens = (cfg.image_size // cfg.patch_size) ** 2 + 1
    assert got["last_hidden_state"].shape == (N_IMAGES, n_tokens, cfg.hidden_size)
    assert got["pooler_output"].shape == (N_IMAGES, cfg.hidden_size)
    errs = {k: rel_err(got[k], ref[k]) for k in ref}
    abs_errs = {k: float(np.max(np.abs(got[k] - ref[k]))) for k in ref}
    print(f"dinov2 {name} vs HF: " + ", ".join(
        f"{k} rel {errs[k]:.2e} abs {abs_errs[k]:.2e}" for k in ref))
    assert all(e <= TOL for e in errs.values())
    assert all(e < 1e-5 for e in errs.values())      # float32 throughout: much tighter than TOL
    # images are independent: one alone gives its row of the batch
    one = named_outputs(m, x[1:2])
    for k in ref:
        assert rel_err(one[k], ref[k][1:2]) < 1e-5, k


def test_layer_scale_and_gate_matter(case):
    """Negative controls: LayerScale gains set to ones, or (SwiGLU) the gate and up halves
    of the fused ``weights_in`` swapped, move the outputs far past TOL."""
    name, hf, path, x, ref = case
    td = md.load_weights(str(path), spec=SPEC)
    for k in list(td.keys()):
        if k.endswith((".ls1.weight", ".ls2.weight")):
            td[k] = np.ones_like(np.asarray(td[k]))
    assert rel_err(named_outputs(md.load_model(SPEC, td), x)["last_hidden_state"],
                   ref["last_hidden_state"]) > 10 * TOL
    if not hf.config.use_swiglu_ffn:
        return
    td = md.load_weights(str(path), spec=SPEC)
    for i in range(hf.config.num_hidden_layers):
        for w in ("weight", "bias"):
            g, u = f"blk.{i}.ffn_gate.{w}", f"blk.{i}.ffn_up.{w}"
            a, b = np.asarray(td[g]), np.asarray(td[u])
            td[g], td[u] = b.copy(), a.copy()
    assert rel_err(named_outputs(md.load_model(SPEC, td), x)["last_hidden_state"],
                   ref["last_hidden_state"]) > 10 * TOL


def test_state_dict_names_and_classifier_checkpoint(tmp_path):
    """transformers 5's in-memory names (``attention.q_proj``, ``mlp.gate_proj``; a
    ``state_dict`` saved as it is) and a Dinov2ForImageClassification checkpoint (the
    model under ``dinov2.``, plus a classifier) load to the same outputs."""
    from safetensors.torch import save_file

    model = make_dinov2(CASES["swiglu"], seed=2, cls=transformers.Dinov2ForImageClassification)
    cfg = model.config
    x = images(cfg, seed=4)
    ref = hf_outputs(model.dinov2, x)

    raw = tmp_path / "state_dict"
    raw.mkdir()
    sd = {k: v.contiguous() for k, v in model.dinov2.state_dict().items()}
    assert "encoder.layer.0.mlp.gate_proj.weight" in sd
    save_file(sd, str(raw / "model.safetensors"), metadata={"format": "pt"})
    (raw / "config.json").write_text(json.dumps(model.dinov2.config.to_dict()))
    got = named_outputs(md.load_model(SPEC, str(raw)), x)
    for k in ref:
        assert rel_err(got[k], ref[k]) < 1e-5, k

    path = save_hf(model, tmp_path / "classifier")
    got = named_outputs(md.load_model(SPEC, str(path)), x)
    for k in ref:
        assert rel_err(got[k], ref[k]) < 1e-5, k


def test_non_square_config_refused(tmp_path):
    model = make_dinov2(CASES["mlp"], seed=3)
    path = save_hf(model, tmp_path)
    cfg = json.loads((tmp_path / "config.json").read_text())
    cfg["image_size"] = [42, 28]
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(md.WeightsError, match="only square images"):
        md.load_model(SPEC, str(path))
