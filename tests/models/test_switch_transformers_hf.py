"""specs/switch_transformers.yaml against transformers' SwitchTransformersForConditionalGeneration.

Small seeded float32 models (vocab 300):

- ``relu``: the released layout: ReLU experts, tied output (d_model ** -0.5 rescaling),
  3 encoder layers with 1 sparse (step 3: layer 1), 2 decoder layers with 2 sparse (step
  1: every layer), 4 experts, 16 buckets / max distance 20 (the 30-token decoder input
  and 25-token source reach the exact, logarithmic and saturated buckets);
- ``gelu``: gelu_new experts, untied lm_head, a router bias, 8 experts, 6 heads of 8
  (inner 48 != d_model 32), 4 encoder layers with 2 sparse (layers 1 and 3), 3 decoder
  layers with 1 sparse (layer 1), 32 buckets / 128;
- ``capacity``: the ``relu`` model with expert_capacity 3: tokens over capacity are
  dropped (the MoE output is 0, only the residual passes), in the encoder (25 source
  tokens over 4 experts) and in a teacher-forced decoder call.

Each case compares teacher-forced logits and the encoder output with transformers', the
decoder stepped through its state against transformers stepped through its cache in the
same chunks, greedy decoding against ``generate``, and negative controls (routing,
capacity, an expert's weights, the output scaling, the decoder state).
"""

import json
import os

import numpy as np
import pytest

import maxdecl as md
from modelhelp import randomize, rel_err, save_hf, spec_path, with_hf_config

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

SPEC = spec_path("switch_transformers")
VOCAB = 300
TOL = 1e-5                 # of max|ref|: float32 throughout

BASE = dict(vocab_size=VOCAB, layer_norm_epsilon=1e-6, decoder_start_token_id=0,
            router_jitter_noise=0.0, dropout_rate=0.0)
CONFIGS = {
    "relu": dict(d_model=32, d_kv=8, num_heads=4, d_ff=64, dense_act_fn="relu",
                 num_layers=3, num_sparse_encoder_layers=1, num_decoder_layers=2,
                 num_sparse_decoder_layers=2, num_experts=4, expert_capacity=64,
                 relative_attention_num_buckets=16, relative_attention_max_distance=20,
                 tie_word_embeddings=True),
    "gelu": dict(d_model=32, d_kv=8, num_heads=6, d_ff=48, dense_act_fn="gelu_new",
                 num_layers=4, num_sparse_encoder_layers=2, num_decoder_layers=3,
                 num_sparse_decoder_layers=1, num_experts=8, expert_capacity=64,
                 router_bias=True, relative_attention_num_buckets=32,
                 relative_attention_max_distance=128, tie_word_embeddings=False),
}
CONFIGS["capacity"] = {**CONFIGS["relu"], "expert_capacity": 3}
SPARSE = {"relu": ([1], [0, 1]), "gelu": ([1, 3], [1]), "capacity": ([1], [0, 1])}
# (source length, decoder length): long, short, one decoder token
LENGTHS = ((25, 30), (7, 9), (11, 1))


def make_switch(kind: str, seed: int = 0):
    torch.manual_seed(seed)
    cfg = transformers.SwitchTransformersConfig(attn_implementation="eager", **BASE,
                                                **CONFIGS[kind])
    model = randomize(transformers.SwitchTransformersForConditionalGeneration(cfg), seed)
    with torch.no_grad():       # T5-style attention does not scale q.k: keep softmaxes soft
        for stack in (model.encoder, model.decoder):
            for block in stack.block:
                for layer in block.layer[:-1]:
                    attn = getattr(layer, "SelfAttention", None) or layer.EncDecAttention
                    attn.q.weight.mul_(cfg.d_kv ** -0.5)
            # a position bias that matters next to q.k
            stack.block[0].layer[0].SelfAttention.relative_attention_bias.weight.mul_(4.0)
    return model


def sequences():
    rng = np.random.default_rng(3)
    return [(rng.integers(0, VOCAB, s).astype(np.int64), rng.integers(0, VOCAB, t).astype(np.int64))
            for s, t in LENGTHS]


def hf_forward(model, src, dec):
    """(logits [len(dec), vocab], encoder output [len(src), d_model]), teacher-forced."""
    with torch.no_grad():
        out = model(input_ids=torch.tensor(src[None]), decoder_input_ids=torch.tensor(dec[None]),
                    use_cache=False)
    return out.logits[0].numpy(), out.encoder_last_hidden_state[0].numpy()


