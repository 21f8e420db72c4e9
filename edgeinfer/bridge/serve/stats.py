"""Per-model answer statistics for the metrics topic: latency percentiles and answers.

The worker records each answered request's total latency (arrival to reply) under its model's
name, from its own threads and from the generation lanes; ``snapshot`` reads them with each
model's queue depth. Home Assistant's discovered sensors (``homeassistant.py``) read these
numbers from ``P/D/metrics``: ``per_model.NAME.{latency_ms.{p50,p99}, queue_depth, answered}``.
A generate model decoding several generations at once adds ``generation``: active and waiting
sequences, aggregate tokens/s (last 10 s), inter-token p50/p99 and queue-wait p50 (ms), KV bytes.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from typing import Any, Protocol

from edgeinfer.runtime.metrics import LatencySummary, LatencyWindow

__all__ = ["ModelStats", "percentiles"]


class _Models(Protocol):
    def names(self) -> list[str]: ...
    def get(self, name: str) -> Any: ...


def percentiles(summary: LatencySummary) -> dict[str, float | None]:
    """p50/p95/p99 of a latency window (``None`` each while it is empty)."""
    if not summary.count:
        return {"p50": None, "p95": None, "p99": None}
    return {"p50": summary.p50_ms, "p95": summary.p95_ms, "p99": summary.p99_ms}


class ModelStats:
    """Total latency per model name over its last ``window`` answers. Thread-safe."""

    def __init__(self, window: int) -> None:
        self._window = window
        self._latency: dict[str, LatencyWindow] = {}
        self._lock = threading.Lock()

    def record(self, model: str, total_ms: float) -> None:
        """One answer of ``model`` (served names only: the caller checked the model exists)."""
        with self._lock:
            window = self._latency.get(model)
            if window is None:
                window = self._latency[model] = LatencyWindow(self._window)
            window.record(total_ms)

    def snapshot(self, models: _Models, queued: Mapping[str, int]) -> dict[str, dict[str, Any]]:
        """``{NAME: {"latency_ms": {p50, p95, p99}, "queue_depth", "answered"}}`` per served
        model, with ``generation`` for a model under continuous batching."""
        with self._lock:
            summaries = {name: w.summary() for name, w in self._latency.items()}
        empty = LatencyWindow(1).summary()
        out: dict[str, dict[str, Any]] = {}
        for name in models.names():
            out[name] = {
                "latency_ms": percentiles(summaries.get(name, empty)),
                "queue_depth": queued.get(name, 0),
                "answered": summaries.get(name, empty).count,
            }
            stats = getattr(models.get(name), "generation_stats", None)
            generation = stats() if callable(stats) else None
            if generation is not None:
                out[name]["generation"] = generation
        return out
