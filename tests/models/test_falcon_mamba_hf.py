"""specs/falcon_mamba.yaml against transformers' FalconMambaForCausalLM (small seeded
random configs): a prefill, then one token at a time through the conv and SSM states;
and the same weights as llama.cpp's converter writes them (arch mamba with
mamba.ssm.dt_b_c_rms), read by maxdecl and, when llama-cpp-python is installed, run by
llama.cpp itself."""

import subprocess
import sys

import numpy as np
import pytest

import maxdecl as md
from archhelp import TOL, decoder_errors, error_with_state_reset, load
from modelhelp import (assert_greedy_matches_hf, hf_case, hf_logits, randomize, rel_err,
                       spec_path, with_hf_config, with_tokenizer)

pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

SPEC = "falcon_mamba"
TOL_LLAMA_CPP = 5e-3        # of max|ref|, as test_llamacpp_interop.py


def make_falcon_mamba(seed=0, **kw):
    """FalconMambaForCausalLM, float32. Defaults: tied output, no in/out biases, conv
    bias, mixer_rms_eps 1e-6 != layer_norm_epsilon 1e-5 (as falcon-mamba-7b)."""
    import torch

    torch.manual_seed(seed)
    cfg = dict(vocab_size=80, hidden_size=64, state_size=8, num_hidden_layers=2, expand=2,
               conv_kernel=4, time_step_rank=6, layer_norm_epsilon=1e-5, mixer_rms_eps=1e-6,
               tie_word_embeddings=True)
    cfg.update(kw)
    model = transformers.FalconMambaForCausalLM(transformers.FalconMambaConfig(**cfg))
    return randomize(model.float(), seed)


# config B: every switch the other way: untied head, in/out projection biases, no conv
# bias, time_step_rank "auto" (ceil(96 / 16) = 6), a large mixer epsilon (so using the
# wrong one shows), a GELU conv activation, 3 layers, d_state 4
CONFIG_B = dict(vocab_size=72, hidden_size=96, state_size=4, num_hidden_layers=3,
                time_step_rank="auto", use_bias=True, use_conv_bias=False,
                mixer_rms_eps=0.05, layer_norm_epsilon=1e-6, hidden_act="gelu",
                tie_word_embeddings=False)


@pytest.fixture(scope="module")
def fm(tmp_path_factory):
    return hf_case(make_falcon_mamba(), tmp_path_factory.mktemp("falcon_mamba_hf"))


@pytest.fixture(scope="module")
def fm_b(tmp_path_factory):
    return hf_case(make_falcon_mamba(seed=5, **CONFIG_B),
                   tmp_path_factory.mktemp("falcon_mamba_b_hf"))


def test_falcon_mamba_weights_from_hf(fm):
    model, path, _, _ = fm
    td = md.load_weights(path, spec=spec_path(SPEC), variant="tiny")
    a_log = model.backbone.layers[1].mixer.A_log.detach().numpy()
    np.testing.assert_allclose(td["blk.1.ssm_a"], -np.exp(a_log), rtol=1e-6)
    assert td["blk.0.ssm_conv1d.weight"].shape == (128, 4)
    assert td.params["dt_rank"] == 6 and td.params["d_inner"] == 128
    assert td.params["mixer_eps"] == 1e-6 and td.params["norm_eps"] == 1e-5
    assert td.params["dt_b_c_rms"] is True
    assert "output.weight" not in td                       # tied
    assert "blk.0.ssm_in.bias" not in td and "blk.0.ssm_out.bias" not in td


def test_falcon_mamba_prefill_and_decode_match_hf(fm):
    _, path, ids, ref = fm
    g, td = load(SPEC, path)
    pre, dec = decoder_errors(g, td, ref, ids)
    print(f"falcon_mamba vs HF: prefill {pre:.2e}, decode {dec:.2e} (of max|ref|)")
    assert pre <= TOL and dec <= TOL


