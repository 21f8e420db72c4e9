"""``ClassifyModel``: texts or images to labels. Text packages (``text-classifier``,
``exit-segments`` over text) answer through the text hot path (``text.py``: caches, dynamic
batching); image packages run one graph (``image-classifier``, docs/vision.md) or image
segments with exit heads (``exit-segments`` over images, docs/early_exit.md): pixels in, no
tokenizer, each result saying how long its batch ran."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

from edgeinfer import providers as eps
from edgeinfer.config import BatchConfig, CacheConfig, RuntimeConfig
from edgeinfer.errors import ConfigError
from edgeinfer.manifest import Manifest
from edgeinfer.package_io import ExitSegmentsIO, ImageClassifierIO
from edgeinfer.runtime.cache.semantic import SemanticCache
from edgeinfer.runtime.cache.tiers import Value
from edgeinfer.runtime.kinds.early_exit import ExitPolicy, SegmentRunner
from edgeinfer.runtime.kinds.embed import EmbedModel
from edgeinfer.runtime.kinds.text import TextRunner
from edgeinfer.runtime.model import DEFAULT_BATCH_SIZE, Model
from edgeinfer.runtime.session import GraphSession
from edgeinfer.runtime.tasks import ClassificationResult, classification_results, prepare_images

__all__ = ["ClassifyModel"]

# images, batch size, exit threshold, exit rule -> one result per image
Classify = Callable[[Any, int, "float | None", "ExitPolicy | None"], list[ClassificationResult]]


class ClassifyModel(Model):
    """A ``classify`` package: texts or images to labels, optionally with early exit.
    ``ClassifyModel.load`` loads one (a ``PackageError`` for another kind); ``edgeinfer.load``
    returns one for such a package. Result caches and dynamic batching serve text packages."""

    TASK = "classify"
    IO_KINDS = ("text-classifier", "image-classifier", "exit-segments")
    OPTIONS = ("cache", "batching")

    def __init__(
        self,
        path: Path,
        manifest: Manifest,
        *,
        config: RuntimeConfig,
        cache: CacheConfig | None = None,
        batching: BatchConfig | None = None,
    ) -> None:
        super().__init__(path, manifest, config=config)
        io = manifest.io
        self._texts: TextRunner | None = None
        self._exits: SegmentRunner | None = None
        images = isinstance(io, ImageClassifierIO) or (
            isinstance(io, ExitSegmentsIO) and io.input != "text"
        )
        if not images:
            semantic = self._semantic(cache, config)
            self._texts = TextRunner(
                path,
                manifest,
                config=config,
                metrics=self._metrics,
                cache=cache,
                batching=batching,
                semantic=semantic,
            )
            self._exits, self.providers = self._texts.exits, self._texts.providers
            return
        if cache or batching:
            raise ConfigError(f"{path.name} classifies images; load it without caches and batching")
        requested = eps.resolve(config.providers or tuple(manifest.providers))
        self._images: Classify
        if isinstance(io, ExitSegmentsIO):
            self._exits = SegmentRunner(path, manifest, providers=requested, config=config)
            self.providers = self._exits.providers
            self._images = self._segments_classifier(self._exits)
            self._blank = np.zeros((1, *self._exits.image_shape), np.float32)
        elif isinstance(io, ImageClassifierIO):
            session = GraphSession(path / io.graph, providers=requested, config=config)
            self.providers = session.providers
            self._images = self._graph_classifier(session, io)
            self._blank = np.zeros((1, io.image.height, io.image.width, 3), np.uint8)

    @staticmethod
    def _semantic(cache: CacheConfig | None, config: RuntimeConfig) -> SemanticCache[Value] | None:
        """The semantic cache over the embed package ``cache.semantic`` names."""
        if cache is None or cache.semantic is None:
            return None
        embedder = Path(cache.semantic.embedder)
        if Manifest.read(embedder).io.kind not in EmbedModel.IO_KINDS:
            raise ConfigError(f"semantic cache embedder {embedder} is not an embed package")
        model = EmbedModel.load(embedder, config=config)
        return SemanticCache(
            embed=model.embed,
            threshold=cache.semantic.threshold,
            max_entries=cache.semantic.max_entries,
        )

    def classify(
        self,
        inputs: str | Path | Sequence[Any] | np.ndarray,
        *,
        batch_size: int = DEFAULT_BATCH_SIZE,
        truncate: bool = True,
        exit_threshold: float | None = None,
        exit_policy: ExitPolicy | None = None,
    ) -> list[ClassificationResult]:
        """Classify texts or images; one ``ClassificationResult`` per input, in input order
        (its ``cached``, ``queue_ms`` and ``compute_ms`` say where the answer came from).

        Image packages take pictures as callers hold them: a file path, a Pillow image, a uint8
        RGB array [H, W, 3] of any size, a list of those, or a uint8 batch [N, H, W, 3]; each
        is resized and cropped as the manifest's ``io.image`` says (Pillow, the ``images``
        extra, is needed unless the arrays already have the package's size). The normalized
        float32 [N, 3, H, W] the graph takes passes as it is. An image early-exit package
        takes float32 intensities in [0, 1], [N, 1, H, W] or [N, H, W].

        On an early-exit package an input is answered by the first exit head where
        ``exit_policy`` (``max_softmax``, ``entropy`` or ``patience``; default: the one chosen
        at export) passes ``exit_threshold`` (default: the calibrated one) and ``exit_layer``
        names that head's layer (see docs/early_exit.md).
        """
        if batch_size < 1:
            raise ConfigError(f"batch_size must be >= 1, got {batch_size}")
        if exit_threshold is not None or exit_policy is not None:
            self._check_exit_rule(exit_threshold, exit_policy)
        if self._texts is None:
            return self._classify_images(inputs, batch_size, exit_threshold, exit_policy)
        answers = self._texts.answer(
            inputs,  # type: ignore[arg-type]  # validate_texts refuses what is not text
            batch_size=batch_size,
            truncate=truncate,
            exit_threshold=exit_threshold,
            exit_policy=exit_policy,
        )
        return [
            replace(a.value, cached=a.cached, queue_ms=a.queue_ms, compute_ms=a.compute_ms)
            for a in answers
        ]

    def clear_cache(self) -> None:
        """Empty a text package's result caches (memory, its SQLite file, the semantic cache)."""
        if self._texts is not None:
            self._texts.clear_cache()

    def close(self) -> None:
        """Stop the batching thread and close the cache file; later calls may fail."""
        if self._texts is not None:
            self._texts.close()

    def _warm_up(self, runs: int) -> None:
        if self._texts is not None:
            self._texts.warm_up(runs)
            return
        for _ in range(runs):
            self._images(self._blank, 1, None, None)

    def _check_exit_rule(self, threshold: float | None, policy: ExitPolicy | None) -> None:
        if self._exits is None:
            raise ConfigError(
                f"{self.path.name} has no exit heads; drop exit_threshold and exit_policy"
            )
        texts = self._texts
        if texts is not None and (texts.caches is not None or texts.batcher is not None):
            raise ConfigError(
                "exit_threshold is per call, but cached and batched answers use the package's "
                "default threshold; load without cache/batching to choose another"
            )
        self._exits.check_rule(threshold, policy)

    def _classify_images(
        self, inputs: Any, batch_size: int, threshold: float | None, policy: ExitPolicy | None
    ) -> list[ClassificationResult]:
        """One result per image, in order (forms: ``prepare_images`` for a single graph,
        ``SegmentRunner.check_images`` for segments), with the call's metrics."""
        started = time.perf_counter()
        results = self._images(inputs, batch_size, threshold, policy)
        metrics = self._metrics
        metrics.observe("classify", "end_to_end", (time.perf_counter() - started) * 1e3)
        metrics.observe_many("classify", "compute", (r.compute_ms for r in results))
        metrics.count_cache("classify", hits={}, misses=len(results))
        for r in results:
            if r.exit_layer is not None:
                metrics.count_exit("classify", r.exit_layer)
        return results

    @staticmethod
    def _segments_classifier(exits: SegmentRunner) -> Classify:
        def run(
            images: Any, batch_size: int, threshold: float | None, policy: ExitPolicy | None
        ) -> list[ClassificationResult]:
            return exits.classify_images(
                images, batch_size=batch_size, threshold=threshold, exit_policy=policy
            )

        return run

    @staticmethod
    def _graph_classifier(session: GraphSession, io: ImageClassifierIO) -> Classify:
        """pixels -> graph -> softmax; a graph with a fixed batch (NPU targets) runs that many
        images per run, the last run padded with zeros."""
        fixed = io.inputs[0].shape[0]
        labels = list(io.labels)

        def run(
            images: Any, batch_size: int, _t: float | None, _p: str | None
        ) -> list[ClassificationResult]:
            pixels = prepare_images(images, image=io.image)  # [N, 3, H, W] float32
            step = fixed if isinstance(fixed, int) and fixed > 0 else batch_size
            results: list[ClassificationResult] = []
            for start in range(0, len(pixels), step):
                chunk = pixels[start : start + step]  # [b, 3, H, W]
                real = len(chunk)
                if isinstance(fixed, int) and fixed > 0 and real < fixed:
                    pad = np.zeros((fixed - real, *chunk.shape[1:]), np.float32)
                    chunk = np.concatenate([chunk, pad])
                began = time.perf_counter()
                logits = session.run({io.inputs[0].name: chunk})[0][:real]  # [b, C]
                compute_ms = (time.perf_counter() - began) * 1e3
                results += [
                    replace(r, compute_ms=compute_ms)
                    for r in classification_results(logits, labels, scores=io.scores)
                ]
            return results

        return run
