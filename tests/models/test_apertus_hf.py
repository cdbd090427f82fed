"""specs/apertus.yaml against transformers' ApertusForCausalLM.

Small seeded float32 Apertus models: a Llama-like decoder with per-head q/k RMSNorm
(one [head_dim] gain shared by the heads), RoPE rotating halves (neox), an ungated MLP
whose activation is xIELU with four parameters per layer, and an untied output.

* "scaled": dim 64, 2 layers, GQA 4/2, llama3 RoPE scaling as Apertus ships it
  (theta 12e6; original context 64 so that the divisors hit all three branches:
  head_dim 16 gives wavelengths 6.3 (< 64 / 4: kept), 48 (smoothed), 371 and up
  (> 64: divided by 8)), xIELU beta 0.5 and eps -1e-6 as released;
* "plain": dim 96, 3 layers, GQA 6/3, unscaled RoPE (theta 10000), and per-layer
  beta and eps other than the released ones (eps -0.05 and -0.3 make the clamp
  min(u, eps) bite on a visible range of inputs).

alpha_p and alpha_n (stored before their softplus) differ per layer and are far from
values where xIELU degenerates (a_p = softplus(alpha_p) in 0.5..1.5, a_n = beta +
softplus(alpha_n) in 0.9..1.7: both branches curved, and the two halves unlike).

The same weights are written as a GGUF the way llama.cpp's converter (ApertusModel,
arch ``apertus``) does: HF's q/k rows kept (undo_permute = False: NEOX rope), the norms
as attn_norm / ffn_norm / attn_q_norm / attn_k_norm, llama3 rope divisors as
``rope_freqs.weight``, and the xIELU scalars not as tensors but as per-layer arrays
under ``xielu.alpha_p`` / ``xielu.alpha_n`` / ``xielu.beta`` / ``xielu.eps`` (no
architecture prefix). maxdecl runs both; llama.cpp itself runs the GGUF when
llama-cpp-python is installed (skipped otherwise). ``maxdecl export`` of the HF folder
writes the xIELU scalars as tensors instead (see specs/apertus.yaml), which maxdecl
reads back.
"""

import json
import math
import shutil

import numpy as np
import pytest

import maxdecl as md

from modelhelp import (TOL, _add_tokenizer, _rope_theta, _write, assert_greedy_matches_hf,
                       compare, gguf_writer, hf_case, hf_params, hf_state, layer_tensors,
                       llama_cpp_logits, llama_cpp_rope_freqs, max_abs_diff, randomize,
                       spec_path, tiny_model)

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

PROMPTS = [[3, 17, 42, 99, 5, 7, 64, 1], [8, 9, 120], [5, 60, 33, 2, 90, 11, 7]]
N_NEW = 5
TOL_LLAMA_CPP = 5e-3        # of max|ref|: llama.cpp keeps its KV cache in f16

SCALING = dict(rope_type="llama3", rope_theta=12000000.0, factor=8.0, low_freq_factor=1.0,
               high_freq_factor=4.0, original_max_position_embeddings=64)

# name -> (config, per-layer xIELU (alpha_p, alpha_n, beta, eps), seed)
CASES = {
    "scaled": (dict(vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                    num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                    rope_parameters=dict(SCALING)),
               [(0.2, 0.9, 0.5, -1e-6), (-0.4, -0.3, 0.5, -1e-6)], 11),
    "plain": (dict(vocab_size=160, hidden_size=96, intermediate_size=160, num_hidden_layers=3,
                   num_attention_heads=6, num_key_value_heads=3, max_position_embeddings=128,
                   rms_norm_eps=1e-6,
                   rope_parameters=dict(rope_type="default", rope_theta=10000.0)),
              [(0.9, 0.4, 0.3, -1e-6), (-0.3, -0.6, 0.7, -0.05), (0.5, 0.1, 0.45, -0.3)], 12),
}

HF_TO_GGUF = {"attention_layernorm": "attn_norm", "self_attn.q_proj": "attn_q",
              "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v",
              "self_attn.o_proj": "attn_output", "self_attn.q_norm": "attn_q_norm",
              "self_attn.k_norm": "attn_k_norm", "feedforward_layernorm": "ffn_norm",
              "mlp.up_proj": "ffn_up", "mlp.down_proj": "ffn_down"}
XIELU = ("alpha_p", "alpha_n", "beta", "eps")


def softplus(x):
    return math.log1p(math.exp(x))


