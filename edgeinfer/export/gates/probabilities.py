"""Outputs that already are probabilities (a graph ending in Softmax): top-1 agreement on the
rows fp32 decides and the largest absolute difference, on the probabilities as they are (never
softmaxed again)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from edgeinfer.export.gates.verdict import PARITY_MAX_PROB_DIFF, OutputScore, Sample, Verdict

__all__ = [
    "DECIDED_MARGIN",
    "label_agreement",
    "looks_like_probabilities",
    "probabilities",
    "top1_agreement",
]

# Agreement counts rows where fp32's top-1 probability leads the runner-up by >= 0.1: on a
# near-tie any rounding flips the answer, and agreement there measures noise, not the model.
DECIDED_MARGIN = 0.1

# How far from 1 a row may sum and still be probabilities (float32 softmax of many classes).
_SUM_TOLERANCE = 1e-3


def looks_like_probabilities(values: np.ndarray) -> bool:
    """Whether ``values`` [..., C] (C >= 2) lie in [0, 1] and sum to 1 along the last axis."""
    if values.ndim == 0 or values.shape[-1] < 2 or values.dtype.kind != "f" or not values.size:
        return False
    rows = values.reshape(-1, values.shape[-1]).astype(np.float64)
    in_range = bool(rows.min() >= -1e-6 and rows.max() <= 1 + 1e-6)
    return in_range and bool(np.all(np.abs(rows.sum(axis=1) - 1) <= _SUM_TOLERANCE))


def probabilities(output: str, reason: str, samples: Sequence[Sample]) -> OutputScore:
    """Top-1 agreement over the decided rows (every row when fp32 decides none)."""
    want = np.concatenate([s.want.reshape(-1, s.want.shape[-1]) for s in samples])  # [R, C]
    got = np.concatenate([s.got.reshape(-1, s.got.shape[-1]) for s in samples])
    ranked = np.sort(want, axis=1)
    decided = ranked[:, -1] - ranked[:, -2] >= DECIDED_MARGIN  # [R]
    agree = want.argmax(axis=1) == got.argmax(axis=1)
    judged = agree[decided] if decided.any() else agree
    max_abs = float(np.abs(want.astype(np.float64) - got).max())
    return OutputScore(
        output=output,
        metric="probabilities",
        reason=reason,
        value=float(judged.mean()),
        count=len(samples),
        parity=bool(judged.all()) and max_abs <= PARITY_MAX_PROB_DIFF,
        details={
            "top1_agreement_all_rows": round(float(agree.mean()), 6),
            "decided_rows": int(decided.sum()),
            "rows": len(agree),
            "max_abs_error": round(max_abs, 6),
        },
    )


def top1_agreement(reference: np.ndarray, candidate: np.ndarray) -> tuple[Verdict, float]:
    """Top-1 agreement of class probabilities [N, C] on the inputs fp32 decides (leads by
    ``DECIDED_MARGIN``; the gate), and on all inputs (reported beside it)."""
    ranked = np.sort(reference, axis=1)
    decided = ranked[:, -1] - ranked[:, -2] >= DECIDED_MARGIN  # [N]
    agree = (reference.argmax(1) == candidate.argmax(1)).astype(np.float64)
    value = float(agree[decided].mean()) if decided.any() else 0.0
    max_diff = float(np.abs(reference - candidate).max())
    views = np.bincount(reference.argmax(1)[decided], minlength=reference.shape[1])  # [C]
    most = int(views.max()) if views.size else 0
    score = OutputScore(
        output="probabilities",
        metric="top1_agreement",
        reason="class probabilities: top-1 label on the views fp32 decides",
        value=value,
        count=int(decided.sum()),
        evidence=(
            f"{int(decided.sum())} decided views of {int((views > 0).sum())} classes "
            f"(at most {most} of one)"
        ),
        # with no decided input the probabilities alone show parity
        parity=(value == 1.0 or not decided.any()) and max_diff <= PARITY_MAX_PROB_DIFF,
        details={"max_prob_diff": round(max_diff, 6)},
    )
    return Verdict((score,), metric="top1_agreement"), float(agree.mean())


def label_agreement(reference: np.ndarray, candidate: np.ndarray) -> Verdict:
    """The share of inputs whose label (argmax of probabilities [N, C]) equals fp32's."""
    agree = (reference.argmax(1) == candidate.argmax(1)).astype(np.float64)
    max_diff = float(np.abs(reference - candidate).max())
    score = OutputScore(
        output="probabilities",
        metric="label_agreement",
        reason="text classifier: the label of every held text",
        value=float(agree.mean()),
        count=len(agree),
        parity=bool(agree.all()) and max_diff <= PARITY_MAX_PROB_DIFF,
        details={"max_prob_diff": round(max_diff, 6)},
    )
    return Verdict((score,), metric="label_agreement")
