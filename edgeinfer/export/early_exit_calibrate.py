"""Labelled BBC News splits and the exit-threshold calibration of early-exit packages.

Articles are split by their index in ``bbc_articles()`` (stable order): index % 10 in 0-5
trains the heads, 6-7 chooses the threshold (validation), 8-9 is held out for the benchmark
(test). An article whose text also occurs in an earlier split (the corpus has duplicates) is
dropped from the later one. Each article gives two texts: ``short`` (headline + first sentence)
and ``full`` (headline + body, truncated to ``MAX_SEQ_LEN`` tokens by the tokenizer).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np

from edgeinfer.config import RuntimeConfig
from edgeinfer.errors import ConfigError
from edgeinfer.export.calibrate import bbc_articles
from edgeinfer.manifest import Manifest
from edgeinfer.runtime.early_exit import SegmentRunner, first_exit
from edgeinfer.runtime.tokenizer import TextTokenizer

__all__ = [
    "MAX_SEQ_LEN",
    "NEVER_EXIT",
    "THRESHOLDS",
    "LabelledSplit",
    "SplitTrace",
    "calibrate_thresholds",
    "labelled_split",
    "trace_split",
]

Split = Literal["train", "validation", "test"]
Variant = Literal["short", "full"]
_SPLITS: dict[str, tuple[int, ...]] = {
    "train": (0, 1, 2, 3, 4, 5),
    "validation": (6, 7),
    "test": (8, 9),
}
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

    def exits_at(self, threshold: float) -> np.ndarray:
        """The exit index [N] each text answers at under ``threshold``."""
        return first_exit(list(self.logits), threshold)

    def accuracy_at(self, threshold: float) -> float:
        """Accuracy of the answers given under ``threshold``."""
        chosen = self.exits_at(threshold)
        answers = self.logits[chosen, np.arange(len(chosen))]  # [N, C]
        return float((answers.argmax(axis=1) == self.labels).mean())

    def point(self, threshold: float) -> dict[str, float]:
        """One point of the curve: accuracy, mean layers executed, mean batch-1 latency."""
        chosen = self.exits_at(threshold)
        cumulative = np.cumsum(self.segment_ms, axis=0)  # [E, N]
        return {
            "threshold": threshold,
            "accuracy": round(self.accuracy_at(threshold), 6),
            "mean_layers": round(float(np.asarray(self.exit_layers)[chosen].mean()), 4),
            "mean_latency_ms": round(float(cumulative[chosen, np.arange(len(chosen))].mean()), 4),
        }


def trace_split(package: Path, split: LabelledSplit, *, threads: int | None = None) -> SplitTrace:
    """Run every text of ``split`` alone (batch 1, as a device sees requests) through all
    segments of the early-exit package at ``package``, timing each segment."""
    manifest = Manifest.read(package)
    runner = SegmentRunner(package, manifest, config=RuntimeConfig(threads=threads, warmup_runs=0))
    io = manifest.io
    tokenizer = TextTokenizer(
        package / io["tokenizer"],
        max_seq_len=int(io["max_seq_len"]),
        pad_id=int(manifest.tokens.get("pad") or 0),
        dtype=np.dtype(np.int64),
    )
    runner.trace(*tokenizer.encode(["warm up"]))
    logits, times = [], []
    for text in split.texts:
        trace = runner.trace(*tokenizer.encode([text]))
        logits.append(np.concatenate(trace.logits))  # [E, C]
        times.append(trace.segment_ms)
    return SplitTrace(
        logits=np.stack(logits, axis=1),
        segment_ms=np.asarray(times, dtype=np.float64).T,
        labels=split.labels,
        exit_layers=runner.exit_layers,
    )


def calibrate_thresholds(trace: SplitTrace, max_accuracy_loss: float) -> dict[str, Any]:
    """Sweep ``THRESHOLDS`` and choose the default: the fastest (fewest mean layers, which is
    deterministic where the measured latency is noisy; ties: the more accurate, then the higher
    threshold) whose accuracy is within ``max_accuracy_loss`` of the full-depth head."""
    curve = [trace.point(t) for t in THRESHOLDS]
    full = trace.point(NEVER_EXIT)
    within = [p for p in curve if p["accuracy"] >= full["accuracy"] - max_accuracy_loss - 1e-9]
    best = min(within, key=lambda p: (p["mean_layers"], -p["accuracy"], -p["threshold"]))
    return {
        "threshold": best["threshold"],
        "max_accuracy_loss": max_accuracy_loss,
        "full_depth": full,
        "default": best,
        "curve": curve,
    }
