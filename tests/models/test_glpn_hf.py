"""specs/glpn.yaml against transformers' GLPNForDepthEstimation.

Two small seeded float32 models, built once per module:

* ``main``: 4 encoder stages (MiT), depths [1, 2, 1, 1], sequence-reduction ratios
  [3, 2, 2, 1] (a 3x3 reduction over an 8x16 map leaves a remainder), exact GELU, a
  decoder of width 16 (the 16-wide stage has no 1x1 conv), head on the last stage;
* ``alt``: 3 stages, 4 input channels, other widths, gelu_new, max_depth 80 and
  ``head_in_index: 1`` (the head reads the middle decoder stage, not the final upsample).

Each runs a batch of two images whose sides are not multiples of the strides (30 x 61
and 30 x 45), with BatchNorm running statistics drawn, and compares predicted_depth,
last_hidden_state and every encoder stage's hidden state with a tolerance of 1e-4 of
max|ref|.
"""

import numpy as np
import pytest

import maxdecl as md

from modelhelp import hf_params, named_outputs, randomize, rel_err, save_hf, spec_path

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

TOL = 1e-4

CASES = {
    "main": dict(
        config=dict(num_channels=3, num_encoder_blocks=4, depths=[1, 2, 1, 1],
                    sr_ratios=[3, 2, 2, 1], hidden_sizes=[8, 16, 24, 32],
                    patch_sizes=[7, 3, 3, 3], strides=[4, 2, 2, 2],
                    num_attention_heads=[1, 2, 2, 4], mlp_ratios=[2, 4, 2, 4],
                    hidden_act="gelu", decoder_hidden_size=16, max_depth=10,
                    head_in_index=-1, drop_path_rate=0.0),
        image=(2, 3, 30, 61)),
    "alt": dict(
        config=dict(num_channels=4, num_encoder_blocks=3, depths=[2, 1, 1],
                    sr_ratios=[4, 2, 1], hidden_sizes=[12, 16, 20],
                    patch_sizes=[7, 3, 3], strides=[4, 2, 2],
                    num_attention_heads=[2, 2, 4], mlp_ratios=[4, 2, 2],
                    hidden_act="gelu_new", decoder_hidden_size=12, max_depth=80,
                    head_in_index=1, drop_path_rate=0.0),
        image=(2, 4, 30, 45)),
}


def make_glpn(seed, config):
    torch.manual_seed(seed)
    model = transformers.GLPNForDepthEstimation(transformers.GLPNConfig(**config))
    # conv_fan_in: 3x3 filters scaled by their fan-in (not by their last axis, 3)
    return randomize(model, seed, running_stats=True, conv_fan_in=True)


def hf_reference(model, pixels) -> dict:
    with torch.no_grad():
        out = model(torch.from_numpy(pixels), output_hidden_states=True, return_dict=True)
    ref = {"predicted_depth": out.predicted_depth.numpy(),
           "last_hidden_state": out.hidden_states[-1].numpy()}
    for s, h in enumerate(out.hidden_states):
        ref[f"encoder.hidden_states.{s}.hidden_state"] = h.numpy()
    return ref


@pytest.fixture(scope="module")
def cases(tmp_path_factory):
    out = {}
    for k, (name, case) in enumerate(CASES.items()):
        model = make_glpn(k, case["config"])
        path = save_hf(model, tmp_path_factory.mktemp(f"glpn_{name}"))
        pixels = np.random.default_rng(10 + k).standard_normal(case["image"]).astype(np.float32)
        ours = md.load_model(spec_path("glpn"), path, variant="tiny")
        out[name] = (model, path, pixels, hf_reference(model, pixels), ours)
    return out


def test_glpn_config_from_hf(cases):
    for name, case in CASES.items():
        cfg = case["config"]
        got = hf_params("glpn", cases[name][1])[2]
        assert got["n_blocks"] == cfg["num_encoder_blocks"]
        assert list(got["hidden_sizes"]) == cfg["hidden_sizes"]
        assert list(got["depths"]) == cfg["depths"]
        assert list(got["sr_ratios"]) == cfg["sr_ratios"]
        assert list(got["n_heads"]) == cfg["num_attention_heads"]
        assert got["dec_dim"] == cfg["decoder_hidden_size"]
        assert got["max_depth"] == cfg["max_depth"]
        assert got["head_in_index"] == cfg["head_in_index"]
        assert got["hidden_act"] == cfg["hidden_act"]
        assert got["num_channels"] == cfg["num_channels"]


@pytest.mark.parametrize("name", list(CASES))
def test_glpn_matches_hf(cases, name):
    model, _, pixels, ref, ours = cases[name]
    got = named_outputs(ours, pixels)
    assert ours.output_names[0] == "last_hidden_state"
    n_stages = CASES[name]["config"]["num_encoder_blocks"]
    assert len([n for n in got if n.startswith("encoder.hidden_states.")]) == n_stages
    depth = ref["predicted_depth"]
    # the depth map must not be saturated (sigmoid near 0 or 1 everywhere hides errors)
    max_depth = CASES[name]["config"]["max_depth"]
    assert depth.std() > 0.02 * max_depth, depth.std()
    errs = {}
    for key, want in ref.items():
        assert got[key].shape == want.shape, (key, got[key].shape, want.shape)
        errs[key] = rel_err(got[key], want)
    print(f"glpn[{name}] vs HF: " + ", ".join(f"{k} {v:.2e}" for k, v in errs.items()))
    assert max(errs.values()) <= TOL, errs


def test_glpn_decoder_size_mismatch_is_refused(cases):
    """An image whose stage maps are odd fails in transformers (torch.cat of unequal
    maps) and in the spec (its check op), rather than silently resizing."""
    model, _, _, _, ours = cases["main"]
    pixels = np.zeros((1, 3, 36, 64), np.float32)     # ceil(36 / 4) = 9: odd
    with torch.no_grad(), pytest.raises(RuntimeError):
        model(torch.from_numpy(pixels))
    with pytest.raises(md.GraphError, match="not this level's size"):
        ours(pixels)


def test_glpn_running_stats_matter(cases):
    """Negative control: BatchNorm running statistics reset to 0 / 1 change the depth."""
    model, path, pixels, ref, _ = cases["main"]
    td = md.load_weights(path)
    for name in list(td.keys()):
        if name.endswith("running_var"):
            td[name] = np.ones_like(np.asarray(td[name]))
    ours = md.load_model(spec_path("glpn"), td, variant="tiny")
    got = named_outputs(ours, pixels)
    assert rel_err(got["predicted_depth"], ref["predicted_depth"]) > 10 * TOL
