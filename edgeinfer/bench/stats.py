"""Latency statistics: percentiles and the summary every report shows."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass

import numpy as np

from edgeinfer.errors import ConfigError

__all__ = ["LatencySummary", "summarize"]


@dataclass(frozen=True)
class LatencySummary:
    """Latency of ``count`` runs, in milliseconds."""

    count: int
    p50_ms: float
    p95_ms: float
    p99_ms: float
    mean_ms: float
    min_ms: float
    max_ms: float

    def to_dict(self) -> dict[str, float]:
        """JSON-ready, rounded to microseconds."""
        return {k: (round(v, 3) if isinstance(v, float) else v) for k, v in asdict(self).items()}


def summarize(latencies_ms: Sequence[float]) -> LatencySummary:
    """Summarize latencies; percentiles use linear interpolation between order statistics."""
    if not latencies_ms:
        raise ConfigError("no latencies to summarize: run at least one measurement")
    values = np.asarray(latencies_ms, dtype=np.float64)
    p50, p95, p99 = np.percentile(values, [50, 95, 99])
    return LatencySummary(
        count=len(values),
        p50_ms=float(p50),
        p95_ms=float(p95),
        p99_ms=float(p99),
        mean_ms=float(values.mean()),
        min_ms=float(values.min()),
        max_ms=float(values.max()),
    )
