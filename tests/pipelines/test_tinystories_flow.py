"""MAX's quantize_tinystories flow: a float llama2.c checkpoint -> Q4_0 by the spec's
encoding rules -> a maxdecl checkpoint that later runs alone (hyperparameters from its
own metadata, tokenizer.bin beside it)."""

import os
import shutil
import struct

import numpy as np
import pytest

import maxdecl as md
from maxdecl.cli import main
from maxdecl.pipelines.generate import generate_ids
from maxdecl.pipelines.sampling import Sampler

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SPEC = os.path.join(ROOT, "specs", "tinystories.yaml")
# Not the tiny variant's sizes: they must come from the checkpoint's header.
DIM, HIDDEN, LAYERS, HEADS, KV_HEADS, VOCAB, SEQ = 64, 96, 3, 4, 2, 300, 32


def _write_llama2c_legacy(path, rng):
    """A llama2.c run.c checkpoint (legacy layout, shared classifier)."""
    hd = DIM // HEADS
    kv = KV_HEADS * hd
    shapes = [(VOCAB, DIM), (LAYERS, DIM), (LAYERS, DIM, DIM), (LAYERS, kv, DIM),
              (LAYERS, kv, DIM), (LAYERS, DIM, DIM), (LAYERS, DIM), (LAYERS, HIDDEN, DIM),
              (LAYERS, DIM, HIDDEN), (LAYERS, HIDDEN, DIM), (DIM,), (SEQ, hd // 2),
              (SEQ, hd // 2)]
    with open(path, "wb") as f:
        f.write(struct.pack("<7i", DIM, HIDDEN, LAYERS, HEADS, KV_HEADS, VOCAB, SEQ))
        for shape in shapes:
            norm = len(shape) == 2 and shape[1] == DIM and shape[0] in (LAYERS,) or len(shape) == 1
            a = (1 + 0.1 * rng.standard_normal(shape) if norm
                 else rng.standard_normal(shape) / np.sqrt(shape[-1]))
            f.write(a.astype("<f4").tobytes())


def _write_tokenizer_bin(path):
    """llama2.c tokenizer.bin: <unk>, <s>, </s>, 256 byte tokens, then a few pieces."""
    pieces = ["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(256)]
    words = ["\u2581the", "\u2581a", "\u2581cat", "\u2581dog", "\u2581sat", "\u2581on", "at",
             "og", "he", "\u2581t", "\u2581c", "\u2581d", "\u2581s", "\u2581o"]
    pieces += words + [chr(c) for c in range(ord("a"), ord("z") + 1)] + ["\u2581"]
    pieces = pieces[:VOCAB] + [f"x{i}" for i in range(VOCAB - len(pieces))]
    with open(path, "wb") as f:
        f.write(struct.pack("<i", max(len(p.encode()) for p in pieces)))
        for i, p in enumerate(pieces):
            b = p.encode()
            score = -float(i) if i >= 259 else 0.0
            f.write(struct.pack("<fi", score, len(b)) + b)


@pytest.fixture(scope="module")
def float_model(tmp_path_factory):
    d = tmp_path_factory.mktemp("stories")
    _write_llama2c_legacy(d / "model.bin", np.random.default_rng(0))
    _write_tokenizer_bin(d / "tokenizer.bin")
    return d


def test_quantize_by_spec_rules_then_run_from_checkpoint_alone(float_model, tmp_path, capsys):
    out_dir = tmp_path / "q"
    out_dir.mkdir()
    out = out_dir / "model-q4_0.safetensors"
    assert main(["quantize", str(float_model / "model.bin"), "-o", str(out),
                 "--encoding", "q4_0", "--spec", SPEC]) == 0
    assert "tensors quantized" in capsys.readouterr().out

    td = md.checkpoint.load(str(out))
    assert td["blk.0.attn_q.weight"].encoding == "q4_0"
    assert td["blk.2.ffn_down.weight"].encoding == "q4_0"
    assert isinstance(td["blk.0.attn_norm.weight"], np.ndarray)      # "*norm.weight": f32
    assert td.metadata["params"]["n_layers"] == LAYERS

    # The float source is gone; the checkpoint and its tokenizer are all there is.
    shutil.copy(float_model / "tokenizer.bin", out_dir / "tokenizer.bin")
    model_q = md.load_model(SPEC, str(out))
    tok = model_q.tokenizer
    assert model_q.note == "" and len([n for n in model_q.input_names if "kv_cache" in n]) == 3
    model_f = md.load_model(SPEC, str(float_model / "model.bin"))

    ids = tok.encode("the cat sat on a dog", add_bos=True)
    assert ids[0] == 1 and len(ids) > 3
    lq, lf = model_q.logits(ids), model_f.logits(ids)
    assert lq.shape == lf.shape == (len(ids), VOCAB)
    assert np.abs(lq - lf).max() > 0          # the weights really were re-encoded
    # ... and qmatmul on the packed blocks equals float math on their dequantized values.
    deq = md.TensorDict({k: (v.dequantize() if isinstance(v, md.QuantizedTensor) else v)
                         for k, v in td.items()}, metadata=dict(td.metadata))
    ld = md.load_model(SPEC, deq).logits(ids)
    np.testing.assert_allclose(lq, ld, rtol=1e-4, atol=1e-4 * np.abs(ld).max())

    res = generate_ids(model_q.session, tok, ids, 5, Sampler(), stop_ids=())
    assert len(res.ids) == 5

    assert main(["run", SPEC, "--weights", str(out), "--max-new-tokens", "3",
                 "--prompt", "the dog"]) == 0
    last = capsys.readouterr().out.strip().splitlines()[-1]
    assert "3 generated tokens" in last

    # The checkpoint carries its tokenizer (tokenizer.bin beside it is not needed);
    # --tokenizer replaces it and the stderr line says which one runs.
    os.remove(out_dir / "tokenizer.bin")
    assert main(["run", SPEC, "--weights", str(out), "-n", "3", "-p", "the dog"]) == 0
    out_text, err = capsys.readouterr()
    assert "3 generated tokens" in out_text.splitlines()[-1] and "from the weights" in err
    assert main(["run", SPEC, "--weights", str(out), "-n", "3", "-p", "the dog",
                 "--tokenizer", str(float_model / "tokenizer.bin")]) == 0
    again, err = capsys.readouterr()
    assert "3 generated tokens" in again.splitlines()[-1]
    assert f"from {float_model / 'tokenizer.bin'}" in err
