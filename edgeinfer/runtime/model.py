"""``load()`` and the ``Model`` facade: package -> verified files -> warm session -> answers."""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from edgeinfer import providers as eps
from edgeinfer.config import BatchConfig, CacheConfig, RuntimeConfig, SamplingConfig
from edgeinfer.errors import ConfigError
from edgeinfer.manifest import Manifest
from edgeinfer.runtime.batching import DynamicBatcher, pad_rows
from edgeinfer.runtime.early_exit import SegmentRunner, validate_threshold
from edgeinfer.runtime.generate import GenerationResult, Generator, Prompt, TextChunk
from edgeinfer.runtime.metrics import Metrics, MetricsSnapshot
from edgeinfer.runtime.result_cache import ResultCache
from edgeinfer.runtime.semantic_cache import SemanticCache
from edgeinfer.runtime.session import GraphSession
from edgeinfer.runtime.tasks import (
    ClassificationResult,
    EmbeddingResult,
    classification_results,
    l2_normalize,
    mean_pool,
    validate_texts,
)
from edgeinfer.runtime.tokenizer import TextTokenizer

__all__ = ["Model", "load"]

log = logging.getLogger(__name__)

_DTYPES = {"int64": np.int64, "int32": np.int32}
# Texts per graph run: big enough to fill the cores, small enough to bound activation memory.
DEFAULT_BATCH_SIZE = 32

# A task's answer for one text: an embedding [D] float32 (read-only) or a ClassificationResult.
Value = Any


@dataclass(frozen=True)
class _Answer:
    """One text's answer on its way out: value, whether a cache gave it, its timings."""

    value: Value
    cached: bool = False
    queue_ms: float = 0.0
    compute_ms: float = 0.0


@dataclass
class _Lookup:
    """What the caches found for one call's texts (``None`` answers are misses)."""

    answers: list[_Answer | None]
    keys: list[bytes] = field(default_factory=list)
    hits: dict[str, int] = field(default_factory=dict)
    vectors: dict[int, np.ndarray] = field(default_factory=dict)  # miss -> semantic embedding


