"""Labelled BBC News splits: the topics early-exit text heads train, calibrate and are
benchmarked on.

Articles are split by their index in ``bbc_articles()`` (stable order): index % 10 in 0-5
trains the heads, 6-7 chooses the threshold (validation), 8-9 is held out for the benchmark
(test). An article whose text also occurs in an earlier split (the corpus has duplicates) is
dropped from the later one. Each article gives two texts: ``short`` (headline + first sentence)
and ``full`` (headline + body, truncated to ``MAX_SEQ_LEN`` tokens by the tokenizer).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import numpy as np

from edgeinfer.errors import ConfigError
from edgeinfer.export.data.text import bbc_articles

__all__ = ["MAX_SEQ_LEN", "TEXT_DATA", "LabelledSplit", "labelled_split"]

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
