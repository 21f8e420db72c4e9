"""The opt-in semantic cache: answer a text from the most similar cached text (cosine >= τ),
and the calibration of τ to a false-hit budget on labelled data.

A *false hit* is a semantic hit whose cached answer differs from the answer the model would
have given fresh. Its rate depends on the data, so τ is measured, not guessed:
``calibrate_threshold`` picks the lowest τ (the most hits) whose false-hit rate stays within
the budget with 95 % confidence (one-sided Wilson bound), and reports the whole curve.

Search is numpy brute force over a preallocated [max_entries, D] float32 matrix: one
matrix-vector product per lookup: 0.04 ms at 1k entries of 384 dims, 0.5 ms at 10k, 11 ms at
100k (two x86 cores, ``benchmarks/semantic_cache_bbc.py``). Past ~10k entries an approximate
index (HNSW, IVF) is the better tool: the lookup then costs as much as a MiniLM run.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from statistics import NormalDist
from typing import Generic, TypeVar

import numpy as np

from edgeinfer.errors import ConfigError

__all__ = ["Calibration", "CurvePoint", "SemanticCache", "calibrate_threshold", "threshold_curve"]

V = TypeVar("V")


class SemanticCache(Generic[V]):
    """Nearest-neighbour answers by embedding similarity; thread-safe.

    Args:
        embed: texts -> L2-normalized float32 [N, D] (an embedding ``Model.embed``).
        threshold: τ; a cached answer is reused when cosine >= τ.
        max_entries: capacity; the oldest entry is replaced first.
    """

    def __init__(
        self,
        *,
        embed: Callable[[Sequence[str]], np.ndarray],
        threshold: float,
        max_entries: int,
    ) -> None:
        self.embed = embed
        self.threshold = threshold
        self.max_entries = max_entries
        self._lock = threading.Lock()
        self._vectors: np.ndarray | None = None  # [max_entries, D] float32, allocated once
        self._values: list[V | None] = [None] * max_entries
        self._count = 0  # entries ever added; the ring slot is _count % max_entries

    def __len__(self) -> int:
        return min(self._count, self.max_entries)

    def lookup(self, vectors: np.ndarray) -> list[tuple[V, float] | None]:
        """For each query vector [N, D]: ``(cached answer, cosine)`` if cosine >= τ, else None."""
        with self._lock:
            n = len(self)
            if n == 0 or self._vectors is None:
                return [None] * vectors.shape[0]
            sims = vectors @ self._vectors[:n].T  # [N, n]
            best = sims.argmax(axis=1)  # [N]
            found: list[tuple[V, float] | None] = []
            for row, col in enumerate(best):
                value, cosine = self._values[int(col)], float(sims[row, col])
                found.append(
                    (value, cosine) if value is not None and cosine >= self.threshold else None
                )
            return found

    def add(self, vectors: np.ndarray, values: Sequence[V]) -> None:
        """Remember answers for query vectors [N, D] (row i answers ``values[i]``)."""
        if vectors.shape[0] != len(values):
            raise ConfigError(f"{vectors.shape[0]} vectors for {len(values)} values")
        with self._lock:
            if self._vectors is None:
                self._vectors = np.zeros((self.max_entries, vectors.shape[1]), dtype=np.float32)
            for vector, value in zip(vectors, values, strict=True):
                slot = self._count % self.max_entries
                self._vectors[slot] = vector
                self._values[slot] = value
                self._count += 1

    def clear(self) -> None:
        """Forget every entry."""
        with self._lock:
            self._count = 0
            self._values = [None] * self.max_entries


@dataclass(frozen=True)
class CurvePoint:
    """Hit rate and false-hit rate at one τ.

    Attributes:
        threshold: τ.
        hit_rate: hits / queries.
        false_hit_rate: false hits / hits (the share of served cached answers that are wrong).
        false_hit_upper: its one-sided 95 % Wilson upper bound.
        hits: queries answered from the cache.
        false_hits: hits whose cached answer differs from the fresh answer.
    """

    threshold: float
    hit_rate: float
    false_hit_rate: float
    false_hit_upper: float
    hits: int
    false_hits: int


@dataclass(frozen=True)
class Calibration:
    """The chosen τ, the budget it was chosen for, and the curve it was chosen from."""

    threshold: float
    false_hit_budget: float
    curve: tuple[CurvePoint, ...]

    @property
    def chosen(self) -> CurvePoint:
        """The curve point at the chosen τ."""
        return next(p for p in self.curve if p.threshold == self.threshold)


def _wilson_upper(false_hits: int, hits: int, confidence: float) -> float:
    """One-sided Wilson score upper bound of the proportion false_hits / hits."""
    if hits == 0:
        return 1.0
    z = NormalDist().inv_cdf(confidence)
    p, z2 = false_hits / hits, z * z
    centre = p + z2 / (2 * hits)
    margin = z * math.sqrt(p * (1 - p) / hits + z2 / (4 * hits * hits))
    return min(1.0, (centre + margin) / (1 + z2 / hits))


def threshold_curve(
    similarity: np.ndarray,
    same_answer: np.ndarray,
    thresholds: Sequence[float],
    *,
    confidence: float = 0.95,
) -> list[CurvePoint]:
    """Hit and false-hit rates at each τ.

    Args:
        similarity: [Q] cosine of each query to its nearest cached text.
        same_answer: [Q] bool, whether that cached text's answer equals the query's fresh one.
        thresholds: the τ values to evaluate.
        confidence: the one-sided confidence of ``false_hit_upper``.
    """
    if similarity.shape != same_answer.shape or similarity.ndim != 1 or similarity.size == 0:
        raise ConfigError("similarity and same_answer must be equal-length, non-empty vectors")
    points = []
    for tau in thresholds:
        hit = similarity >= tau
        hits = int(hit.sum())
        false_hits = int((hit & ~same_answer).sum())
        points.append(
            CurvePoint(
                threshold=float(tau),
                hit_rate=hits / similarity.size,
                false_hit_rate=false_hits / hits if hits else 0.0,
                false_hit_upper=_wilson_upper(false_hits, hits, confidence),
                hits=hits,
                false_hits=false_hits,
            )
        )
    return points


def calibrate_threshold(
    similarity: np.ndarray,
    same_answer: np.ndarray,
    *,
    false_hit_budget: float = 0.01,
    confidence: float = 0.95,
    thresholds: Sequence[float] | None = None,
) -> Calibration:
    """The lowest τ whose false-hit rate is within ``false_hit_budget`` at ``confidence``.

    Args:
        similarity: [Q] cosine of each calibration query to its nearest cached text.
        same_answer: [Q] bool, whether that neighbour's answer equals the query's fresh answer.
        false_hit_budget: the allowed share of wrong answers among semantic hits.
        confidence: how sure the bound must be (one-sided Wilson); 0.95 needs ~300 hits
            without a false one before any τ passes a 1 % budget, so calibrate on enough data.
        thresholds: the τ grid (default 0.50 to 1.00 in steps of 0.005).

    Raises:
        ConfigError: no τ of the grid meets the budget (then do not enable the cache).
    """
    if not 0.0 < false_hit_budget < 1.0:
        raise ConfigError(f"false_hit_budget must be in (0, 1), got {false_hit_budget}")
    if not 0.5 <= confidence < 1.0:
        raise ConfigError(f"confidence must be in [0.5, 1), got {confidence}")
    grid = (
        list(thresholds)
        if thresholds is not None
        else [round(0.5 + 0.005 * i, 3) for i in range(101)]
    )
    curve = tuple(threshold_curve(similarity, same_answer, grid, confidence=confidence))
    passing = [p for p in curve if p.hits > 0 and p.false_hit_upper <= false_hit_budget]
    if not passing:
        raise ConfigError(
            f"no threshold keeps false hits within {false_hit_budget:.1%} on this data; "
            "collect more calibration data or leave the semantic cache off"
        )
    best = min(passing, key=lambda p: p.threshold)
    return Calibration(threshold=best.threshold, false_hit_budget=false_hit_budget, curve=curve)