def hf_stepped(model, src, dec, chunks):
    """transformers' logits with the decoder ids fed in ``chunks`` through its cache
    (use_cache=True cannot be passed with input_ids in transformers 5.24: the encoder
    stack refuses it, so the encoder output is computed once and passed)."""
    with torch.no_grad():
        enc = model.encoder(input_ids=torch.tensor(src[None]))
        cache, rows, t = None, [], 0
        for n in chunks:
            out = model(encoder_outputs=enc, decoder_input_ids=torch.tensor(dec[None, t:t + n]),
                        cache=cache, use_cache=True)
            cache, t = out.cache, t + n
            rows.append(out.logits[0].numpy())
    return np.concatenate(rows)


def router_choices(model, src, dec):
    """{(stack, layer): (expert index [tokens], kept [tokens])} of every sparse layer of a
    teacher-forced call, from transformers' own routers (hooks)."""
    got, hooks = {}, []
    for name in ("encoder", "decoder"):
        for i, block in enumerate(getattr(model, name).block):
            mlp = block.layer[-1].mlp
            if hasattr(mlp, "router"):
                def hook(mod, inp, out, key=(name, i)):
                    mask = out[0][0]                 # [tokens, experts] one-hot, capacity-masked
                    got[key] = (out[2][0].argmax(-1).numpy(), mask.sum(-1).numpy() > 0)
                hooks.append(mlp.router.register_forward_hook(hook))
    hf_forward(model, src, dec)
    for h in hooks:
        h.remove()
    return got


def empty_state(model) -> dict:
    return {v.name: np.zeros([d if isinstance(d, int) else 0 for d in v.type.shape],
                             v.type.dtype.numpy)
            for v in model.graph.inputs if v.name in model.output_names}


def ours_step(model, src, dec, state=None, start: int = 0):
    """(outputs by name, new state) of one call of the spec's graph."""
    feed = {"enc_tokens": src, "dec_tokens": dec,
            "dec_positions": np.arange(start, start + dec.size, dtype=np.int64),
            **(empty_state(model) if state is None else state)}
    got = dict(zip(model.output_names, model(*(feed[n] for n in model.input_names))))
    return got, {n: got[n] for n in model.input_names if n in got}


def ours_logits(model, src, dec):
    return np.asarray(ours_step(model, src, dec)[0]["logits"])


def max_err(model, seqs, refs) -> float:
    return max(rel_err(ours_logits(model, s, d), r[0]) for (s, d), r in zip(seqs, refs))


def rewrite(src, dst, tensors=None) -> str:
    """A copy of the HF folder ``src`` at ``dst`` with its tensors edited by ``tensors(dict)``."""
    from safetensors.numpy import load_file, save_file

    os.makedirs(dst, exist_ok=True)
    td = load_file(os.path.join(src, "model.safetensors"))
    if tensors:
        tensors(td)
    save_file(td, os.path.join(dst, "model.safetensors"), metadata={"format": "pt"})
    with open(os.path.join(src, "config.json")) as f:
        cfg = json.load(f)
    with open(os.path.join(dst, "config.json"), "w") as f:
        json.dump(cfg, f)
    return str(dst)


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    """kind -> (HF reference model, its save_pretrained folder): each built and saved once."""
    out = {}
    for k, kind in enumerate(CONFIGS):
        model = make_switch(kind, seed=0 if kind == "capacity" else k)
        out[kind] = model, save_hf(model, tmp_path_factory.mktemp(f"switch_{kind}") / "hf")
    return out


@pytest.fixture(scope="module", params=list(CONFIGS))
def case(request, folders):
    """(kind, HF model, folder, (src, dec) pairs, reference (logits, encoder output),
    loaded maxdecl model)."""
    kind = request.param
    model, path = folders[kind]
    seqs = sequences()
    refs = [hf_forward(model, s, d) for s, d in seqs]
    return kind, model, path, seqs, refs, md.load_model(SPEC, path)


