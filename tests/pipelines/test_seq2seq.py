"""Encoder-decoder specs generate through ``model.generate`` and ``maxdecl run``: the
recognised inputs, the decoder start param, the refusals (logits, lookup, a missing
decoder_start) and the command line on random weights."""

import subprocess
import sys
from pathlib import Path

import pytest

import maxdecl as md
from maxdecl.pipelines.seq2seq import is_encoder_decoder

SPECS = Path(__file__).resolve().parents[2] / "specs"


def test_which_graphs_are_encoder_decoders():
    states = ["dec.blk.0.kv_cache"]
    assert is_encoder_decoder(["enc_tokens", "enc_positions", "dec_tokens", "dec_positions",
                               *states], ["logits", *states])
    assert not is_encoder_decoder(["enc_tokens", "dec_tokens", "mask"], ["logits"])  # not a state
    assert is_encoder_decoder(["enc_features", "dec_tokens", "dec_positions"], ["logits"])
    assert not is_encoder_decoder(["enc_a", "enc_b", "dec_tokens"], ["logits"])  # two sources
    assert not is_encoder_decoder(["tokens", "positions"], ["logits"])
    assert not is_encoder_decoder(["enc_tokens", "dec_tokens"], ["hidden"])


@pytest.mark.parametrize("name", ["t5", "bart"])
def test_random_weights_generate_and_refuse_what_does_not_apply(name):
    model = md.load_model(SPECS / f"{name}.yaml")
    assert model.encoder_decoder and model.session is None
    out = model.generate("Hi!", 3, temperature=0)
    assert len(out.ids) == 3 and out.prompt_tokens >= 3
    again = model.generate("Hi!", 3, temperature=0)
    assert again.ids == out.ids                                  # deterministic, stateless
    with pytest.raises(md.InputError, match="encoder-decoder"):
        model.logits([1, 2, 3])
    with pytest.raises(md.InputError, match="lookup"):
        model.generate("Hi!", 3, temperature=0, lookup=4)
    params = dict(model.params)
    model.params.pop("decoder_start")
    with pytest.raises(md.MaxdeclError, match="decoder_start"):
        model.generate("Hi!", 2)
    model.params.update(params)


def test_run_prints_the_source_then_the_generated_text():
    r = subprocess.run([sys.executable, "-m", "maxdecl", "run", str(SPECS / "t5.yaml"), "-p",
                        "hello", "-n", "3"], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert lines[1] == "hello" and "3 generated tokens" in lines[-1]


def test_run_of_an_array_source_encoder_decoder_takes_inputs_not_text():
    r = subprocess.run([sys.executable, "-m", "maxdecl", "run", str(SPECS / "whisper.yaml"),
                        "-p", "hello", "-n", "2"], capture_output=True, text=True, timeout=300)
    assert r.returncode != 0 and "missing --input for enc_features" in r.stderr


def test_run_generates_from_an_array_source_given_alone(tmp_path):
    """`maxdecl run specs/whisper.yaml --input enc_features=f.npy` transcribes: the text
    model.generate gives for that array, then the summary line."""
    import numpy as np

    model = md.load_model(SPECS / "whisper.yaml")
    shape = [d if isinstance(d, int) else 8 for d in
             next(v for v in model.graph.inputs if v.name == "enc_features").shape]
    feats = np.random.default_rng(3).standard_normal(shape).astype(np.float32)
    np.save(tmp_path / "f.npy", feats)
    want = model.generate(feats, 3, temperature=0)
    r = subprocess.run([sys.executable, "-m", "maxdecl", "run", str(SPECS / "whisper.yaml"),
                        "--input", f"enc_features={tmp_path / 'f.npy'}", "-n", "3"],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert lines[-2] == want.text and f"{len(want.ids)} generated token" in lines[-1]
    np.save(tmp_path / "bad.npy", feats.astype(np.float64))
    r = subprocess.run([sys.executable, "-m", "maxdecl", "run", str(SPECS / "whisper.yaml"),
                        "--input", f"enc_features={tmp_path / 'bad.npy'}"],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode != 0 and "expected float32" in r.stderr
    with pytest.raises(md.InputError, match="exceeds the decoder's context"):
        model.generate(feats, model.context + 1, temperature=0)


def test_source_and_new_tokens_each_fit_the_context():
    """The encoder's positions and the decoder's are counted apart: a source as long as
    the context still decodes; each part past it is refused on its own terms."""
    model = md.load_model(SPECS / "bart.yaml")
    ctx = model.context
    src = [5] * ctx
    out = model.generate([src], 2, temperature=0)[0]
    assert out.prompt_tokens == ctx and len(out.ids) == 2
    with pytest.raises(md.InputError, match=f"source \\({ctx + 1} tokens\\) exceeds the "
                                            f"encoder's context of {ctx}"):
        model.generate(src + [5], 2, temperature=0)
    cut = model.generate(src + [6], 1, temperature=0, truncate=True)
    assert cut.prompt_tokens == ctx
    with pytest.raises(md.InputError, match="exceeds the decoder's context"):
        model.generate([5, 6], ctx + 1, temperature=0)


def test_run_takes_a_decoder_prompt():
    """`--decoder-prompt IDS` is generate's decoder_prompt: the same ids on the command
    line; a language model refuses it, and so does text that is not ids."""
    model = md.load_model(SPECS / "t5.yaml")
    plain = model.generate("hello", 3, temperature=0)
    want = model.generate("hello", 3, temperature=0, decoder_prompt=[plain.ids[0] + 1, 7])
    r = subprocess.run([sys.executable, "-m", "maxdecl", "run", str(SPECS / "t5.yaml"), "-p",
                        "hello", "-n", "3", "--decoder-prompt", f"{plain.ids[0] + 1}, 7"],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines()[-2] == want.text
    r = subprocess.run([sys.executable, "-m", "maxdecl", "run", str(SPECS / "t5.yaml"), "-p",
                        "hello", "--decoder-prompt", "fr_XX"], capture_output=True, text=True,
                       timeout=300)
    assert r.returncode != 0 and "--decoder-prompt takes token ids" in r.stderr
    lm = md.load_model(SPECS / "tinystories.yaml")
    with pytest.raises(md.InputError, match="decoder_prompt is for encoder-decoder"):
        lm.generate([1, 2], 2, decoder_prompt=[3])
