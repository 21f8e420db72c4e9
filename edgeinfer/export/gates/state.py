"""State outputs of a stateful graph (carried into the next call): judged after every call by
the cosine of the whole state to fp32's, so drift that builds up over a stream shows at the
calls where it has built up, whatever the state's scale."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from edgeinfer.export.gates.embeddings import cosines
from edgeinfer.export.gates.verdict import PARITY_MIN_COSINE, OutputScore, Sample

__all__ = ["state"]


def state(output: str, reason: str, samples: Sequence[Sample]) -> OutputScore:
    """Mean and minimum per-call cosine of the flattened state."""
    cos = np.array(
        [
            cosines(s.want.reshape(1, -1).astype(np.float64), s.got.reshape(1, -1))[0]
            for s in samples
        ]
    )  # [calls]
    return OutputScore(
        output=output,
        metric="state_cosine",
        reason=reason,
        value=float(cos.mean()),
        worst=float(cos.min()),
        count=len(samples),
        parity=float(cos.min()) >= PARITY_MIN_COSINE,
        details={"worst_call": int(cos.argmin())},
    )
