"""The text hot path that embed and text classification packages share, with result caches,
dynamic batching and early exit (``text-encoder``, ``text-classifier``, ``exit-segments`` over
text).

The hot path reads top to bottom: validate -> tokenize -> cache lookup -> run the misses
(batched, or here in length order) -> store -> metrics.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np

from edgeinfer import providers as eps
from edgeinfer.config import BatchConfig, CacheConfig, RuntimeConfig
from edgeinfer.errors import ConfigError
from edgeinfer.manifest import Manifest
from edgeinfer.package_io import ExitSegmentsIO, TextClassifierIO, TextEncoderIO
from edgeinfer.runtime.batching import DynamicBatcher, pad_rows
from edgeinfer.runtime.cache.results import ResultCache
from edgeinfer.runtime.cache.semantic import SemanticCache
from edgeinfer.runtime.cache.tiers import Answer, Caches, Lookup, Value
from edgeinfer.runtime.kinds.early_exit import ExitPolicy, SegmentRunner
from edgeinfer.runtime.metrics import Metrics
from edgeinfer.runtime.session import GraphSession
from edgeinfer.runtime.tasks import (
    ClassificationResult,
    classification_results,
    l2_normalize,
    mean_pool,
    validate_texts,
)
from edgeinfer.runtime.tokenizer import TextTokenizer

__all__ = ["MAX_TOKENS_PER_RUN", "TextRunner"]

# Padded tokens per graph run (rows x longest row): activations grow with it, so one request
# of many long texts must not run as one batch. On 2 cores, 64 MiniLM int8 texts of 256
# tokens ran faster as [8, 256] runs than as [32, 256] (1.40 vs 1.80 s) and peaked at 230
# instead of 557 MB; short texts still batch up to ``batch_size``.
MAX_TOKENS_PER_RUN = 2048

# rows [S_i] int -> one value per row (a read-only embedding [D] or a ClassificationResult);
# the exit threshold and rule apply to early-exit packages only.
RunRows = Callable[[list[np.ndarray], "float | None", "ExitPolicy | None"], list[Value]]


# Padded tokens above which a run shrinks onnxruntime's arena afterwards: a run of short
# texts (the common request) keeps its arena warm.
_SHRINK_ABOVE_TOKENS = 1024


def _runs(order: list[int], rows: list[np.ndarray], batch_size: int) -> list[list[int]]:
    """``order`` (row indexes, shortest first) cut into graph runs of at most ``batch_size``
    rows and ``MAX_TOKENS_PER_RUN`` padded tokens (one row always runs, whatever its length)."""
    runs: list[list[int]] = []
    for i in order:
        last = runs[-1] if runs else None
        longest = rows[i].shape[0]  # sorted: this row sets the run's padded length
        if last and len(last) < batch_size and (len(last) + 1) * longest <= MAX_TOKENS_PER_RUN:
            last.append(i)
        else:
            runs.append([i])
    return runs


class TextRunner:
    """The text hot path of a text package (``text-encoder``, ``text-classifier``,
    ``exit-segments`` over text), shared by ``EmbedModel`` and ``ClassifyModel``: every text's
    answer, from the caches or the graph, with the call's metrics.

    Args:
        path, manifest: the package.
        config: providers, threads, spinning.
        metrics: the model's metrics (latencies, cache hits, exits are counted there).
        cache: the result caches; ``None``: off.
        batching: gather concurrent calls into dynamic batches; ``None``: each call runs alone.
        semantic: the semantic cache behind the exact one (classification packages).
    """

    def __init__(
        self,
        path: Path,
        manifest: Manifest,
        *,
        config: RuntimeConfig,
        metrics: Metrics,
        cache: CacheConfig | None,
        batching: BatchConfig | None,
        semantic: SemanticCache[Value] | None = None,
    ) -> None:
        self.path, self.manifest, self.metrics = path, manifest, metrics
        io = manifest.io
        self.task = manifest.task
        requested = eps.resolve(config.providers or tuple(manifest.providers))
        self.exits: SegmentRunner | None = None
        self._run_rows: RunRows
        if isinstance(io, ExitSegmentsIO):
            self.exits = SegmentRunner(path, manifest, providers=requested, config=config)
            self.providers = self.exits.providers
            self._run_rows = self._exit_runner(self.exits)
        elif isinstance(io, (TextEncoderIO, TextClassifierIO)):
            session = GraphSession(path / io.graph, providers=requested, config=config)
            self.providers = session.providers
            self._run_rows = self._graph_runner(session, io)
        else:
            raise ConfigError(f"{path.name} is a {io.kind!r} package, not a text package")
        self.tokenizer = TextTokenizer.for_package(path, manifest)
        self.caches = (
            None
            if cache is None
            else Caches(ResultCache.for_package(manifest, config=cache), semantic)
        )
        self.batcher = (
            None
            if batching is None
            else DynamicBatcher(
                lambda rows: self._run_rows(rows, None, None),
                config=batching,
                name=f"edgeinfer-{manifest.name}",
            )
        )

    def warm_up(self, runs: int) -> None:
        """Run ``runs`` throw-away texts so the first real call pays no allocation."""
        for _ in range(runs):
            self._run_rows(self._tokenize(["warm up"], truncate=True), None, None)

    # -- the hot path: validate -> tokenize -> cache lookup -> run the misses -> store -> metrics

    def answer(
        self,
        texts: str | Sequence[str],
        *,
        batch_size: int,
        truncate: bool,
        exit_threshold: float | None = None,
        exit_policy: ExitPolicy | None = None,
    ) -> list[Answer]:
        """Every text's answer, from the caches or the graph, in input order."""
        started = time.perf_counter()
        items = validate_texts(texts, batch_size=batch_size)
        rows = self._tokenize(items, truncate=truncate)  # token ids [S_i] per text
        tokenized = time.perf_counter()
        found = (
            self.caches.lookup(items, rows)
            if self.caches is not None
            else Lookup(answers=[None] * len(rows))
        )
        misses = [i for i, answer in enumerate(found.answers) if answer is None]
        if misses:
            computed = self._compute(
                [rows[i] for i in misses], batch_size, exit_threshold, exit_policy
            )
            for i, answer in zip(misses, computed, strict=True):
                found.answers[i] = answer
            if self.caches is not None:
                self.caches.store(found, misses)
        answers = [a for a in found.answers if a is not None]
        self._record(answers, found.hits, started_s=started, tokenized_s=tokenized)
        return answers

    def _tokenize(self, items: Sequence[str], *, truncate: bool) -> list[np.ndarray]:
        """Token ids of each text, unpadded: [S_i] each."""
        ids, mask = self.tokenizer.encode(items, truncate=truncate)  # [N, S], [N, S]
        return [ids[i, :n] for i, n in enumerate(mask.sum(axis=1))]

    def _compute(
        self,
        rows: list[np.ndarray],
        batch_size: int,
        exit_threshold: float | None,
        exit_policy: ExitPolicy | None,
    ) -> list[Answer]:
        """Run the graph for ``rows``: through the dynamic batcher, or here in length order."""
        if self.batcher is not None:
            return [
                Answer(a.value, queue_ms=a.queue_ms, compute_ms=a.compute_ms)
                for a in self.batcher.submit(rows)
            ]
        order = sorted(range(len(rows)), key=lambda i: rows[i].shape[0])  # less padding
        answers: list[Answer | None] = [None] * len(rows)
        for chunk in _runs(order, rows, batch_size):
            began = time.perf_counter()
            values = self._run_rows([rows[i] for i in chunk], exit_threshold, exit_policy)
            compute_ms = (time.perf_counter() - began) * 1e3
            for i, value in zip(chunk, values, strict=True):
                answers[i] = Answer(value, compute_ms=compute_ms)
        return [a for a in answers if a is not None]

    def _graph_runner(self, session: GraphSession, io: TextEncoderIO | TextClassifierIO) -> RunRows:
        """Pad rows into one batch, run the graph, apply the task head: one value per row."""
        pad_id = self.tokenizer_pad_id()

        def run(rows: list[np.ndarray], _t: float | None, _p: ExitPolicy | None) -> list[Value]:
            input_ids, attention_mask = pad_rows(rows, pad_id=pad_id)  # [B, S]
            feeds = {
                "input_ids": input_ids,
                "attention_mask": attention_mask,
                "token_type_ids": np.zeros_like(input_ids),
            }
            # A run past the steady size gives its arena growth back (memory after a burst of
            # long texts returns to what short requests need; costs ~1 % of such a run).
            output = session.run(feeds, shrink_arena=input_ids.size > _SHRINK_ABOVE_TOKENS)[0]
            if isinstance(io, TextClassifierIO):
                return list(classification_results(output, list(io.labels), scores=io.scores))
            if io.pooling == "none":  # the graph pools: [B, D]
                pooled = output
            elif io.pooling == "cls":
                pooled = output[:, 0]  # [B, D]
            else:
                pooled = mean_pool(output, attention_mask)  # [B, D]
            if io.normalize:
                pooled = l2_normalize(pooled)
            vectors = [row.astype(np.float32) for row in pooled]  # own copies: cached
            for vector in vectors:
                vector.flags.writeable = False  # shared with the cache
            return vectors

        return run

    def tokenizer_pad_id(self) -> int:
        """The id a batch is padded with."""
        return int(self.manifest.tokens.get("pad") or 0)

    def _exit_runner(self, exits: SegmentRunner) -> RunRows:
        """Pad rows into one batch and run the segments until every row has exited."""
        pad_id = self.tokenizer_pad_id()

        def run(
            rows: list[np.ndarray], threshold: float | None, policy: ExitPolicy | None
        ) -> list[Value]:
            input_ids, attention_mask = pad_rows(rows, pad_id=pad_id)  # [B, S]
            return list(
                exits.classify(input_ids, attention_mask, threshold=threshold, exit_policy=policy)
            )

        return run

    def _record(
        self, answers: list[Answer], hits: dict[str, int], *, started_s: float, tokenized_s: float
    ) -> None:
        metrics, task = self.metrics, self.task
        computed = [a for a in answers if not a.cached]
        metrics.observe(task, "end_to_end", (time.perf_counter() - started_s) * 1e3)
        metrics.observe(task, "tokenize", (tokenized_s - started_s) * 1e3)
        if computed:
            metrics.observe_many(task, "queue", (a.queue_ms for a in computed))
            metrics.observe_many(task, "compute", (a.compute_ms for a in computed))
        metrics.count_cache(task, hits=hits, misses=len(computed))
        for a in computed:
            if isinstance(a.value, ClassificationResult) and a.value.exit_layer is not None:
                metrics.count_exit(task, a.value.exit_layer)

    def clear_cache(self) -> None:
        """Empty the result caches (memory, the SQLite file, the semantic cache)."""
        if self.caches is not None:
            self.caches.clear()

    def close(self) -> None:
        """Stop the batching thread and close the cache file."""
        if self.batcher is not None:
            self.batcher.close()
        if self.caches is not None:
            self.caches.close()
