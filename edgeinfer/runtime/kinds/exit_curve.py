"""The early-exit curve of a segments package: every input traced once through every segment
(each exit's logits, each segment's batch-1 time), then any exit rule and threshold evaluated on
the trace without rerunning: accuracy, mean layers, mean latency.

The export chooses a package's default rule on the validation split's curve; ``edgeinfer bench
--early-exit-curve`` draws it on the held-out split. Both read it from here (numpy and the
runtime's ``SegmentRunner`` only).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np

from edgeinfer.runtime.kinds.early_exit import SegmentRunner, first_exit

__all__ = [
    "ENTROPY_THRESHOLDS",
    "NEVER_EXIT",
    "THRESHOLDS",
    "ExitTrace",
    "sweep",
    "trace_inputs",
]

# A threshold above 1 never passes: every text runs to the full-depth head.
NEVER_EXIT = 2.0
# Max-softmax thresholds swept at export (5 classes: the max probability is >= 0.2).
THRESHOLDS: tuple[float, ...] = (
    *(round(0.2 + 0.05 * i, 2) for i in range(15)),
    *(round(0.95 + 0.01 * i, 2) for i in range(5)),
    0.995,
    0.999,
    0.9999,
    NEVER_EXIT,
)
# Normalized-entropy thresholds (exit when <= tau); -1 never passes (full depth).
ENTROPY_THRESHOLDS: tuple[float, ...] = (
    0.0001,
    0.001,
    0.003,
    0.01,
    0.02,
    0.03,
    0.05,
    *(round(0.1 * i, 1) for i in range(1, 11)),
)


@dataclass(frozen=True)
class ExitTrace:
    """Every exit's logits and every segment's batch-1 time for each input of a labelled set."""

    logits: np.ndarray  # [E, N, C] float32
    segment_ms: np.ndarray  # [E, N] float64
    labels: np.ndarray  # [N] int64
    exit_layers: list[int]

    def exits_at(self, threshold: float, policy: str = "max_softmax") -> np.ndarray:
        """The exit index [N] each input answers at under ``policy`` and ``threshold``."""
        return first_exit(list(self.logits), threshold, policy)

    def accuracy_at(self, threshold: float, policy: str = "max_softmax") -> float:
        """Accuracy of the answers given under ``policy`` and ``threshold``."""
        chosen = self.exits_at(threshold, policy)
        answers = self.logits[chosen, np.arange(len(chosen))]  # [N, C]
        return float((answers.argmax(axis=1) == self.labels).mean())

    def point(self, threshold: float, policy: str = "max_softmax") -> dict[str, float]:
        """One point of the curve: accuracy, mean layers executed, mean batch-1 latency, and
        ``losses``: the share of inputs the full-depth head gets right and this point wrong
        (its accuracy drop before the inputs it gets right and the full depth wrong)."""
        chosen = self.exits_at(threshold, policy)
        cumulative = np.cumsum(self.segment_ms, axis=0)  # [E, N]
        rows = np.arange(len(chosen))
        right = self.logits[chosen, rows].argmax(axis=1) == self.labels  # [N]
        full_right = self.logits[-1].argmax(axis=1) == self.labels  # [N]
        losses = int((full_right & ~right).sum())
        return {
            "threshold": threshold,
            "accuracy": round(self.accuracy_at(threshold, policy), 6),
            "mean_layers": round(float(np.asarray(self.exit_layers)[chosen].mean()), 4),
            "mean_latency_ms": round(float(cumulative[chosen, rows].mean()), 4),
            "losses": round(losses / max(len(chosen), 1), 6),
        }


def trace_inputs(
    runner: SegmentRunner,
    inputs: Iterable[tuple[np.ndarray, np.ndarray | None]],
    labels: np.ndarray,
) -> ExitTrace:
    """Trace each ``(features, attention_mask)`` input (batch 1) through every segment."""
    logits, times = [], []
    for features, mask in inputs:
        trace = runner.trace(features, mask)
        logits.append(np.concatenate(trace.logits))  # [E, C]
        times.append(trace.segment_ms)
    return ExitTrace(
        logits=np.stack(logits, axis=1),
        segment_ms=np.asarray(times, dtype=np.float64).T,
        labels=labels,
        exit_layers=runner.exit_layers,
    )


def sweep(policy: str, exits: int) -> tuple[float, ...]:
    """The thresholds swept for ``policy`` on a package with ``exits`` heads."""
    if policy == "entropy":
        return ENTROPY_THRESHOLDS
    if policy == "patience":
        return tuple(float(p) for p in range(1, exits + 1))  # ``exits``: the last head answers
    return THRESHOLDS
