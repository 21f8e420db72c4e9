"""Embeddings: cosine to fp32 per item, token states [B, S, D] mean-pooled over the positions
the graph's own mask input keeps (padding never counts), vectors [B, D] as they are."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from edgeinfer.export.gates.verdict import PARITY_MIN_COSINE, OutputScore, Sample, Verdict

__all__ = ["cosines", "embedding_cosine", "embeddings"]


def _pooled(values: np.ndarray, mask: np.ndarray | None) -> np.ndarray:
    """[B, D] vectors: masked mean over positions of [B, S, D], or [B, D] itself."""
    values = values.astype(np.float64)
    if values.ndim == 2:
        return values
    weights = np.ones(values.shape[:2]) if mask is None else _kept(mask, values.shape[:2])
    total = np.einsum("bs,bsd->bd", weights, values)
    return np.asarray(total / np.maximum(weights.sum(axis=1, keepdims=True), 1.0))


def _kept(mask: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
    """1.0 where ``mask`` keeps a position, as [B, S]: a 1/0 mask as it is, an additive one
    (0 kept, large negatives masked) where it is at its maximum."""
    values = mask.reshape(shape).astype(np.float64)
    kept = values >= values.max() if values.min() < 0 else values > 0
    return np.asarray(kept, np.float64)


def cosines(want: np.ndarray, got: np.ndarray) -> np.ndarray:
    """Row-wise cosine of [B, D] (two zero rows agree: 1.0)."""
    norms = np.linalg.norm(want, axis=1) * np.linalg.norm(got, axis=1)
    dots = np.sum(want * got, axis=1)
    both_zero = (np.linalg.norm(want, axis=1) == 0) & (np.linalg.norm(got, axis=1) == 0)
    return np.where(both_zero, 1.0, dots / np.maximum(norms, 1e-30))


def embeddings(
    output: str, reason: str, samples: Sequence[Sample], *, mask: str | None
) -> OutputScore:
    """Mean and minimum cosine over every held item."""
    values = []
    for sample in samples:
        weights = sample.feeds.get(mask) if mask else None
        values.append(cosines(_pooled(sample.want, weights), _pooled(sample.got, weights)))
    cos = np.concatenate(values)
    return OutputScore(
        output=output,
        metric="masked_cosine" if mask else "cosine",
        reason=reason,
        value=float(cos.mean()),
        worst=float(cos.min()),
        count=len(samples),
        parity=float(cos.min()) >= PARITY_MIN_COSINE,
        details={"items": len(cos), **({"mask": mask} if mask else {})},
    )


def embedding_cosine(reference: np.ndarray, candidate: np.ndarray) -> Verdict:
    """Cosine of each held text's embedding [N, D] to the reference's: the mean gates, the
    hardest text may fall ``MIN_SLACK`` times further."""
    cos = cosines(reference.astype(np.float64), candidate.astype(np.float64))  # [N]
    score = OutputScore(
        output="embedding",
        metric="cosine",
        reason="sentence embeddings: cosine per held text",
        value=float(cos.mean()),
        worst=float(cos.min()),
        count=len(cos),
        parity=float(cos.min()) >= PARITY_MIN_COSINE,
    )
    return Verdict((score,), metric="cosine")
