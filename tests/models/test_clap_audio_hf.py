"""specs/clap_audio.yaml against transformers' ClapAudioModelWithProjection (HTS-AT).

Seeded small float32 models saved with ``save_pretrained`` (safetensors + config.json);
every parameter random (``modelhelp.randomize``, BatchNorm running statistics drawn too,
so the input BatchNorm and the AFF block's BatchNorms are read), so a weight read wrongly
or left out changes the outputs. The sizes come from config.json, not the variant.

Cases: the tiny unfused model (2 stages, window 4: stage 0 shifted, stage 1 as large as
the window, so unshifted); the fused model (``enable_fusion``: a global mel and three
local crops, ``is_longer`` true for some clips only, so both the AFF path and the plain
path run in one batch); and a variant config (3 stages with window 2, a stage map of 3x3
padded to whole windows and shifted, patch 6 with stride 4 so the patch conv pads, no
q/k/v bias, no patch LayerNorm, gelu_new, another eps and MLP ratio, a GELU projection,
freq_ratio 3). Each runs with fewer frames than spec_size * freq_ratio (the bicubic
resize) and with exactly that many (no resize).
"""

import numpy as np
import pytest

import maxdecl as md
from modelhelp import randomize, rel_err, spec_path

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

SPEC = spec_path("clap_audio")
BATCH = 3
TOL = 1e-4          # max|ours - ref| <= TOL * max|ref|

BASE = dict(num_mel_bins=16, spec_size=32, window_size=4, depths=[2, 2],
            num_attention_heads=[2, 4], patch_embeds_hidden_size=16, hidden_size=32,
            projection_dim=24)

CASES = {
    "unfused": dict(config=dict(BASE), frames=[50, 64]),
    "fused": dict(config=dict(BASE, enable_fusion=True, fusion_type="aff_2d", aff_block_r=2),
                  frames=[41, 64]),
    "variant": dict(config=dict(num_mel_bins=16, spec_size=48, window_size=2, depths=[2, 1, 2],
                                num_attention_heads=[1, 2, 2], patch_embeds_hidden_size=8,
                                hidden_size=32, projection_dim=12, patch_size=6,
                                patch_stride=[4, 4], qkv_bias=False,
                                enable_patch_layer_norm=False, hidden_act="gelu_new",
                                layer_norm_eps=1e-6, mlp_ratio=2.0,
                                projection_hidden_act="gelu"),
                    frames=[100, 144]),
}


def make_clap(config, seed=0):
    torch.manual_seed(seed)
    cfg = transformers.ClapAudioConfig(**config)
    return randomize(transformers.ClapAudioModelWithProjection(cfg), seed, running_stats=True)


def features(cfg, frames, seed):
    ch = 4 if cfg.enable_fusion else cfg.patch_embed_input_channels
    rng = np.random.default_rng(seed)
    return rng.standard_normal((BATCH, ch, frames, cfg.num_mel_bins)).astype(np.float32)


IS_LONGER = np.array([[True], [False], [True]])


def hf_outputs(model, x):
    """(last_hidden_state, pooler_output, audio_embeds) of transformers."""
    kw = {"is_longer": torch.from_numpy(IS_LONGER)} if model.config.enable_fusion else {}
    with torch.no_grad():
        base = model.audio_model(input_features=torch.from_numpy(x), **kw)
        out = model(input_features=torch.from_numpy(x), **kw)
    assert torch.equal(base.last_hidden_state, out.last_hidden_state)
    return (out.last_hidden_state.numpy(), base.pooler_output.numpy(),
            out.audio_embeds.numpy())


def ours_outputs(m, x):
    args = (x, IS_LONGER) if m.params["enable_fusion"] else (x,)
    got = dict(zip(m.output_names, m(*args)))
    return got["last_hidden_state"], got["pooler_output"], got["audio_embeds"]


@pytest.fixture(scope="module", params=sorted(CASES))
def case(request, tmp_path_factory):
    """name, HF model, its folder, {frames: (input, HF outputs)}, the spec's model."""
    c = CASES[request.param]
    model = make_clap(c["config"])
    path = tmp_path_factory.mktemp(f"clap_audio_{request.param}")
    model.save_pretrained(str(path))
    refs = {}
    for k, t in enumerate(c["frames"]):
        x = features(model.config, t, seed=1 + k)
        refs[t] = (x, hf_outputs(model, x))
    ours = md.load_model(SPEC, str(path))
    return request.param, model, path, refs, ours


def test_params_from_config(case):
    name, model, _, _, m = case
    cfg = model.config
    assert m.params["depths"] == list(cfg.depths)
    assert m.params["num_attention_heads"] == list(cfg.num_attention_heads)
    assert m.params["window_size"] == cfg.window_size
    assert m.params["spec_size"] == cfg.spec_size
    assert m.params["num_mel_bins"] == cfg.num_mel_bins
    assert m.params["freq_ratio"] == cfg.spec_size // cfg.num_mel_bins
    assert m.params["enable_fusion"] == cfg.enable_fusion
    assert m.params["qkv_bias"] == cfg.qkv_bias
    assert m.params["layer_norm_eps"] == cfg.layer_norm_eps
    assert m.params["projection_dim"] == cfg.projection_dim
    assert m.output_names[:3] == ["last_hidden_state", "pooler_output", "audio_embeds"]
    want_inputs = ["input_features", "is_longer"] if cfg.enable_fusion else ["input_features"]
    assert list(m.input_names) == want_inputs