class Model:
    """A loaded, warmed model package. Create it with ``edgeinfer.load``.

    Calls are thread-safe. With a ``BatchConfig``, concurrent calls are gathered into dynamic
    batches; with a ``CacheConfig``, answers are cached (see ``docs/cache.md``).

    Attributes:
        path: the package folder.
        manifest: its parsed manifest.
        providers: the ORT providers the session really uses, in order.
        cold_start_ms: from ``load()`` being called to the model being warm.
        load_breakdown_ms: the same time split into ``verify``, ``session`` and ``warmup``.
    """

    def __init__(
        self,
        path: Path,
        manifest: Manifest,
        *,
        config: RuntimeConfig,
        cache: CacheConfig | None = None,
        batching: BatchConfig | None = None,
        load_started_s: float | None = None,
    ) -> None:
        started = time.perf_counter()
        self.path = path
        self.manifest = manifest
        self.config = config
        self._metrics = Metrics(model=manifest.name)
        self._metrics.mark_load_started(load_started_s or started)
        self._generator: Generator | None = None
        self._cache: ResultCache[Value] | None = None
        self._semantic: SemanticCache[Value] | None = None
        self._batcher: DynamicBatcher[Value] | None = None
        if manifest.task == "generate":
            if cache is not None or batching is not None:
                raise ConfigError(
                    "result caching and dynamic batching serve embed/classify "
                    "packages; load a generate package without them"
                )
            self._generator = Generator(path, manifest, config=config)  # warms itself up
            self.providers = self._generator.providers
            self.load_breakdown_ms = {"session": (time.perf_counter() - started) * 1e3}
            self.cold_start_ms = 0.0
            return
        io = manifest.io
        requested = config.providers or tuple(manifest.providers)
        # An early-exit package runs its segments (runtime/early_exit.py) instead of one graph.
        self._exits: SegmentRunner | None = None
        if manifest.early_exit is not None:
            self._exits = SegmentRunner(path, manifest, providers=requested, config=config)
            self.providers = self._exits.providers
        else:
            self._session = GraphSession(
                path / io["graph"], providers=eps.resolve(requested), config=config
            )
            self.providers = self._session.providers
        dtype = np.dtype(_DTYPES[io["inputs"][0]["dtype"]])
        self._tokenizer = TextTokenizer(
            path / io["tokenizer"],
            max_seq_len=int(io["max_seq_len"]),
            pad_id=int(manifest.tokens.get("pad") or 0),
            dtype=dtype,
        )
        if cache is not None:
            self._cache = ResultCache.for_package(manifest, config=cache)
            self._semantic = self._open_semantic(cache)
        if batching is not None:
            name = f"edgeinfer-{manifest.name}"
            self._batcher = DynamicBatcher(self._run_rows, config=batching, name=name)
        session_done = time.perf_counter()
        for _ in range(config.warmup_runs):
            self._run_rows(self._tokenize(["warm up"], truncate=True))
        self.load_breakdown_ms = {
            "session": (session_done - started) * 1e3,
            "warmup": (time.perf_counter() - session_done) * 1e3,
        }
        self.cold_start_ms = 0.0

    def _open_semantic(self, cache: CacheConfig | None) -> SemanticCache[Value] | None:
        if cache is None or cache.semantic is None:
            return None
        if self.task != "classify":
            raise ConfigError(
                f"the semantic cache answers classification packages; {self.path.name} is "
                f"{self.task!r} (a neighbour's embedding is not this text's embedding)"
            )
        embedder = load(cache.semantic.embedder, config=self.config)
        if embedder.task != "embed":
            raise ConfigError(f"semantic cache embedder {embedder.path} is not an embed package")
        return SemanticCache(
            embed=embedder.embed,
            threshold=cache.semantic.threshold,
            max_entries=cache.semantic.max_entries,
        )

    @property
    def task(self) -> str:
        """The package's task: ``embed``, ``classify`` or ``generate``."""
        return self.manifest.task

    # -- the hot path: validate -> tokenize -> cache lookup -> run the misses -> store -> metrics

    def _answer(
        self,
        texts: str | Sequence[str],
        *,
        batch_size: int,
        truncate: bool,
        exit_threshold: float | None = None,
    ) -> list[_Answer]:
        started = time.perf_counter()
        items = validate_texts(texts, batch_size=batch_size)
        rows = self._tokenize(items, truncate=truncate)  # token ids [S_i] per text
        tokenized = time.perf_counter()
        found = self._lookup(items, rows)
        misses = [i for i, answer in enumerate(found.answers) if answer is None]
        if misses:
            computed = self._compute(
                [rows[i] for i in misses], batch_size=batch_size, exit_threshold=exit_threshold
            )
            for i, answer in zip(misses, computed, strict=True):
                found.answers[i] = answer
            self._store(found, misses)
        answers = [a for a in found.answers if a is not None]
        self._record(answers, found.hits, started_s=started, tokenized_s=tokenized)
        return answers

    def _tokenize(self, items: Sequence[str], *, truncate: bool) -> list[np.ndarray]:
        """Token ids of each text, unpadded: [S_i] each."""
        ids, mask = self._tokenizer.encode(items, truncate=truncate)  # [N, S], [N, S]
        return [ids[i, :n] for i, n in enumerate(mask.sum(axis=1))]

    def _lookup(self, items: Sequence[str], rows: Sequence[np.ndarray]) -> _Lookup:
        """Exact cache (memory, then disk), then the semantic cache for what is left."""
        found = _Lookup(answers=[None] * len(rows))
        if self._cache is None:
            return found
        found.keys = [self._cache.key(row) for row in rows]
        for i, key in enumerate(found.keys):
            hit = self._cache.get(key)
            if hit is not None:
                found.answers[i] = _Answer(hit[0], cached=True)
                found.hits[hit[1]] = found.hits.get(hit[1], 0) + 1
        missing = [i for i, answer in enumerate(found.answers) if answer is None]
        if self._semantic is not None and missing:
            vectors = self._semantic.embed([items[i] for i in missing])  # [M, D]
            near = self._semantic.lookup(vectors)
            for i, vector, neighbour in zip(missing, vectors, near, strict=True):
                if neighbour is None:
                    found.vectors[i] = vector
                else:
                    found.answers[i] = _Answer(neighbour[0], cached=True)
                    found.hits["semantic"] = found.hits.get("semantic", 0) + 1
        return found

    def _compute(
        self, rows: list[np.ndarray], *, batch_size: int, exit_threshold: float | None = None
    ) -> list[_Answer]:
        """Run the graph for ``rows``: through the dynamic batcher, or here in length order."""
        if self._batcher is not None:
            return [
                _Answer(a.value, queue_ms=a.queue_ms, compute_ms=a.compute_ms)
                for a in self._batcher.submit(rows)
            ]
        order = sorted(range(len(rows)), key=lambda i: rows[i].shape[0])  # less padding
        answers: list[_Answer | None] = [None] * len(rows)
        for start in range(0, len(order), batch_size):
            chunk = order[start : start + batch_size]
            began = time.perf_counter()
            values = self._run_rows([rows[i] for i in chunk], exit_threshold=exit_threshold)
            compute_ms = (time.perf_counter() - began) * 1e3
            for i, value in zip(chunk, values, strict=True):
                answers[i] = _Answer(value, compute_ms=compute_ms)
        return [a for a in answers if a is not None]

    def _run_rows(
        self, rows: list[np.ndarray], *, exit_threshold: float | None = None
    ) -> list[Value]:
        """Pad rows into one batch, run the graph, apply the task head: one value per row."""
        input_ids, attention_mask = pad_rows(rows, pad_id=self._tokenizer.pad_id)  # [B, S]
        if self._exits is not None:
            return list(self._exits.classify(input_ids, attention_mask, threshold=exit_threshold))
        feeds = {
            "input_ids": input_ids,
            "attention_mask": attention_mask,
            "token_type_ids": np.zeros_like(input_ids),
        }
        output = self._session.run(feeds)[0]
        if self.task == "classify":
            return list(classification_results(output, list(self.manifest.io["labels"])))
        pooled = mean_pool(output, attention_mask)  # [B, D]
        if self.manifest.io.get("normalize", True):
            pooled = l2_normalize(pooled)
        rows_out = [row.astype(np.float32) for row in pooled]  # own copies: the cache counts them
        for row in rows_out:
            row.flags.writeable = False  # shared with the cache
        return rows_out

    def _store(self, found: _Lookup, misses: list[int]) -> None:
        """Put freshly computed answers into the exact and the semantic cache."""
        fresh = [(i, found.answers[i]) for i in misses]
        if self._cache is not None:
            self._cache.put_many([(found.keys[i], a.value) for i, a in fresh if a is not None])
        if self._semantic is not None and found.vectors:
            done = [(found.vectors[i], a.value) for i, a in fresh if a is not None]
            self._semantic.add(np.stack([v for v, _ in done]), [value for _, value in done])

    def _record(
        self, answers: list[_Answer], hits: dict[str, int], *, started_s: float, tokenized_s: float
    ) -> None:
        metrics, task = self._metrics, self.task
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
        metrics.first_result()

    # -- public API

    def embed(
        self,
        texts: str | Sequence[str],
        *,
        batch_size: int = DEFAULT_BATCH_SIZE,
        truncate: bool = True,
    ) -> np.ndarray:
        """Embed texts: mean pooling over tokens, then L2 normalization (as the source does).

        Args:
            texts: one text or a sequence of texts.
            batch_size: texts per graph run (with dynamic batching: its ``max_batch_size``).
            truncate: cut texts longer than the model's window; if False they raise ``InputError``.

        Returns:
            float32 array [N, D], row i for text i. ``embed_with_info`` also says which rows
            came from the cache and how long each waited and ran.
        """
        self._require("embed")
        answers = self._answer(texts, batch_size=batch_size, truncate=truncate)
        return np.stack([a.value for a in answers]).astype(np.float32, copy=False)

    def embed_with_info(
        self,
        texts: str | Sequence[str],
        *,
        batch_size: int = DEFAULT_BATCH_SIZE,
        truncate: bool = True,
    ) -> list[EmbeddingResult]:
        """As ``embed``, one ``EmbeddingResult`` per text: its vector (read-only), whether it
        came from the cache, and its queue and compute time."""
        self._require("embed")
        answers = self._answer(texts, batch_size=batch_size, truncate=truncate)
        return [EmbeddingResult(a.value, a.cached, a.queue_ms, a.compute_ms) for a in answers]

    def classify(
        self,
        texts: str | Sequence[str],
        *,
        batch_size: int = DEFAULT_BATCH_SIZE,
        truncate: bool = True,
        exit_threshold: float | None = None,
    ) -> list[ClassificationResult]:
        """Classify texts; one ``ClassificationResult`` per text, in input order (its
        ``cached``, ``queue_ms`` and ``compute_ms`` say where the answer came from).

        On an early-exit package a text is answered by the first exit head whose max softmax
        probability is >= ``exit_threshold`` (default: the one calibrated at export; 0: the
        first head, > 1: the full depth) and ``exit_layer`` names that head's layer.
        """
        self._require("classify")
        if exit_threshold is not None:
            self._check_exit_threshold(exit_threshold)
        answers = self._answer(
            texts, batch_size=batch_size, truncate=truncate, exit_threshold=exit_threshold
        )
        return [
            replace(a.value, cached=a.cached, queue_ms=a.queue_ms, compute_ms=a.compute_ms)
            for a in answers
        ]

    def generate(
        self,
        prompt: Prompt,
        *,
        max_new_tokens: int = 128,
        sampling: SamplingConfig | None = None,
        stop: Sequence[str] = (),
        timeout_s: float | None = None,
    ) -> GenerationResult:
        """Complete ``prompt`` (text, or chat messages rendered with the package's template).

        Stops at the end-of-text token, a ``stop`` string, ``max_new_tokens`` or ``timeout_s``.
        Raises ``ContextLengthExceededError`` before any work when the prompt plus
        ``max_new_tokens`` exceeds the package's context length.
        """
        return self._need_generator().generate(
            prompt,
            max_new_tokens=max_new_tokens,
            sampling=sampling,
            stop=stop,
            timeout_s=timeout_s,
        )

    def stream(
        self,
        prompt: Prompt,
        *,
        max_new_tokens: int = 128,
        sampling: SamplingConfig | None = None,
        stop: Sequence[str] = (),
        timeout_s: float | None = None,
    ) -> Iterator[TextChunk]:
        """As ``generate``, yielding text as it is decoded (never half a character)."""
        return self._need_generator().stream(
            prompt,
            max_new_tokens=max_new_tokens,
            sampling=sampling,
            stop=stop,
            timeout_s=timeout_s,
        )

    def _need_generator(self) -> Generator:
        if self._generator is None:
            raise ConfigError(
                f"{self.path.name} is a {self.task!r} package; generate() and stream() need a "
                "generate package"
            )
        return self._generator

    def metrics(self) -> MetricsSnapshot:
        """A snapshot of this model's latencies (p50/p95/p99), cold start and cache counts.
        ``edgeinfer.render_prometheus([model.metrics()])`` writes it for Prometheus."""
        return self._metrics.snapshot()

    def clear_cache(self) -> None:
        """Empty this model's result caches (memory, its SQLite file, the semantic cache)."""
        if self._cache is not None:
            self._cache.clear()
        if self._semantic is not None:
            self._semantic.clear()

    def close(self) -> None:
        """Stop the batching thread and close the cache file; later calls may fail."""
        if self._batcher is not None:
            self._batcher.close()
        if self._cache is not None:
            self._cache.close()

    def __enter__(self) -> Model:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def _check_exit_threshold(self, threshold: float) -> None:
        validate_threshold(threshold)
        if self._exits is None:
            raise ConfigError(f"{self.path.name} has no exit heads; drop exit_threshold")
        if self._cache is not None or self._batcher is not None:
            raise ConfigError(
                "exit_threshold is per call, but cached and batched answers use the package's "
                "default threshold; load without cache/batching to choose another"
            )

    def _require(self, task: str) -> None:
        if self.manifest.task != task:
            raise ConfigError(
                f"{self.path.name} is a {self.manifest.task!r} package; it has no {task}()"
            )

    def __repr__(self) -> str:
        return (
            f"Model({self.manifest.name!r}, task={self.task!r}, "
            f"precision={self.manifest.precision!r}, providers={self.providers})"
        )


