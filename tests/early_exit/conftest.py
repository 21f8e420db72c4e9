"""Small real early-exit packages, built once per session through the real export pipeline (or
reused from EDGEINFER_TEST_CACHE, re-verified against their manifest): MiniLM with exits at
layers 2, 4 and 6 (heads trained on a few dozen BBC News articles) and the MNIST CNN with an
exit after each conv block (trained on a few hundred images); fp32 segments, seconds each."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

# Articles per split: enough for every topic and a meaningful curve, small enough for seconds.
ARTICLES = 60


@pytest.fixture(scope="session")
def early_exit_package(package_root: Path, export_once: Callable[..., Path]) -> Path:
    """An fp32 early-exit classify package (exit every 2 layers, BBC topics)."""
    return export_once(
        package_root / "minilm-early-exit",
        source="minilm",
        task="classify",
        quantize="none",
        early_exit=True,
        exit_every=2,
        train_data="bbc",
        early_exit_articles=ARTICLES,
        max_accuracy_loss=0.01,
        threads=2,
    )


# Images per split for the test CNN: every digit ~30 times, trained in seconds.
IMAGES = 300


@pytest.fixture(scope="session")
def mnist_early_exit_package(package_root: Path, export_once: Callable[..., Path]) -> Path:
    """An fp32 early-exit CNN on MNIST (exits after each of its 3 conv blocks)."""
    return export_once(
        package_root / "mnist-cnn-early-exit",
        source="mnist-cnn",
        task="classify",
        quantize="none",
        early_exit=True,
        train_data="mnist",
        early_exit_articles=IMAGES,
        max_accuracy_loss=0.01,
        threads=2,
    )
