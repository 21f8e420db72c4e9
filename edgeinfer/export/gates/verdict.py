"""The gate's one vocabulary: a score per output and the verdict over all of them (the worst
output decides).

Every gate speaks it — embeddings and classifiers of the builtin builders, the per-output
metrics of user ONNX files, a decoder's next-token agreement and perplexity, early-exit
segments — and ``ExportContext.measured`` turns a ``Verdict`` into the candidate's ``Quality``,
in that one place.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, NamedTuple

import numpy as np

__all__ = [
    "MIN_SLACK",
    "PARITY_MAX_PROB_DIFF",
    "PARITY_MIN_COSINE",
    "OutputScore",
    "Sample",
    "Verdict",
]

# A per-item minimum (cosine of the hardest text, the worst channel) may fall this many times
# further than the mean: one hard item must not fail a good model, but a broken one must.
MIN_SLACK = 3.0


class Sample(NamedTuple):
    """One held call of one output: the call's inputs, fp32's value and the candidate's."""

    feeds: dict[str, np.ndarray]
    want: np.ndarray
    got: np.ndarray


# fp32 ONNX vs PyTorch differs only by float reassociation: ~1e-6 in cosine, ~1e-5 in probability.
PARITY_MIN_COSINE = 0.9999
PARITY_MAX_PROB_DIFF = 1e-3


@dataclass(frozen=True)
class OutputScore:
    """One output (or one measured property of it) against the reference.

    ``value`` is the headline, 1.0 when the candidate reproduces fp32 (F1, agreement, cosine,
    1 - error); ``worst`` the worst item's, where the metric has items (None: only ``value``
    gates); ``parity`` whether it is what an fp32 rewrite must reach; ``details`` the numbers
    the report shows beside it. The bar is the run's budget (``value`` >= 1 - loss, ``worst``
    >= 1 - ``MIN_SLACK`` x loss) unless the metric brings its own: ``floor`` for ``value``
    (a decoder's agreement gate, an accuracy measured against fp32's own), ``worst_floor`` for
    ``worst``.

    ``decided_by`` counts the items that decided it (fp32 detections or masks, decided views,
    sequences; None: ``count``), ``evidence`` says what they are; below ``min_items`` the
    score is weak: ``ExportContext.measured`` passes no quantized variant on it (an fp32
    rewrite needs no evidence) and the summary asks for more data.
    """

    output: str
    metric: str
    reason: str
    value: float
    count: int
    parity: bool
    worst: float | None = None
    details: dict[str, Any] = field(default_factory=dict)
    floor: float | None = None
    worst_floor: float | None = None
    decided_by: int | None = None
    min_items: int = 0
    evidence: str = ""

    @property
    def items(self) -> int:
        """How many items decided the score."""
        return self.count if self.decided_by is None else self.decided_by

    @property
    def weak(self) -> bool:
        """Whether too few items decided it (below ``min_items``)."""
        return self.items < self.min_items

    def passes(self, max_accuracy_loss: float) -> bool:
        """Whether the loss stays within ``max_accuracy_loss`` (a fraction, 0.01 = 1 %); a
        weak score's pass only holds for an fp32 rewrite (``Verdict.weak``)."""
        floor = 1.0 - max_accuracy_loss if self.floor is None else self.floor
        if self.value < floor:
            return False
        if self.worst is None:
            return True
        worst_floor = (
            1.0 - MIN_SLACK * max_accuracy_loss if self.worst_floor is None else self.worst_floor
        )
        return self.worst >= worst_floor

    def to_dict(self, max_accuracy_loss: float) -> dict[str, Any]:
        """JSON-ready, with whether it passes."""
        out: dict[str, Any] = {
            "metric": self.metric,
            "why": self.reason,
            "value": round(self.value, 6),
            "count": self.count,
            "decided_by": self.evidence or f"{self.items} items",
            "passed": self.passes(max_accuracy_loss),
        }
        if self.min_items:
            out.update(min_items=self.min_items, weak=self.weak)
        if self.worst is not None:
            out["worst"] = round(self.worst, 6)
        if self.floor is not None:
            out["floor"] = round(self.floor, 6)
        return {**out, **self.details}


@dataclass(frozen=True)
class Verdict:
    """Every score of a candidate; it passes when every score does.

    ``metric`` names the verdict as a whole: the one metric of a builtin gate (``cosine``,
    ``top1_agreement``, ...) or ``per-output`` for a graph judged output by output, whose report
    lists each output under ``outputs``.
    """

    scores: tuple[OutputScore, ...]
    metric: str = "per-output"

    @property
    def mean(self) -> float:
        """The worst score's value (what ``--keep-best`` ranks)."""
        return min(score.value for score in self.scores)

    @property
    def min(self) -> float:
        """The worst item over every score (a score without items: its value)."""
        return min(score.value if score.worst is None else score.worst for score in self.scores)

    @property
    def count(self) -> int:
        """Held items scored (the most any one score saw)."""
        return max(score.count for score in self.scores)

    @property
    def weak(self) -> bool:
        """Whether any score was decided by fewer items than it needs."""
        return any(score.weak for score in self.scores)

    def passes(self, max_accuracy_loss: float) -> bool:
        """Whether every score passes."""
        return all(score.passes(max_accuracy_loss) for score in self.scores)

    def is_parity(self) -> bool:
        """Whether every score is reproduced as an fp32 rewrite must."""
        return all(score.parity for score in self.scores)

    def summary(self, max_accuracy_loss: float) -> str:
        """One line: each score's output, metric and value, failing ones marked."""
        parts = []
        for score in self.scores:
            mark = "" if score.passes(max_accuracy_loss) else " (fails)"
            if score.weak:
                mark += (
                    f" (weak: decided by {score.evidence or score.items}, at least "
                    f"{score.min_items} needed: give --eval-data with more)"
                )
            worst = "" if score.worst is None else f", worst {score.worst:.4f}"
            parts.append(f"{score.output}: {score.metric} {score.value:.4f}{worst}{mark}")
        return "; ".join(parts)

    def to_dict(self, max_accuracy_loss: float) -> dict[str, Any]:
        """JSON-ready: the headline (``mean``, ``min``, ``count``, whether all pass), then a
        single score's details beside it, or every score under ``outputs``."""
        out: dict[str, Any] = {
            "metric": self.metric,
            "mean": round(self.mean, 6),
            "min": round(self.min, 6),
            "count": self.count,
            "decided_by": "; ".join(s.evidence or f"{s.items} items" for s in self.scores),
            "weak": self.weak,
            "passed": self.passes(max_accuracy_loss),
        }
        if len(self.scores) == 1 and self.metric != "per-output":
            return {**out, **self.scores[0].details}
        return {**out, "outputs": {s.output: s.to_dict(max_accuracy_loss) for s in self.scores}}