def test_config_from_hf(case):
    kind, model, path, seqs, refs, ours = case
    c, p = model.config, ours.params
    assert (p["vocab"], p["dim"], p["head_dim"], p["n_heads"], p["ffn_dim"]) == (
        VOCAB, c.d_model, c.d_kv, c.num_heads, c.d_ff)
    assert (p["enc_layers"], p["dec_layers"]) == (c.num_layers, c.num_decoder_layers)
    assert (p["enc_step"], p["dec_step"]) == (c.encoder_sparse_step, c.decoder_sparse_step)
    assert (p["n_expert"], p["expert_capacity"]) == (c.num_experts, c.expert_capacity)
    assert (p["n_buckets"], p["max_distance"]) == (c.relative_attention_num_buckets,
                                                   c.relative_attention_max_distance)
    assert p["ffn_act"] == c.dense_act_fn and p["tied"] is c.tie_word_embeddings
    assert p["decoder_start"] == 0
    assert ours.input_names[:3] == ["enc_tokens", "dec_tokens", "dec_positions"]
    assert ours.output_names[:2] == ["logits", "encoder_last_hidden_state"]
    # the sparse layers are transformers' (is_sparse), the others dense
    enc_sparse, dec_sparse = SPARSE[kind]
    for stack, prefix, sparse in ((model.encoder, "enc", enc_sparse),
                                  (model.decoder, "dec", dec_sparse)):
        assert [i for i, b in enumerate(stack.block) if b.is_sparse] == sparse
        for i in range(len(stack.block)):
            assert (f"{prefix}.blk.{i}.ffn_up_exps.weight" in ours.weights) is (i in sparse)
            assert (f"{prefix}.blk.{i}.ffn_up.weight" in ours.weights) is (i not in sparse)
    assert ("output.weight" in ours.weights) is (not c.tie_word_embeddings)
    assert ("enc.blk.1.ffn_gate_inp.bias" in ours.weights) is c.router_bias
    assert ours.weights["enc.blk.1.ffn_up_exps.weight"].shape == (c.num_experts, c.d_ff, c.d_model)


def test_routing_is_exercised(case):
    """The routers send the test's tokens to several experts; with capacity 3, transformers
    drops tokens in the encoder and in the teacher-forced decoder (none otherwise)."""
    kind, model, path, seqs, refs, ours = case
    got = router_choices(model, *seqs[0])
    for key, (experts, kept) in got.items():
        assert len(set(experts.tolist())) >= 2, key
        if kind != "capacity":
            assert kept.all(), key
    if kind == "capacity":
        assert not got[("encoder", 1)][1].all() and not got[("decoder", 0)][1].all()


def test_logits_match_hf(case):
    """Teacher-forced logits (the whole decoder input in one call) and the encoder output."""
    kind, model, path, seqs, refs, ours = case
    errs, enc_errs = [], []
    for (s, d), (ref, enc_ref) in zip(seqs, refs):
        got, _ = ours_step(ours, s, d)
        errs.append(rel_err(got["logits"], ref))
        enc_errs.append(rel_err(got["encoder_last_hidden_state"], enc_ref))
    print(f"switch {kind} vs HF: logits {max(errs):.2e} ({', '.join(f'{e:.1e}' for e in errs)}); "
          f"encoder {max(enc_errs):.2e}")
    assert max(errs) <= TOL and max(enc_errs) <= TOL


def test_decoder_state_steps_match_hf(case):
    """A 4-token prefix, a 3-token chunk, then one token per step through the state, against
    transformers fed the same chunks through its cache (expert capacity counts the tokens of
    one call, in both); without dropping, also the teacher-forced logits."""
    kind, model, path, seqs, refs, ours = case
    (src, dec), (ref, _) = seqs[0], refs[0]
    p = ours.params
    chunks = [4, 3] + [1] * (dec.size - 7)
    got, state = ours_step(ours, src, dec[:4])
    assert state["dec.key_positions"].tolist() == [0, 1, 2, 3]
    assert state["dec.blk.0.kv_cache"].shape == (2, 4, p["n_heads"], p["head_dim"])
    rows, t = [np.asarray(got["logits"])], 4
    for n in chunks[1:]:
        got, state = ours_step(ours, src, dec[t:t + n], state, start=t)
        rows.append(np.asarray(got["logits"]))
        t += n
    rows = np.concatenate(rows)
    err = rel_err(rows, hf_stepped(model, src, dec, chunks))
    print(f"switch {kind} vs HF: prefix + stepped decode {err:.2e}")
    assert err <= TOL
    assert state["dec.key_positions"].tolist() == list(range(dec.size))
    if kind != "capacity":
        assert rel_err(rows, ref) <= TOL
    else:       # transformers' own stepped and teacher-forced logits differ (drops)
        assert rel_err(rows, ref) > 100 * TOL


