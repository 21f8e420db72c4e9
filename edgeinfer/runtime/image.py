"""Image packages: one graph (``image-classifier``, docs/vision.md) or image segments with exit
heads (``exit-segments`` over images, docs/early_exit.md). Pixels in, no tokenizer; each result
says how long its batch ran."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

from edgeinfer import providers as eps
from edgeinfer.errors import ConfigError
from edgeinfer.manifest import Manifest
from edgeinfer.package_io import ExitSegmentsIO, ImageClassifierIO
from edgeinfer.runtime.backends import Backend, BackendOptions
from edgeinfer.runtime.early_exit import ExitPolicy, SegmentRunner
from edgeinfer.runtime.session import GraphSession
from edgeinfer.runtime.tasks import ClassificationResult, classification_results, prepare_images

__all__ = ["ImageBackend"]

# images, batch size, exit threshold, exit rule -> one result per image
Classify = Callable[[Any, int, "float | None", "ExitPolicy | None"], list[ClassificationResult]]


class ImageBackend(Backend):
    """Classify images with an image package (arrays; see ``classify`` for the forms)."""

    def __init__(self, path: Path, manifest: Manifest, options: BackendOptions) -> None:
        super().__init__(path, manifest, options)
        if options.cache or options.batching or options.prefix_cache:
            raise ConfigError(f"{path.name} classifies images; load it without caches and batching")
        io, config = manifest.io, options.config
        requested = eps.resolve(config.providers or tuple(manifest.providers))
        self.exits: SegmentRunner | None = None
        self._classify: Classify
        if isinstance(io, ExitSegmentsIO):
            self.exits = SegmentRunner(path, manifest, providers=requested, config=config)
            self.providers = self.exits.providers
            self._classify = self._segments_classifier(self.exits)
            self._blank = np.zeros((1, *self.exits.image_shape), np.float32)
        elif isinstance(io, ImageClassifierIO):
            session = GraphSession(path / io.graph, providers=requested, config=config)
            self.providers = session.providers
            self._classify = self._graph_classifier(session, io)
            self._blank = np.zeros((1, io.image.height, io.image.width, 3), np.uint8)
        else:
            raise ConfigError(f"{path.name} is a {io.kind!r} package, not an image package")

    def warm_up(self, runs: int) -> None:
        for _ in range(runs):
            self._classify(self._blank, 1, None, None)

    def classify(
        self,
        inputs: Any,
        *,
        batch_size: int,
        truncate: bool,
        exit_threshold: float | None,
        exit_policy: ExitPolicy | None,
    ) -> list[ClassificationResult]:
        """One result per image, in order (forms: ``prepare_images`` for a single graph,
        ``SegmentRunner.check_images`` for segments)."""
        if batch_size < 1:
            raise ConfigError(f"batch_size must be >= 1, got {batch_size}")
        if exit_threshold is not None or exit_policy is not None:
            if self.exits is None:
                raise ConfigError(
                    f"{self.path.name} has no exit heads; drop exit_threshold and exit_policy"
                )
            self.exits.check_rule(exit_threshold, exit_policy)
        started = time.perf_counter()
        results = self._classify(inputs, batch_size, exit_threshold, exit_policy)
        metrics = self.metrics
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
