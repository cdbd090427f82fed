"""Next-token choice from a logits row, in llama.cpp's order:

    penalties -> top-k -> top-p -> min-p -> temperature -> draw

* penalties, over the last ``repeat_last_n`` tokens of the context (prompt and
  generated): each distinct id has its logit divided by ``repeat_penalty`` when
  positive, multiplied by it when negative (llama.cpp's ``penalty_repeat``), then
  lowered by ``presence_penalty`` once and by ``frequency_penalty`` per occurrence
  (OpenAI's and llama.cpp's ``penalty_present`` / ``penalty_freq``);
* top-k keeps the ``top_k`` largest logits; top-p the smallest set of the most likely
  tokens whose probability reaches ``top_p``; min-p the tokens whose probability is at
  least ``min_p`` times the top one's. Probabilities here are the softmax of the
  logits before the temperature, as in llama.cpp;
* ``temperature == 0`` is greedy: argmax of the penalised logits, lowest id on ties.
"""

from __future__ import annotations

import secrets

import numpy as np

from .params import check_sampling


class Sampler:
    """Picks token ids from float logits; ``sampler(logits, context=ids)``.

    Arguments are checked by ``params.check_sampling`` (``md.InputError`` when bad);
    ``seed`` -1 or None draws a fresh random seed, kept in ``self.seed``.

    Example::

        s = Sampler(temperature=0.8, top_p=0.95, repeat_penalty=1.1, seed=1)
        next_id = s(logits_row, context=prompt_ids + generated)
    """

    def __init__(self, temperature: float = 0.0, top_k: int | None = None,
                 top_p: float | None = None, seed: int | None = 0, *,
                 min_p: float | None = None, repeat_penalty: float = 1.0,
                 repeat_last_n: int = 64, presence_penalty: float = 0.0,
                 frequency_penalty: float = 0.0):
        p = check_sampling(temperature, top_k, top_p, min_p, repeat_penalty, repeat_last_n, seed,
                           presence_penalty, frequency_penalty)
        self.presence_penalty = p["presence_penalty"]
        self.frequency_penalty = p["frequency_penalty"]
        self.temperature, self.top_k, self.top_p = p["temperature"], p["top_k"], p["top_p"]
        self.min_p, self.repeat_penalty = p["min_p"], p["repeat_penalty"]
        self.repeat_last_n = p["repeat_last_n"]
        self.seed = p["seed"] if p["seed"] is not None else secrets.randbits(64)
        self.rng = np.random.default_rng(self.seed)

    def _no_penalty(self, context) -> bool:
        return ((self.repeat_penalty == 1.0 and not self.presence_penalty
                 and not self.frequency_penalty) or self.repeat_last_n == 0 or not len(context))

    def penalize(self, logits: np.ndarray, context=()) -> np.ndarray:
        """``logits`` (float64) with the penalties applied for the ids in ``context``."""
        if self._no_penalty(context):
            return logits
        window = context if self.repeat_last_n < 0 else context[-self.repeat_last_n:]
        ids, counts = np.unique(np.asarray(window, np.int64), return_counts=True)
        keep = (ids >= 0) & (ids < logits.size)
        ids, counts = ids[keep], counts[keep]
        z = logits[ids]
        logits = logits.copy()
        z = np.where(z > 0, z / self.repeat_penalty, z * self.repeat_penalty)
        logits[ids] = z - self.presence_penalty - self.frequency_penalty * counts
        return logits

    def __call__(self, logits: np.ndarray, context=()) -> int:
        if self.temperature == 0 and self._no_penalty(context):
            # plain greedy: the argmax of the logits as they are (widening to float64
            # keeps every value and tie, and would copy 262144 of them a token)
            return int(np.argmax(np.asarray(logits).reshape(-1)))
        logits = self.penalize(np.asarray(logits, dtype=np.float64).reshape(-1), context)
        if self.temperature == 0:
            return int(np.argmax(logits))
        ids, z = np.arange(logits.size), logits
        if self.top_k is not None and self.top_k < z.size:
            keep = np.argpartition(-z, self.top_k - 1)[: self.top_k]
            ids, z = keep, z[keep]
        order = np.argsort(-z, kind="stable")
        ids, z = ids[order], z[order]
        if self.top_p is not None and self.top_p < 1:
            p = np.exp(z - z[0])
            p /= p.sum()
            cut = min(int(np.searchsorted(np.cumsum(p), self.top_p)) + 1, z.size)
            ids, z = ids[:cut], z[:cut]
        if self.min_p is not None and self.min_p > 0:
            keep = z >= z[0] + np.log(self.min_p)     # p_i >= min_p * p_max
            ids, z = ids[keep], z[keep]
        p = np.exp((z - z[0]) / self.temperature)
        p /= p.sum()
        return int(ids[self.rng.choice(ids.size, p=p)])
