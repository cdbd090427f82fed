"""specs/mamba.yaml against transformers' MambaForCausalLM (small random config):
a prefill, then one token at a time through the conv and SSM states."""

import numpy as np
import pytest

import maxdecl as md
from archhelp import TOL, decoder_errors, error_with_state_reset, load
from modelhelp import hf_case, hf_logits, randomize, rel_err, save_hf, token_ids

pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")


def make_mamba(seed=0, tied=True):
    import torch

    torch.manual_seed(seed)
    cfg = transformers.MambaConfig(vocab_size=80, hidden_size=64, state_size=8,
                                   num_hidden_layers=2, expand=2, conv_kernel=4,
                                   time_step_rank=6, layer_norm_epsilon=1e-5,
                                   tie_word_embeddings=tied)
    return randomize(transformers.MambaForCausalLM(cfg), seed)


@pytest.fixture(scope="module")
def mamba(tmp_path_factory):
    model = make_mamba()
    return hf_case(model, tmp_path_factory.mktemp("mamba_hf"))


def test_mamba_weights_from_hf(mamba):
    model, path, _, _ = mamba
    td = md.load_weights(path, spec="specs/mamba.yaml", variant="tiny")
    a_log = model.backbone.layers[1].mixer.A_log.detach().numpy()
    np.testing.assert_allclose(td["blk.1.ssm_a"], -np.exp(a_log), rtol=1e-6)
    assert td["blk.0.ssm_conv1d.weight"].shape == (128, 4)
    assert td.params["dt_rank"] == 6 and td.params["d_inner"] == 128
    assert "output.weight" not in td                       # tied


def test_mamba_prefill_and_decode_match_hf(mamba):
    _, path, ids, ref = mamba
    g, td = load("mamba", path)
    pre, dec = decoder_errors(g, td, ref, ids)
    print(f"mamba vs HF: prefill {pre:.2e}, decode {dec:.2e} (of max|ref|)")
    assert pre <= TOL and dec <= TOL


def test_mamba_state_matters(mamba):
    """Negative control: decoding with the states reset to zeros diverges."""
    _, path, ids, ref = mamba
    g, td = load("mamba", path)
    assert error_with_state_reset(g, td, ref, ids) > 100 * TOL


def test_mamba_untied_output(tmp_path):
    model = make_mamba(seed=2, tied=False)
    path = save_hf(model, tmp_path / "hf")
    ids = token_ids(model.config.vocab_size, seed=3)
    g, td = load("mamba", path)
    pre, dec = decoder_errors(g, td, hf_logits(model, ids), ids)
    assert pre <= TOL and dec <= TOL


def mamba_to_gguf(model, path) -> str:
    """A MambaForCausalLM as llama.cpp's converter writes it (arch mamba): conv filters
    squeezed to [d_inner, d_conv], blk.N.ssm_a = -exp(A_log), tied output left out."""
    import gguf

    from modelhelp import _add_tokenizer, _write, hf_state

    cfg, sd = model.config, hf_state(model)
    w = gguf.GGUFWriter(str(path), "mamba")
    w.add_context_length(1024)
    w.add_embedding_length(cfg.hidden_size)
    w.add_block_count(cfg.num_hidden_layers)
    w.add_ssm_conv_kernel(cfg.conv_kernel)
    w.add_ssm_inner_size(cfg.intermediate_size)
    w.add_ssm_state_size(cfg.state_size)
    w.add_ssm_time_step_rank(cfg.time_step_rank)
    w.add_layer_norm_rms_eps(cfg.layer_norm_epsilon)
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
    _write(w, t)
    return str(path)


def test_mamba_gguf_matches_hf(mamba, tmp_path):
    model, _, ids, ref = mamba
    g, td = load("mamba", mamba_to_gguf(model, tmp_path / "mamba.gguf"))
    assert td.params["d_state"] == 8 and td.params["vocab"] == 80
    pre, dec = decoder_errors(g, td, ref, ids)
    print(f"mamba GGUF vs HF: prefill {pre:.2e}, decode {dec:.2e} (of max|ref|)")
    assert pre <= TOL and dec <= TOL


def test_mamba_export_runs_in_llama_cpp(mamba, tmp_path):
    """`maxdecl export` of the HF folder writes the keys llama.cpp's mamba loader requires
    (context_length, feed_forward_length, head_count: formats.gguf.write); maxdecl reads
    the file back, and llama.cpp (when installed) runs it with transformers' logits."""
    import subprocess
    import sys

    import gguf

    model, path, ids, ref = mamba
    out = tmp_path / "export.gguf"
    subprocess.run([sys.executable, "-m", "maxdecl", "export", path, "--spec",
                    "specs/mamba.yaml", "--variant", "tiny", "-o", str(out)],
                   check=True, capture_output=True)
    fields = gguf.GGUFReader(str(out)).fields
    assert fields["mamba.context_length"].contents() == 1048576
    assert fields["mamba.attention.head_count"].contents() == 0
    g, td = load("mamba", str(out))
    pre, dec = decoder_errors(g, td, ref, ids)
    assert pre <= TOL and dec <= TOL
    try:
        import llama_cpp
    except ImportError:
        return
    from modelhelp import llama_cpp_logits, with_tokenizer

    tok = with_tokenizer(str(out), tmp_path / "export_tok.gguf", model.config.vocab_size)
    assert rel_err(llama_cpp_logits(llama_cpp, tok, ids), ref) <= 5e-3
