"""Per-step class scores [B, T, C] of a recognizer (OCR, CTC): what matters is the decoded
sequence. Steps are argmaxed, repeats collapsed and blanks dropped (CTC greedy decoding); the
gate is the share of equal sequences, with the per-step agreement reported."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from edgeinfer.export.gates.verdict import OutputScore, Sample

__all__ = ["ctc_decode", "sequences"]


def _steps(values: np.ndarray) -> np.ndarray:
    """Scores as [B, T, C]: [T, C] is one sequence, [T, 1, C] is time-major."""
    if values.ndim == 2:
        return values[None]
    if values.ndim == 3 and values.shape[0] != 1 and values.shape[1] == 1:
        return np.transpose(values, (1, 0, 2))
    return values


def ctc_decode(ids: np.ndarray, *, blank: int) -> tuple[int, ...]:
    """Greedy CTC: repeats collapsed, then blanks dropped."""
    kept = [int(i) for n, i in enumerate(ids) if n == 0 or i != ids[n - 1]]
    return tuple(i for i in kept if i != blank)


def sequences(output: str, reason: str, samples: Sequence[Sample], *, blank: int) -> OutputScore:
    """Share of equal decoded sequences over every held sequence."""
    equal = total = same_steps = steps = 0
    for sample in samples:
        want = _steps(sample.want).argmax(axis=-1)  # [B, T]
        got = _steps(sample.got).argmax(axis=-1)
        same_steps += int(np.sum(want == got))
        steps += want.size
        for row_want, row_got in zip(want, got, strict=True):
            equal += ctc_decode(row_want, blank=blank) == ctc_decode(row_got, blank=blank)
            total += 1
    share = equal / total if total else 1.0
    step_agreement = same_steps / steps if steps else 1.0
    return OutputScore(
        output=output,
        metric="sequence",
        reason=reason,
        value=share,
        count=len(samples),
        parity=share == 1.0 and step_agreement == 1.0,
        decided_by=total,
        evidence=f"{total} sequences",
        details={
            "sequences": total,
            "step_agreement": round(step_agreement, 6),
            "ctc_blank": blank,
        },
    )
