"""Image classification packages: one graph (docs/vision.md) or image segments with exit heads
(docs/early_exit.md). Pixels in, no tokenizer; each result says how long its batch ran."""

from __future__ import annotations

import time
from dataclasses import replace
from typing import Any

import numpy as np

from edgeinfer.errors import ConfigError
from edgeinfer.manifest import Manifest
from edgeinfer.runtime.early_exit import SegmentRunner
from edgeinfer.runtime.session import GraphSession
from edgeinfer.runtime.tasks import ClassificationResult, classification_results, prepare_images

__all__ = ["ImageClassifier"]


class ImageClassifier:
    """Classify image arrays with a package's single graph or its exit segments.

    Args:
        manifest: the package's manifest.
        runner: the graph of a single-graph package (``io["image"]`` describes its input), or
            the segment runner of an early-exit image package.
    """

    def __init__(self, manifest: Manifest, runner: GraphSession | SegmentRunner) -> None:
        self.io = manifest.io
        self._runner = runner

    def blank(self) -> np.ndarray:
        """One all-zero image in the form ``classify`` takes (warm-up input)."""
        if isinstance(self._runner, SegmentRunner):
            return np.zeros((1, *self._runner.image_shape), np.float32)
        image = self.io["image"]
        return np.zeros((1, int(image["height"]), int(image["width"]), 3), np.uint8)

    def classify(
        self,
        images: Any,
        *,
        batch_size: int,
        exit_threshold: float | None = None,
        exit_policy: str | None = None,
    ) -> list[ClassificationResult]:
        """One result per image, in order (the accepted forms: ``prepare_images`` for a single
        graph, ``SegmentRunner.check_images`` for segments)."""
        if batch_size < 1:
            raise ConfigError(f"batch_size must be >= 1, got {batch_size}")
        if isinstance(self._runner, SegmentRunner):
            return self._runner.classify_images(
                images, batch_size=batch_size, threshold=exit_threshold, exit_policy=exit_policy
            )
        return self._classify_graph(self._runner, images, batch_size=batch_size)

    def _classify_graph(
        self, session: GraphSession, images: Any, *, batch_size: int
    ) -> list[ClassificationResult]:
        """pixels -> graph -> softmax; a graph with a fixed batch (NPU targets) runs that many
        images per run, the last run padded with zeros."""
        pixels = prepare_images(images, image=self.io["image"])  # [N, 3, H, W] float32
        fixed = self.io["inputs"][0]["shape"][0]
        step = fixed if isinstance(fixed, int) and fixed > 0 else batch_size
        labels = list(self.io["labels"])
        results: list[ClassificationResult] = []
        for start in range(0, len(pixels), step):
            chunk = pixels[start : start + step]  # [b, 3, H, W]
            real = len(chunk)
            if isinstance(fixed, int) and real < fixed:
                pad = np.zeros((fixed - real, *chunk.shape[1:]), np.float32)
                chunk = np.concatenate([chunk, pad])
            began = time.perf_counter()
            logits = session.run({self.io["inputs"][0]["name"]: chunk})[0][:real]  # [b, C]
            compute_ms = (time.perf_counter() - began) * 1e3
            results += [
                replace(r, compute_ms=compute_ms) for r in classification_results(logits, labels)
            ]
        return results
