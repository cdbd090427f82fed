"""specs/xlstm.yaml against transformers' xLSTMForCausalLM / xLSTMModel.

A small seeded float32 xLSTM: 2 mLSTM blocks of width 128, 4 heads (qk head dim 16,
v head dim 32), SwiGLU feed-forward of 384, gate soft cap 15, logit soft cap 30.
``chunk_size`` is 8, so transformers' whole-sequence forward of 19 tokens runs its
chunkwise-parallel kernel over two chunks and its recurrent kernel over the last 3.
The input gates are scaled up and the forget biases raised so that the max
stabiliser, the soft cap and the denominator's ``max(|q.n|, exp(-m)) + eps`` all
matter (random N(0, 1) gates would forget nearly everything at every step).

The spec runs one sequence a call (the generation convention, tokens ``[seq]``); a
batch of two sequences in transformers is compared row by row.
"""

import json
import pathlib

import numpy as np
import pytest

import maxdecl as md

from archhelp import load
from modelhelp import randomize, rel_err, save_hf, spec_path, token_ids

pytest.importorskip("torch")
pytest.importorskip("transformers")

TOL = 1e-4           # max|ours - ref| <= TOL * max|ref|
N_TOKENS = 19        # two chunks of 8 (chunkwise kernel) + 3 (recurrent kernel)
N_PROMPT = 11
VOCAB = 96


def make_xlstm(seed=0, **kw):
    import torch
    import transformers

    torch.manual_seed(seed)
    cfg = dict(vocab_size=VOCAB, hidden_size=128, num_hidden_layers=2, num_heads=4,
               chunk_size=8, qk_dim_factor=0.5, v_dim_factor=1.0, ffn_proj_factor=2.667,
               ffn_round_up_to_multiple_of=64, norm_eps=1e-6, eps=1e-6,
               gate_soft_cap=15.0, output_logit_soft_cap=30.0)
    cfg.update(kw)
    model = randomize(transformers.xLSTMForCausalLM(transformers.xLSTMConfig(**cfg)), seed)
    gen = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for blk in model.backbone.blocks:
            layer = blk.mlstm_layer
            layer.igate_preact.weight.mul_(8.0)              # i up to the soft cap
            layer.igate_preact.bias.copy_(2.0 * torch.randn(4, generator=gen))
            layer.fgate_preact.bias.add_(3.0)                # remember over the sequence
    return model


def hf_reference(model, ids2):
    """(logits [2, T, V], last_hidden_state [2, T, D]) of one batched forward."""
    import torch

    x = torch.tensor(ids2, dtype=torch.long)
    with torch.no_grad():
        logits = model(x, use_cache=False).logits.float().numpy()
        hidden = model.backbone(x, use_cache=False).last_hidden_state.float().numpy()
    return logits, hidden


@pytest.fixture(scope="module")
def xlstm(tmp_path_factory):
    model = make_xlstm()
    path = save_hf(model, tmp_path_factory.mktemp("xlstm_hf"))
    ids2 = [token_ids(VOCAB, n=N_TOKENS, seed=7), token_ids(VOCAB, n=N_TOKENS, seed=8)]
    logits, hidden = hf_reference(model, ids2)
    return model, path, ids2, logits, hidden


@pytest.fixture(scope="module")
def ours(xlstm):
    return Runner(*load("xlstm", xlstm[1]))


class Runner:
    """The graph run on one sequence, state fed back (every output by name)."""

    def __init__(self, graph, weights):
        self.graph, self.weights = graph, weights
        self.run = md.compile(graph, weights)
        self.names = [v.name for v in graph.inputs]
        self.outs = list(graph.output_names)
        self.state_names = [n for n in self.names if n in self.outs]

    def initial_state(self):
        return {v.name: np.zeros(tuple(0 if isinstance(d, str) else d for d in v.shape),
                                 v.dtype.numpy)
                for v in self.graph.inputs if v.name in self.state_names}

    def step(self, ids, start, state):
        ids = np.asarray(ids, np.int64)
        feed = {"tokens": ids, "positions": np.arange(start, start + ids.size, dtype=np.int64),
                "logit_rows": np.arange(ids.size, dtype=np.int64), **state}
        got = dict(zip(self.outs, self.run(*(feed[n] for n in self.names))))
        return got, {n: got[n] for n in self.state_names}

    def whole(self, ids):
        return self.step(ids, 0, self.initial_state())[0]

    def stepwise(self, ids, n_prompt):
        """Logits of a prefill of n_prompt tokens, then of one token a step."""
        got, state = self.step(ids[:n_prompt], 0, self.initial_state())
        rows = [got["logits"]]
        for pos in range(n_prompt, len(ids)):
            got, state = self.step(ids[pos:pos + 1], pos, state)
            rows.append(got["logits"])
        return np.concatenate(rows), state


