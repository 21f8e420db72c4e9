"""Choosing the next token from the logits: greedy, temperature, top-k, top-p, seeded.

Every token runs this, so it reads the whole vocabulary (49k logits for SmolLM2) only in a few
vectorized float32 passes into buffers allocated once per request: no full sort, no
``arange(V)``, no float64 copy, no cumulative sum over the vocabulary.

- top-k: the tokens within a margin of the best (one comparison; the margin widens until k
  tokens pass, and starts from the one that served last) are ``argpartition``-ed to k.
- top-p: the exact softmax (one ``exp`` pass, the total by a BLAS dot); only the tokens above a
  weight floor are sorted, which is exact when they alone reach p of the mass (every token
  below the floor is less likely than every token above it).
- the draw: the inverse CDF over 256-token block sums, then within one block.
"""

from __future__ import annotations

import math

import numpy as np

from edgeinfer.config import SamplingConfig

__all__ = ["Sampler"]

_BLOCK = 256  # tokens per block of the two-level inverse CDF
# Weight floors (relative to the best token) tried in turn for the sorted part of top-p; the
# first holds the nucleus on peaked distributions, the last on nearly flat ones.
_NUCLEUS_FLOORS = (math.exp(-4.0), math.exp(-10.0), math.exp(-16.0), 0.0)
_FIRST_MARGIN_NATS = 8.0  # top-k's first margin below the best logit, in nats
# exp of a scaled logit above this overflows float32: only then is the best one subtracted.
_EXP_SAFE = 80.0


class Sampler:
    """Pick token ids from logits according to a ``SamplingConfig``.

    One sampler serves one request: its random generator is seeded from ``config.seed`` when
    it is created, so the same seed, prompt and package give the same tokens.
    """

    def __init__(self, config: SamplingConfig) -> None:
        self.config = config
        self.greedy = config.greedy
        self._rng = np.random.default_rng(config.seed)
        self._scale = np.float32(1.0 / config.temperature) if not self.greedy else np.float32(1)
        self._margin = _FIRST_MARGIN_NATS * config.temperature
        self._weights = np.zeros(0, np.float32)  # [blocks * 256], allocated on the first call
        self._ones = np.ones(_BLOCK, np.float32)
        self._top_weight = 1.0  # the largest softmax weight of the last row
        self._floor = 0  # the index of the nucleus floor that held last

    def __call__(self, logits: np.ndarray) -> int:
        """Return the next token id for ``logits`` [V] float32 (the last position's row)."""
        if self.greedy:
            return int(logits.argmax())
        if 0 < self.config.top_k < logits.shape[0]:
            ids, weights = self._top_k(logits)
            if self.config.top_p < 1.0:
                head, weights = _sorted_head(weights, self.config.top_p * float(weights.sum()))
                ids = ids[head]
            return int(ids[_pick(np.cumsum(weights), self._rng.random())])
        weights = self._softmax(logits)
        blocks = self._weights.reshape(-1, _BLOCK) @ self._ones  # [B] block masses
        if self.config.top_p < 1.0:
            ids, kept = self._nucleus(weights, float(blocks.sum()))
            return int(ids[_pick(np.cumsum(kept), self._rng.random())])
        return self._draw(blocks, logits.shape[0])

    def _softmax(self, logits: np.ndarray) -> np.ndarray:
        """exp(logits / T - c) [V] in the request's buffer (c: the best scaled logit, only
        when exp would overflow without it): the probabilities up to their total."""
        vocab = logits.shape[0]
        if self._weights.shape[0] < vocab:
            self._weights = np.zeros(-(-vocab // _BLOCK) * _BLOCK, np.float32)  # zero padding
        weights = self._weights[:vocab]
        np.multiply(logits, self._scale, out=weights)
        top = float(weights.max())
        if top > _EXP_SAFE:
            np.subtract(weights, np.float32(top), out=weights)
            top = 0.0
        np.exp(weights, out=weights)
        self._top_weight = math.exp(top)
        return weights

    def _nucleus(self, weights: np.ndarray, total: float) -> tuple[np.ndarray, np.ndarray]:
        """The top-p tokens of the softmax ``weights`` (``total``: their sum), most likely
        first, with their weights. Only tokens above a weight floor are sorted: exact when
        they alone reach the mass (every token below the floor is less likely than every
        token above it); the floor that held last time is tried first."""
        target = self.config.top_p * total
        start = max(0, self._floor - 1)
        for index in range(start, len(_NUCLEUS_FLOORS)):
            floor = np.float32(self._top_weight * _NUCLEUS_FLOORS[index])
            head = np.flatnonzero(weights >= floor)
            if float(weights[head].sum()) >= target:
                break
        self._floor = index
        order, kept = _sorted_head(weights[head], target)
        return head[order], kept

    def _draw(self, blocks: np.ndarray, vocab: int) -> int:
        """A token drawn from the softmax weights by the two-level inverse CDF (``blocks``:
        the masses of their 256-token blocks)."""
        cumulative = np.cumsum(blocks)
        target = self._rng.random() * float(cumulative[-1])
        block = min(int(np.searchsorted(cumulative, target, side="right")), blocks.shape[0] - 1)
        target -= float(cumulative[block - 1]) if block else 0.0
        inner = np.cumsum(self._weights[block * _BLOCK : (block + 1) * _BLOCK])
        index = block * _BLOCK + _pick(inner, target / max(float(inner[-1]), 1e-30))
        return min(int(index), vocab - 1)

    def _top_k(self, logits: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The k most likely tokens and their unnormalized probabilities."""
        k = self.config.top_k
        best = float(logits.max())
        while True:
            ids = np.flatnonzero(logits >= np.float32(best - self._margin))
            if ids.shape[0] >= k or ids.shape[0] == logits.shape[0]:
                break
            self._margin *= 2.0
        if ids.shape[0] > 4 * k:  # a margin too wide for this row: narrower next time
            self._margin *= 0.5
        if ids.shape[0] > k:
            ids = ids[np.argpartition(logits[ids], -k)[-k:]]
        weights = np.exp((logits[ids] - np.float32(best)) * self._scale)
        return ids, weights


def _pick(cumulative: np.ndarray, fraction: float) -> int:
    """The index where ``fraction`` of the cumulative mass is reached."""
    index = int(np.searchsorted(cumulative, fraction * float(cumulative[-1]), side="right"))
    return min(index, int(cumulative.shape[0]) - 1)


def _sorted_head(weights: np.ndarray, target: float) -> tuple[np.ndarray, np.ndarray]:
    """The positions of the fewest largest ``weights`` whose sum reaches ``target``, largest
    first, and their weights."""
    order = np.argsort(-weights, kind="stable")
    keep = int(np.searchsorted(np.cumsum(weights[order]), np.float32(target))) + 1
    order = order[:keep]
    return order, weights[order]
