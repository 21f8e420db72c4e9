"""Task heads on top of graph outputs (pooling, normalization, softmax, labels), each task's
result type, and the codec that stores it in the result cache."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

import numpy as np

from edgeinfer.errors import ConfigError, InputError
from edgeinfer.package_io import ImageSpec, Scores
from edgeinfer.runtime.kinds.pictures import pictures_to_batch

__all__ = [
    "ClassificationCodec",
    "ClassificationResult",
    "Codec",
    "Detection",
    "EmbeddingCodec",
    "EmbeddingResult",
    "classification_results",
    "l2_normalize",
    "mean_pool",
    "prepare_images",
    "softmax",
    "validate_texts",
]

V = TypeVar("V")


@dataclass(frozen=True)
class Detection:
    """One detected object: ``box`` x1, y1, x2, y2 in the image's own pixels, its ``label``
    and ``score`` (the class score, times objectness for YOLOv5 layouts)."""

    box: tuple[float, float, float, float]
    label: str
    score: float


@dataclass(frozen=True)
class ClassificationResult:
    """One text's classification.

    Attributes:
        label: the most probable label.
        score: its probability.
        scores: every label's probability, most probable first.
        exit_layer: the layer whose head answered (``None``: the full model).
        cached: True when the answer came from the result cache (exact or semantic) and no
            graph ran for it.
        queue_ms: time the text waited for a dynamic batch (0 without batching or on a hit).
        compute_ms: time of the graph run that answered it (0 on a cache hit).
    """

    label: str
    score: float
    scores: dict[str, float]
    exit_layer: int | None = None
    cached: bool = False
    queue_ms: float = 0.0
    compute_ms: float = 0.0


@dataclass(frozen=True)
class EmbeddingResult:
    """One text's embedding, with where it came from (``Model.embed_with_info``).

    Attributes:
        vector: float32 [D], read-only (it may be shared with the cache).
        cached: True when it came from the result cache and no graph ran for it.
        queue_ms: time the text waited for a dynamic batch (0 without batching or on a hit).
        compute_ms: time of the graph run that produced it (0 on a cache hit).
    """

    vector: np.ndarray
    cached: bool = False
    queue_ms: float = 0.0
    compute_ms: float = 0.0


def mean_pool(hidden: np.ndarray, mask: np.ndarray) -> np.ndarray:
    """Average token vectors over real (unmasked) tokens.

    hidden: [B, S, D] float32; mask: [B, S] int; returns [B, D] float32.
    """
    weights = mask.astype(hidden.dtype)[:, :, None]  # [B, S, 1]
    summed = np.einsum("bsd,bsk->bd", hidden, weights)  # [B, D]
    counts = np.maximum(weights.sum(axis=1), 1e-9)  # [B, 1]
    pooled: np.ndarray = summed / counts
    return pooled


def l2_normalize(x: np.ndarray) -> np.ndarray:
    """Scale each row of ``x`` [B, D] to unit length (zero rows stay zero)."""
    norms = np.linalg.norm(x, axis=1, keepdims=True)
    unit: np.ndarray = x / np.maximum(norms, 1e-12)
    return unit


def softmax(logits: np.ndarray) -> np.ndarray:
    """Row-wise softmax of ``logits`` [B, C] in float32, stable for large logits."""
    shifted = logits - logits.max(axis=1, keepdims=True)
    exp = np.exp(shifted)
    probs: np.ndarray = exp / exp.sum(axis=1, keepdims=True)
    return probs


def classification_results(
    logits: np.ndarray, labels: list[str], *, scores: Scores = "logits"
) -> list[ClassificationResult]:
    """One ``ClassificationResult`` per row of ``logits`` [B, C] (labels: C names in order;
    ``scores`` "probabilities": the rows already are, taken as they are)."""
    raw = logits.astype(np.float32)
    probs = raw if scores == "probabilities" else softmax(raw)  # [B, C]
    results = []
    for p in probs:
        ranked = np.argsort(-p)
        results.append(
            ClassificationResult(
                label=labels[int(ranked[0])],
                score=float(p[ranked[0]]),
                scores={labels[int(i)]: float(p[i]) for i in ranked},
            )
        )
    return results


def prepare_images(images: Any, *, image: ImageSpec) -> np.ndarray:
    """The graph's ``pixel_values`` [N, 3, H, W] float32 from what a caller passes.

    ``image`` is the package's ``io.image``. Accepted: float32 [3, H, W] or [N, 3, H, W],
    already normalized, passed as they are; else pictures (``pictures.pictures_to_batch``: file
    paths, Pillow images, uint8 RGB arrays of any size), resized as the manifest says, put in
    the graph's channel order and normalized as ``(pixel - mean) / std``.
    """
    h, w = image.height, image.width
    if isinstance(images, np.ndarray) and images.dtype == np.float32:
        batch = images[None] if images.ndim == 3 else images
        if batch.ndim != 4 or batch.shape[1:] != (3, h, w) or len(batch) == 0:
            raise InputError(
                f"float32 images must be normalized pixel_values [N, 3, {h}, {w}] or "
                f"[3, {h}, {w}], got {list(images.shape)}"
            )
        if not np.isfinite(batch).all():
            raise InputError("float32 images hold NaN or infinite values")
        return np.ascontiguousarray(batch)
    if isinstance(images, np.ndarray) and images.dtype != np.uint8:
        raise InputError(
            f"images must be uint8 RGB [N, H, W, 3] or float32 [N, 3, {h}, {w}], "
            f"got dtype {images.dtype}"
        )
    if isinstance(images, np.ndarray) and images.ndim not in (3, 4):
        raise InputError(
            f"uint8 images must be RGB [N, H, W, 3] or [H, W, 3], got {list(images.shape)}"
        )
    batch = pictures_to_batch(images, image=image)  # [N, H, W, 3] uint8 RGB
    if image.color == "BGR":
        batch = batch[..., ::-1]
    mean = np.asarray(image.mean, np.float32)  # [3]
    std = np.asarray(image.std, np.float32)  # [3]
    pixels = (batch.astype(np.float32) - mean) / std  # [N, H, W, 3]
    return np.ascontiguousarray(pixels.transpose(0, 3, 1, 2))  # [N, 3, H, W]


def validate_texts(texts: str | Sequence[str], *, batch_size: int) -> list[str]:
    """The texts of a call as a list; raise on an empty call, a bad batch size, an empty text."""
    items = [texts] if isinstance(texts, str) else list(texts)
    if not items:
        raise InputError("expected at least one text")
    if batch_size < 1:
        raise ConfigError(f"batch_size must be >= 1, got {batch_size}")
    for text in items:
        if not isinstance(text, str) or not text.strip():
            raise InputError("every text must be a non-empty string")
    return items


class Codec(Protocol[V]):
    """How a task's value is written to and read from bytes."""

    def encode(self, value: V) -> bytes:
        """Serialize ``value``."""

    def decode(self, data: bytes) -> V:
        """Rebuild a value written by ``encode``."""


class EmbeddingCodec:
    """An embedding vector as raw little-endian float32 (decoded read-only, without a copy)."""

    def encode(self, value: np.ndarray) -> bytes:
        """Serialize a [D] float32 vector."""
        return np.ascontiguousarray(value, dtype="<f4").tobytes()

    def decode(self, data: bytes) -> np.ndarray:
        """A read-only [D] float32 vector."""
        return np.frombuffer(data, dtype="<f4")


class ClassificationCodec:
    """A ``ClassificationResult`` as JSON (label order kept; floats round-trip exactly)."""

    def encode(self, value: ClassificationResult) -> bytes:
        """Serialize the answer (not its cache flag or timings)."""
        data = {
            "label": value.label,
            "score": value.score,
            "scores": list(value.scores.items()),
            "exit_layer": value.exit_layer,
        }
        return json.dumps(data, separators=(",", ":")).encode()

    def decode(self, data: bytes) -> ClassificationResult:
        """Rebuild the answer, with ``cached=False`` and zero timings."""
        d = json.loads(data)
        return ClassificationResult(
            label=d["label"], score=d["score"], scores=dict(d["scores"]), exit_layer=d["exit_layer"]
        )