def make_apertus(name="scaled"):
    """A seeded ApertusForCausalLM of CASES[name], its xIELU parameters set per layer."""
    import transformers

    cfg, xielu, seed = CASES[name]
    torch.manual_seed(seed)
    config = transformers.ApertusConfig(**cfg, pad_token_id=3, bos_token_id=1, eos_token_id=2,
                                        tie_word_embeddings=False, attn_implementation="eager")
    model = randomize(transformers.ApertusForCausalLM(config), seed)
    with torch.no_grad():
        for layer, values in zip(model.model.layers, xielu):
            act = layer.mlp.act_fn
            for attr, value in zip(XIELU, values):
                getattr(act, attr).fill_(value)
    return model


def xielu_params(model):
    """{param: [per-layer float]} of the model's xIELU activations, as stored (raw)."""
    return {k: [float(getattr(l.mlp.act_fn, k).detach().reshape(-1)[0])
                for l in model.model.layers] for k in XIELU}


def apertus_to_gguf(model, path, xielu=None, quantize=None) -> str:
    """Write an ApertusForCausalLM as llama.cpp's converter does (arch ``apertus``).

    ``xielu`` replaces the per-layer arrays (a negative control); ``False`` leaves the
    keys out."""
    import gguf

    cfg, sd = model.config, hf_state(model)
    head_dim = cfg.hidden_size // cfg.num_attention_heads
    w = gguf_writer(path, "apertus", cfg)
    w.add_rope_freq_base(float(_rope_theta(cfg)))
    w.add_layer_norm_rms_eps(cfg.rms_norm_eps)
    w.add_vocab_size(cfg.vocab_size)
    w.add_rope_dimension_count(head_dim)
    w.add_file_type(gguf.LlamaFileType.ALL_F32)
    values = xielu_params(model) if xielu is None else xielu
    if values:
        w.add_xielu_alpha_n(values["alpha_n"])
        w.add_xielu_alpha_p(values["alpha_p"])
        w.add_xielu_beta(values["beta"])
        w.add_xielu_eps(values["eps"])
    _add_tokenizer(w, cfg.vocab_size)
    t = {"token_embd.weight": sd["model.embed_tokens.weight"]}
    freqs = llama_cpp_rope_freqs(cfg)
    if freqs is not None:
        t["rope_freqs.weight"] = freqs
    t.update(layer_tensors(sd, cfg.num_hidden_layers, HF_TO_GGUF))   # q/k rows as in HF
    t["output_norm.weight"] = sd["model.norm.weight"]
    t["output.weight"] = sd["lm_head.weight"]
    _write(w, t, quantize)
    return str(path)


@pytest.fixture(scope="module")
def cases(tmp_path_factory):
    """name -> the case: model, HF folder, its GGUF, prompt ids, reference logits
    (built once per module, on first use)."""
    built = {}

    def get(name):
        if name not in built:
            tmp = tmp_path_factory.mktemp(f"apertus_{name}")
            model, path, ids, ref = hf_case(make_apertus(name), tmp / "hf")
            built[name] = dict(name=name, model=model, hf=path, ids=ids, ref=ref,
                               gguf=apertus_to_gguf(model, tmp / "model.gguf"))
        return built[name]
    return get


@pytest.fixture(params=list(CASES))
def case(request, cases):
    return cases(request.param)


@pytest.fixture
def scaled(cases):
    return cases("scaled")


def report(label, model, ids, ref):
    pre, dec = compare(model, ref, ids)
    print(f"apertus {label} vs HF: prefill {pre:.2e}, decode {dec:.2e} (of max|ref|); "
          f"max abs {max_abs_diff(model, ids, ref):.2e} (max|ref| {np.abs(ref).max():.1f})")
    return pre, dec


def test_xielu_parameters_are_not_degenerate():
    """Both branches of every layer's xIELU are curved and differ: a_p and a_n well away
    from 0, and the reference activation is neither linear nor odd-symmetric."""
    for name in CASES:
        model = make_apertus(name)
        for layer in model.model.layers:
            act = layer.mlp.act_fn
            a_p = softplus(float(act.alpha_p.detach()))
            a_n = float(act.beta) + softplus(float(act.alpha_n.detach()))
            assert 0.4 < a_p < 1.6 and 0.8 < a_n < 1.8
            u = torch.linspace(-3, 3, 61)
            with torch.no_grad():
                y, y_neg = act(u), act(-u)
            assert torch.all(torch.isfinite(y))
            # second differences: curved on both sides of 0
            d2 = y[2:] - 2 * y[1:-1] + y[:-2]
            assert d2[:25].abs().min() > 1e-4 and d2[-25:].abs().min() > 1e-4
            assert (y + y_neg).abs().max() > 0.1


