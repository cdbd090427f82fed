"""specs/sew_d.yaml against transformers' SEWDModel and SEWDForCTC.

Small seeded float32 SEW-D models on a batch of two raw waveforms:

* ``base``: the default layout. GroupNorm on the first of three strided convs, a
  LayerNorm and a projection (24 -> 32 channels), the weight-normed grouped positional
  conv (even kernel 16, 4 groups, stride 2) added to the average-pooled sequence,
  DeBERTa-v2 layers with shared-key c2p and p2c attention over log-bucketed relative
  positions (8 buckets, max_position_embeddings 16, so the log branch and the clamp
  are both reached), the upsampling back and the zero row that pads an odd length.
* ``ctc``: SEWDForCTC with every switch the other way. LayerNorm convs with bias,
  no projection, separate ``pos_key_proj`` (c2p only), no buckets (raw distances
  clamped to +-max_position_embeddings), no LayerNorm on the relative embeddings,
  squeeze factor 3, an odd positional kernel, and the CTC head's logits.
* ``norel``: relative_attention off (plain attention, still scaled by
  sqrt(head_dim * 2) for the one listed pos_att_type).
"""

import numpy as np
import pytest

import maxdecl as md

from modelhelp import hf_params, named_outputs, randomize, rel_err, save_hf, spec_path

pytest.importorskip("torch")
pytest.importorskip("transformers")

TOL = 1e-5              # max|ours - ref| <= TOL * max|ref|
N_SAMPLES = 1000        # per waveform: 199 -> 99 -> 49 frames for strides 5, 2, 2

BASE = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64,
            conv_dim=(16, 24, 24), conv_stride=(5, 2, 2), conv_kernel=(10, 3, 3),
            num_conv_pos_embeddings=16, num_conv_pos_embedding_groups=4, squeeze_factor=2,
            position_buckets=8, max_position_embeddings=16, feat_extract_norm="group",
            share_att_key=True, pos_att_type=["p2c", "c2p"], norm_rel_ebd="layer_norm",
            hidden_act="gelu_python", feat_extract_activation="gelu", vocab_size=256)

CASES = {
    "base": ("SEWDModel", {}),
    "ctc": ("SEWDForCTC", dict(
        conv_dim=(16, 32, 32), feat_extract_norm="layer", conv_bias=True, share_att_key=False,
        pos_att_type=["c2p"], position_buckets=-1, max_position_embeddings=6,
        norm_rel_ebd="none", squeeze_factor=3, num_conv_pos_embeddings=15,
        num_conv_pos_embedding_groups=2, hidden_act="gelu_new", feat_extract_activation="relu",
        layer_norm_eps=1e-5)),
    "norel": ("SEWDModel", dict(relative_attention=False, pos_att_type=["p2c"],
                                num_hidden_layers=1)),
}


def make_sew_d(cls: str, seed: int = 0, **kw):
    import torch
    import transformers

    torch.manual_seed(seed)
    cfg = transformers.SEWDConfig(**{**BASE, **kw})
    cfg._attn_implementation = "eager"
    return randomize(getattr(transformers, cls)(cfg), seed)


def waveforms(seed: int) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((2, N_SAMPLES)).astype(np.float32)


@pytest.fixture(scope="module")
def cases(tmp_path_factory):
    """name -> (HF model, saved folder, waveforms, {output: reference})."""
    import torch

    out = {}
    for k, (name, (cls, kw)) in enumerate(CASES.items()):
        model = make_sew_d(cls, seed=k, **kw)
        path = save_hf(model, tmp_path_factory.mktemp(f"sew_d_{name}"))
        x = waveforms(11 + k)
        with torch.no_grad():
            if cls == "SEWDForCTC":
                ref = {"logits": model(torch.from_numpy(x)).logits.numpy(),
                       "last_hidden_state":
                           model.sew_d(torch.from_numpy(x)).last_hidden_state.numpy()}
            else:
                ref = {"last_hidden_state": model(torch.from_numpy(x)).last_hidden_state.numpy()}
        out[name] = (model, path, x, ref)
    return out


@pytest.fixture(scope="module")
def ours(cases):
    return {name: md.load_model(spec_path("sew_d"), path, variant="tiny")
            for name, (_, path, _, _) in cases.items()}


def test_sew_d_config_from_hf(cases):
    got = hf_params("sew_d", cases["base"][1])[2]
    assert (got["dim"], got["n_layers"], got["n_heads"], got["ffn_dim"]) == (32, 2, 4, 64)
    assert list(got["conv_dim"]) == [16, 24, 24] and list(got["conv_stride"]) == [5, 2, 2]
    assert (got["buckets"], got["max_pos"], got["squeeze"]) == (8, 16, 2)
    assert got["has_ctc"] is False
    got = hf_params("sew_d", cases["ctc"][1])[2]
    assert got["has_ctc"] is True and got["ctc_vocab"] == 256
    assert got["share_key"] is False and got["feat_norm"] == "layer"


@pytest.mark.parametrize("name", list(CASES))
def test_sew_d_matches_hf(cases, ours, name):
    model, _, x, ref = cases[name]
    got = named_outputs(ours[name], x)
    assert list(ours[name].output_names) == list(ref)       # logits first for CTC
    for key, want in ref.items():
        err = rel_err(got[key], want)
        print(f"sew_d {name} {key}: {err:.2e} of max|ref| {np.abs(want).max():.2f}")
        assert err <= TOL, (name, key, err)


def test_sew_d_reaches_log_buckets_and_clamp(cases, ours):
    """The base case's squeezed length (24) exceeds both half the buckets (4) and
    max_position_embeddings (16): relative distances take the log branch and some are
    clamped to the table's last row; the odd frame count (49) makes the zero pad row."""
    model, _, x, ref = cases["base"]
    h = ref["last_hidden_state"]
    assert h.shape == (2, 49, 32)
    assert np.all(h[:, -1] == 0.0) and np.abs(h[:, -2]).max() > 0
    frames = 49 // 2
    assert frames - 1 > BASE["max_position_embeddings"] > BASE["position_buckets"] // 2


def test_sew_d_relative_terms_matter(cases):
    """Negative control: without the bucket mapping (raw distances instead), the same
    weights give a different result far beyond TOL."""
    from modelhelp import with_hf_config

    model, path, x, ref = cases["base"]
    spec = with_hf_config(md.load_spec(spec_path("sew_d")), buckets="{-1}")
    td = md.load_weights(path)
    td["encoder.encoder.rel_embeddings.weight"] = np.concatenate(
        [np.asarray(td["encoder.encoder.rel_embeddings.weight"])] * 2)  # 2 * max_pos rows
    bad = md.load_model(spec, td, variant="tiny")
    err = rel_err(named_outputs(bad, x)["last_hidden_state"], ref["last_hidden_state"])
    print(f"without buckets: {err:.2e}")
    assert err > 100 * TOL


def test_sew_d_old_weight_norm_names_load(cases):
    """transformers 4's weight norm names (``conv.weight_g`` / ``conv.weight_v``) map too."""
    model, path, x, ref = cases["base"]
    td = md.load_weights(path)
    pre = "encoder.pos_conv_embed.conv."
    td[pre + "weight_g"] = td.pop(pre + "parametrizations.weight.original0")
    td[pre + "weight_v"] = td.pop(pre + "parametrizations.weight.original1")
    old = md.load_model(spec_path("sew_d"), td, variant="tiny")
    err = rel_err(named_outputs(old, x)["last_hidden_state"], ref["last_hidden_state"])
    assert err <= TOL