def test_outputs_match_transformers(case):
    """last_hidden_state [n, C, c_freq_bin, ...], pooler_output and audio_embeds at every
    frame count of the case, through one built graph."""
    name, model, _, refs, m = case
    graph = m.graph
    for t, (x, ref) in refs.items():
        got = ours_outputs(m, x)
        assert m.graph is graph
        errs = []
        for label, a, b in zip(("last_hidden_state", "pooler_output", "audio_embeds"), got, ref):
            assert a.shape == b.shape, (label, a.shape, b.shape)
            errs.append(rel_err(a, b))
            print(f"clap_audio {name} frames={t} {label}: {errs[-1]:.2e} of max|ref| "
                  f"({np.abs(b).max():.3f}), max abs {np.abs(a - b).max():.2e}")
        assert max(errs) <= TOL


def test_fusion_path_matters(case):
    """Negative control for the fused model: flipping is_longer changes transformers'
    result and ours the same way (so the AFF branch and the plain branch are both
    taken and both match)."""
    name, model, _, refs, m = case
    if not model.config.enable_fusion:
        pytest.skip("fused case only")
    x, ref = next(iter(refs.values()))
    flipped = ~IS_LONGER
    with torch.no_grad():
        other = model(input_features=torch.from_numpy(x),
                      is_longer=torch.from_numpy(flipped)).audio_embeds.numpy()
    assert rel_err(other, ref[2]) > 1e-2
    got = dict(zip(m.output_names, m(x, flipped)))["audio_embeds"]
    assert rel_err(got, other) <= TOL


def test_relative_position_bias_is_read(case):
    """Negative control: zeroing the relative position bias tables moves our output."""
    name, model, path, refs, _ = case
    x, ref = next(iter(refs.values()))
    td = md.load_weights(str(path), spec=SPEC)
    tables = [k for k in td.keys() if k.endswith("relative_position_bias_table")]
    assert len(tables) == sum(model.config.depths)
    for k in tables:
        td[k] = np.zeros_like(np.asarray(td[k]))
    m = md.load_model(SPEC, td)
    assert rel_err(ours_outputs(m, x)[2], ref[2]) > 1e-2


def test_shift_matters(case):
    """Negative control: transformers' output moves when its shifted blocks do not shift,
    so the match above covers the roll and the shift mask."""
    name, model, _, refs, _ = case
    x, ref = next(iter(refs.values()))
    saved = {}
    for mod_name, mod in model.named_modules():
        if type(mod).__name__ == "ClapAudioLayer" and mod.shift_size:
            saved[mod_name] = mod.shift_size
            mod.shift_size = 0
    assert saved
    try:
        unshifted = hf_outputs(model, x)
    finally:
        for mod_name, mod in model.named_modules():
            if mod_name in saved:
                mod.shift_size = saved[mod_name]
    assert rel_err(unshifted[0], ref[0]) > 1e-2
    assert rel_err(hf_outputs(model, x)[0], ref[0]) < 1e-5      # restored


def test_too_many_frames_fails(case):
    """More frames than spec_size * freq_ratio: transformers raises, the spec's check too."""
    name, model, _, _, m = case
    cfg = model.config
    x = features(cfg, cfg.spec_size * (cfg.spec_size // cfg.num_mel_bins) + 1, seed=9)
    with pytest.raises(ValueError):
        hf_outputs(model, x)
    with pytest.raises(md.GraphError, match="reshape_mel2img"):
        ours_outputs(m, x)


def test_full_clap_checkpoint(tmp_path):
    """The audio tower of a full ClapModel checkpoint (config.json's audio_config, the
    text tower's tensors dropped) gives ClapModel's audio_model and audio_projection."""
    torch.manual_seed(3)
    cfg = transformers.ClapConfig(
        text_config=dict(vocab_size=256, hidden_size=32, num_hidden_layers=1,
                         num_attention_heads=2, intermediate_size=64,
                         max_position_embeddings=40),
        audio_config=dict(BASE), projection_dim=24)
    model = randomize(transformers.ClapModel(cfg), 3, running_stats=True)
    model.save_pretrained(str(tmp_path))
    x = features(model.config.audio_config, 64, seed=4)
    with torch.no_grad():
        a = model.audio_model(input_features=torch.from_numpy(x))
        emb = model.audio_projection(a.pooler_output).numpy()
    m = md.load_model(SPEC, str(tmp_path))
    hidden, _, got = ours_outputs(m, x)
    e_h, e_e = rel_err(hidden, a.last_hidden_state.numpy()), rel_err(got, emb)
    print(f"clap_audio full ClapModel: last_hidden_state {e_h:.2e}, audio_embeds {e_e:.2e}")
    assert e_h <= TOL and e_e <= TOL
