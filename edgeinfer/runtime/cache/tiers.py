"""The caches in front of a text model's graph: the exact cache (memory, then SQLite), then the
semantic cache for what is left; fresh answers are stored in both (docs/cache.md)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from edgeinfer.runtime.cache.results import ResultCache
from edgeinfer.runtime.cache.semantic import SemanticCache

__all__ = ["Answer", "Caches", "Lookup", "Value"]

# A task's answer for one text: an embedding [D] float32 (read-only) or a ClassificationResult.
Value = Any


@dataclass(frozen=True)
class Answer:
    """One text's answer on its way out: value, whether a cache gave it, its timings."""

    value: Value
    cached: bool = False
    queue_ms: float = 0.0
    compute_ms: float = 0.0


@dataclass
class Lookup:
    """What the caches found for one call's texts (``None`` answers are misses)."""

    answers: list[Answer | None]
    keys: list[bytes] = field(default_factory=list)
    hits: dict[str, int] = field(default_factory=dict)
    vectors: dict[int, np.ndarray] = field(default_factory=dict)  # miss -> semantic embedding


class Caches:
    """The exact cache and the optional semantic cache of one model."""

    def __init__(self, exact: ResultCache[Value], semantic: SemanticCache[Value] | None) -> None:
        self.exact = exact
        self.semantic = semantic

    def lookup(self, items: Sequence[str], rows: Sequence[np.ndarray]) -> Lookup:
        """Exact cache (memory, then disk), then the semantic cache for what is left."""
        found = Lookup(answers=[None] * len(rows))
        found.keys = [self.exact.key(row) for row in rows]
        for i, key in enumerate(found.keys):
            hit = self.exact.get(key)
            if hit is not None:
                found.answers[i] = Answer(hit[0], cached=True)
                found.hits[hit[1]] = found.hits.get(hit[1], 0) + 1
        missing = [i for i, answer in enumerate(found.answers) if answer is None]
        if self.semantic is not None and missing:
            vectors = self.semantic.embed([items[i] for i in missing])  # [M, D]
            near = self.semantic.lookup(vectors)
            for i, vector, neighbour in zip(missing, vectors, near, strict=True):
                if neighbour is None:
                    found.vectors[i] = vector
                else:
                    found.answers[i] = Answer(neighbour[0], cached=True)
                    found.hits["semantic"] = found.hits.get("semantic", 0) + 1
        return found

    def store(self, found: Lookup, misses: list[int]) -> None:
        """Put freshly computed answers into the exact and the semantic cache."""
        fresh = [(i, found.answers[i]) for i in misses]
        self.exact.put_many([(found.keys[i], a.value) for i, a in fresh if a is not None])
        if self.semantic is not None and found.vectors:
            done = [(found.vectors[i], a.value) for i, a in fresh if a is not None]
            self.semantic.add(np.stack([v for v, _ in done]), [value for _, value in done])

    def clear(self) -> None:
        """Empty both caches (memory, the SQLite file, the semantic entries)."""
        self.exact.clear()
        if self.semantic is not None:
            self.semantic.clear()

    def close(self) -> None:
        """Close the SQLite file."""
        self.exact.close()
