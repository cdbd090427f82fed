"""specs/lilt.yaml against transformers' LiltForTokenClassification.

A small seeded float32 LiLT: a RoBERTa-style text stream (positions counted from the
non-pad tokens after pad_token_id) beside a layout stream a quarter as wide, fed by
six box tables (x0, y0, x1, y1, height, width) and a box position table. In each
layer the text and layout attention scores are summed and one softmax weights both
streams' values (bidirectional attention complementarity). A padded batch of two
with an attention mask; the token-classification logits, the text stream's last
hidden state and the layout stream's last hidden state are compared.
"""

import numpy as np
import pytest

import maxdecl as md

from modelhelp import hf_params, named_outputs, randomize, rel_err, save_hf, spec_path

pytest.importorskip("torch")
pytest.importorskip("transformers")

TOL = 1e-5                      # max|ours - ref| <= TOL * max|ref|
BATCH, SEQ, N_PAD = 2, 12, 4    # the second sequence ends in N_PAD pad tokens
PAD = 1

# a config that differs from the spec's tiny variant where it can, so config.json
# (not the variant) must drive the sizes
CFG = dict(vocab_size=300, hidden_size=120, num_hidden_layers=2, num_attention_heads=5,
           intermediate_size=160, max_position_embeddings=48, max_2d_position_embeddings=160,
           channel_shrink_ratio=4, type_vocab_size=3, num_labels=7, pad_token_id=PAD,
           layer_norm_eps=1e-6, hidden_act="gelu_new", attn_implementation="eager")


def make_lilt(seed=0, **kw):
    import torch
    import transformers

    torch.manual_seed(seed)
    cfg = {**CFG, **kw}
    model = transformers.LiltForTokenClassification(transformers.LiltConfig(**cfg))
    return randomize(model, seed)


def make_inputs(cfg, seed=3, token_types=False):
    """input_ids, bbox, attention_mask, token_type_ids as int64 arrays [2, SEQ(, 4)]."""
    rng = np.random.default_rng(seed)
    ids = rng.integers(PAD + 1, cfg["vocab_size"], size=(BATCH, SEQ))
    mask = np.ones((BATCH, SEQ), np.int64)
    ids[1, SEQ - N_PAD:] = PAD
    mask[1, SEQ - N_PAD:] = 0
    half = cfg["max_2d_position_embeddings"] // 2
    x0 = rng.integers(0, half, size=(BATCH, SEQ))
    y0 = rng.integers(0, half, size=(BATCH, SEQ))
    x1 = x0 + rng.integers(0, half, size=(BATCH, SEQ))
    y1 = y0 + rng.integers(0, half, size=(BATCH, SEQ))
    bbox = np.stack([x0, y0, x1, y1], axis=-1)
    bbox[1, SEQ - N_PAD:] = 0                    # padding boxes, as processors write them
    tt = (rng.integers(0, cfg["type_vocab_size"], size=(BATCH, SEQ)) if token_types
          else np.zeros((BATCH, SEQ)))
    return tuple(np.ascontiguousarray(a, np.int64) for a in (ids, bbox, mask, tt))


def hf_run(model, inputs):
    """(logits, last_hidden_state, the layout stream's last hidden state) of ``model``."""
    import torch

    ids, bbox, mask, tt = (torch.from_numpy(a) for a in inputs)
    got = {}
    hook = model.lilt.encoder.layer[-1].register_forward_hook(
        lambda mod, args, out: got.__setitem__("layout", out[1]))
    try:
        with torch.no_grad():
            out = model(input_ids=ids, bbox=bbox, attention_mask=mask, token_type_ids=tt,
                        output_hidden_states=True)
    finally:
        hook.remove()
    return (out.logits.numpy(), out.hidden_states[-1].numpy(), got["layout"].numpy())


@pytest.fixture(scope="module")
def lilt(tmp_path_factory):
    model = make_lilt()
    path = save_hf(model, tmp_path_factory.mktemp("lilt_hf"))
    return model, path


@pytest.fixture(scope="module")
def ours(lilt):
    return md.load_model(spec_path("lilt"), lilt[1], variant="tiny")


def ours_run(ours, inputs):
    out = named_outputs(ours, *inputs)
    return out["logits"], out["last_hidden_state"], out["layout_last_hidden_state"]


