"""Choosing the next token from the logits: greedy, temperature, top-k, top-p, seeded."""

from __future__ import annotations

import numpy as np

from edgeinfer.config import SamplingConfig

__all__ = ["Sampler"]


class Sampler:
    """Pick token ids from logits according to a ``SamplingConfig``.

    One sampler serves one request: its random generator is seeded from ``config.seed`` when
    it is created, so the same seed, prompt and package give the same tokens.
    """

    def __init__(self, config: SamplingConfig) -> None:
        self.config = config
        self._rng = np.random.default_rng(config.seed)

    def __call__(self, logits: np.ndarray) -> int:
        """Return the next token id for ``logits`` [V] float32 (the last position's row)."""
        if self.config.greedy:
            return int(np.argmax(logits))
        scaled = logits.astype(np.float64) / self.config.temperature  # [V]
        candidates = np.arange(scaled.shape[0])
        if 0 < self.config.top_k < scaled.shape[0]:
            candidates = np.argpartition(scaled, -self.config.top_k)[-self.config.top_k :]
            scaled = scaled[candidates]
        probs = np.exp(scaled - scaled.max())
        probs /= probs.sum()
        if self.config.top_p < 1.0:
            order = np.argsort(probs)[::-1]
            # Keep the smallest prefix whose mass reaches top_p (at least one token).
            keep = int(np.searchsorted(np.cumsum(probs[order]), self.config.top_p)) + 1
            order = order[:keep]
            candidates, probs = candidates[order], probs[order] / probs[order].sum()
        return int(candidates[self._rng.choice(probs.shape[0], p=probs)])
