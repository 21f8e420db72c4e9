"""Labelled BBC News splits and the exit-threshold calibration of early-exit packages.

Articles are split by their index in ``bbc_articles()`` (stable order): index % 10 in 0-5
trains the heads, 6-7 chooses the threshold (validation), 8-9 is held out for the benchmark
(test). An article whose text also occurs in an earlier split (the corpus has duplicates) is
dropped from the later one. Each article gives two texts: ``short`` (headline + first sentence)
and ``full`` (headline + body, truncated to ``MAX_SEQ_LEN`` tokens by the tokenizer).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np

from edgeinfer.config import RuntimeConfig
from edgeinfer.errors import ConfigError
from edgeinfer.export.calibrate import bbc_articles
from edgeinfer.manifest import Manifest
from edgeinfer.runtime.early_exit import EXIT_POLICIES, SegmentRunner, first_exit
from edgeinfer.runtime.tokenizer import TextTokenizer

__all__ = [
    "ENTROPY_THRESHOLDS",
    "MAX_SEQ_LEN",
    "NEVER_EXIT",
    "TEXT_DATA",
    "THRESHOLDS",
    "LabelledSplit",
    "SplitTrace",
    "calibrate_policies",
    "labelled_split",
    "sweep",
    "trace_split",
]

Split = Literal["train", "validation", "test"]
Variant = Literal["short", "full"]
_SPLITS: dict[str, tuple[int, ...]] = {
    "train": (0, 1, 2, 3, 4, 5),
    "validation": (6, 7),
    "test": (8, 9),
}
# The labelled text the heads train on ("bbc": the name packages before recipes recorded).
TEXT_DATA = ("bbc-news", "bbc")
# Full articles are cut to 128 tokens: the "full text" input variant.
MAX_SEQ_LEN = 128
# A threshold above 1 never passes: every text runs to the full-depth head.
NEVER_EXIT = 2.0
# Max-softmax thresholds swept at export (5 classes: the max probability is >= 0.2).
THRESHOLDS: tuple[float, ...] = (
    *(round(0.2 + 0.05 * i, 2) for i in range(15)),
    *(round(0.95 + 0.01 * i, 2) for i in range(5)),
    0.995,
    0.999,
    0.9999,
    NEVER_EXIT,
)
# Normalized-entropy thresholds (exit when <= tau); -1 never passes (full depth).
ENTROPY_THRESHOLDS: tuple[float, ...] = (
    0.0001,
    0.001,
    0.003,
    0.01,
    0.02,
    0.03,
    0.05,
    *(round(0.1 * i, 1) for i in range(1, 11)),
)


@dataclass(frozen=True)
class LabelledSplit:
    """Texts with their topic index; ``variants[i]`` says which input variant text i is."""

    texts: list[str]
    labels: np.ndarray  # [N] int64
    variants: list[str]
    topics: list[str]

    def only(self, variant: Variant) -> LabelledSplit:
        """The texts of one input variant."""
        keep = [i for i, v in enumerate(self.variants) if v == variant]
        return LabelledSplit(
            [self.texts[i] for i in keep], self.labels[keep], [variant] * len(keep), self.topics
        )


def _variants(article: str) -> dict[str, str]:
    lines = [line.strip() for line in article.splitlines() if line.strip()]
    if len(lines) < 2:
        return {}
    headline, body = lines[0], " ".join(lines[1:])
    first_sentence = body.split(". ")[0].rstrip(".") + "."
    return {"short": f"{headline}. {first_sentence}", "full": f"{headline}. {body}"}


def labelled_split(split: Split, *, limit: int | None = None) -> LabelledSplit:
    """The texts of ``split`` (both variants); ``limit`` keeps that many articles, evenly
    spaced through the split (so every topic stays represented) — for quick builds."""
    if split not in _SPLITS:
        raise ConfigError(f"unknown split {split!r}: use train, validation or test")
    if limit is not None and limit < 1:
        raise ConfigError(f"limit must be >= 1, got {limit}")
    articles = bbc_articles()
    topics = sorted({topic for topic, _ in articles})
    seen: set[str] = set()
    for earlier in list(_SPLITS)[: list(_SPLITS).index(split)]:
        seen.update(text for i, (_, text) in enumerate(articles) if i % 10 in _SPLITS[earlier])
    pool = [
        (topic, text)
        for i, (topic, text) in enumerate(articles)
        if i % 10 in _SPLITS[split] and text not in seen
    ]
    if limit is not None:
        pool = pool[:: max(1, len(pool) // limit)][:limit]
    texts: list[str] = []
    labels: list[int] = []
    variants: list[str] = []
    for topic, article in pool:
        for variant, text in _variants(article).items():
            texts.append(text)
            labels.append(topics.index(topic))
            variants.append(variant)
    return LabelledSplit(texts, np.asarray(labels, dtype=np.int64), variants, topics)


@dataclass(frozen=True)
class SplitTrace:
    """Every exit's logits and every segment's batch-1 time for each text of a split."""

    logits: np.ndarray  # [E, N, C] float32
    segment_ms: np.ndarray  # [E, N] float64
    labels: np.ndarray  # [N] int64
    exit_layers: list[int]

    def exits_at(self, threshold: float, policy: str = "max_softmax") -> np.ndarray:
        """The exit index [N] each input answers at under ``policy`` and ``threshold``."""
        return first_exit(list(self.logits), threshold, policy)

    def accuracy_at(self, threshold: float, policy: str = "max_softmax") -> float:
        """Accuracy of the answers given under ``policy`` and ``threshold``."""
        chosen = self.exits_at(threshold, policy)
        answers = self.logits[chosen, np.arange(len(chosen))]  # [N, C]
        return float((answers.argmax(axis=1) == self.labels).mean())

    def point(self, threshold: float, policy: str = "max_softmax") -> dict[str, float]:
        """One point of the curve: accuracy, mean layers executed, mean batch-1 latency, and
        ``losses``: the share of inputs the full-depth head gets right and this point wrong
        (its accuracy drop before the inputs it gets right and the full depth wrong)."""
        chosen = self.exits_at(threshold, policy)
        cumulative = np.cumsum(self.segment_ms, axis=0)  # [E, N]
        rows = np.arange(len(chosen))
        right = self.logits[chosen, rows].argmax(axis=1) == self.labels  # [N]
        full_right = self.logits[-1].argmax(axis=1) == self.labels  # [N]
        losses = int((full_right & ~right).sum())
        return {
            "threshold": threshold,
            "accuracy": round(self.accuracy_at(threshold, policy), 6),
            "mean_layers": round(float(np.asarray(self.exit_layers)[chosen].mean()), 4),
            "mean_latency_ms": round(float(cumulative[chosen, rows].mean()), 4),
            "losses": round(losses / max(len(chosen), 1), 6),
        }


def trace_split(package: Path, split: LabelledSplit, *, threads: int | None = None) -> SplitTrace:
    """Run every text of ``split`` alone (batch 1, as a device sees requests) through all
    segments of the early-exit package at ``package``, timing each segment."""
    manifest = Manifest.read(package)
    runner = SegmentRunner(package, manifest, config=RuntimeConfig(threads=threads, warmup_runs=0))
    tokenizer = TextTokenizer.for_package(package, manifest)
    runner.trace(*tokenizer.encode(["warm up"]))
    return trace_inputs(runner, (tokenizer.encode([text]) for text in split.texts), split.labels)


def trace_inputs(
    runner: SegmentRunner,
    inputs: Iterable[tuple[np.ndarray, np.ndarray | None]],
    labels: np.ndarray,
) -> SplitTrace:
    """Trace each ``(features, attention_mask)`` input (batch 1) through every segment."""
    logits, times = [], []
    for features, mask in inputs:
        trace = runner.trace(features, mask)
        logits.append(np.concatenate(trace.logits))  # [E, C]
        times.append(trace.segment_ms)
    return SplitTrace(
        logits=np.stack(logits, axis=1),
        segment_ms=np.asarray(times, dtype=np.float64).T,
        labels=labels,
        exit_layers=runner.exit_layers,
    )


def sweep(policy: str, exits: int) -> tuple[float, ...]:
    """The thresholds swept for ``policy`` on a package with ``exits`` heads."""
    if policy == "entropy":
        return ENTROPY_THRESHOLDS
    if policy == "patience":
        return tuple(float(p) for p in range(1, exits + 1))  # ``exits``: the last head answers
    return THRESHOLDS


def calibrate_policies(trace: SplitTrace, max_accuracy_loss: float) -> dict[str, Any]:
    """Sweep every exit rule and choose the default rule and threshold: the fastest (fewest
    mean layers, which is deterministic where the measured latency is noisy; ties: the more
    accurate, then max_softmax before entropy before patience, then the more cautious
    threshold) whose ``losses`` — the share of inputs the full depth gets right and it gets
    wrong — are within ``max_accuracy_loss``. Inputs an early head gets right and the full
    depth wrong earn no credit: netting them out lets the sweep pick the point where such
    gains were luckiest on validation, which then misses the budget on new data.

    Returns the manifest fields ``policy``, ``threshold``, ``max_accuracy_loss``,
    ``full_depth``, ``default``, ``curve`` (the default rule's) and ``curves`` (every rule's).
    """
    exits = len(trace.exit_layers)
    curves = {p: [trace.point(t, p) for t in sweep(p, exits)] for p in EXIT_POLICIES}
    full = trace.point(NEVER_EXIT)

    def within(point: dict[str, float]) -> bool:
        return point["losses"] <= max_accuracy_loss + 1e-9

    def cost(item: tuple[str, dict[str, float]]) -> tuple[float, ...]:
        policy, point = item
        cautious = -point["threshold"] if policy == "entropy" else point["threshold"]
        rank = EXIT_POLICIES.index(policy)
        return (point["mean_layers"], -point["accuracy"], rank, -cautious)

    passing = [(p, pt) for p, curve in curves.items() for pt in curve if within(pt)]
    policy, best = min(passing, key=cost)  # never empty: the full-depth point is swept
    return {
        "policy": policy,
        "threshold": best["threshold"],
        "max_accuracy_loss": max_accuracy_loss,
        "criterion": "losses",
        "full_depth": full,
        "default": best,
        "curve": curves[policy],
        "curves": curves,
    }
