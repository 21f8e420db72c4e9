"""``load()`` and the ``Model`` facade: package -> verified files -> warm session -> answers."""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

from edgeinfer import providers as eps
from edgeinfer.config import (
    BatchConfig,
    CacheConfig,
    PrefixCacheConfig,
    RuntimeConfig,
    SamplingConfig,
)
from edgeinfer.errors import ConfigError
from edgeinfer.manifest import Manifest
from edgeinfer.runtime.answers import Answer, Caches, Lookup, Value
from edgeinfer.runtime.batching import DynamicBatcher, pad_rows
from edgeinfer.runtime.chat import Prompt
from edgeinfer.runtime.early_exit import SegmentRunner, validate_threshold
from edgeinfer.runtime.generate import Generator
from edgeinfer.runtime.images import ImageClassifier
from edgeinfer.runtime.metrics import Metrics, MetricsSnapshot
from edgeinfer.runtime.result_cache import ResultCache
from edgeinfer.runtime.semantic_cache import SemanticCache
from edgeinfer.runtime.session import GraphSession
from edgeinfer.runtime.streaming import GenerationResult, TextChunk
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

# Texts per graph run: big enough to fill the cores, small enough to bound activation memory.
DEFAULT_BATCH_SIZE = 32


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
        prefix_cache: PrefixCacheConfig | None = None,
        load_started_s: float | None = None,
    ) -> None:
        started = time.perf_counter()
        self.path = path
        self.manifest = manifest
        self.config = config
        self._metrics = Metrics(model=manifest.name)
        self._metrics.mark_load_started(load_started_s or started)
        self._generator: Generator | None = None
        self._caches: Caches | None = None
        self._batcher: DynamicBatcher[Value] | None = None
        if manifest.task == "generate":
            if cache is not None or batching is not None:
                raise ConfigError(
                    "result caching and dynamic batching serve embed/classify "
                    "packages; load a generate package without them"
                )
            self._generator = Generator(  # warms itself up
                path, manifest, config=config, prefix_cache=prefix_cache
            )
            self.providers = self._generator.providers
            self.load_breakdown_ms = {"session": (time.perf_counter() - started) * 1e3}
            self.cold_start_ms = 0.0
            return
        if prefix_cache is not None:
            raise ConfigError("prefix_cache serves generate packages; load this one without it")
        io = manifest.io
        requested = config.providers or tuple(manifest.providers)
        # An early-exit package runs its segments (runtime/early_exit.py) instead of one graph.
        self._exits: SegmentRunner | None = None
        self._images: ImageClassifier | None = None
        if manifest.early_exit is not None:
            self._exits = SegmentRunner(path, manifest, providers=requested, config=config)
            self.providers = self._exits.providers
            if self._exits.images:
                self._images = ImageClassifier(manifest, self._exits)
        else:
            self._session = GraphSession(
                path / io["graph"], providers=eps.resolve(requested), config=config
            )
            self.providers = self._session.providers
            if "image" in io:  # an image classifier (docs/vision.md)
                self._images = ImageClassifier(manifest, self._session)
        if self._images is not None:  # pixels in: no tokenizer, cache or batcher
            self._start_images(self._images, cache, batching, started)
            return
        self._tokenizer = TextTokenizer.for_package(path, manifest)
        if cache is not None:
            self._caches = Caches(
                ResultCache.for_package(manifest, config=cache), self._open_semantic(cache)
            )
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
        exit_policy: str | None = None,
    ) -> list[Answer]:
        started = time.perf_counter()
        items = validate_texts(texts, batch_size=batch_size)
        rows = self._tokenize(items, truncate=truncate)  # token ids [S_i] per text
        tokenized = time.perf_counter()
        found = (
            self._caches.lookup(items, rows)
            if self._caches is not None
            else Lookup(answers=[None] * len(rows))
        )
        misses = [i for i, answer in enumerate(found.answers) if answer is None]
        if misses:
            computed = self._compute(
                [rows[i] for i in misses],
                batch_size=batch_size,
                exit_threshold=exit_threshold,
                exit_policy=exit_policy,
            )
            for i, answer in zip(misses, computed, strict=True):
                found.answers[i] = answer
            if self._caches is not None:
                self._caches.store(found, misses)
        answers = [a for a in found.answers if a is not None]
        self._record(answers, found.hits, started_s=started, tokenized_s=tokenized)
        return answers

    def _tokenize(self, items: Sequence[str], *, truncate: bool) -> list[np.ndarray]:
        """Token ids of each text, unpadded: [S_i] each."""
        ids, mask = self._tokenizer.encode(items, truncate=truncate)  # [N, S], [N, S]
        return [ids[i, :n] for i, n in enumerate(mask.sum(axis=1))]

    def _compute(
        self,
        rows: list[np.ndarray],
        *,
        batch_size: int,
        exit_threshold: float | None = None,
        exit_policy: str | None = None,
    ) -> list[Answer]:
        """Run the graph for ``rows``: through the dynamic batcher, or here in length order."""
        if self._batcher is not None:
            return [
                Answer(a.value, queue_ms=a.queue_ms, compute_ms=a.compute_ms)
                for a in self._batcher.submit(rows)
            ]
        order = sorted(range(len(rows)), key=lambda i: rows[i].shape[0])  # less padding
        answers: list[Answer | None] = [None] * len(rows)
        for start in range(0, len(order), batch_size):
            chunk = order[start : start + batch_size]
            began = time.perf_counter()
            values = self._run_rows(
                [rows[i] for i in chunk], exit_threshold=exit_threshold, exit_policy=exit_policy
            )
            compute_ms = (time.perf_counter() - began) * 1e3
            for i, value in zip(chunk, values, strict=True):
                answers[i] = Answer(value, compute_ms=compute_ms)
        return [a for a in answers if a is not None]

    def _run_rows(
        self,
        rows: list[np.ndarray],
        *,
        exit_threshold: float | None = None,
        exit_policy: str | None = None,
    ) -> list[Value]:
        """Pad rows into one batch, run the graph, apply the task head: one value per row."""
        input_ids, attention_mask = pad_rows(rows, pad_id=self._tokenizer.pad_id)  # [B, S]
        if self._exits is not None:
            return list(
                self._exits.classify(
                    input_ids, attention_mask, threshold=exit_threshold, exit_policy=exit_policy
                )
            )
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

    def _record(
        self, answers: list[Answer], hits: dict[str, int], *, started_s: float, tokenized_s: float
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
        texts: str | Sequence[str] | np.ndarray,
        *,
        batch_size: int = DEFAULT_BATCH_SIZE,
        truncate: bool = True,
        exit_threshold: float | None = None,
        exit_policy: str | None = None,
    ) -> list[ClassificationResult]:
        """Classify texts; one ``ClassificationResult`` per text, in input order (its
        ``cached``, ``queue_ms`` and ``compute_ms`` say where the answer came from).

        On an early-exit package an input is answered by the first exit head where
        ``exit_policy`` (``max_softmax``, ``entropy`` or ``patience``; default: the one chosen
        at export) passes ``exit_threshold`` (default: the calibrated one) and ``exit_layer``
        names that head's layer (see docs/early_exit.md). An image early-exit package takes
        a float32 array of intensities in [0, 1], [N, 1, H, W] or [N, H, W], instead of texts.
        """
        self._require("classify")
        if exit_threshold is not None or exit_policy is not None:
            self._check_exit_rule(exit_threshold, exit_policy)
        if self._images is not None:
            return self._classify_images(
                self._images,
                texts,
                batch_size=batch_size,
                exit_threshold=exit_threshold,
                exit_policy=exit_policy,
            )
        answers = self._answer(
            texts,  # type: ignore[arg-type]  # validate_texts refuses what is not text
            batch_size=batch_size,
            truncate=truncate,
            exit_threshold=exit_threshold,
            exit_policy=exit_policy,
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

    def warm_prefix(self, prefix: str) -> int:
        """Load (or prefill and store) the keys/values of text every prompt starts with;
        returns its token count. A chat's system message needs no call: it is kept
        automatically. See ``docs/generation.md``."""
        return self._need_generator().warm_prefix(prefix)

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
        if self._caches is not None:
            self._caches.clear()

    def close(self) -> None:
        """Stop the batching thread and close the cache file; later calls may fail."""
        if self._batcher is not None:
            self._batcher.close()
        if self._caches is not None:
            self._caches.close()

    def __enter__(self) -> Model:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def _start_images(
        self,
        images: ImageClassifier,
        cache: CacheConfig | None,
        batching: BatchConfig | None,
        started: float,
    ) -> None:
        """Warm up an image package (its images skip tokenizer, caches and batcher)."""
        if cache is not None or batching is not None:
            raise ConfigError(
                f"{self.path.name} classifies images; load it without cache and batching"
            )
        session_done = time.perf_counter()
        for _ in range(self.config.warmup_runs):
            images.classify(images.blank(), batch_size=1)
        self.load_breakdown_ms = {
            "session": (session_done - started) * 1e3,
            "warmup": (time.perf_counter() - session_done) * 1e3,
        }
        self.cold_start_ms = 0.0

    def _classify_images(
        self,
        classifier: ImageClassifier,
        images: Any,
        *,
        batch_size: int,
        exit_threshold: float | None,
        exit_policy: str | None,
    ) -> list[ClassificationResult]:
        """Classify an image array (runtime/images.py), with metrics."""
        started = time.perf_counter()
        results = classifier.classify(
            images, batch_size=batch_size, exit_threshold=exit_threshold, exit_policy=exit_policy
        )
        metrics = self._metrics
        metrics.observe("classify", "end_to_end", (time.perf_counter() - started) * 1e3)
        metrics.observe_many("classify", "compute", (r.compute_ms for r in results))
        metrics.count_cache("classify", hits={}, misses=len(results))
        for r in results:
            if r.exit_layer is not None:
                metrics.count_exit("classify", r.exit_layer)
        metrics.first_result()
        return results

    def _check_exit_rule(self, threshold: float | None, policy: str | None) -> None:
        if self._exits is None:
            raise ConfigError(
                f"{self.path.name} has no exit heads; drop exit_threshold and exit_policy"
            )
        if self._caches is not None or self._batcher is not None:
            raise ConfigError(
                "exit_threshold is per call, but cached and batched answers use the package's "
                "default threshold; load without cache/batching to choose another"
            )
        rule = policy or self._exits.default_policy
        validate_threshold(self._exits.default_threshold if threshold is None else threshold, rule)
        if threshold is None and rule != self._exits.default_policy:
            raise ConfigError(f"pass exit_threshold with exit_policy={rule!r}")

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
    prefix_cache: PrefixCacheConfig | None = None,
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
        prefix_cache: keep a generate package's system-prompt keys/values on disk across
            restarts (see ``docs/generation.md``); ``None``: in memory only.

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
        path,
        manifest,
        config=config,
        cache=cache,
        batching=batching,
        prefix_cache=prefix_cache,
        load_started_s=started,
    )
    model.load_breakdown_ms = {"verify": verify_ms, **model.load_breakdown_ms}
    model.cold_start_ms = (time.perf_counter() - started) * 1e3
    log.info("loaded %s in %.1f ms (%s)", path, model.cold_start_ms, ", ".join(model.providers))
    return model