def test_falcon_mamba_config_b_matches_hf(fm_b):
    """Untied, biased projections, no conv bias, auto dt rank, GELU, own mixer eps."""
    model, path, ids, ref = fm_b
    g, td = load(SPEC, path)
    assert td.params["dt_rank"] == 6 and td.params["mixer_eps"] == 0.05
    assert td.params["hidden_act"] == "gelu"
    assert "output.weight" in td and "blk.2.ssm_in.bias" in td
    assert "blk.0.ssm_conv1d.bias" not in td
    pre, dec = decoder_errors(g, td, ref, ids)
    print(f"falcon_mamba (config B) vs HF: prefill {pre:.2e}, decode {dec:.2e} (of max|ref|)")
    assert pre <= TOL and dec <= TOL


def _errors_with_config(path, ref, ids, **values):
    spec = with_hf_config(md.load_spec(spec_path(SPEC)), **values)
    td = md.load_weights(path, spec=spec, variant="tiny")
    return decoder_errors(md.build(spec, weights=td), td, ref, ids)


def test_falcon_mamba_norms_and_eps_matter(fm_b):
    """Negative controls: without the dt/B/C norms, or with the block epsilon in them
    (what llama.cpp does), the logits are off."""
    _, path, ids, ref = fm_b
    pre, _ = _errors_with_config(path, ref, ids, dt_b_c_rms="{False}")
    assert pre > 100 * TOL
    pre, _ = _errors_with_config(path, ref, ids, mixer_eps="{None}")
    assert pre > 10 * TOL


def test_falcon_mamba_state_matters(fm):
    """Negative control: decoding with the states reset to zeros diverges."""
    _, path, ids, ref = fm
    g, td = load(SPEC, path)
    assert error_with_state_reset(g, td, ref, ids) > 100 * TOL


def test_falcon_mamba_greedy_generate_matches_hf(fm):
    """The generation loop (states fed back; two prompts decoded together) gives
    transformers' greedy tokens."""
    model, path, _, _ = fm
    ours = md.load_model(spec_path(SPEC), path, variant="tiny")
    assert_greedy_matches_hf(model, ours, [[5, 17, 3, 40, 2], [9, 1, 66]], 6)


# -- GGUF as llama.cpp's converter writes it (convert_hf_to_gguf.py, MambaModel) ---------

def falcon_mamba_to_gguf(model, path) -> str:
    """A FalconMambaForCausalLM as llama.cpp's converter writes it: arch mamba,
    mamba.ssm.dt_b_c_rms true (model_type falcon_mamba), context 2**20, feed-forward
    length and head count 0, conv filters squeezed, blk.N.ssm_a = -exp(A_log), a tied
    output left out. mixer_rms_eps is not written (llama.cpp uses the block epsilon)."""
    import gguf

    from modelhelp import _add_tokenizer, _write, hf_state

    cfg, sd = model.config, hf_state(model)
    assert cfg.vocab_size % 8 == 0, "the converter pads the vocab to a multiple of 8"
    assert not cfg.use_bias and cfg.use_conv_bias, "llama.cpp's mamba has no such tensors"
    w = gguf.GGUFWriter(str(path), "mamba")
    w.add_context_length(2 ** 20)
    w.add_embedding_length(cfg.hidden_size)
    w.add_feed_forward_length(0)
    w.add_head_count(0)
    w.add_block_count(cfg.num_hidden_layers)
    w.add_ssm_conv_kernel(cfg.conv_kernel)
    w.add_ssm_inner_size(cfg.intermediate_size)
    w.add_ssm_state_size(cfg.state_size)
    w.add_ssm_time_step_rank(cfg.time_step_rank)
    w.add_layer_norm_rms_eps(cfg.layer_norm_epsilon)
    w.add_ssm_dt_b_c_rms(True)
    w.add_file_type(0)                                      # ALL_F32
    _add_tokenizer(w, cfg.vocab_size)
    t = {"token_embd.weight": sd["backbone.embeddings.weight"]}
    for i in range(cfg.num_hidden_layers):
        p = f"backbone.layers.{i}."
        m = p + "mixer."
        t.update({
            f"blk.{i}.attn_norm.weight": sd[p + "norm.weight"],
            f"blk.{i}.ssm_in.weight": sd[m + "in_proj.weight"],
            f"blk.{i}.ssm_conv1d.weight": sd[m + "conv1d.weight"][:, 0, :],
            f"blk.{i}.ssm_conv1d.bias": sd[m + "conv1d.bias"],
            f"blk.{i}.ssm_x.weight": sd[m + "x_proj.weight"],
            f"blk.{i}.ssm_dt.weight": sd[m + "dt_proj.weight"],
            f"blk.{i}.ssm_dt.bias": sd[m + "dt_proj.bias"],
            f"blk.{i}.ssm_a": -np.exp(sd[m + "A_log"]),
            f"blk.{i}.ssm_d": sd[m + "D"],
            f"blk.{i}.ssm_out.weight": sd[m + "out_proj.weight"],
        })
    t["output_norm.weight"] = sd["backbone.norm_f.weight"]
    if not cfg.tie_word_embeddings:
        t["output.weight"] = sd["lm_head.weight"]
    _write(w, t)
    return str(path)


