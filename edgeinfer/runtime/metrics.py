"""Runtime latency metrics: per-task histograms (p50/p95/p99), cold start, cache hits/misses.

Each ``Model`` owns one ``Metrics`` (no process-wide registry). Latencies are kept as the most
recent ``window`` samples per (task, stage) in a preallocated ring, so percentiles are exact
over that window and recording allocates nothing; ``_sum`` and ``_count`` are cumulative.

Stages: ``end_to_end`` (one call), ``tokenize`` (one call), ``queue`` and ``compute`` (one text
that ran the graph; queue is the wait for a dynamic batch). Generation will add
``time_to_first_token`` and ``inter_token``.

The Prometheus text exposition is written by hand rather than with ``prometheus-client``: that
library keeps a process-global default registry (module-level mutable state, which this code
base avoids), adds a dependency to every device, and the text format (version 0.0.4) that we
need (summaries, counters, gauges) is a few lines.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any, Protocol

import numpy as np

__all__ = ["LatencySummary", "LatencyWindow", "Metrics", "MetricsSnapshot", "render_prometheus"]

# Samples kept per histogram: enough for a stable p99 (~40 samples above it), 32 KiB each.
DEFAULT_WINDOW = 4096
QUANTILES = (0.5, 0.95, 0.99)


@dataclass(frozen=True)
class LatencySummary:
    """Percentiles over the recent window, plus cumulative count and sum (milliseconds).

    Percentiles use the nearest-rank definition: each is a latency that was really observed.
    """

    count: int
    sum_ms: float
    p50_ms: float
    p95_ms: float
    p99_ms: float
    max_ms: float


class LatencyWindow:
    """A ring of the last ``capacity`` latencies in milliseconds. Not thread-safe alone."""

    def __init__(self, capacity: int = DEFAULT_WINDOW) -> None:
        self._samples = np.zeros(capacity, dtype=np.float64)  # [capacity] ms
        self._count = 0
        self._sum_ms = 0.0

    def record(self, latency_ms: float) -> None:
        """Add one sample, replacing the oldest once the ring is full."""
        self._samples[self._count % self._samples.shape[0]] = latency_ms
        self._count += 1
        self._sum_ms += latency_ms

    def summary(self) -> LatencySummary:
        """Percentiles over the window (zeros before any sample)."""
        window = self._samples[: min(self._count, self._samples.shape[0])]
        if window.size == 0:
            return LatencySummary(0, 0.0, 0.0, 0.0, 0.0, 0.0)
        p50, p95, p99 = np.percentile(window, [q * 100 for q in QUANTILES], method="inverted_cdf")
        return LatencySummary(
            count=self._count,
            sum_ms=self._sum_ms,
            p50_ms=float(p50),
            p95_ms=float(p95),
            p99_ms=float(p99),
            max_ms=float(window.max()),
        )


@dataclass(frozen=True)
class MetricsSnapshot:
    """A point-in-time copy of one model's metrics (``Model.metrics()``).

    Attributes:
        model: the package name.
        cold_start_ms: from ``load()`` being called to the model being warm and ready
            (``Model.cold_start_ms``; ``None`` until then).
        latency_ms: task -> stage -> summary.
        cache_hits: task -> tier (``memory``, ``disk``, ``semantic``) -> texts answered.
        cache_misses: task -> texts that ran the graph.
        early_exits: task -> exit layer -> texts answered by that layer's head.
    """

    model: str
    cold_start_ms: float | None
    latency_ms: dict[str, dict[str, LatencySummary]] = field(default_factory=dict)
    cache_hits: dict[str, dict[str, int]] = field(default_factory=dict)
    cache_misses: dict[str, int] = field(default_factory=dict)
    early_exits: dict[str, dict[int, int]] = field(default_factory=dict)

    def hit_rate(self, task: str) -> float:
        """The share of ``task``'s texts answered from a cache (0 before any)."""
        hits = sum(self.cache_hits.get(task, {}).values())
        total = hits + self.cache_misses.get(task, 0)
        return hits / total if total else 0.0

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-ready data."""
        return asdict(self)


class Metrics:
    """The thread-safe metrics of one model.

    Args:
        model: the package name (a label on every series).
        window: samples kept per histogram.
    """

    def __init__(self, *, model: str, window: int = DEFAULT_WINDOW) -> None:
        self.model = model
        self._window = window
        self._lock = threading.Lock()
        self._latency: dict[tuple[str, str], LatencyWindow] = {}
        self._hits: dict[tuple[str, str], int] = {}
        self._misses: dict[str, int] = {}
        self._exits: dict[tuple[str, int], int] = {}
        self._cold_start_ms: float | None = None

    def mark_ready(self, cold_start_ms: float) -> None:
        """Record the cold start: ``load()`` called -> the model warm and ready."""
        self._cold_start_ms = cold_start_ms

    def observe(self, task: str, stage: str, latency_ms: float) -> None:
        """Record one latency of ``stage`` for ``task``."""
        with self._lock:
            window = self._latency.get((task, stage))
            if window is None:
                window = self._latency[(task, stage)] = LatencyWindow(self._window)
            window.record(latency_ms)

    def observe_many(self, task: str, stage: str, latencies_ms: Iterable[float]) -> None:
        """Record several latencies of one stage under one lock."""
        with self._lock:
            window = self._latency.get((task, stage))
            if window is None:
                window = self._latency[(task, stage)] = LatencyWindow(self._window)
            for latency_ms in latencies_ms:
                window.record(latency_ms)

    def count_cache(self, task: str, *, hits: dict[str, int], misses: int) -> None:
        """Add cache hits per tier and misses for ``task``."""
        with self._lock:
            for tier, n in hits.items():
                self._hits[(task, tier)] = self._hits.get((task, tier), 0) + n
            self._misses[task] = self._misses.get(task, 0) + misses

    def count_exit(self, task: str, layer: int) -> None:
        """Count one text answered by the early-exit head of ``layer``."""
        with self._lock:
            self._exits[(task, layer)] = self._exits.get((task, layer), 0) + 1

    def snapshot(self) -> MetricsSnapshot:
        """A consistent copy of everything recorded so far."""
        with self._lock:
            latency: dict[str, dict[str, LatencySummary]] = {}
            for (task, stage), window in sorted(self._latency.items()):
                latency.setdefault(task, {})[stage] = window.summary()
            hits: dict[str, dict[str, int]] = {}
            for (task, tier), n in sorted(self._hits.items()):
                hits.setdefault(task, {})[tier] = n
            exits: dict[str, dict[int, int]] = {}
            for (task, layer), n in sorted(self._exits.items()):
                exits.setdefault(task, {})[layer] = n
            return MetricsSnapshot(
                model=self.model,
                cold_start_ms=self._cold_start_ms,
                latency_ms=latency,
                cache_hits=hits,
                cache_misses=dict(self._misses),
                early_exits=exits,
            )


def _labels(**labels: str | int) -> str:
    def escape(value: str | int) -> str:
        return str(value).replace("\\", r"\\").replace('"', r"\"").replace("\n", r"\n")

    return "{" + ",".join(f'{k}="{escape(v)}"' for k, v in labels.items()) + "}"


def _family(
    name: str, kind: str, help: str, samples: Sequence[tuple[Mapping[str, str | int], float]]
) -> list[str]:
    """One metric family: its HELP and TYPE lines, then one line per (labels, value); a count
    is written whole, a float with 9 significant digits."""
    lines = [f"# HELP {name} {help}", f"# TYPE {name} {kind}"]
    for labels, value in samples:
        text = f"{value:.9g}" if isinstance(value, float) else str(value)
        lines.append(f"{name}{_labels(**labels)} {text}")
    return lines


class _Measured(Protocol):
    def metrics(self) -> MetricsSnapshot: ...


def render_prometheus(snapshots: Iterable[MetricsSnapshot | _Measured]) -> str:
    """Render snapshots (one per model) in the Prometheus text exposition format 0.0.4; a
    loaded model stands for its snapshot now (``render_prometheus([model])``).

    Latencies are exported as summaries in seconds (Prometheus' base unit), quantiles over the
    recent window, ``_sum``/``_count`` cumulative.
    """
    snaps = [s if isinstance(s, MetricsSnapshot) else s.metrics() for s in snapshots]
    lines = [
        "# HELP edgeinfer_latency_seconds Latency per model, task and stage.",
        "# TYPE edgeinfer_latency_seconds summary",
    ]
    for snap in snaps:
        for task, stages in snap.latency_ms.items():
            for stage, s in stages.items():
                base = {"model": snap.model, "task": task, "stage": stage}
                for q, value_ms in zip(QUANTILES, (s.p50_ms, s.p95_ms, s.p99_ms), strict=True):
                    quantile = _labels(**base, quantile=str(q))
                    lines.append(f"edgeinfer_latency_seconds{quantile} {value_ms / 1e3:.9g}")
                lines.append(f"edgeinfer_latency_seconds_sum{_labels(**base)} {s.sum_ms / 1e3:.9g}")
                lines.append(f"edgeinfer_latency_seconds_count{_labels(**base)} {s.count}")
    hits = [
        ({"model": snap.model, "task": task, "tier": tier}, n)
        for snap in snaps
        for task, tiers in snap.cache_hits.items()
        for tier, n in tiers.items()
    ]
    misses = [
        ({"model": snap.model, "task": task}, n)
        for snap in snaps
        for task, n in snap.cache_misses.items()
    ]
    exits: list[tuple[Mapping[str, str | int], int]] = [
        ({"model": snap.model, "task": task, "layer": layer}, n)
        for snap in snaps
        for task, layers in snap.early_exits.items()
        for layer, n in layers.items()
    ]
    cold = [
        ({"model": s.model}, s.cold_start_ms / 1e3) for s in snaps if s.cold_start_ms is not None
    ]
    lines += _family(
        "edgeinfer_cache_hits_total", "counter", "Texts answered from a result cache.", hits
    )
    lines += _family("edgeinfer_cache_misses_total", "counter", "Texts that ran the graph.", misses)
    lines += _family(
        "edgeinfer_early_exits_total", "counter", "Texts answered by an early-exit head.", exits
    )
    lines += _family(
        "edgeinfer_cold_start_seconds",
        "gauge",
        "From load() to the model being warm and ready.",
        cold,
    )
    return "\n".join(lines) + "\n"
