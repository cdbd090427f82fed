"""A language model or encoder-decoder without KV caches (no state inputs: transformers'
``use_cache=False``) generates by rerunning every token so far at each step: the ids
equal a greedy loop over ``model(*inputs)`` on the whole sequence, one prompt or many."""

import numpy as np
import pytest
import yaml

import maxdecl as md

DECODER = """
maxdecl: 1
name: nocache_lm
default_variant: tiny
variants:
  tiny: {vocab: 300, dim: 16}
dims:
  seq: tokens
inputs:
  tokens: {dtype: int64, shape: [seq]}
  positions: {dtype: int64, shape: [seq]}
layers:
  - name: token_embd
    weights: {weight: [vocab, dim]}
    layers:
      - {op: embedding, in: [.weight, tokens], out: x}
  - name: pos_embd
    weights: {weight: [64, dim]}
    layers:
      - {op: embedding, in: [.weight, positions], out: p}
      - {op: add, in: [x, p], out: x}
  - name: attn
    layers:
      - {op: unsqueeze, in: x, attrs: {axis: [1]}, out: h}
      - {op: attention, in: [h, h, h], attrs: {causal: true}, out: h}
      - {op: squeeze, in: h, attrs: {axis: [1]}, out: h}
      - {op: add, in: [x, h], out: x}
  - name: output
    weights: {weight: [vocab, dim]}
    layers:
      - {op: linear, in: [x, .weight], out: logits}
outputs: [logits]
"""

SEQ2SEQ = """
maxdecl: 1
name: nocache_seq2seq
default_variant: tiny
variants:
  tiny: {vocab: 300, dim: 16, decoder_start: 0}
dims:
  src: source tokens
  seq: decoder tokens
inputs:
  enc_tokens: {dtype: int64, shape: [src]}
  dec_tokens: {dtype: int64, shape: [seq]}
  dec_positions: {dtype: int64, shape: [seq]}
layers:
  - name: token_embd
    weights: {weight: [vocab, dim]}
    layers:
      - {op: embedding, in: [.weight, enc_tokens], out: e}
      - {op: embedding, in: [.weight, dec_tokens], out: x}
  - name: pos_embd
    weights: {weight: [64, dim]}
    layers:
      - {op: embedding, in: [.weight, dec_positions], out: p}
      - {op: add, in: [x, p], out: x}
  - name: self_attn
    layers:
      - {op: unsqueeze, in: x, attrs: {axis: [1]}, out: h}
      - {op: attention, in: [h, h, h], attrs: {causal: true}, out: h}
      - {op: squeeze, in: h, attrs: {axis: [1]}, out: h}
      - {op: add, in: [x, h], out: x}
  - name: cross_attn
    layers:
      - {op: unsqueeze, in: x, attrs: {axis: [1]}, out: q}
      - {op: unsqueeze, in: e, attrs: {axis: [1]}, out: kv}
      - {op: attention, in: [q, kv, kv], attrs: {causal: false}, out: h}
      - {op: squeeze, in: h, attrs: {axis: [1]}, out: h}
      - {op: add, in: [x, h], out: x}
  - name: output
    weights: {weight: [vocab, dim]}
    layers:
      - {op: linear, in: [x, .weight], out: logits}
outputs: [logits]
"""


def _model(tmp_path, text):
    path = tmp_path / (yaml.safe_load(text)["name"] + ".yaml")
    path.write_text(text)
    return md.load_model(path)


def _greedy(run, n):
    """The reference: the whole sequence through the graph at every step."""
    ids = []
    for _ in range(n):
        ids.append(int(np.argmax(run(ids)[-1])))
    return ids


def test_decoder_only_without_cache(tmp_path):
    model = _model(tmp_path, DECODER)
    assert model.session is not None and model.session.stateless
    prompts = [[5, 17, 200, 3], [9], [250, 250, 1, 2, 7, 8]]
    outs = model.generate(prompts, 6, temperature=0)
    for p, out in zip(prompts, outs):
        def run(ids, p=p):
            seq = np.array(p + ids, np.int64)
            return model(seq, np.arange(seq.size, dtype=np.int64))[0]
        want = _greedy(run, 6)
        assert out.ids == want and len(set(want)) > 1
    assert model.generate(prompts[0], 6, temperature=0).ids == outs[0].ids
    with pytest.raises(md.InputError, match="KV cache"):
        model.generate(prompts[0], 3, temperature=0, lookup=2)


def test_encoder_decoder_without_cache(tmp_path):
    model = _model(tmp_path, SEQ2SEQ)
    assert model.encoder_decoder
    source = [11, 42, 7, 99, 3]
    out = model.generate(source, 6, temperature=0)

    def run(ids):
        dec = np.array([0] + ids, np.int64)
        return model(np.array(source, np.int64), dec, np.arange(dec.size, dtype=np.int64))[0]
    want = _greedy(run, 6)
    assert out.ids == want and len(set(want)) > 1