def load(
    package: str | Path,
    *,
    providers: Sequence[str] | None = None,
    threads: int | None = None,
    verify: bool = True,
    config: RuntimeConfig | None = None,
    cache: CacheConfig | None = None,
    batching: BatchConfig | None = None,
) -> Model:
    """Load a model package, verify it, start its session and warm it up.

    Args:
        package: the package folder written by ``edgeinfer export``.
        providers: execution providers in order of preference (aliases like ``cuda`` or ORT
            names); default: the package's own order. CPU is always the fallback.
        threads: intra-op threads (default: every core).
        verify: check each file's sha256 against the manifest before loading (recommended).
        config: a full ``RuntimeConfig``; the keyword arguments above override its fields.
        cache: cache results (memory LRU, SQLite, optional semantic cache); ``None``: off.
        batching: gather concurrent calls into dynamic batches; ``None``: each call runs alone.

    Raises:
        ManifestError, IntegrityError, PackageError, ProviderError, ConfigError.
    """
    started = time.perf_counter()
    path = Path(package)
    base = config or RuntimeConfig()
    config = RuntimeConfig(
        providers=tuple(providers) if providers is not None else base.providers,
        threads=threads if threads is not None else base.threads,
        spin_wait=base.spin_wait,
        warmup_runs=base.warmup_runs,
        verify=verify and base.verify,
    )
    manifest = Manifest.read(path)
    verified = time.perf_counter()
    if config.verify:
        manifest.verify(path)
    verify_ms = (time.perf_counter() - verified) * 1e3
    model = Model(
        path, manifest, config=config, cache=cache, batching=batching, load_started_s=started
    )
    model.load_breakdown_ms = {"verify": verify_ms, **model.load_breakdown_ms}
    model.cold_start_ms = (time.perf_counter() - started) * 1e3
    log.info("loaded %s in %.1f ms (%s)", path, model.cold_start_ms, ", ".join(model.providers))
    return model
