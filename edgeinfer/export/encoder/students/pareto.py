"""Every candidate's accuracy against its batch-1 latency: the export report's Pareto table and
its plot (``pareto.png`` in the package).

Latency is measured through the runtime on held texts, one text per call (a device's
requests), the candidates taking turns round by round so that load from other processes hits
them alike: the median over rounds of the mean time per short text (headline + first sentence)
and per long text (a whole article, cut at the model's window).
"""

from __future__ import annotations

import io
import time
from collections.abc import Sequence
from typing import Any

import numpy as np

from edgeinfer.export.context import Candidate, ExportContext
from edgeinfer.export.passes import validate

__all__ = ["fastest", "front", "measure", "plot", "probe_sets"]

_ROUNDS = 15
_PER_SET = 3  # texts in each of the short and the long probe set


def probe_sets(held: Sequence[str]) -> tuple[list[str], list[str]]:
    """The ``_PER_SET`` shortest and longest of the first held texts."""
    pool = sorted(held[: 6 * _PER_SET], key=len)
    return pool[:_PER_SET], pool[-_PER_SET:]


def measure(run: ExportContext, held: Sequence[str]) -> list[dict[str, Any]]:
    """Time every candidate, fill ``run.report.pareto`` and attach ``pareto.png``; returns the
    table (one row per candidate, fastest first)."""
    short, long = probe_sets(held)
    candidates = list(run.candidates.values())
    models = [validate.load_candidate(run.stage_candidate(c), run.threads) for c in candidates]
    times: dict[str, list[tuple[float, float]]] = {c.name: [] for c in candidates}
    try:
        for model in models:  # first calls allocate: kept out of the samples
            validate.run_model(model, short[:1])
            validate.run_model(model, long[:1])
        for _ in range(_ROUNDS):
            for candidate, model in zip(candidates, models, strict=True):
                times[candidate.name].append((_per_text(model, short), _per_text(model, long)))
    finally:
        for model in models:
            model.close()
    reference = _mean_ms(times.get("fp32") or next(iter(times.values())))
    rows = [_row(c, times[c.name], reference, run) for c in candidates]
    on_front = front([(r["latency_ms"], r["accuracy"]) for r in rows])
    for row, best in zip(rows, on_front, strict=True):
        row["pareto_front"] = best
        run.note(row["name"], latency=row)
    rows.sort(key=lambda r: r["latency_ms"])
    run.report.pareto = rows
    run.attachments["pareto.png"] = plot(rows, metric=candidates[0].measured.metric)
    return rows


def _per_text(model: Any, texts: list[str]) -> float:
    started = time.perf_counter()
    for text in texts:
        validate.run_model(model, [text])
    return (time.perf_counter() - started) * 1e3 / len(texts)


def _mean_ms(samples: list[tuple[float, float]]) -> float:
    short, long = np.median(np.asarray(samples), axis=0)
    return float(short + long) / 2


def _row(
    candidate: Candidate,
    samples: list[tuple[float, float]],
    reference_ms: float,
    run: ExportContext,
) -> dict[str, Any]:
    short, long = np.median(np.asarray(samples), axis=0)
    latency = float(short + long) / 2
    quality = candidate.measured
    student = candidate.extra.get("student", {})
    config = run.source.config
    size = sum(p.stat().st_size for n, p in candidate.files.items() if n.endswith(".onnx"))
    return {
        "name": candidate.name,
        "precision": candidate.precision,
        "layers": student.get("layers", config.get("num_hidden_layers")),
        "heads": student.get("heads", config.get("num_attention_heads")),
        "ffn": student.get("ffn", config.get("intermediate_size")),
        "graph_mb": round(size / 1e6, 1),
        "accuracy": round(quality.score, 6),
        "accuracy_min": quality.details.get("min"),
        **{  # with students, the gate's two texts (the worse decides: ``accuracy``)
            text: {"mean": quality.details[text]["mean"], "min": quality.details[text]["min"]}
            for text in ("in_domain", "off_domain")
            if text in quality.details
        },
        "passed": quality.passed,
        "short_ms": round(float(short), 3),
        "long_ms": round(float(long), 3),
        "latency_ms": round(latency, 3),
        "speedup_vs_fp32": round(reference_ms / latency, 3),
        "requested": candidate.requested,
    }


def fastest(passing: list[Candidate], variants: dict[str, dict[str, Any]]) -> Candidate:
    """The candidate of ``passing`` with the lowest latency measured by ``measure``."""
    return min(passing, key=lambda c: variants[c.name]["latency"]["latency_ms"])


def front(points: Sequence[tuple[float, float]]) -> list[bool]:
    """Whether each (latency, accuracy) point is on the Pareto front: no other point is at
    least as fast and as accurate, and strictly better in one."""
    return [
        not any(
            (lat2 <= lat and acc2 >= acc) and (lat2 < lat or acc2 > acc) for lat2, acc2 in points
        )
        for lat, acc in points
    ]


def plot(rows: list[dict[str, Any]], *, metric: str) -> bytes:
    """A PNG of accuracy against latency, the Pareto front joined, each point named."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
    for row in rows:
        color = "tab:green" if row["passed"] else "tab:red"
        ax.scatter(row["latency_ms"], row["accuracy"], color=color, zorder=3)
        ax.annotate(
            row["name"],
            (row["latency_ms"], row["accuracy"]),
            fontsize=8,
            xytext=(4, 4),
            textcoords="offset points",
        )
    best = sorted((r for r in rows if r["pareto_front"]), key=lambda r: r["latency_ms"])
    ax.plot([r["latency_ms"] for r in best], [r["accuracy"] for r in best], "--", color="grey")
    ax.set_xlabel("batch-1 latency per text (ms; mean of short and long held texts)")
    ax.set_ylabel(f"{metric} vs PyTorch fp32 teacher (held text)")
    ax.set_title("export candidates: green passed the gate, dashed: the Pareto front")
    ax.grid(alpha=0.3)
    fig.tight_layout()
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=110)
    plt.close(fig)
    return buffer.getvalue()
