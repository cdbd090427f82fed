"""Next-token choice from a logits row: greedy, or temperature / top-k / top-p sampling."""

from __future__ import annotations

import numpy as np


class Sampler:
    """Picks token ids from float logits.

    ``temperature == 0`` is greedy (argmax, lowest id on ties). Otherwise logits are
    divided by the temperature, cut to the ``top_k`` largest, then to the smallest
    set whose probability reaches ``top_p``, and sampled with a seeded generator.
    """

    def __init__(self, temperature: float = 0.0, top_k: int | None = None,
                 top_p: float | None = None, seed: int | None = 0):
        if temperature < 0:
            raise ValueError(f"temperature must be >= 0, got {temperature}")
        if top_k is not None and top_k < 1:
            raise ValueError(f"top_k must be >= 1, got {top_k}")
        if top_p is not None and not 0 < top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {top_p}")
        self.temperature, self.top_k, self.top_p = temperature, top_k, top_p
        self.rng = np.random.default_rng(seed)

    def __call__(self, logits: np.ndarray) -> int:
        logits = np.asarray(logits, dtype=np.float64).reshape(-1)
        if self.temperature == 0:
            return int(np.argmax(logits))
        z = logits / self.temperature
        ids = np.arange(z.size)
        if self.top_k is not None and self.top_k < z.size:
            keep = np.argpartition(-z, self.top_k - 1)[: self.top_k]
            ids, z = keep, z[keep]
        order = np.argsort(-z, kind="stable")
        ids, z = ids[order], z[order]
        p = np.exp(z - z[0])
        p /= p.sum()
        if self.top_p is not None and self.top_p < 1:
            cut = int(np.searchsorted(np.cumsum(p), self.top_p)) + 1
            ids, p = ids[:cut], p[:cut] / p[:cut].sum()
        return int(ids[self.rng.choice(ids.size, p=p)])