def test_xlstm_config_from_hf(xlstm):
    from modelhelp import hf_params

    got = hf_params("xlstm", xlstm[1])[2]
    assert (got["dim"], got["n_layers"], got["n_heads"], got["vocab"]) == (128, 2, 4, VOCAB)
    assert got["gate_soft_cap"] == 15.0 and got["logit_soft_cap"] == 30.0
    spec = md.load_spec(spec_path("xlstm"))
    model = md.load_model(spec, xlstm[1])
    p = model.params
    assert (p["qk_dim"], p["v_dim"], p["dqk"], p["dv"], p["ffn_dim"]) == (64, 128, 16, 32, 384)


def test_xlstm_parallel_logits_and_hidden_match_hf(xlstm, ours):
    """Whole-sequence (parallel) mode: logits and last hidden state of both sequences
    of transformers' batch."""
    _, _, ids2, ref_logits, ref_hidden = xlstm
    errs = []
    for b, ids in enumerate(ids2):
        got = ours.whole(ids)
        errs.append((rel_err(got["logits"], ref_logits[b]),
                     rel_err(got["last_hidden_state"], ref_hidden[b])))
    print("xlstm parallel vs HF (logits, hidden) per sequence:", errs)
    assert max(max(e) for e in errs) <= TOL


def test_xlstm_stepwise_decoding_matches_whole_sequence(xlstm, ours):
    """A prefill, then one token a step through the (C, n, m) state, gives transformers'
    whole-sequence logits."""
    _, _, ids2, ref_logits, _ = xlstm
    for b, ids in enumerate(ids2):
        got, _ = ours.stepwise(ids, N_PROMPT)
        err = rel_err(got, ref_logits[b])
        print(f"xlstm stepwise vs HF whole sequence (seq {b}): {err:.2e}")
        assert err <= TOL
    # one token at a time from the first
    got, _ = ours.stepwise(ids2[0], 1)
    assert rel_err(got, ref_logits[0]) <= TOL


def test_xlstm_state_matches_hf_cache(xlstm, ours):
    """The state after the prompt is transformers' xLSTMCache.rnn_state (C, n, m)."""
    import torch

    model, _, ids2, _, _ = xlstm
    x = torch.tensor(ids2, dtype=torch.long)[:, :N_PROMPT]
    with torch.no_grad():
        cache = model(x, use_cache=True).cache
    for b, ids in enumerate(ids2):
        _, state = ours.step(ids[:N_PROMPT], 0, ours.initial_state())
        for i in range(2):
            c, n, m = (t[b].float().numpy() for t in cache.rnn_state[i])
            assert rel_err(state[f"blk.{i}.c_state"], c) <= TOL
            assert rel_err(state[f"blk.{i}.n_state"], n) <= TOL
            np.testing.assert_allclose(state[f"blk.{i}.m_state"], m, rtol=1e-5, atol=1e-5)


def test_xlstm_hf_cached_decoding_matches_ours(xlstm, ours):
    """transformers' own cached decoding (prefill, then one token a step) and ours."""
    import torch

    model, _, ids2, _, _ = xlstm
    x = torch.tensor(ids2, dtype=torch.long)
    with torch.no_grad():
        out = model(x[:, :N_PROMPT], use_cache=True)
        rows, cache = [out.logits], out.cache
        for pos in range(N_PROMPT, N_TOKENS):
            out = model(x[:, pos:pos + 1], cache=cache, use_cache=True)
            rows.append(out.logits)
            cache = out.cache
    hf_step = torch.cat(rows, dim=1).float().numpy()
    for b, ids in enumerate(ids2):
        got, _ = ours.stepwise(ids, N_PROMPT)
        assert rel_err(got, hf_step[b]) <= TOL


def test_xlstm_state_matters(xlstm, ours):
    """Negative control: decoding after the prompt from a zero state is far off."""
    _, _, ids2, ref_logits, _ = xlstm
    ids = ids2[0]
    got, _ = ours.step(ids[N_PROMPT:N_PROMPT + 1], N_PROMPT, ours.initial_state())
    assert rel_err(got["logits"][0], ref_logits[0][N_PROMPT]) > 100 * TOL


def test_xlstm_base_model_checkpoint_loads(xlstm, tmp_path):
    """An xLSTMModel checkpoint (no backbone. prefix, no lm_head) loads; its output
    falls back to the embedding table, and last_hidden_state is the backbone's."""
    model, _, ids2, _, ref_hidden = xlstm
    path = save_hf(model.backbone, tmp_path / "base")
    keys = set(md.load_weights(path).keys())
    assert "embeddings.weight" in keys and not any(k.startswith("backbone.") for k in keys)
    run = Runner(*load("xlstm", path))
    got = run.whole(ids2[1])
    assert rel_err(got["last_hidden_state"], ref_hidden[1]) <= TOL