def test_greedy_decode_matches_generate(case):
    """Greedy decoding (model.generate, from config.json's decoder_start_token_id) gives
    transformers' generate ids (its cache on: one token per step)."""
    kind, model, path, seqs, refs, ours = case
    n_new = 12
    want = []
    for src, _ in seqs[:2]:
        with torch.no_grad():
            out = model.generate(torch.tensor(src[None]), max_new_tokens=n_new, do_sample=False,
                                 eos_token_id=None, pad_token_id=0, min_length=0)
        want.append(out[0, 1:].tolist())
    assert ours.encoder_decoder and ours.params["decoder_start"] == 0
    got = ours.generate([int(t) for t in seqs[0][0]], n_new, temperature=0)
    assert got.ids == want[0] and got.prompt_tokens == seqs[0][0].size
    both = ours.generate([[int(t) for t in s] for s, _ in seqs[:2]], n_new, temperature=0)
    assert [o.ids for o in both] == want


# -- negative controls --------------------------------------------------------------------

def test_perturbed_expert_fails(case, tmp_path):
    """One expert's wi of the encoder's first sparse layer perturbed on disk: large errors
    (that expert is read)."""
    kind, model, path, seqs, refs, ours = case
    experts, _ = router_choices(model, *seqs[0])[("encoder", 1)]
    e = int(experts[0])
    name = f"encoder.block.1.layer.1.mlp.experts.expert_{e}.wi.weight"

    def perturb(td):
        td[name] = td[name] + np.random.default_rng(1).standard_normal(td[name].shape).astype(np.float32)

    bad = md.load_model(SPEC, rewrite(path, tmp_path / "bad", tensors=perturb))
    assert max_err(bad, seqs[:1], refs[:1]) > 100 * TOL


def test_router_matters(case, tmp_path):
    """The router's rows (experts) reversed on disk: other experts, other logits."""
    kind, model, path, seqs, refs, ours = case

    def reverse(td):
        for k in list(td):
            if k.endswith("router.classifier.weight") or k.endswith("router.classifier.bias"):
                td[k] = np.ascontiguousarray(td[k][::-1])

    bad = md.load_model(SPEC, rewrite(path, tmp_path / "rev", tensors=reverse))
    assert max_err(bad, seqs[:1], refs[:1]) > 100 * TOL


def test_capacity_matters(case):
    """expert_capacity read as 64 where config.json says 3 (no dropping): other logits;
    where nothing is dropped, a capacity of 64 or 3 gives the same logits."""
    kind, model, path, seqs, refs, ours = case
    m = md.load_model(with_hf_config(md.load_spec(SPEC), expert_capacity=64), path)
    assert m.params["expert_capacity"] == 64
    if kind == "capacity":
        assert max_err(m, seqs[:1], refs[:1]) > 100 * TOL
    else:
        assert max_err(m, seqs, refs) <= TOL


def test_output_scaling_matters(case):
    """The tied head's d_model ** -0.5 rescaling read the other way round: other logits."""
    kind, model, path, seqs, refs, ours = case
    flipped = "{False}" if model.config.tie_word_embeddings else "{True}"
    m = md.load_model(with_hf_config(md.load_spec(SPEC), tied=flipped), path)
    assert max_err(m, seqs[:1], refs[:1]) > 100 * TOL


def test_decoder_state_matters(case):
    """One decode step after a 12-token prefix with the state tampered with (key positions
    shifted: the relative bias moves; KV caches zeroed): wrong logits."""
    kind, model, path, seqs, refs, ours = case
    (src, dec) = seqs[0]
    chunks = [12, 1]
    ref = hf_stepped(model, src, dec[:13], chunks)[12]
    _, state = ours_step(ours, src, dec[:12])
    got, _ = ours_step(ours, src, dec[12:13], state, start=12)
    assert rel_err(got["logits"][0], ref) <= TOL
    shifted = {**state, "dec.key_positions": state["dec.key_positions"] + 5}
    zeroed = {n: np.zeros_like(v) if n.endswith("kv_cache") else v for n, v in state.items()}
    for bad in (shifted, zeroed):
        got, _ = ours_step(ours, src, dec[12:13], bad, start=12)
        assert rel_err(got["logits"][0], ref) > 100 * TOL