def test_lilt_config_from_hf(lilt, ours):
    got = hf_params("lilt", lilt[1])[2]
    assert (got["dim"], got["n_layers"], got["n_heads"], got["ffn_dim"]) == (120, 2, 5, 160)
    assert (got["vocab"], got["n_positions"], got["max_2d"], got["shrink"]) == (300, 48, 160, 4)
    assert (got["type_vocab"], got["n_classes"], got["pad_id"]) == (3, 7, PAD)
    assert got["norm_eps"] == pytest.approx(1e-6)
    assert got["hidden_act"] == "gelu_new"
    p = ours.params
    assert (p["head_dim"], p["lay_dim"], p["lay_head_dim"], p["lay_ffn"], p["box_dim"]) == \
        (24, 30, 6, 40, 20)
    assert ours.input_names[:4] == ["tokens", "bbox", "attention_mask", "token_type_ids"]
    assert ours.output_names[0] == "logits"


def test_lilt_token_logits_match_hf(lilt, ours):
    """Padded batch of two: logits at every position (the padded ones too), and both
    streams' last hidden states."""
    inputs = make_inputs(CFG)
    ref = hf_run(lilt[0], inputs)
    got = ours_run(ours, inputs)
    errs = [rel_err(g, r) for g, r in zip(got, ref)]
    print(f"lilt vs HF: logits {errs[0]:.2e}, text {errs[1]:.2e}, layout {errs[2]:.2e} "
          f"(of max|ref|; max|logits| {np.abs(ref[0]).max():.2f})")
    assert got[0].shape == (BATCH, SEQ, CFG["num_labels"])
    assert max(errs) <= TOL


def test_lilt_token_types_match_hf(lilt, ours):
    """Non-zero token_type_ids (type_vocab_size 3) reach the text embeddings."""
    inputs = make_inputs(CFG, seed=5, token_types=True)
    assert inputs[3].any()
    ref = hf_run(lilt[0], inputs)
    got = ours_run(ours, inputs)
    assert rel_err(got[0], ref[0]) <= TOL


def test_lilt_padding_does_not_leak(lilt, ours):
    """The unpadded rows of the padded sequence equal that sequence run alone (and
    HF's), so the mask hides the pad keys."""
    inputs = make_inputs(CFG)
    n = SEQ - N_PAD
    alone = tuple(np.ascontiguousarray(a[1:2, :n]) for a in inputs)
    got_batch = ours_run(ours, inputs)[0][1, :n]
    got_alone = ours_run(ours, alone)[0][0]
    ref_alone = hf_run(lilt[0], alone)[0][0]
    assert rel_err(got_alone, ref_alone) <= TOL
    assert rel_err(got_batch, got_alone) <= TOL


def test_lilt_bbox_matters(lilt, ours):
    """Moving the boxes changes transformers' logits clearly, and ours follow."""
    inputs = make_inputs(CFG)
    ids, bbox, mask, tt = inputs
    moved = bbox.copy()
    moved[..., [0, 2]] += 7                      # shift every box right
    moved[..., 3] += 3                           # and make it taller
    ref0 = hf_run(lilt[0], inputs)[0]
    ref1 = hf_run(lilt[0], (ids, moved, mask, tt))[0]
    assert rel_err(ref1, ref0) > 100 * TOL
    got1 = ours_run(ours, (ids, moved, mask, tt))[0]
    assert rel_err(got1, ref1) <= TOL


@pytest.mark.parametrize("zeroed", ["layout_query", "query"])
def test_lilt_complementarity_matters(lilt, zeroed):
    """Negative controls for the shared softmax: with the layout (or text) query weights
    zeroed, that stream's scores drop out of the sum and the logits are far off; the
    layout scores reach the text logits, and the text scores the layout stream."""
    model, path = lilt
    td = md.load_weights(path)
    for i in range(CFG["num_hidden_layers"]):
        for kind in ("weight", "bias"):
            name = f"lilt.encoder.layer.{i}.attention.self.{zeroed}.{kind}"
            td[name] = np.zeros_like(np.asarray(td[name]))
    broken = md.load_model(spec_path("lilt"), td, variant="tiny")
    inputs = make_inputs(CFG)
    ref = hf_run(model, inputs)
    got = ours_run(broken, inputs)
    assert rel_err(got[0], ref[0]) > 100 * TOL       # the text logits
    assert rel_err(got[2], ref[2]) > 100 * TOL       # the layout stream


def test_lilt_refuses_bad_width(lilt, tmp_path):
    """hidden_size must split into six box tables; a config.json that says otherwise is
    refused by name (transformers cannot build such a model either)."""
    import json
    import shutil

    path = tmp_path / "bad"
    shutil.copytree(lilt[1], path)
    cfg = json.loads((path / "config.json").read_text())
    cfg["hidden_size"] = 100
    (path / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(md.WeightsError, match="multiple of 6"):
        md.load_model(spec_path("lilt"), str(path), variant="tiny")