@pytest.fixture(scope="module")
def fm_gguf(fm, tmp_path_factory):
    """(gguf path, ids, reference): the reference is the same seeded HF model with
    mixer_rms_eps = layer_norm_epsilon, which is what llama.cpp computes for the file."""
    model, _, ids, _ = fm
    path = falcon_mamba_to_gguf(model, tmp_path_factory.mktemp("fm_gguf") / "fm.gguf")
    same_eps = make_falcon_mamba(mixer_rms_eps=model.config.layer_norm_epsilon)
    return path, ids, hf_logits(same_eps, ids)


def test_falcon_mamba_gguf_matches_hf(fm_gguf):
    path, ids, ref = fm_gguf
    g, td = load(SPEC, path)
    assert td.params["dt_b_c_rms"] is True and td.params["d_state"] == 8
    assert td.params["vocab"] == 80 and td.params["mixer_eps"] is None
    pre, dec = decoder_errors(g, td, ref, ids)
    print(f"falcon_mamba GGUF vs HF: prefill {pre:.2e}, decode {dec:.2e} (of max|ref|)")
    assert pre <= TOL and dec <= TOL


def test_falcon_mamba_gguf_runs_in_llama_cpp(fm_gguf):
    llama_cpp = pytest.importorskip("llama_cpp")
    from modelhelp import llama_cpp_logits

    path, ids, ref = fm_gguf
    theirs = llama_cpp_logits(llama_cpp, path, ids)
    err = rel_err(theirs, ref)
    print(f"llama.cpp on the falcon_mamba GGUF vs HF: {err:.2e} (of max|ref|)")
    assert err <= TOL_LLAMA_CPP


def test_falcon_mamba_export_round_trip(fm, tmp_path):
    """`maxdecl export` of the HF folder writes llama.cpp's keys (dt_b_c_rms on, the
    keys its loader requires) plus the mixer epsilon under a key of its own: it reads
    back with the HF logits, and llama.cpp runs it (tokenizer added; llama.cpp uses
    the block epsilon 1e-5 in the dt/B/C norms where HF uses 1e-6)."""
    import gguf

    model, path, ids, ref = fm
    out = tmp_path / "exported.gguf"
    subprocess.run([sys.executable, "-m", "maxdecl", "export", "--spec", spec_path(SPEC),
                    "--variant", "tiny", "-o", str(out), path], check=True, capture_output=True)
    reader = gguf.GGUFReader(out)
    keys = {f.name: f.contents() for f in reader.fields.values() if f.name.startswith("mamba.")}
    assert keys["mamba.ssm.dt_b_c_rms"] is True and keys["mamba.ssm.time_step_rank"] == 6
    assert keys["mamba.context_length"] == 2 ** 20 and keys["mamba.attention.head_count"] == 0
    assert "output.weight" not in {t.name for t in reader.tensors}
    g, td = load(SPEC, out)
    pre, dec = decoder_errors(g, td, ref, ids)
    assert pre <= TOL and dec <= TOL
    llama_cpp = pytest.importorskip("llama_cpp")
    from modelhelp import llama_cpp_logits

    with_tok = with_tokenizer(out, tmp_path / "exported-tok.gguf", model.config.vocab_size)
    err = rel_err(llama_cpp_logits(llama_cpp, with_tok, ids), ref)
    print(f"llama.cpp on the exported GGUF vs HF: {err:.2e} (of max|ref|)")
    assert err <= TOL_LLAMA_CPP
