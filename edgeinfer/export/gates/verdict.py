"""A candidate's score per output and the verdict over all of them (the worst output decides)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, NamedTuple

import numpy as np

__all__ = ["MIN_SLACK", "OutputScore", "Sample", "Verdict"]

# A per-item minimum (cosine of the hardest text, the worst channel) may fall this many times
# further than the mean: one hard item must not fail a good model, but a broken one must.
MIN_SLACK = 3.0


class Sample(NamedTuple):
    """One held call of one output: the call's inputs, fp32's value and the candidate's."""

    feeds: dict[str, np.ndarray]
    want: np.ndarray
    got: np.ndarray


@dataclass(frozen=True)
class OutputScore:
    """One output against the reference.

    ``value`` is the headline, 1.0 when the candidate reproduces fp32 (F1, agreement, cosine,
    1 - error); ``worst`` the worst item's, where the metric has items (None: only ``value``
    gates); ``parity`` whether it is what an fp32 rewrite must reach; ``details`` the numbers
    the report shows beside it.
    """

    output: str
    metric: str
    reason: str
    value: float
    count: int
    parity: bool
    worst: float | None = None
    details: dict[str, Any] = field(default_factory=dict)

    def passes(self, max_accuracy_loss: float) -> bool:
        """Whether the loss stays within ``max_accuracy_loss`` (a fraction, 0.01 = 1 %)."""
        if self.value < 1.0 - max_accuracy_loss:
            return False
        return self.worst is None or self.worst >= 1.0 - MIN_SLACK * max_accuracy_loss

    def to_dict(self, max_accuracy_loss: float) -> dict[str, Any]:
        """JSON-ready, with whether it passes."""
        out: dict[str, Any] = {
            "metric": self.metric,
            "why": self.reason,
            "value": round(self.value, 6),
            "count": self.count,
            "passed": self.passes(max_accuracy_loss),
        }
        if self.worst is not None:
            out["worst"] = round(self.worst, 6)
        return {**out, **self.details}


@dataclass(frozen=True)
class Verdict:
    """Every output's score; a candidate passes when every output does. It reads like
    ``validate.Accuracy`` where the builders take one (``metric``, ``mean``, ``count``)."""

    scores: tuple[OutputScore, ...]
    metric: str = "per-output"

    @property
    def mean(self) -> float:
        """The worst output's value (what ``--keep-best`` ranks)."""
        return min(score.value for score in self.scores)

    @property
    def count(self) -> int:
        """Held calls scored."""
        return max(score.count for score in self.scores)

    def passes(self, max_accuracy_loss: float) -> bool:
        """Whether every output passes."""
        return all(score.passes(max_accuracy_loss) for score in self.scores)

    def is_parity(self) -> bool:
        """Whether every output is reproduced as an fp32 rewrite must."""
        return all(score.parity for score in self.scores)

    def summary(self, max_accuracy_loss: float) -> str:
        """One line: each output's metric and value, failing ones marked."""
        parts = []
        for score in self.scores:
            mark = "" if score.passes(max_accuracy_loss) else " (fails)"
            worst = "" if score.worst is None else f", worst {score.worst:.4f}"
            parts.append(f"{score.output}: {score.metric} {score.value:.4f}{worst}{mark}")
        return "; ".join(parts)

    def to_dict(self, max_accuracy_loss: float) -> dict[str, Any]:
        """JSON-ready: each output's score, and whether all pass."""
        return {
            "metric": self.metric,
            "mean": round(self.mean, 6),
            "count": self.count,
            "passed": self.passes(max_accuracy_loss),
            "outputs": {s.output: s.to_dict(max_accuracy_loss) for s in self.scores},
        }
