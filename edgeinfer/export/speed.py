"""The export's speed guard: is a quantized variant slower than fp32 on this machine, with
confidence?

A single median per variant flips on noise (a small BERT was refused at 19.23 vs 19.13 ms and
shipped on the next run). Here the two variants run in pairs, taking turns who goes first, and
each pair gives one ratio, so a burst of load from another process slows both sides of the
pairs it hits. The verdict uses a bootstrap interval of the median ratio: a variant is refused
only when the whole interval lies below ``1 - MIN_EFFECT`` — slower, beyond doubt, by more than
a few percent.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

__all__ = ["MIN_EFFECT", "SpeedComparison", "compare"]

# Slower by less than this is no reason to refuse a smaller, quantized model.
MIN_EFFECT = 0.05
# 99 %: on simulated ties with 10 % noise per run, 0 of 1,000 exports refused (95 % with a 3 %
# minimum effect refused 3); a variant 15 % slower is still caught about half the time, one
# 1.5x slower always (tests/export/test_speed.py).
CONFIDENCE = 0.99
_BOOTSTRAP = 2000


@dataclass(frozen=True)
class SpeedComparison:
    """Reference time / candidate time over paired runs (> 1: the candidate is faster).

    Attributes:
        ratio: the median of the per-pair ratios.
        low, high: its bootstrap confidence interval (``CONFIDENCE``).
        pairs: how many pairs were timed.
        reference_ms, candidate_ms: the median time of one run of each.
    """

    ratio: float
    low: float
    high: float
    pairs: int
    reference_ms: float
    candidate_ms: float

    @property
    def slower(self) -> bool:
        """Whether the candidate is slower than the reference with confidence, by more than
        ``MIN_EFFECT``."""
        return self.high < 1.0 - MIN_EFFECT

    def describe(self) -> str:
        """One line: the ratio with its interval and the medians."""
        return (
            f"{self.ratio:.2f}x fp32 speed ({CONFIDENCE:.0%} interval {self.low:.2f}-"
            f"{self.high:.2f}, "
            f"{self.pairs} paired runs; {self.candidate_ms:.2f} vs {self.reference_ms:.2f} ms)"
        )

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready, for the export report."""
        return {
            "speedup_vs_fp32": round(self.ratio, 3),
            "interval": [round(self.low, 3), round(self.high, 3)],
            "pairs": self.pairs,
            "fp32_ms": round(self.reference_ms, 3),
            "ms": round(self.candidate_ms, 3),
            "slower": self.slower,
        }


def _seconds(run: Callable[[], object]) -> float:
    started = time.perf_counter()
    run()
    return time.perf_counter() - started


def compare(
    reference: Callable[[], object],
    candidate: Callable[[], object],
    *,
    pairs: int = 24,
    warmup: int = 2,
    clock: Callable[[Callable[[], object]], float] = _seconds,
) -> SpeedComparison:
    """Time ``reference`` and ``candidate`` (one unit of work each) in ``pairs`` interleaved
    pairs, alternating which runs first, and summarize the ratio (``clock`` times one call)."""
    if pairs < 2:
        raise ValueError(f"pairs must be >= 2, got {pairs}")
    for _ in range(warmup):  # first-run allocations stay out of the samples
        reference()
        candidate()
    ref, cand = np.empty(pairs), np.empty(pairs)
    for i in range(pairs):
        if i % 2 == 0:
            ref[i], cand[i] = clock(reference), clock(candidate)
        else:
            cand[i], ref[i] = clock(candidate), clock(reference)
    ratios = ref / np.maximum(cand, 1e-12)  # [pairs]
    rng = np.random.default_rng(0)  # a fixed seed: the same samples give the same verdict
    resampled = np.median(rng.choice(ratios, size=(_BOOTSTRAP, pairs)), axis=1)
    tail = (1.0 - CONFIDENCE) / 2 * 100
    low, high = np.percentile(resampled, [tail, 100 - tail])
    return SpeedComparison(
        ratio=float(np.median(ratios)),
        low=float(low),
        high=float(high),
        pairs=pairs,
        reference_ms=float(np.median(ref) * 1e3),
        candidate_ms=float(np.median(cand) * 1e3),
    )
