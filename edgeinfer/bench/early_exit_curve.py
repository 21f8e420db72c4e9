"""``edgeinfer bench PKG --early-exit-curve``: accuracy vs mean latency of an early-exit package
over every exit rule and threshold, on the held-out test split, with full depth as reference.

Every held-out input runs alone (batch 1, as a device sees requests) through all segments once,
timing each: for any rule and threshold the exit each input takes, hence accuracy, mean layers
and mean latency (the segments it runs), follow without rerunning (the curve). Then the default
rule and threshold and full depth (the same package with no early exit) run for real, alternating
input by input, so the reported speedup is measured, not derived. The held-out split was used
neither for training nor for choosing the threshold (docs/early_exit.md).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import numpy as np
from rich.table import Table

from edgeinfer.config import RuntimeConfig
from edgeinfer.errors import ConfigError
from edgeinfer.manifest import Manifest
from edgeinfer.runtime.kinds.early_exit import EXIT_POLICIES, ExitPolicy, SegmentRunner
from edgeinfer.runtime.kinds.exit_curve import NEVER_EXIT, sweep, trace_inputs
from edgeinfer.runtime.tokenizer import TextTokenizer

__all__ = ["curve_table", "plot_curve", "run_curve"]

# The rule and threshold that never exit early: full depth.
_FULL: tuple[ExitPolicy, float] = ("max_softmax", 2.0)


def _held_out(
    package: Path, manifest: Manifest, limit: int | None
) -> tuple[list[tuple[np.ndarray, np.ndarray | None]], np.ndarray, list[str]]:
    """The test split of the data the heads trained on (the package's ``early_exit.train``),
    as batch-1 inputs (input, mask), labels [N] and each input's variant."""
    data = str(((manifest.early_exit or {}).get("train") or {}).get("data"))
    if data == "mnist":
        from edgeinfer.export.data.digits import digit_split

        digits = digit_split("test", limit=limit)
        inputs: list[tuple[np.ndarray, np.ndarray | None]] = [
            (x[None], None) for x in digits.images
        ]
        return inputs, digits.labels, ["image"] * len(inputs)
    from edgeinfer.export.data.topics import TEXT_DATA, labelled_split

    if data not in TEXT_DATA:
        raise ConfigError(f"{package.name}: no held-out split of {data!r} to measure on")
    split = labelled_split("test", limit=limit)
    tokenizer = TextTokenizer.for_package(package, manifest)
    encoded: list[tuple[np.ndarray, np.ndarray | None]] = [
        tokenizer.encode([text]) for text in split.texts
    ]
    return encoded, split.labels, split.variants


def _measure(
    runner: SegmentRunner,
    inputs: list[tuple[np.ndarray, np.ndarray | None]],
    rule: tuple[ExitPolicy, float],
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Early exit under ``rule`` and full depth, alternating input by input: (early ms [N],
    full ms [N], early predictions [N])."""
    early, full, labels = [], [], []
    for index, (x, mask) in enumerate(inputs):
        order = (rule, _FULL) if index % 2 == 0 else (_FULL, rule)  # no order bias
        for current in order:
            began = time.perf_counter()
            _, logits = runner.run(x, mask, threshold=current[1], exit_policy=current[0])
            elapsed = (time.perf_counter() - began) * 1e3
            if current == rule:
                early.append(elapsed)
                labels.append(int(logits.argmax(axis=1)[0]))
            else:
                full.append(elapsed)
    return np.asarray(early), np.asarray(full), np.asarray(labels)


def run_curve(
    package: Path, *, threads: int | None = None, limit: int | None = None
) -> dict[str, Any]:
    """Sweep every exit rule on the held-out split of ``package`` and measure the default
    rule against full depth in the same run; returns JSON-ready results.

    Args:
        package: an early-exit package folder.
        threads: intra-op threads (default: every core).
        limit: cap the held-out articles (text) or images, evenly spaced (quick runs).
    """
    manifest = Manifest.read(package)
    spec = manifest.early_exit
    if not spec:
        raise ConfigError(f"{package.name} has no exit heads; --early-exit-curve needs one")
    runner = SegmentRunner(package, manifest, config=RuntimeConfig(threads=threads, warmup_runs=0))
    inputs, labels, variants = _held_out(package, manifest, limit)
    for x, mask in inputs[:3]:  # first runs allocate
        runner.trace(x, mask)
    split = trace_inputs(runner, inputs, labels)
    exits = len(runner.exit_layers)
    curves = {p: [split.point(t, p) for t in sweep(p, exits)] for p in EXIT_POLICIES}
    rule = (runner.default_policy, runner.default_threshold)
    early_ms, full_ms, predicted = _measure(runner, inputs, rule)
    full_pred = split.logits[-1].argmax(axis=1)  # [N] the full-depth head's answers

    def summary(keep: np.ndarray) -> dict[str, Any]:
        early_acc = float((predicted[keep] == labels[keep]).mean())
        full_acc = float((full_pred[keep] == labels[keep]).mean())
        chosen = split.exits_at(rule[1], rule[0])[keep]
        return {
            "inputs": int(keep.sum()),
            "accuracy": round(early_acc, 6),
            "full_accuracy": round(full_acc, 6),
            "accuracy_drop_points": round((full_acc - early_acc) * 100, 3),
            "mean_layers": round(float(np.asarray(runner.exit_layers)[chosen].mean()), 4),
            "mean_ms": round(float(early_ms[keep].mean()), 4),
            "full_mean_ms": round(float(full_ms[keep].mean()), 4),
            "speedup": round(float(full_ms[keep].mean() / early_ms[keep].mean()), 3),
        }

    every = np.ones(len(labels), dtype=bool)
    names = sorted(set(variants))
    by_variant = {v: summary(np.asarray(variants) == v) for v in names} if len(names) > 1 else {}
    return {
        "package": str(package),
        "split": "test",
        "inputs": len(labels),
        "limit": limit,
        "threads": threads,
        "policy": rule[0],
        "threshold": rule[1],
        "measured": summary(every),
        "variants": by_variant,
        "full_depth": split.point(NEVER_EXIT),
        "curves": curves,
    }


def curve_table(result: dict[str, Any]) -> Table:
    """The measured default vs full depth (per input variant), then the swept curves."""
    table = Table(title=f"early exit on the held-out split ({result['inputs']} inputs)")
    for column in ("rule", "threshold", "inputs", "accuracy", "mean layers", "mean ms", "speedup"):
        table.add_column(column, justify="left" if column == "rule" else "right")
    rows = {"all": result["measured"], **result["variants"]}
    for name, m in rows.items():
        table.add_row(
            f"full depth ({name}, measured)", "-", str(m["inputs"]),
            f"{m['full_accuracy']:.4f}", "", f"{m['full_mean_ms']:.3f}", "1.00x",
        )  # fmt: skip
        table.add_row(
            f"{result['policy']} default ({name}, measured)", f"{result['threshold']:g}",
            str(m["inputs"]), f"{m['accuracy']:.4f}", f"{m['mean_layers']:.2f}",
            f"{m['mean_ms']:.3f}", f"{m['speedup']:.2f}x",
        )  # fmt: skip
    full_ms = result["full_depth"]["mean_latency_ms"]
    for policy, curve in result["curves"].items():
        for p in curve:
            table.add_row(
                f"{policy} (swept)", f"{p['threshold']:g}", str(result["inputs"]),
                f"{p['accuracy']:.4f}", f"{p['mean_layers']:.2f}",
                f"{p['mean_latency_ms']:.3f}", f"{full_ms / p['mean_latency_ms']:.2f}x",
            )  # fmt: skip
    return table


def plot_curve(result: dict[str, Any], path: Path) -> None:
    """Accuracy vs mean latency, one line per exit rule, the default and full depth marked."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
    for policy, curve in result["curves"].items():
        points = sorted(curve, key=lambda p: p["mean_layers"])  # depth order: no noise zigzag
        ax.plot(
            [p["mean_latency_ms"] for p in points],
            [p["accuracy"] for p in points],
            marker=".",
            label=f"{policy} (traced: segment time)",
        )
    full, measured = result["full_depth"], result["measured"]
    ax.scatter([full["mean_latency_ms"]], [full["accuracy"]], c="k", marker="s", label="full depth")
    ax.scatter(
        [measured["full_mean_ms"]],
        [measured["full_accuracy"]],
        c="k",
        marker="D",
        label="full depth (measured call)",
    )
    ax.scatter(
        [measured["mean_ms"]],
        [measured["accuracy"]],
        c="r",
        marker="*",
        s=150,
        label=f"default ({result['policy']} {result['threshold']:g}, measured call)",
    )
    ax.set_xlabel("mean latency per input, batch 1 (ms)")
    ax.set_ylabel("accuracy (held-out split)")
    ax.set_title(f"{Path(result['package']).name}: early exit")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