def test_apertus_config_from_hf(case):
    model, path = case["model"], case["hf"]
    spec, meta, got = hf_params("apertus", path)
    cfg = model.config
    assert (got["dim"], got["n_layers"], got["n_heads"], got["n_kv_heads"], got["ffn_dim"],
            got["vocab"]) == (cfg.hidden_size, cfg.num_hidden_layers, cfg.num_attention_heads,
                              cfg.num_key_value_heads, cfg.intermediate_size, cfg.vocab_size)
    assert got["rope_theta"] == _rope_theta(cfg) and got["hidden_act"] == "xielu"
    assert got["rope_type"] == cfg.rope_parameters["rope_type"]
    s = md.load_model(spec_path("apertus"), path, variant="tiny")
    want = llama_cpp_rope_freqs(cfg)
    if want is None:
        assert "rope_freqs.weight" not in s.weights
    else:
        assert ((want == 1).sum(), (want == 8).sum()) == (1, 6)     # and one smoothed
        np.testing.assert_allclose(s.weights["rope_freqs.weight"], want, rtol=1e-6)
    for i, layer in enumerate(model.model.layers):
        for k in XIELU:
            got_w = np.asarray(s.weights[f"blk.{i}.ffn_act.{k}"], np.float32).reshape(-1)
            assert got_w.tolist() == [xielu_params(model)[k][i]]


def test_config_json_as_released(tmp_path):
    """Apertus config.json as released (transformers 4.56): top-level ``rope_theta`` and
    ``rope_scaling`` instead of ``rope_parameters``."""
    model = make_apertus("scaled")
    src = tmp_path / "v5"
    model.save_pretrained(src)
    path = tmp_path / "released"
    shutil.copytree(src, path)
    cfg = json.loads((path / "config.json").read_text())
    params = cfg.pop("rope_parameters")
    cfg["rope_theta"] = params.pop("rope_theta")
    cfg["rope_scaling"] = params
    (path / "config.json").write_text(json.dumps(cfg))
    s = md.load_model(spec_path("apertus"), str(path), variant="tiny")
    np.testing.assert_allclose(s.weights["rope_freqs.weight"],
                               llama_cpp_rope_freqs(model.config), rtol=1e-6)


@pytest.mark.parametrize("fmt", ["hf", "gguf"])
def test_apertus_prefill_and_decode_match_hf(case, fmt):
    ours = md.load_model(spec_path("apertus"), case[fmt], variant="tiny")
    pre, dec = report(f"{case['name']} {fmt}", ours, case["ids"], case["ref"])
    assert pre <= TOL and dec <= TOL


def test_apertus_greedy_generate_matches_hf(scaled):
    ours = tiny_model("apertus", scaled["hf"])
    assert_greedy_matches_hf(scaled["model"], ours, PROMPTS, N_NEW)


def test_gguf_metadata_gives_the_xielu_arrays(case):
    got = hf_params("apertus", case["gguf"])[2]
    want = xielu_params(case["model"])
    for k in XIELU:
        np.testing.assert_allclose(got[f"xielu_{k}"], want[k], rtol=1e-6)
    cfg = case["model"].config
    assert (got["n_layers"], got["ffn_dim"], got["vocab"]) == (
        cfg.num_hidden_layers, cfg.intermediate_size, cfg.vocab_size)
    assert "blk.0.ffn_act.alpha_p" not in md.load_weights(case["gguf"])


def test_gguf_with_the_layers_xielu_swapped_differs(cases, tmp_path):
    """Negative control: the per-layer arrays reversed (each layer reads another
    layer's xIELU) miss the reference, so the match needs layer i's own values."""
    c = cases("plain")
    swapped = {k: v[::-1] for k, v in xielu_params(c["model"]).items()}
    path = apertus_to_gguf(c["model"], tmp_path / "swapped.gguf", xielu=swapped)
    pre, dec = compare(md.load_model(spec_path("apertus"), path, variant="tiny"),
                       c["ref"], c["ids"])
    assert pre > 10 * TOL and dec > 10 * TOL


CLAMP = "{op: minimum, in: [u, .eps], out: n}"
NO_CLAMP = ("{op: sub, in: [u, .eps], out: n}\n"
            "          - {op: add, in: [n, .eps], out: n}")


