"""Benchmark output: a table for people, JSON for machines, a plot for reports."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rich.table import Table

from edgeinfer.bench.runner import BenchResult

__all__ = ["generation_plot", "generation_table", "plot", "table"]


def _input(result: BenchResult) -> str:
    """What one input was: a text of ``seq_len`` tokens, or an image (``seq_len`` 0)."""
    return f"seq {result.seq_len} tokens" if result.seq_len else "one image"


def table(result: BenchResult) -> Table:
    """A rich table: one row per candidate, the subject first, speedups vs the subject."""
    config = result.config
    out = Table(
        title=(
            f"batch {config.batch} · {_input(result)} · {config.thread_count} "
            f"threads · {result.results[0].latency.count} runs"
        ),
    )
    for column in (
        "candidate",
        "p50 ms",
        "p95 ms",
        "p99 ms",
        "mean ms",
        "cold start ms",
        "items/s",
        "peak RSS MB",
        "subject speedup",
    ):
        out.add_column(column, justify="left" if column == "candidate" else "right")
    speedups = result.speedups
    for r in result.results:
        s = r.latency
        speed = f"{speedups[r.label]:.2f}x" if r.label in speedups else "—"
        out.add_row(
            r.label,
            f"{s.p50_ms:.2f}",
            f"{s.p95_ms:.2f}",
            f"{s.p99_ms:.2f}",
            f"{s.mean_ms:.2f}",
            f"{r.cold_start_ms:.0f}",
            f"{r.throughput_items_s:.1f}",
            f"{r.peak_rss_bytes / 2**20:.0f}",
            speed,
        )
    return out


def plot(result: BenchResult, path: Path) -> None:
    """Save a box plot of every candidate's latency distribution to ``path`` (PNG)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    labels = [r.label for r in result.results]
    fig, ax = plt.subplots(figsize=(8, 1.2 + 0.6 * len(labels)))
    ax.boxplot(
        [r.latencies_ms for r in result.results],
        orientation="horizontal",
        showfliers=True,
        whis=(1, 99),
    )
    ax.set_yticks(range(1, len(labels) + 1), labels)
    ax.set_xlabel("latency per request (ms); whiskers at p1 and p99")
    ax.set_title(
        f"edgeinfer bench: batch {result.config.batch}, {_input(result)}, "
        f"{result.config.thread_count} threads"
    )
    ax.grid(axis="x", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def generation_table(result: dict[str, Any]) -> Table:
    """A rich table of a generation bench: one row per package, then the llama.cpp and PyTorch
    baselines."""
    out = Table(
        title=(
            f"batch 1 · {result['tokens']} decode tokens · {result['threads']} threads · "
            f"read bandwidth {result['read_bandwidth_gbs']} GB/s"
        ),
    )
    for column in (
        "candidate",
        "TTFT ms",
        "tok/s",
        "inter-token p50/p95/p99 ms",
        "overhead µs/tok",
        "roofline tok/s",
        "of roofline",
        "file MB",
        "RSS MB load/run/peak",
        "vs PyTorch",
    ):
        out.add_column(column, justify="left" if column == "candidate" else "right")
    for row in result["packages"]:
        p = row["inter_token_ms"]
        speed = row.get("speedup_vs_torch")
        out.add_row(
            f"{Path(row['package']).name} ({row['precision']})",
            f"{row['ttft_ms']:.1f}",
            f"{row['decode_tokens_per_s']:.1f}",
            f"{p['p50']}/{p['p95']}/{p['p99']}",
            f"{row['python_overhead_us_per_token']:.0f}",
            f"{row['roofline_tokens_per_s']:.1f}",
            f"{row['roofline_fraction']:.0%}",
            f"{row['file_mb']:.1f}",
            _rss(row),
            f"{speed:.2f}x" if speed is not None else "—",
        )
    for c in result.get("llamacpp", []):
        out.add_row(
            f"llama.cpp {Path(c['gguf']).name}",
            f"{c['ttft_ms']:.1f}",
            f"{c['decode_tokens_per_s']:.1f}",
            *("—",) * 4,
            f"{c['file_mb']:.1f}",
            _rss(c),
            "—",
        )
    if "torch" in result:
        t = result["torch"]
        out.add_row(
            t["baseline"],
            f"{t['ttft_ms']:.1f}",
            f"{t['decode_tokens_per_s']:.1f}",
            "—",
            "—",
            "—",
            "—",
            "—",
            "—",
            "1.00x",
        )
    return out


def _rss(row: dict[str, Any]) -> str:
    return f"{row['loaded_rss_mb']:.0f}/{row['rss_after_run_mb']:.0f}/{row['peak_rss_mb']:.0f}"


def generation_plot(result: dict[str, Any], path: Path) -> None:
    """Save a box plot of each package's inter-token latency to ``path`` (PNG)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = result["packages"]
    labels = [f"{Path(r['package']).name} ({r['precision']})" for r in rows]
    fig, ax = plt.subplots(figsize=(8, 1.2 + 0.6 * len(rows)))
    ax.boxplot([r["inter_token_samples_ms"] for r in rows], orientation="horizontal", whis=(1, 99))
    ax.set_yticks(range(1, len(labels) + 1), labels)
    ax.set_xlabel("inter-token latency (ms); whiskers at p1 and p99")
    ax.set_title(f"edgeinfer bench: {result['tokens']} tokens, {result['threads']} threads")
    ax.grid(axis="x", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