def test_xlstm_model_generate_matches_hf(xlstm):
    """md.load_model drives the spec as a language model: greedy ids as transformers'."""
    import torch

    model, path, ids2, _, _ = xlstm
    prompt = ids2[0][:8]
    want = model.generate(torch.tensor([prompt]), max_new_tokens=6, do_sample=False,
                          eos_token_id=None, pad_token_id=0)[0, len(prompt):].tolist()
    ours = md.load_model(spec_path("xlstm"), path, variant="tiny")
    assert ours.generate(prompt, 6, temperature=0).ids == want


def test_xlstm_batched_generate_matches_hf(xlstm):
    import torch

    model, path, ids2, _, _ = xlstm
    prompts = [ids2[0][:8], ids2[1][:5]]
    want = [model.generate(torch.tensor([p]), max_new_tokens=4, do_sample=False,
                           eos_token_id=None, pad_token_id=0)[0, len(p):].tolist()
            for p in prompts]
    ours = md.load_model(spec_path("xlstm"), path, variant="tiny")
    assert [o.ids for o in ours.generate(prompts, 4, temperature=0)] == want


# -- use_bias, other soft caps, the fused weight layout ------------------------

@pytest.fixture(scope="module")
def xlstm_bias(tmp_path_factory):
    model = make_xlstm(seed=3, use_bias=True, num_hidden_layers=1, gate_soft_cap=5.0,
                       output_logit_soft_cap=10.0, tie_word_embeddings=True)
    path = save_hf(model, tmp_path_factory.mktemp("xlstm_bias"))
    ids2 = [token_ids(VOCAB, n=N_TOKENS, seed=11), token_ids(VOCAB, n=N_TOKENS, seed=12)]
    logits, hidden = hf_reference(model, ids2)
    return model, path, ids2, logits, hidden


def test_xlstm_bias_and_other_caps_match_hf(xlstm_bias):
    _, path, ids2, ref_logits, ref_hidden = xlstm_bias
    g, td = load("xlstm", path)
    assert td.params["gate_soft_cap"] == 5.0 and td.params["logit_soft_cap"] == 10.0
    run = Runner(g, td)
    for b, ids in enumerate(ids2):
        got = run.whole(ids)
        assert rel_err(got["logits"], ref_logits[b]) <= TOL
        assert rel_err(got["last_hidden_state"], ref_hidden[b]) <= TOL
        step, _ = run.stepwise(ids, N_PROMPT)
        assert rel_err(step, ref_logits[b]) <= TOL


def test_xlstm_fused_layout_loads(xlstm_bias, tmp_path):
    """weight_mode "fused" (qkv_opreact = q | k | v | o, ifgate_preact = i | f,
    proj_up_gate_z = gate | up) splits into the same weights. transformers 5.24 cannot
    build a fused model (its _init_weights fails), so the checkpoint is the single
    one's tensors concatenated as the fused modules hold them."""
    _, path, ids2, ref_logits, _ = xlstm_bias
    from safetensors.numpy import save_file

    td = md.load_weights(path)
    pre = "backbone.blocks.0."
    fused = {}
    for kind in ("weight", "bias"):
        fused[f"mlstm_layer.qkv_opreact.{kind}"] = [f"mlstm_layer.{n}.{kind}" for n in
                                                    ("q", "k", "v", "ogate_preact")]
        fused[f"mlstm_layer.ifgate_preact.{kind}"] = [f"mlstm_layer.{n}.{kind}" for n in
                                                      ("igate_preact", "fgate_preact")]
        fused[f"ffn.proj_up_gate_z.{kind}"] = [f"ffn.{n}.{kind}" for n in
                                               ("proj_up_gate", "proj_up")]
    tensors = {k: np.asarray(td[k]) for k in td.keys()}
    for name, parts in fused.items():
        tensors[pre + name] = np.concatenate([tensors.pop(pre + p) for p in parts], axis=0)
    out = tmp_path / "fused"
    out.mkdir()
    save_file({k: np.ascontiguousarray(v) for k, v in tensors.items()},
              str(out / "model.safetensors"))
    cfg = json.loads((pathlib.Path(path) / "config.json").read_text())
    cfg["weight_mode"] = "fused"
    (out / "config.json").write_text(json.dumps(cfg))
    run = Runner(*load("xlstm", out))
    got = run.whole(ids2[0])
    assert rel_err(got["logits"], ref_logits[0]) <= TOL