def test_the_eps_clamp_matters(cases, tmp_path):
    """Negative control: the spec without min(u, eps) (u - eps + eps, so eps is still
    read) misses the "plain" reference, whose eps -0.05 and -0.3 clamp visible ranges."""
    c = cases("plain")
    text = open(spec_path("apertus")).read()
    assert text.count(CLAMP) == 1
    unclamped = tmp_path / "apertus_unclamped.yaml"
    unclamped.write_text(text.replace(CLAMP, NO_CLAMP))
    pre, dec = compare(md.load_model(str(unclamped), c["hf"], variant="tiny"),
                       c["ref"], c["ids"])
    assert pre > 10 * TOL and dec > 10 * TOL


@pytest.mark.filterwarnings("ignore:invalid value:RuntimeWarning")
def test_gguf_without_xielu_takes_the_initial_values(scaled, tmp_path):
    """A GGUF with neither the xielu.* keys nor xIELU tensors (llama.cpp refuses it), like
    random weights, runs with transformers' initial XIELU values (alpha_p, alpha_n raw
    softplus^-1(0.8) and softplus^-1(0.3), beta 0.5, eps -1e-6): finite logits."""
    path = apertus_to_gguf(scaled["model"], tmp_path / "bare.gguf", xielu=False)
    ours = md.load_model(spec_path("apertus"), path, variant="tiny")
    assert np.isfinite(np.asarray(ours.logits(scaled["ids"][:4]))).all()
    td = md.load_weights(path, spec=spec_path("apertus"), variant="tiny")
    assert "blk.0.ffn_act.alpha_p" not in td          # a stand-in, not a bound tensor


def test_gguf_with_wrong_length_xielu_arrays_is_refused(scaled, tmp_path):
    short = {k: v[:1] for k, v in xielu_params(scaled["model"]).items()}
    path = apertus_to_gguf(scaled["model"], tmp_path / "short.gguf", xielu=short)
    with pytest.raises(md.WeightsError, match="one value per layer"):
        md.load_model(spec_path("apertus"), path, variant="tiny")


def test_export_writes_xielu_as_tensors_and_reads_back(scaled, tmp_path):
    """`maxdecl export` of the HF folder: the xIELU scalars go out as the spec's [1]
    tensors blk.N.ffn_act.* (export writes weights, not llama.cpp's xielu.* keys, so
    llama.cpp cannot load this file), and maxdecl reads them back with the same logits."""
    import subprocess
    import sys

    import gguf

    out = tmp_path / "exported.gguf"
    subprocess.run([sys.executable, "-m", "maxdecl", "export", "--spec", spec_path("apertus"),
                    "--variant", "tiny", "-o", str(out), scaled["hf"]],
                   check=True, capture_output=True)
    reader = gguf.GGUFReader(out)
    assert not [f for f in reader.fields if f.startswith("xielu.")]
    names = {t.name for t in reader.tensors}
    assert {f"blk.1.ffn_act.{k}" for k in XIELU} <= names and "rope_freqs.weight" in names
    pre, dec = compare(md.load_model(spec_path("apertus"), str(out), variant="tiny"),
                       scaled["ref"], scaled["ids"])
    assert pre <= TOL and dec <= TOL


@pytest.mark.parametrize("change", [{"hidden_act": "gelu"}, {"attention_bias": True},
                                    {"rope_parameters": {"rope_type": "yarn",
                                                         "rope_theta": 1e4, "factor": 4.0}}])
def test_unmodelled_configs_are_refused(scaled, tmp_path, change):
    path = tmp_path / "changed"
    shutil.copytree(scaled["hf"], path)
    cfg = json.loads((path / "config.json").read_text())
    cfg.update(change)
    (path / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(md.WeightsError, match="not modelled"):
        md.load_model(spec_path("apertus"), str(path), variant="tiny")


def test_llama_cpp_runs_the_gguf_as_hf(case):
    llama_cpp = pytest.importorskip("llama_cpp")
    try:
        theirs = llama_cpp_logits(llama_cpp, case["gguf"], case["ids"])
    except ValueError as e:                       # an older llama.cpp without apertus
        pytest.skip(f"llama.cpp does not load apertus: {e}")
    ref = case["ref"]
    err = float(np.abs(theirs - ref).max() / np.abs(ref).max())
    print(f"apertus {case['name']} llama.cpp vs HF: {err:.2e} (of max|ref|)")
    assert err <= TOL_LLAMA_CPP
